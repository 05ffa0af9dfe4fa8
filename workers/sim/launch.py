"""How the simulated server resolves its launch command: exactly as SGLang 0.5.23 would.

The command is parsed and resolved by ``workers.sglang`` (unknown flag: SGLang's usage text, exit 2; a
resolution error SGLang raises: its traceback, exit 1); the effective config (num-draft-tokens rewritten
under topk 1, max_running_requests 48, architecture defaults) is what the server serves and reports in
``/server_info``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from specsweep.errors import SpecsweepError
from workers.sglang import SpecParams, api, builtin_resolve, failures, parse_launch_args
from workers.sglang.rules import Resolution, read_model_config
from workers.sim.algorithms import Drafting, drafting_of
from workers.sim.model import DraftShape

ADAPTIVE_STARTUP_ERRORS = ("adaptive_config", "adaptive_steps")  # SGLang raises on these before serving


class LaunchRefused(SpecsweepError):
    """SGLang would stop on this launch before serving; ``text`` is what it prints."""

    def __init__(self, text: str, *, exit_code: int) -> None:
        super().__init__(text.strip().splitlines()[-1])
        self.text = text
        self.exit_code = exit_code


@dataclass(frozen=True)
class ServedConfig:
    """What the simulated server runs: the resolved launch plus what it reports about the model."""

    resolved_args: dict[str, Any]  # every flag, speculative ones as resolved: /server_info's body
    spec: SpecParams
    shape: DraftShape | None
    drafts_always_rejected: bool  # EAGLE with an EAGLE3 draft: SGLang runs it, acceptance is exactly 1
    drafting: Drafting | None  # how the algorithm drafts (MTP, a standalone model, n-grams, ...)
    load_crash: str | None  # the traceback SGLang dies with while loading, if this launch cannot load
    draft_tokens_rewritten: bool  # topk 1 changed the requested num-draft-tokens (SGLang logs a warning)
    model_path: str
    served_model_name: str
    target_config: dict[str, Any]

    @property
    def adaptive_config_path(self) -> str | None:
        """--speculative-adaptive-config's file (None: SGLang's default table)."""
        path = self.resolved_args.get(api.SPEC_ADAPTIVE_CONFIG)
        return str(path) if path is not None else None

    @property
    def context_length(self) -> int:
        given = self.resolved_args.get("context_length")
        return int(given or self.target_config.get("max_position_embeddings") or 131072)


def _resolution_traceback(exception_line: str) -> str:
    """The uncaught-exception text SGLang's launch_server prints when resolution raises."""
    return (
        "Traceback (most recent call last):\n"
        '  File "<frozen runpy>", line 198, in _run_module_as_main\n'
        '  File "<frozen runpy>", line 88, in _run_code\n'
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/launch_server.py", line 83, in <module>\n'
        "    server_args = prepare_server_args(sys.argv[1:])\n"
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/server_args.py", line 412, '
        "in prepare_server_args\n    server_args.resolve_once()\n"
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/arg_groups/speculative_hook.py", '
        "line 188, in resolve_speculative\n"
        f"{exception_line}\n"
    )


def _refusal(res: Resolution) -> LaunchRefused | None:
    """The resolution error SGLang itself raises for this launch, if any."""
    for finding in res.errors:
        if finding.code == "incomplete_triple":
            requested = res.launch
            if requested.get(api.SPEC_NUM_STEPS) is None:
                line = "AssertionError"
            elif requested.get(api.SPEC_EAGLE_TOPK) is None:
                line = "TypeError: '>' not supported between instances of 'NoneType' and 'int'"
            else:
                continue  # topk > 1 without draft tokens: SGLang resolves it (and fails later)
            return LaunchRefused(_resolution_traceback(line), exit_code=1)
        template = failures.RESOLVE_EXCEPTIONS.get(finding.code)
        if template is not None:
            line = template.format(
                algorithm=res.launch.get(api.SPEC_ALGORITHM),
                attention_backend=res.launch.get("attention_backend"),
                message=finding.message,
            )
            return LaunchRefused(_resolution_traceback(line), exit_code=1)
        if finding.code in ADAPTIVE_STARTUP_ERRORS:
            return LaunchRefused(_resolution_traceback(f"ValueError: {finding.message}"), exit_code=1)
    return None


def _load_crash(res: Resolution) -> str | None:
    for finding in res.errors:
        if finding.code in failures.LOAD_CRASH_CODES:
            return (
                "Traceback (most recent call last):\n"
                '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", '
                "line 6367, in run_scheduler_process\n    scheduler = Scheduler(server_args, port_args)\n"
                f"RuntimeError: {finding.message}\n"
            )
    return None


def resolve_launch(argv: Sequence[str]) -> ServedConfig:
    """Parse and resolve a launch command as SGLang 0.5.23 would; raises ArgvError or LaunchRefused."""
    launch = parse_launch_args(list(argv))
    res = builtin_resolve(launch)
    refusal = _refusal(res)
    if refusal is not None:
        raise refusal
    spec = (
        res.effective
        if res.effective.speculative_algorithm
        else SpecParams(max_running_requests=launch.get(api.MAX_RUNNING_REQUESTS))
    )
    resolved = dict(launch.values)
    resolved.update(spec.as_dict())
    if spec.speculative_algorithm:
        resolved[api.SPEC_DRAFT_MODEL_PATH] = res.draft_path
    model_path = str(launch.get("model_path"))
    return ServedConfig(
        resolved_args=resolved,
        spec=spec,
        shape=DraftShape.from_spec(spec),
        drafts_always_rejected=any(f.code == "eagle3_draft_with_eagle" for f in res.errors),
        drafting=drafting_of(
            spec.speculative_algorithm,
            draft_path=res.draft_path,
            model_path=model_path,
            draft_config=res.draft,
            target_config=res.target,
        ),
        load_crash=_load_crash(res),
        draft_tokens_rewritten=launch.get(api.SPEC_NUM_DRAFT_TOKENS)
        not in (None, spec.speculative_num_draft_tokens),
        model_path=model_path,
        served_model_name=launch.get("served_model_name") or model_path,
        target_config=read_model_config(model_path) or {},
    )
