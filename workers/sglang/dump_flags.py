"""Dump SGLang's launch-server flag set as JSON (runs inside the SGLang interpreter, stdlib + sglang only).

``python dump_flags.py > flags.json`` regenerates ``workers/sglang/flags.json``; a test runs it against
the installed SGLang and fails when the packaged copy drifts.
"""

from __future__ import annotations

import argparse
import json
import sys


def _json_safe(value: object) -> object:
    if value is None or isinstance(value, bool | int | float | str):
        return value
    if isinstance(value, list | tuple):
        return [_json_safe(v) for v in value]
    return repr(value)


def _kind(action: argparse.Action) -> str:
    name = type(action).__name__
    if "BooleanOptional" in name:
        return "bool_optional"
    if action.nargs == 0:
        return "switch"
    return "value"


def dump() -> dict:
    import sglang
    from sglang.srt.server_args import ServerArgs

    parser = argparse.ArgumentParser(prog="sglang serve")
    ServerArgs.add_cli_args(parser)
    flags = []
    for action in parser._actions:
        if not action.option_strings or isinstance(action, argparse._HelpAction):
            continue
        flags.append(
            {
                "options": list(action.option_strings),
                "dest": action.dest,
                "kind": _kind(action),
                "nargs": _json_safe(action.nargs),
                "type": getattr(action.type, "__name__", None) if action.type else None,
                "choices": _json_safe(list(action.choices)) if action.choices else None,
                "default": _json_safe(action.default),
                "deprecated": type(action).__name__.startswith("Deprecated"),
                "help": " ".join((action.help or "").split())[:160],
            }
        )
    return {"sglang_version": sglang.__version__, "prog": parser.prog, "flags": flags}


if __name__ == "__main__":
    json.dump(dump(), sys.stdout, indent=1, sort_keys=True)
    sys.stdout.write("\n")
