"""``specsweep report OUT [-o report.html]``: one self-contained HTML file to look at."""

from __future__ import annotations

import argparse
from pathlib import Path

from harness.commands.base import Command
from harness.commands.best import add_selection_arguments, confirmation_from_args, selection_from_args
from specsweep.errors import ResultsError, disk_full_error, is_disk_full

REPORT = "report.html"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        default=None,
        metavar="FILE",
        help="where to write (default OUT/report.html; into the bucket when OUT is a URI)",
    )
    parser.add_argument(
        "--compare-with",
        metavar="REF",
        default=None,
        help="add a section comparing this sweep with the sweep at REF (its OUT directory or URI), as "
        "`specsweep compare REF OUT` does: each config's ratio to REF with its interval, ties, what changed",
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


def _comparison_section(args: argparse.Namespace) -> str:
    """The report's comparison with ``--compare-with`` (the reference) as HTML."""
    from analysis.compare import DEFAULT_METRICS, render_html
    from harness.commands.compare import compare_outs

    comparison = compare_outs(
        [args.compare_with, args.out],
        metrics=DEFAULT_METRICS,
        replicates=args.bootstrap,
        confidence=args.confidence,
        seed=args.seed,
        allow_partial=args.allow_partial,
    )
    return render_html(comparison)


def run(args: argparse.Namespace) -> int:
    from analysis.report import render_report, write_report
    from analysis.store import open_store
    from analysis.views import readable_results
    from harness.deploy_launch import deploy_launches

    store = open_store(args.out)
    target: Path | None = args.output or (store.local(REPORT) if store.local_dir is not None else None)
    if target is not None and target.is_dir():  # found before the work, not after it
        raise ResultsError(
            "the report's target is a directory",
            where=str(target),
            fix="pass a file name, e.g. -o report.html",
        )
    comparison = [] if args.compare_with is None else [_comparison_section(args)]
    con, selection = selection_from_args(args, store)
    try:
        confirmation = confirmation_from_args(args, store, con, selection)
        with readable_results(store):
            launches = deploy_launches(con, args.publish_drafter)
            html = render_report(
                con,
                selection,
                server_timeline(),
                confirmation,
                launches=launches,
                extra_sections=comparison,
            )
    finally:
        con.close()
    if target is None:  # OUT is an object store: the report goes next to the results
        store.write_bytes(REPORT, html.encode())
        print(f"wrote {store.describe(REPORT)}")
        return 0
    try:
        target = write_report(html, target)
    except OSError as err:
        if is_disk_full(err):
            raise disk_full_error(err, where=str(target), doing="writing the report") from None
        raise ResultsError(
            f"cannot write the report: {err.strerror}", where=str(target), fix="choose a writable -o FILE"
        ) from None
    print(f"wrote {target}")
    return 0


COMMAND = Command(
    name="report",
    help="write a self-contained HTML report: winner, configs per level, and plots",
    add_arguments=add_arguments,
    run=run,
)
