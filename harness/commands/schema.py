"""``specsweep schema``: the JSON Schema of the sweep spec (docs/config.md is generated from it)."""

from __future__ import annotations

import argparse
import json

from harness.commands.base import Command
from harness.spec import spec_json_schema


def run(args: argparse.Namespace) -> int:
    print(json.dumps(spec_json_schema(), indent=2))
    return 0


COMMAND = Command(
    name="schema",
    help="print the JSON Schema of the sweep spec",
    add_arguments=lambda parser: None,
    run=run,
)
