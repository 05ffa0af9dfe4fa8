"""Server axes: how a swept SGLang flag becomes launch arguments, and what SGLang 0.5.23 makes of a swept
environment variable.

Flags need no table of their own: an axis value becomes argv tokens here and SGLang's parser and resolver
judge the launch like any other (``validate``). Environment variables have no parser, so ``ENV_RULES`` says,
for the variables the project knows, how SGLang 0.5.23 reads each (``srt/environ.py``'s ``EnvBool`` /
``EnvInt`` / ``EnvFloat``) and which rules follow from it, with the source that reads it. A variable
outside the table is passed through with a warning: nothing here knows whether SGLang reads it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from workers.sglang.flags import flag_table
from workers.sglang.rules import Finding, SpecParams

SWITCH_VALUES = ("true", "false")  # a switch axis: the flag given, or left out
_KIND_WORDS = {"bool": "boolean", "int": "integer", "float": "float", "str": "string"}
REFUSED_CODES = ("env_simulated_acceptance",)  # rule findings that make a point invalid (others warn)


def switch_problem(flag: str, values: Iterable[str]) -> str | None:
    """Why ``values`` cannot be values of a switch flag's axis (None when they can, or it is no switch)."""
    known = flag_table().by_option.get(flag)
    if known is None or known.kind not in ("switch", "bool_optional"):
        return None
    bad = [v for v in values if v not in SWITCH_VALUES]
    if not bad:
        return None
    return f"{flag} takes no value: give 'true' (the flag given) or 'false' (left out), not {bad[0]!r}"


def axis_flag_args(flag: str, value: str) -> list[str]:
    """The argv tokens of one flag axis at ``value``: a switch is given (``true``) or left out (``false``;
    ``--no-X`` for a ``--X/--no-X`` flag); any other flag takes the value. An unknown flag is passed on
    as written, so SGLang's parser refuses it with its own message."""
    known = flag_table().by_option.get(flag)
    if known is not None and known.kind == "switch":
        return [flag] if value == "true" else []
    if known is not None and known.kind == "bool_optional":
        return [flag] if value == "true" else ["--no-" + flag.removeprefix("--")]
    return [flag, value]


def _parses_as(kind: str) -> Callable[[str], object]:
    """``srt/environ.py``'s parse of an ``Env<kind>``: what SGLang accepts without falling back."""

    def parse_bool(raw: str) -> bool:
        value = raw.lower()
        if value in ("true", "1", "yes", "y"):
            return True
        if value in ("false", "0", "no", "n"):
            return False
        raise ValueError(f'"{raw}" is not a valid boolean value')

    parsers: dict[str, Callable[[str], object]] = {"bool": parse_bool, "int": int, "float": float, "str": str}
    return parsers[kind]


@dataclass(frozen=True, slots=True)
class EnvRule:
    """One environment variable as SGLang 0.5.23 reads it."""

    name: str
    kind: str  # "bool" | "int" | "float" | "str": the EnvField subclass in srt/environ.py
    default: str  # SGLang's default, as it would print it
    source: str  # where 0.5.23 reads it, or why it does not
    note: str  # what it does, in a line (docs/axes.md lists these)
    check: Callable[[object, SpecParams], Finding | None] | None = None


def _spec_v2_not_read(_value: object, _params: SpecParams) -> Finding:
    return Finding(
        "env_not_read",
        "SGLang 0.5.23 does not read SGLANG_ENABLE_SPEC_V2 (spec v2 is its only EAGLE path, overlapped "
        "unless --disable-overlap-schedule: arg_groups/speculative_hook.py::_handle_eagle_family): its "
        "values run the same server",
        "sweep --disable-overlap-schedule ('true'/'false') for the overlap scheduler on 0.5.23",
    )


def _simulated_acceptance(value: object, _params: SpecParams) -> Finding | None:
    if not isinstance(value, float) or value <= 0:
        return None  # -1 (the default) and any value <= 0 leave acceptance real
    return Finding(
        "env_simulated_acceptance",
        f"SGLANG_SIMULATE_ACC_LEN={value:g} makes SGLang accept drafts at a simulated mean length instead of "
        "verifying them (speculative/spec_utils.py, read at import; arg_groups/speculative_hook.py::"
        "_handle_eagle_family): such a server measures no drafter",
        "leave SGLANG_SIMULATE_ACC_LEN unset (or -1)",
    )


ENV_RULES: dict[str, EnvRule] = {
    rule.name: rule
    for rule in (
        EnvRule(
            "SGLANG_ENABLE_SPEC_V2",
            "bool",
            "unset",
            "not read by 0.5.23 (no reader in the package; srt/environ.py has no such field)",
            "older SGLang: switched speculation onto the overlap scheduler; 0.5.23 always runs spec v2",
            _spec_v2_not_read,
        ),
        EnvRule(
            "SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION",
            "bool",
            "False",
            "srt/environ.py EnvBool; arg_groups/speculative_hook.py (handle_speculative_decoding, "
            "_handle_eagle_family), which the resolver runs",
            "coordinates speculative prefill across DP ranks; SGLang's resolver checks its requirements",
        ),
        EnvRule(
            "SGLANG_SIMULATE_ACC_LEN",
            "float",
            "-1",
            "srt/environ.py EnvFloat; speculative/spec_utils.py SIMULATE_ACC_LEN",
            "above 0: accepted drafts are drawn around this mean instead of verified (refused)",
            _simulated_acceptance,
        ),
        EnvRule(
            "SGLANG_SPEC_EXPANSION_SAFETY_FACTOR",
            "int",
            "2",
            "srt/environ.py EnvInt",
            "headroom factor of the speculative KV expansion",
        ),
    )
}


def env_findings(
    env: Mapping[str, str], params: SpecParams, *, swept: Iterable[str] = ()
) -> tuple[list[Finding], list[Finding]]:
    """What SGLang 0.5.23 makes of a server's environment: an error for a value it would not parse (it
    warns and runs the default instead, so the point would measure something else) or a rule that refuses
    the value; warnings from the rules and, for each ``swept`` variable the table does not know, that it
    is passed through unchecked. Returns (errors, warnings)."""
    errors: list[Finding] = []
    warnings: list[Finding] = []
    for name, raw in env.items():
        rule = ENV_RULES.get(name)
        if rule is None:
            if name in swept:
                warnings.append(
                    Finding(
                        "env_unknown",
                        f"{name} is not in the project's table of SGLang environment variables "
                        "(workers/sglang/axes.py ENV_RULES): its values are passed to the server unchecked",
                        "check that SGLang 0.5.23 reads it (grep srt/environ.py), or add it to ENV_RULES",
                    )
                )
            continue
        try:
            value = _parses_as(rule.kind)(raw)
        except ValueError:
            errors.append(
                Finding(
                    "env_invalid_value",
                    f'SGLang would warn "Invalid value for {name}: "{raw.lower() if rule.kind == "bool" else raw}" '
                    f'is not a valid {_KIND_WORDS[rule.kind]} value, using default "{rule.default}"" and run '
                    f"with the default ({rule.source})",
                    f"give {name} a {rule.kind} value"
                    + (" (true/false, 1/0, yes/no)" if rule.kind == "bool" else ""),
                )
            )
            continue
        finding = rule.check(value, params) if rule.check is not None else None
        if finding is not None:
            (errors if finding.code in REFUSED_CODES else warnings).append(finding)
    return errors, warnings
