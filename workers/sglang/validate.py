"""Decide, before a GPU is touched, whether a launch command is valid and what it really runs.

Two layers, both always reported: the built-in layer (flag table + ``rules``; no SGLang needed) and
SGLang's own parser and resolver (``resolver``), which is authoritative about what SGLang does. The
project's own rules then refuse launches SGLang would accept but that measure the wrong thing.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from workers.sglang import api
from workers.sglang.flags import ArgvError, parse_launch_args
from workers.sglang.resolver import ResolverResult, SGLangResolver, default_sglang_python, installed_version
from workers.sglang.rules import (
    Finding,
    SpecParams,
    adaptive_fallback_finding,
    builtin_resolve,
    normalize_algorithm,
    requested_params,
)

Status = Literal["ok", "adjusted", "invalid"]
EXIT_CODES: dict[str, int] = {"ok": 0, "adjusted": 3, "invalid": 2}
BUILTIN = "builtin"


class ValidationReport(BaseModel):
    """The verdict on one launch command."""

    model_config = ConfigDict(frozen=True)

    argv: list[str]
    status: Status
    errors: list[Finding]
    warnings: list[Finding]
    requested: SpecParams
    effective: SpecParams | None
    resolved: dict[str, Any] | None
    checked_by: list[str]
    layers: dict[str, str]  # each layer's own verdict: "ok" / "invalid" / SGLang's error text
    corrected_argv: list[str] | None

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.status]

    def to_json_dict(self) -> dict[str, Any]:
        """The ``--json`` object (``resolved`` is left out: it is SGLang's whole resolved arg set)."""
        return {
            "status": self.status,
            "errors": [_finding_dict(f) for f in self.errors],
            "warnings": [_finding_dict(f) for f in self.warnings],
            "requested": self.requested.as_dict(),
            "effective": self.effective.as_dict() if self.effective else None,
            "checked_by": self.checked_by,
            "layers": self.layers,
            "corrected_argv": self.corrected_argv,
            "argv": self.argv,
        }


def _finding_dict(finding: Finding) -> dict[str, str | None]:
    return {"code": finding.code, "message": finding.message, "suggestion": finding.suggestion}


# ---------------------------------------------------------------------------------------------------


def _explain_sglang_error(result: ResolverResult, builtin_errors: list[Finding]) -> Finding:
    """SGLang's own error text, with a plain-words explanation when SGLang gives none."""
    text = _sglang_verdict(result)
    if result.parser_exit is not None:
        return Finding(
            "sglang_parser", f"SGLang's {text}", builtin_errors[0].suggestion if builtin_errors else None
        )
    explanation = builtin_errors[0] if builtin_errors else None
    if explanation is not None:
        return Finding(
            "sglang_error",
            f"SGLang's resolver raised {text}. Why: {explanation.message}",
            explanation.suggestion,
        )
    return Finding("sglang_error", f"SGLang's resolver raised {text}", None)


def _is_adjusted(requested: SpecParams, effective: SpecParams) -> bool:
    """An explicitly given value that SGLang changed (aliases and letter case do not count)."""
    for name, asked in requested.as_dict().items():
        if asked is None:
            continue
        got = getattr(effective, name)
        if name == api.SPEC_ALGORITHM:
            asked = normalize_algorithm(asked)
        if asked != got:
            return True
    return False


def _with_value(argv: Sequence[str], flag: str, value: object) -> list[str]:
    """argv with ``flag``'s value replaced (or the flag appended)."""
    out = list(argv)
    for i, token in enumerate(out):
        if token == flag and i + 1 < len(out):
            out[i + 1] = str(value)
            return out
        if token.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, str(value)]


def corrected_command(argv: Sequence[str], requested: SpecParams, effective: SpecParams) -> list[str] | None:
    """The launch that really runs what was asked, when SGLang rewrote the draft-token count.

    Under topk 1 SGLang forces draft tokens to steps + 1, so "16 draft tokens" needs 15 steps.
    """
    asked = requested.speculative_num_draft_tokens
    if (
        asked is None
        or asked == effective.speculative_num_draft_tokens
        or effective.speculative_eagle_topk != 1
    ):
        return None
    return _with_value(argv, "--speculative-num-steps", asked - 1)


