"""``specsweep validate -- <sglang.launch_server args>``: is this launch valid, and what does it really run?"""

from __future__ import annotations

import argparse
import json
import shlex

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from harness.commands.base import Command
from harness.output import table_console
from workers.sglang import ValidationReport, validate
from workers.sglang.rules import SpecParams

LAUNCH_PREFIX = ["python", "-m", "sglang.launch_server"]
STATUS_STYLE = {"ok": "bold green", "adjusted": "bold yellow", "invalid": "bold red"}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="Python interpreter with sglang installed (default: .venv-sglang/bin/python when present)",
    )
    parser.add_argument(
        "--builtin-only",
        action="store_true",
        help="skip SGLang's own resolver (faster; the built-in rules only)",
    )
    parser.add_argument(
        "--target-config",
        metavar="DIR",
        help="directory with the target's config.json, when --model-path exists only on the GPU nodes",
    )
    parser.add_argument(
        "--draft-config",
        metavar="DIR",
        help="directory with the draft's config.json, when the draft path exists only on the GPU nodes",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "launch_args",
        nargs=argparse.REMAINDER,
        help="-- followed by the arguments of `python -m sglang.launch_server`",
    )


def _launch_args(raw: list[str]) -> list[str]:
    return raw[1:] if raw[:1] == ["--"] else raw


def _cell(value: object) -> str:
    return "(unset)" if value is None else str(value)


def _spec_table(report: ValidationReport) -> Table:
    table = Table(show_edge=False, box=None, pad_edge=False)
    table.add_column("setting")
    table.add_column("requested")
    table.add_column("effective")
    table.add_column("")
    shown = report.effective if report.status != "invalid" else None
    effective = shown or SpecParams()
    for name, asked in report.requested.as_dict().items():
        got = getattr(effective, name)
        if shown is None:
            note = ""
        elif asked is None and got is not None:
            note = "[dim]default[/dim]"
        elif asked is not None and str(asked).upper() != str(got).upper() and got is not None:
            note = "[yellow]changed by SGLang[/yellow]"
        else:
            note = ""
        table.add_row(name, _cell(asked), _cell(got) if shown else "-", note)
    return table


def print_human(report: ValidationReport, console: Console) -> None:
    """A short report: status, requested vs effective side by side, findings, corrected command."""
    style = STATUS_STYLE[report.status]
    console.print(f"[{style}]{report.status.upper()}[/{style}]  (checked by {', '.join(report.checked_by)})")
    if report.effective is not None or any(v is not None for v in report.requested.as_dict().values()):
        console.print(_spec_table(report))
    for finding in report.errors:
        console.print(f"[red]error[/red] {escape(f'[{finding.code}] {finding.message}')}", soft_wrap=True)
        if finding.suggestion:
            console.print(f"  fix: {escape(finding.suggestion)}", soft_wrap=True)
    for finding in report.warnings:
        console.print(
            f"[yellow]warning[/yellow] {escape(f'[{finding.code}] {finding.message}')}", soft_wrap=True
        )
        if finding.suggestion:
            console.print(f"  fix: {escape(finding.suggestion)}", soft_wrap=True)
    if report.corrected_argv:
        console.print("command that runs what was asked:")
        console.print("  " + shlex.join(LAUNCH_PREFIX + report.corrected_argv), soft_wrap=True, markup=False)


def run(args: argparse.Namespace) -> int:
    launch = _launch_args(args.launch_args)
    report = validate(
        launch,
        sglang_python=args.sglang_python,
        use_resolver=not args.builtin_only,
        target_config_dir=args.target_config,
        draft_config_dir=args.draft_config,
    )
    if args.json:
        print(json.dumps(report.to_json_dict(), indent=2))
    else:
        print_human(report, table_console())
    return report.exit_code


COMMAND = Command(
    name="validate",
    help="check an SGLang launch command with built-in rules and SGLang's own resolver",
    description=(
        "Check `python -m sglang.launch_server` arguments before any GPU is touched. Exit 0: ok, "
        "3: adjusted (SGLang changes a value you gave), 2: invalid."
    ),
    add_arguments=add_arguments,
    run=run,
)
