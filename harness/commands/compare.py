"""``specsweep compare A B [...]``: sweeps side by side, each against the first (``analysis.compare``)."""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from harness.commands.base import Command
from harness.commands.best import add_resampling_arguments
from harness.output import add_format_argument, print_csv, print_json
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    from analysis.compare import Comparison

CATEGORY_METRICS = ("tpot_p50_ms", "ttft_p99_ms")  # --by category: percentiles (a rate is per level)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from analysis.compare import DEFAULT_METRICS

    parser.add_argument(
        "outs",
        nargs="+",
        metavar="OUT",
        help="two or more sweeps' outputs (directories or s3:// / gs:// URIs); the first is the reference A",
    )
    parser.add_argument(
        "--metrics",
        metavar="NAMES",
        help="comma-separated metrics to compare, as `best --objective` takes them "
        f"(default {','.join(DEFAULT_METRICS)}; --by category: {','.join(CATEGORY_METRICS)})",
    )
    parser.add_argument(
        "--by",
        choices=("level", "category"),
        default="level",
        help="level: per load level and config (default); category: per level, request category and "
        "config (percentiles only)",
    )
    add_resampling_arguments(parser, "the ratios' intervals")
    parser.add_argument(
        "--allow-partial", action="store_true", help="compare the committed jobs of sweeps not finished"
    )
    add_format_argument(parser)
    parser.add_argument(
        "--html", type=Path, metavar="FILE", help="also write the comparison as a self-contained HTML page"
    )


def _metrics(args: argparse.Namespace) -> tuple[str, ...]:
    """The --metrics names, each one `best` can rank by (goodput needs per-request SLOs compare lacks)."""
    from analysis.compare import DEFAULT_METRICS
    from analysis.goodput import GOODPUT_METRICS
    from analysis.select import OBJECTIVE_ALIASES, OBJECTIVE_METRICS

    if args.metrics is None:
        return CATEGORY_METRICS if args.by == "category" else DEFAULT_METRICS
    names = tuple(dict.fromkeys(n.strip() for n in args.metrics.split(",") if n.strip()))
    allowed = [m for m in OBJECTIVE_METRICS if OBJECTIVE_ALIASES.get(m, m) not in GOODPUT_METRICS]
    for name in names:
        if name not in allowed:
            raise ResultsError(
                f"{name!r} is not a metric compare can resample",
                where="--metrics",
                fix=f"use some of: {', '.join(allowed)}",
            )
    if not names:
        raise ResultsError("no metric given", where="--metrics", fix="e.g. --metrics output_tok_s_per_gpu")
    return names


def compare_outs(outs: Sequence[str], **options: Any) -> Comparison:
    """``analysis.compare.compare_sweeps`` over the sweeps at ``outs`` (directories or URIs; the first is
    the reference), with SGLang's launch flags compared as a deployment sees them; ``options`` are
    ``compare_sweeps``'s keywords."""
    from analysis.compare import compare_sweeps
    from analysis.store import open_store
    from analysis.views import connect, readable_results
    from workers.sglang.deploy import compared_flags

    with contextlib.ExitStack() as stack:
        sweeps = []
        for out in outs:
            store = open_store(out)
            with readable_results(store):
                con = connect(store)
            stack.callback(con.close)
            sweeps.append((store, con))
        return compare_sweeps(sweeps, flags_of=compared_flags, **options)


def _check_html_target(path: Path | None) -> None:
    if path is not None and path.is_dir():  # found before the work, not after it
        raise ResultsError(
            "the HTML page's target is a directory",
            where=str(path),
            fix="pass a file name, e.g. --html compare.html",
        )


def run(args: argparse.Namespace) -> int:
    from analysis.compare import CSV_COLUMNS, comparison_page, format_text
    from analysis.store import write_local_atomic

    if len(args.outs) < 2:
        raise ResultsError(
            "compare needs two or more sweeps", where="OUT", fix="pass the reference sweep, then the others"
        )
    metrics = _metrics(args)
    _check_html_target(args.html)
    comparison = compare_outs(
        args.outs,
        metrics=metrics,
        by=args.by,
        replicates=args.bootstrap,
        confidence=args.confidence,
        seed=args.seed,
        allow_partial=args.allow_partial,
    )
    if args.format == "json":
        print_json(comparison.as_json())
    elif args.format == "csv":
        print_csv(CSV_COLUMNS, comparison.csv_rows())
    else:
        print(format_text(comparison))
    if args.html is not None:
        write_local_atomic(args.html, comparison_page(comparison).encode())
        print(f"wrote {args.html}", file=sys.stderr)
    return 0


COMMAND = Command(
    name="compare",
    help="compare two or more sweeps per level and config: B / A with intervals, ties, what changed",
    add_arguments=add_arguments,
    run=run,
)
