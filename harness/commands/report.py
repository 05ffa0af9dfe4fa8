"""``specsweep report OUT [-o report.html]``: one self-contained HTML file to look at."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.base import Command
from harness.commands.best import add_selection_arguments, selection_from_args


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write (default OUT/report.html)",
    )


def server_timeline() -> tuple[tuple[str, str], ...]:
    """SGLang's /metrics samples the report plots over each level's time, with their axis labels."""
    from workers.sglang import api

    return (
        (api.METRIC_NUM_RUNNING, "running requests"),
        (api.METRIC_NUM_QUEUE, "queued requests"),
        (api.METRIC_TOKEN_USAGE, "KV pool in use"),
        (api.METRIC_SPEC_ACCEPT_LENGTH, "accept length"),
    )


def run(args: argparse.Namespace) -> int:
    from analysis.report import render_report, write_report

    con, selection = selection_from_args(args)
    try:
        html = render_report(con, selection, server_timeline())
    finally:
        con.close()
    target = write_report(html, args.output or args.out / "report.html")
    print(f"wrote {target}")
    return 0


COMMAND = Command(
    name="report",
    help="write a self-contained HTML report: winner, configs per level, and plots",
    add_arguments=add_arguments,
    run=run,
)
