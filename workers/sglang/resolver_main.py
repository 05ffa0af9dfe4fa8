"""Resolve SGLang launch commands with SGLang's own code (runs INSIDE the SGLang interpreter).

Protocol: one JSON object per line on stdin, ``{"argv": [...]}``; one JSON object per line on stdout,
``{"ok": bool, "resolved": {...} | null, "error_type": str | null, "error_message": str | null,
"parser_exit": int | null, "parser_stderr": str, "adaptive_fallback_reason": str | null}`` (the last is
SGLang's ``adaptive_unsupported_reason`` when it silently turned an asked ``--speculative-adaptive`` off). SGLang is imported once, so a batch of commands
costs one import (about 10 s) plus a few tens of milliseconds each. Only stdlib and sglang are
imported: this file must not import specsweep, which is not installed in SGLang's venv.
"""

from __future__ import annotations

import contextlib
import io
import json
import logging
import os
import sys
import traceback


def _gpu_present() -> bool:
    try:
        import torch

        return bool(torch.cuda.is_available())
    except Exception:
        return False


def _json_safe(value: object) -> object:
    try:
        json.dumps(value)
        return value
    except (TypeError, ValueError):
        if isinstance(value, dict):
            return {str(k): _json_safe(v) for k, v in value.items()}
        if isinstance(value, list | tuple):
            return [_json_safe(v) for v in value]
        return repr(value)


def resolve(argv: list[str], add_device: bool) -> dict:
    from sglang.srt.server_args import prepare_server_args

    if add_device and not any(a == "--device" or a.startswith("--device=") for a in argv):
        argv = [*argv, "--device", "cuda"]
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            server_args = prepare_server_args(argv)
    except SystemExit as exit_:
        return {
            "ok": False,
            "resolved": None,
            "error_type": "SystemExit",
            "error_message": None,
            "parser_exit": exit_.code,
            "parser_stderr": stderr.getvalue(),
        }
    try:
        server_args.resolve_once()
        # The engine runs SGLang's argument checks before it starts (entrypoints/engine.py); among them
        # the multi-node ones: tp x pp divisible by --nnodes, no DP replicas across nodes. Run for
        # multi-node launches only: on one node they also refuse launches (pdmux, two-batch overlap with
        # adaptive) whose recorded verdicts (tests/fixtures/sglang-rules-corpus.json) predate this call.
        if server_args.nnodes > 1:
            server_args.check_server_args()
        resolved = server_args.resolved_dict()
    except BaseException as err:  # SGLang raises AssertionError, ValueError, TypeError, ...
        tail = traceback.format_exception(type(err), err, err.__traceback__)[-3:]
        return {
            "ok": False,
            "resolved": None,
            "error_type": type(err).__name__,
            "error_message": str(err),
            "parser_exit": None,
            "parser_stderr": "".join(tail),
        }
    return {
        "ok": True,
        "resolved": _json_safe(resolved),
        "error_type": None,
        "error_message": None,
        "parser_exit": None,
        "parser_stderr": "",
        "adaptive_fallback_reason": _adaptive_fallback_reason(argv, server_args, resolved),
    }


def _adaptive_fallback_reason(argv: list[str], server_args: object, resolved: dict) -> str | None:
    """Why SGLang turned an asked --speculative-adaptive off (it only logs a warning), else None."""
    if "--speculative-adaptive" not in argv or resolved.get("speculative_adaptive"):
        return None
    from sglang.srt.speculative.adaptive_spec_params import adaptive_unsupported_reason

    return adaptive_unsupported_reason(server_args) or "unknown (SGLang gave no reason)"


def main() -> None:
    # Protocol lines go to the real stdout; anything SGLang prints goes to stderr.
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    logging.disable(logging.WARNING)
    import sglang

    add_device = not _gpu_present()
    protocol.write(json.dumps({"ready": True, "sglang_version": sglang.__version__}) + "\n")
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        protocol.write(json.dumps(resolve(list(request["argv"]), add_device)) + "\n")
    # Every answer is written (line-buffered). The interpreter's own teardown of SGLang's and torch's
    # modules takes 5-8 s on a 2-core machine and does nothing the caller needs, who waits for this exit
    # after each batch (`plan`, `run`, `validate`, `best --emit`): skip it.
    protocol.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
