"""``specsweep schema``: the JSON Schema of the sweep spec (docs/config.md is generated from it)."""

from __future__ import annotations

import argparse
import json

from harness.commands.base import Command
from harness.spec import spec_json_schema


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--markdown", action="store_true", help="print the reference in docs/config.md instead"
    )


def run(args: argparse.Namespace) -> int:
    if args.markdown:
        from harness.spec_docs import spec_markdown

        print(spec_markdown(), end="")
    else:
        print(json.dumps(spec_json_schema(), indent=2))
    return 0


COMMAND = Command(
    name="schema",
    help="print the JSON Schema of the sweep spec",
    add_arguments=add_arguments,
    run=run,
)
