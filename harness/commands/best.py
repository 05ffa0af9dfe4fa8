"""``specsweep best OUT``: the config to deploy at each load level, under SLOs, with its command."""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands.base import Command

if TYPE_CHECKING:
    import duckdb

    from analysis.select import Selection


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``best`` and ``report`` share: which sweep, which SLOs, what to rank by."""
    from analysis.select import DEFAULT_MAX_ERROR_RATE, DEFAULT_OBJECTIVE, DEFAULT_REPLICATES

    parser.add_argument("out", type=Path, metavar="OUT", help="the sweep's output directory")
    parser.add_argument(
        "--slo",
        default="",
        metavar="CLAUSES",
        help='comma-separated limits every ranked config must meet, e.g. "ttft_p99_ms<=2000,tpot_p99_ms<=50"',
    )
    parser.add_argument(
        "--objective",
        default=DEFAULT_OBJECTIVE,
        metavar="METRIC",
        help=f"what to rank by (default {DEFAULT_OBJECTIVE})",
    )
    parser.add_argument("--at", metavar="LEVEL", help="only this load level, e.g. concurrency=64")
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_REPLICATES,
        metavar="N",
        help=f"bootstrap replicates (default {DEFAULT_REPLICATES})",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")
    parser.add_argument(
        "--max-error-rate",
        type=float,
        default=DEFAULT_MAX_ERROR_RATE,
        metavar="SHARE",
        help="a config whose failed requests exceed this share at a level is not ranked there "
        f"(default {DEFAULT_MAX_ERROR_RATE:g}; 1 ranks every config)",
    )
    parser.add_argument(
        "--allow-partial",
        action="store_true",
        help="rank the committed jobs of a sweep that has not finished",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def selection_from_args(args: argparse.Namespace) -> tuple[duckdb.DuckDBPyConnection, Selection]:
    """Open OUT and run the selection the flags ask for (shared with ``report``)."""
    from analysis.select import SLO_METRICS, select_best
    from analysis.slo import parse_slos
    from analysis.views import connect, readable_results

    slos = parse_slos(args.slo, SLO_METRICS)
    with readable_results(args.out):
        con = connect(args.out)
        selection = select_best(
            con,
            args.out,
            objective=args.objective,
            slos=slos,
            at=args.at,
            replicates=args.bootstrap,
            seed=args.seed,
            allow_partial=args.allow_partial,
            max_error_rate=args.max_error_rate,
        )
    return con, selection


def run(args: argparse.Namespace) -> int:
    con, selection = selection_from_args(args)
    con.close()
    if args.json:
        print(json.dumps(dataclasses.asdict(selection), indent=2))
    else:
        print(format_selection(selection))
    return 0


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def format_selection(selection: Selection) -> str:
    """The human-readable ranking: one block per load level."""
    from analysis.select import share_text

    slos = ", ".join(selection.slos) or "none"
    lines = [
        f"sweep {selection.sweep_id}: ranked by {selection.objective} ({selection.objective_unit}, "
        f"{selection.better} is better); SLOs: {slos}; error rate at most {selection.max_error_rate:.1%}; "
        f"95% intervals from {selection.replicates} bootstrap resamples of requests",
    ]
    for note in selection.notes:
        lines.append(f"note: {note}")
    for level in selection.levels:
        lines.append("")
        base = (
            f"baseline {level.baseline_label!r} = {_num(level.baseline_objective)}"
            if level.baseline_label
            else "no baseline"
        )
        lines.append(f"== {level.load_level}  ({base})")
        if not level.ranked:
            lines.append("   no config meets every SLO here")
        header = (
            f"   {'#':>2}  {'config':<22} {selection.objective:>22} {'MAD':>8} {'errors':>7} {'speedup':>8}  "
            f"{'95% CI':<16} note"
        )
        if level.ranked:
            lines.append(header)
        for r in level.ranked:
            ci = f"[{r.speedup_ci.low:.3f}, {r.speedup_ci.high:.3f}]" if r.speedup_ci else "-"
            note = "winner" if r.rank == 1 else ("tie" if r.tie else "")
            if r.is_baseline:
                note = (note + " baseline").strip()
            speedup = f"{r.speedup:.3f}x" if r.speedup is not None else "-"
            lines.append(
                f"   {r.rank:>2}  {r.config_label:<22} {_num(r.objective, 6):>22} {_num(r.objective_mad):>8} "
                f"{share_text(r.error_rate):>7} {speedup:>8}  {ci:<16} {note}"
            )
        for e in level.excluded:
            lines.append(
                f"   excluded {e.config_label} (errors {share_text(e.error_rate)}): {'; '.join(e.reasons)}"
            )
        if level.winner is not None:
            lines.append(f"   launch: {level.winner.launch_command or '(unknown)'}")
    return "\n".join(lines)


COMMAND = Command(
    name="best",
    help="the best config per load level under SLOs, its speedup with a 95%% interval, and its command",
    add_arguments=add_arguments,
    run=run,
)