def _sglang_verdict(result: ResolverResult) -> str:
    """SGLang's own words: the parser's error line or the resolver's exception."""
    if result.ok:
        return "ok"
    if result.parser_exit is not None:
        lines = result.parser_stderr.strip().splitlines()
        return f"parser exit {result.parser_exit}: {lines[-1] if lines else ''}"
    return (
        f"{result.error_type}: {result.error_message}"
        if result.error_message
        else f"bare {result.error_type}"
    )


def _report(
    argv: list[str],
    sglang: ResolverResult | None,
    sglang_label: str | None,
    target_config_dir: str | None,
    draft_config_dir: str | None,
) -> ValidationReport:
    checked_by = [BUILTIN] + ([sglang_label] if sglang is not None and sglang_label else [])
    layers = {sglang_label: _sglang_verdict(sglang)} if sglang is not None and sglang_label else {}
    try:
        launch = parse_launch_args(argv)
    except ArgvError as err:
        warnings = []
        if sglang is not None and sglang.parser_exit is None:
            warnings.append(
                Finding(
                    "builtin_drift",
                    f"SGLang's parser accepted what the flag table refused: {err}",
                    "regenerate workers/sglang/flags.json from the installed SGLang",
                )
            )
        return ValidationReport(
            argv=argv,
            status="invalid",
            errors=[Finding(err.code, err.problem, err.fix)],
            warnings=warnings,
            requested=SpecParams(),
            effective=None,
            resolved=None,
            checked_by=checked_by,
            layers={BUILTIN: "invalid", **layers},
            corrected_argv=None,
        )
    requested = requested_params(launch)
    res = builtin_resolve(launch, target_config_dir=target_config_dir, draft_config_dir=draft_config_dir)
    layers = {BUILTIN: "invalid" if res.errors else "ok", **layers}
    errors, warnings = list(res.errors), list(res.warnings)
    effective: SpecParams | None = res.effective
    resolved: dict[str, Any] | None = None
    if sglang is not None and sglang.ok and sglang.resolved is not None:
        resolved = sglang.resolved
        from_sglang = SpecParams.from_mapping(resolved)
        if not errors and from_sglang != res.effective:
            warnings.append(
                Finding(
                    "builtin_drift",
                    f"built-in rules expected {res.effective.as_dict()} but SGLang resolved "
                    f"{from_sglang.as_dict()}; SGLang's answer is used",
                    "report this: the built-in mirror of SGLang's rules is out of date",
                )
            )
        effective = from_sglang
        if sglang.adaptive_fallback_reason is not None:  # SGLang's own words replace the mirror's
            warnings = [w for w in warnings if w.code != "adaptive_fallback"]
            warnings.append(adaptive_fallback_finding(sglang.adaptive_fallback_reason))
    elif sglang is not None:
        errors = [_explain_sglang_error(sglang, errors), *errors[1:]]
    if errors:
        return ValidationReport(
            argv=argv,
            status="invalid",
            errors=errors,
            warnings=warnings,
            requested=requested,
            effective=effective,
            resolved=resolved,
            checked_by=checked_by,
            layers=layers,
            corrected_argv=None,
        )
    if effective is None:  # a launch without errors always resolves
        raise RuntimeError(f"no effective config for {argv}")
    if effective.speculative_algorithm is None:
        effective = replace(
            effective,
            speculative_num_steps=None,
            speculative_eagle_topk=None,
            speculative_num_draft_tokens=None,
        )
    adjusted = _is_adjusted(requested, effective)
    return ValidationReport(
        argv=argv,
        status="adjusted" if adjusted else "ok",
        errors=[],
        warnings=warnings,
        requested=requested,
        effective=effective,
        resolved=resolved,
        checked_by=checked_by,
        layers=layers,
        corrected_argv=corrected_command(argv, requested, effective) if adjusted else None,
    )


def _resolver_argv(argv: list[str], target_config_dir: str | None, draft_config_dir: str | None) -> list[str]:
    """What SGLang resolves: the launch with model paths pointed at local config directories."""
    out = list(argv)
    if target_config_dir:
        out = _with_value(out, "--model-path", target_config_dir)
    if draft_config_dir and any(t.startswith("--speculative-draft-model") for t in out):
        out = _with_value(out, "--speculative-draft-model-path", draft_config_dir)
    return out


def validate_many(
    argvs: Sequence[Sequence[str]],
    *,
    sglang_python: str | None = None,
    use_resolver: bool = True,
    target_config_dir: str | None = None,
    draft_config_dir: str | None = None,
    draft_config_dirs: Sequence[str | None] | None = None,
) -> list[ValidationReport]:
    """Validate many launch commands with ONE SGLang process (import once, resolve each).

    ``draft_config_dirs``: one draft config directory per command, instead of ``draft_config_dir`` for
    all (a sweep comparing algorithms: only its EAGLE3 / EAGLE launches load the converted drafter)."""
    argv_lists = [list(a) for a in argvs]
    drafts = (
        list(draft_config_dirs) if draft_config_dirs is not None else [draft_config_dir] * len(argv_lists)
    )
    python = (sglang_python or default_sglang_python()) if use_resolver else None
    if python is None:
        return [_report(a, None, None, target_config_dir, d) for a, d in zip(argv_lists, drafts, strict=True)]
    missing = [None if target_config_dir else _target_not_here(argv) for argv in argv_lists]
    reports = []
    with contextlib.ExitStack() as stack:
        # SGLang starts only when a launch is for it to judge (its import is 10-30 s); else its version
        # labels the reports.
        resolver = None
        if all(path is not None for path in missing):
            label = f"sglang {installed_version(python)}"
        else:
            resolver = stack.enter_context(SGLangResolver(python))
            label = f"sglang {resolver.version}"
        for argv, draft, model_path in zip(argv_lists, drafts, missing, strict=True):
            if model_path is not None:
                report = _report(argv, None, None, target_config_dir, draft)
                reports.append(_resolver_not_run(report, label, model_path))
                continue
            assert resolver is not None
            result = resolver.resolve(_resolver_argv(argv, target_config_dir, draft))
            reports.append(_report(argv, result, label, target_config_dir, draft))
    return reports


def _target_not_here(argv: list[str]) -> str | None:
    """The launch's ``--model-path`` when it names no local directory with a ``config.json``.

    SGLang's resolver reads the target's config; given a path that exists only on the GPU nodes it takes
    it for a Hugging Face repo id and raises ``OSError: Repo id must be ...``, which says nothing about
    the launch. Such a launch is judged by the built-in rules alone, and the report says so."""
    try:
        model_path = parse_launch_args(argv).get("model_path")
    except ArgvError:
        return None  # SGLang's parser gives its own verdict on the argv
    if not model_path or model_path == "dummy" or (Path(model_path) / "config.json").is_file():
        return None
    return str(model_path)


def _resolver_not_run(report: ValidationReport, label: str, model_path: str) -> ValidationReport:
    """``report`` (built-in rules only) marked with why SGLang's resolver did not judge it."""
    note = Finding(
        "sglang_not_run",
        f"SGLang's resolver was not run: {model_path!r} has no config.json on this machine (a path on the "
        "GPU nodes?); the verdict is the built-in rules'",
        "pass --target-config DIR, a local directory holding the target's config.json (weights are not "
        "needed), to have SGLang check the launch",
    )
    warnings = [w for w in report.warnings if w.code != "target_config_unreadable"]
    return report.model_copy(
        update={
            "warnings": [note, *warnings],
            "layers": {**report.layers, label: f"not run: no config.json under {model_path!r}"},
        }
    )


def validate(
    argv: Sequence[str],
    *,
    sglang_python: str | None = None,
    use_resolver: bool = True,
    target_config_dir: str | None = None,
    draft_config_dir: str | None = None,
) -> ValidationReport:
    """Validate one launch command (see ``validate_many`` for batches)."""
    return validate_many(
        [argv],
        sglang_python=sglang_python,
        use_resolver=use_resolver,
        target_config_dir=target_config_dir,
        draft_config_dir=draft_config_dir,
    )[0]
