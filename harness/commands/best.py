"""``specsweep best OUT``: the config to deploy at each load level, under SLOs, with its command."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import sys
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

from harness.commands.base import Command
from harness.output import add_format_argument, print_csv, print_json
from specsweep.errors import NoConfigMeetsSlosError

CAPACITY = "capacity"  # --objective capacity: rank by the capacity search's result, not a level metric

if TYPE_CHECKING:
    import duckdb

    from analysis.confirmation import Confirmation
    from analysis.select import LevelChoice, Selection
    from analysis.slo import Slo
    from analysis.store import ResultStore
    from harness.deploy_launch import DeployLaunch


def add_resampling_arguments(parser: argparse.ArgumentParser, intervals: str) -> None:
    """--confidence (of ``intervals``), --bootstrap and --seed: how every interval is resampled."""
    from analysis.select import DEFAULT_CONFIDENCE, DEFAULT_REPLICATES

    parser.add_argument(
        "--confidence",
        type=float,
        default=DEFAULT_CONFIDENCE,
        metavar="P",
        help=f"confidence of {intervals} (default {DEFAULT_CONFIDENCE})",
    )
    parser.add_argument(
        "--bootstrap",
        type=int,
        default=DEFAULT_REPLICATES,
        metavar="N",
        help=f"bootstrap replicates (default {DEFAULT_REPLICATES})",
    )
    parser.add_argument("--seed", type=int, default=0, help="bootstrap seed (default 0)")


def add_selection_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags ``best`` and ``report`` share: which sweep, which SLOs, what to rank by."""
    from analysis.select import (
        DEFAULT_MAX_ERROR_RATE,
        DEFAULT_OBJECTIVE,
        OBJECTIVE_ALIASES,
    )

    parser.add_argument(
        "out",
        metavar="OUT",
        help="the sweep's output: a directory, or an s3:// or gs:// URI (docs/results.md)",
    )
    parser.add_argument(
        "--slo",
        default="",
        metavar="CLAUSES",
        help='comma-separated limits every ranked config must meet, e.g. "ttft_p99_ms<=2000,tpot_p99_ms<=50"',
    )
    parser.add_argument(
        "--request-slo",
        default=None,
        metavar="CLAUSES",
        help='per-request limits that define goodput, e.g. "ttft_ms<=2000,tpot_ms<=50" '
        "(of ttft_ms, tpot_ms, e2e_ms; default: the spec's request_slo)",
    )
    aliases = ", ".join(f"{alias} = {name}" for alias, name in OBJECTIVE_ALIASES.items())
    parser.add_argument(
        "--objective",
        default=DEFAULT_OBJECTIVE,
        metavar="METRIC",
        help=f"what to rank by: a level metric, {aliases}, or capacity (the load.capacity search's "
        f"highest load within its SLOs; best only) (default {DEFAULT_OBJECTIVE})",
    )
    add_resampling_arguments(parser, "the intervals and of telling two configs apart")
    parser.add_argument("--at", metavar="LEVEL", help="only this load level, e.g. concurrency=64")
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
    parser.add_argument(
        "--publish-drafter",
        metavar="PATH",
        help="where the converted drafter is published: the launches to deploy name it there (default: "
        "<drafter path>-sglang with --emit, else the spec's drafter path and how to convert it)",
    )


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_selection_arguments(parser)
    parser.add_argument(
        "--by",
        choices=("level", "category"),
        default="level",
        help="level: the config to deploy per load level (default); category: per level and request "
        "category, the config whose requests of that category decode fastest (mean TPOT)",
    )
    parser.add_argument(
        "--axis",
        metavar="NAME",
        help="rank within each value of the server axis NAME on its own (the configs run at that value, "
        "speedups over the baseline run at it): one ranking per value",
    )
    add_format_argument(parser, json_alias=True)
    parser.add_argument(
        "--emit",
        type=Path,
        metavar="DIR",
        help="write the launch to deploy (static best over the spec's deploy_weights, or an adaptive "
        "schedule from the per-level winners), adaptive.json and the drafter's provenance into DIR",
    )
    parser.add_argument(
        "--allow-lossy",
        action="store_true",
        help="let --emit deploy a config the lossless check flagged (greedy outputs that differ from the "
        "baseline's beyond the noise floor, or an accept threshold below 1.0); refused by default",
    )


def selection_from_args(
    args: argparse.Namespace, store: ResultStore, axis: tuple[str, str] | None = None
) -> tuple[duckdb.DuckDBPyConnection, Selection]:
    """Open OUT (``store``) and run the selection the flags ask for (shared with ``report``); ``axis``:
    only the jobs run at this (server axis, value)."""
    from analysis.select import select_best
    from analysis.views import connect, readable_results

    slos = _slos(args)
    with readable_results(store):
        con = connect(store)
        request_slos = _request_slos(args, con)
        selection = select_best(
            con,
            store,
            objective=args.objective,
            slos=slos,
            request_slos=request_slos,
            at=args.at,
            replicates=args.bootstrap,
            confidence=args.confidence,
            seed=args.seed,
            allow_partial=args.allow_partial,
            max_error_rate=args.max_error_rate,
            axis=axis,
        )
    return con, selection


def confirmation_from_args(
    args: argparse.Namespace, store: ResultStore, con: duckdb.DuckDBPyConnection, selection: Selection
) -> Confirmation | None:
    """The confirmation job measured against ``selection`` (ranked again with it, under the same flags);
    None when the sweep has no finished confirmation job or ``--at`` picks one level."""
    from analysis.confirmation import CONFIRMATION_ROLE, confirm, confirmation_label
    from analysis.deploy import config_shapes, level_concurrency, spec_weights
    from analysis.select import SWEEP_ROLES, select_best
    from analysis.views import readable_results

    found = confirmation_label(con)
    if found is None or args.at is not None:
        return None
    with readable_results(store):
        with_confirmation = select_best(
            con,
            store,
            objective=args.objective,
            slos=_slos(args),
            request_slos=_request_slos(args, con),
            replicates=args.bootstrap,
            confidence=args.confidence,
            seed=args.seed,
            allow_partial=args.allow_partial,
            max_error_rate=args.max_error_rate,
            roles=(*SWEEP_ROLES, CONFIRMATION_ROLE),
        )
        label, schedule = found
        return confirm(
            selection, with_confirmation, label, schedule, config_shapes(con), level_concurrency(con),
            spec_weights(con),
        )  # fmt: skip


def _slos(args: argparse.Namespace) -> tuple[Slo, ...]:
    from analysis.select import SLO_METRICS
    from analysis.slo import parse_slos

    return parse_slos(args.slo, SLO_METRICS)


def _request_slos(args: argparse.Namespace, con: duckdb.DuckDBPyConnection) -> tuple[Slo, ...]:
    from analysis.goodput import parse_request_slos

    if args.request_slo is not None:
        return parse_request_slos(args.request_slo)
    return parse_request_slos(_spec_request_slo(con), where="the sweep spec's request_slo")


def _spec_request_slo(con: duckdb.DuckDBPyConnection) -> str:
    """The spec's per-request SLOs as clauses ("" when the sweep row or the field is absent)."""
    import yaml

    from harness.spec import RequestSlo

    rows = con.sql("SELECT spec_text FROM sweep").fetchall()
    spec = yaml.safe_load(rows[0][0]) if rows and rows[0][0] else None
    field = spec.get("request_slo") if isinstance(spec, dict) else None
    return RequestSlo.model_validate(field).clauses() if field else ""


def run(args: argparse.Namespace) -> int:
    from analysis.store import open_store

    store = open_store(args.out)
    if args.by == "category":
        return _run_by_category(args, store)
    if args.objective == CAPACITY:
        return _run_capacity(args, store)
    if args.axis is not None:
        return _run_by_axis(args, store)
    if args.emit is not None:
        from harness.emit import check_destination

        check_destination(args.emit)  # before the ranking, which can take a while
    from analysis.lossless import format_lossless, lossless_summary
    from harness.deploy_launch import deploy_launches
    from harness.progress import long_step

    steps = sys.stdout if args.format == "table" else sys.stderr  # json and csv keep stdout clean
    with long_step("best: ranking the configs", steps):
        con, selection = selection_from_args(args, store)
    try:
        confirmation = confirmation_from_args(args, store, con, selection)
        launches = deploy_launches(con, args.publish_drafter, emitting=args.emit is not None)
        lossless = lossless_summary(con)
        deployment = None
        if args.emit is not None:
            from harness.emit import emit

            with long_step("best --emit: building and validating the deploy launches", steps):
                deployment = emit(
                    con,
                    selection,
                    args.emit,
                    publish_drafter=args.publish_drafter,
                    confirmation=confirmation,
                    allow_lossy=args.allow_lossy,
                )
    finally:
        con.close()
    if args.format == "json":
        print_json(
            {
                **dataclasses.asdict(selection),
                "confirmation": dataclasses.asdict(confirmation) if confirmation else None,
                "deploy_launches": {label: dataclasses.asdict(d) for label, d in launches.items()},
                "deploy": deployment,
                "lossless": dataclasses.asdict(lossless) if lossless else None,
            }
        )
    elif args.format == "csv":
        print_csv(SELECTION_CSV_COLUMNS, selection_csv_rows(selection))
    else:
        print(format_selection(selection, launches, lossy=lossless.flagged() if lossless else {}))
        if lossless is not None:
            print("\n".join(format_lossless(lossless)))
        if confirmation is not None:
            print(format_confirmation(confirmation, selection))
        if deployment is not None:
            from harness.emit import describe

            print(describe(deployment, args.emit))
    if all(level.winner is None for level in selection.levels):
        raise NoConfigMeetsSlosError(
            "no config meets every SLO at any load level: there is nothing to deploy",
            where="--slo" if selection.slos else "--max-error-rate",
            fix="relax the limits the excluded configs miss (each one's reasons are listed: --slo, "
            "--max-error-rate), or measure other configs",
        )
    return 0


# ``best --format csv``: one row per level x config, ranked ones first (rank empty for excluded ones).
SELECTION_CSV_COLUMNS = (
    "load_level",
    "rank",
    "config_label",
    "is_baseline",
    "repeats",
    "objective",
    "objective_low",
    "objective_high",
    "speedup",
    "speedup_low",
    "speedup_high",
    "tie",
    "more_repeats",
    "error_rate",
    "goodput_rps",
    "goodput_share",
    "excluded_because",
    "launch_command",
)


def selection_csv_rows(selection: Selection) -> list[tuple[object, ...]]:
    """The ranking as ``SELECTION_CSV_COLUMNS`` rows."""
    rows: list[tuple[object, ...]] = []
    for level in selection.levels:
        for r in level.ranked:
            o, s = r.objective_ci, r.speedup_ci
            rows.append(
                (level.load_level, r.rank, r.config_label, r.is_baseline, r.repeats, r.objective,
                 o and o.low, o and o.high, r.speedup, s and s.low, s and s.high, r.tie, r.more_repeats,
                 r.error_rate, r.goodput_rps, r.goodput_share, None, r.launch_command)
            )  # fmt: skip
        for e in level.excluded:
            rows.append(
                (level.load_level, None, e.config_label, e.config_label == level.baseline_label, None, None,
                 None, None, None, None, None, None, None, e.error_rate, None, None, "; ".join(e.reasons),
                 None)
            )  # fmt: skip
    return rows


@contextlib.contextmanager
def _open_results(store: ResultStore) -> Iterator[duckdb.DuckDBPyConnection]:
    """A connection to OUT's tables, closed however the ranking ends."""
    from analysis.views import connect, readable_results

    with readable_results(store):
        con = connect(store)
        try:
            yield con
        finally:
            con.close()


def _refuse_emit(args: argparse.Namespace, why: str, fix: str) -> None:
    """``--emit`` deploys per-level winners only; a mode that ranks something else refuses it up front."""
    from specsweep.errors import ResultsError

    if args.emit is not None:
        raise ResultsError(why, where="--emit", fix=fix)


def _run_by_category(args: argparse.Namespace, store: ResultStore) -> int:
    """``best --by category``: the winners per level and category (``analysis.by_category``)."""
    from analysis.by_category import best_by_category, format_by_category
    from analysis.views import check_current_inputs
    from specsweep.errors import ResultsError

    _refuse_emit(
        args,
        "--emit deploys the per-level winners, and --by category ranks per category",
        fix="drop --by category to emit, or --emit to see the winners per category",
    )
    with _open_results(store) as con:
        notes = check_current_inputs(con, store.location)
        levels = [row[0] for row in con.sql("SELECT DISTINCT load_level FROM levels ORDER BY 1").fetchall()]
        if args.at is not None and args.at not in levels:
            raise ResultsError(
                f"load level {args.at!r} was not measured",
                where="--at",
                fix=f"use one of: {', '.join(levels)}",
            )
        choices = best_by_category(con, args.at)
    if args.format == "json":
        print_json({"by": "category", "notes": notes, "levels": [dataclasses.asdict(c) for c in choices]})
    elif args.format == "csv":
        columns = (
            "load_level",
            "category",
            "rank",
            "config_label",
            "tpot_ms",
            "speedup",
            "accept_length_mean",
            "num_ok",
        )
        print_csv(
            columns,
            (
                (
                    c.load_level,
                    c.category,
                    i,
                    r.config_label,
                    r.tpot_ms,
                    r.speedup,
                    r.accept_length_mean,
                    r.num_ok,
                )
                for c in choices
                for i, r in enumerate(c.ranked, start=1)
            ),
        )
    else:
        print("\n".join([*(f"note: {note}" for note in notes), format_by_category(choices)]))
    return 0


def _run_by_axis(args: argparse.Namespace, store: ResultStore) -> int:
    """``best --axis NAME``: one ranking per value of the server axis, each over the jobs run at it."""
    from analysis.axes import axis_values

    _refuse_emit(
        args,
        "--emit deploys one launch, and --axis ranks per axis value",
        fix="drop --axis to emit (the config labels name their axis values), or --emit to rank per value",
    )
    with _open_results(store) as con:
        values = axis_values(con, args.axis)
    rankings: list[tuple[str, Selection]] = []
    for value in values:
        con, selection = selection_from_args(args, store, axis=(args.axis, value))
        con.close()
        rankings.append((value, selection))
    if args.format == "json":
        print_json(
            {"axis": args.axis, "values": [{"value": v, **dataclasses.asdict(s)} for v, s in rankings]}
        )
    elif args.format == "csv":
        print_csv(
            ("axis_value", *SELECTION_CSV_COLUMNS),
            ((value, *row) for value, selection in rankings for row in selection_csv_rows(selection)),
        )
    else:
        print("\n\n".join(f"### {args.axis} = {v}\n{format_selection(s)}" for v, s in rankings))
    if all(level.winner is None for _, selection in rankings for level in selection.levels):
        raise NoConfigMeetsSlosError(
            f"no config meets every SLO at any load level and value of {args.axis}: there is nothing to deploy",
            where="--slo" if rankings[0][1].slos else "--max-error-rate",
            fix="relax the limits the excluded configs miss (each one's reasons are listed), or measure "
            "other configs",
        )
    return 0


def _run_capacity(args: argparse.Namespace, store: ResultStore) -> int:
    """``--objective capacity``: configs by the highest load their capacity search found within its SLOs.
    When no probe of any config met the SLOs there is no capacity and no launch to recommend: the ranking
    is shown (each config's bound), then that is a ResultsError (exit 2), as ``--emit`` refuses when no
    config meets the SLOs."""
    from analysis.capacity import capacity_text, rank_by_capacity
    from analysis.views import check_current_inputs

    _refuse_emit(
        args,
        "--emit picks per-level winners; it does not take --objective capacity",
        fix="run `best --emit DIR` with a level objective (the default throughput)",
    )
    from harness.deploy_launch import deploy_launches

    with _open_results(store) as con:
        notes = check_current_inputs(con, store.location)
        choices = rank_by_capacity(con)
        launches = deploy_launches(con, args.publish_drafter)
    first = choices[0]
    if args.format == "json":
        print_json(
            {"objective": CAPACITY, "notes": notes, "ranked": [dataclasses.asdict(c) for c in choices]}
        )
    elif args.format == "csv":
        rows = [dataclasses.asdict(c) for c in choices]
        print_csv(list(rows[0]), (list(row.values()) for row in rows))
    else:
        lines = [f"ranked by capacity under SLO ({first.kind}, highest is better); SLOs: {first.slo}"]
        lines.extend(f"note: {note}" for note in notes)
        lines.append(f"   {'#':>2}  {'config':<22} {'capacity':>24} {'launches':>8} {'probes':>6}")
        for c in choices:
            lines.append(
                f"   {c.rank:>2}  {c.config_label:<22} {capacity_text(c):>24} {c.launches:>8} {c.probes:>6}"
            )
        if first.capacity is not None:
            lines.extend(launch_lines(launches.get(first.config_label)))
        print("\n".join(lines))
    if first.capacity is None:  # ranked highest first, so no config has one
        raise NoConfigMeetsSlosError(
            f"no config met its SLO ({first.slo}) at any probed load: there is no capacity and no launch "
            "to recommend",
            where="--objective capacity",
            fix="lower load.capacity.lo below the lowest failing load shown, or relax load.capacity.slo, "
            "and run the sweep again",
        )
    return 0


def _num(value: float | None, digits: int = 4) -> str:
    return "-" if value is None else f"{value:.{digits}g}"


def _fixed(value: float | None, decimals: int = 2) -> str:
    """A column's value with the same decimals on every row (significant digits gave 24.1332 beside
    23.129), so a column of numbers lines up and reads at a glance."""
    return "-" if value is None else f"{value:.{decimals}f}"


def launch_lines(launch: DeployLaunch | None) -> list[str]:
    """A winner's launch to deploy, where the measured one differed, and what the drafter needs."""
    if launch is None:
        return ["   launch: (unknown)"]
    lines = [f"   launch: {launch.command}"]
    if launch.differed:
        lines.append(f"   measured launch differed: {launch.differed}")
    if launch.drafter_note:
        lines.append(f"   drafter: {launch.drafter_note}")
    return lines


def format_selection(
    selection: Selection,
    launches: Mapping[str, DeployLaunch] | None = None,
    lossy: Mapping[str, str] | None = None,
) -> str:
    """The human-readable ranking: one block per load level, each winner with its deploy launch; a config
    the lossless check flagged (``lossy``: label -> why) is ranked as measured and marked."""
    from analysis.lossless import LOSSY_MARK
    from analysis.select import share_text

    slos = ", ".join(selection.slos) or "none"
    confidence = f"{selection.confidence:.0%}"
    goodput = bool(selection.request_slos)
    lines = [
        f"sweep {selection.sweep_id}: ranked by {selection.objective} ({selection.objective_unit}, "
        f"{selection.better} is better); SLOs: {slos}; error rate at most {selection.max_error_rate:.1%}; "
        f"{confidence} intervals from {selection.replicates} bootstrap resamples of launches and requests",
    ]
    if goodput:
        lines.append(f"goodput: requests that succeeded with {' and '.join(selection.request_slos)}")
    for note in selection.notes:
        lines.append(f"note: {note}")
    for level in selection.levels:
        lines.append("")
        base = (
            f"baseline {level.baseline_label!r} = {_fixed(level.baseline_objective)}"
            if level.baseline_label
            else "no baseline"
        )
        lines.append(f"== {level.load_level}  ({base})")
        if not level.ranked:
            lines.append("   no config meets every SLO here")
        goodput_header = f" {'goodput/s':>10} {'share':>6}" if goodput else ""
        header = (
            f"   {'#':>2}  {'config':<22} {selection.objective:>22} {'MAD':>8} {'errors':>7}{goodput_header} "
            f"{'speedup':>8}  {confidence + ' CI':<16} note"
        )
        if level.ranked:
            lines.append(header)
        for r in level.ranked:
            ci = f"[{r.speedup_ci.low:.3f}, {r.speedup_ci.high:.3f}]" if r.speedup_ci else "-"
            note = "winner" if r.rank == 1 else ("tie" if r.tie else "")
            if r.is_baseline:
                note = (note + " baseline").strip()
            if r.config_label in (lossy or {}):
                note = (note + " " + LOSSY_MARK).strip()
            speedup = f"{r.speedup:.3f}x" if r.speedup is not None else "-"
            goodput_cells = f" {_fixed(r.goodput_rps):>10} {_fixed(r.goodput_share, 3):>6}" if goodput else ""
            lines.append(
                f"   {r.rank:>2}  {r.config_label:<22} {_fixed(r.objective):>22} {_fixed(r.objective_mad):>8} "
                f"{share_text(r.error_rate):>7}{goodput_cells} {speedup:>8}  {ci:<16} {note}"
            )
        lines.extend(_undecided(level, confidence))
        for e in level.excluded:
            lines.append(
                f"   excluded {e.config_label} (errors {share_text(e.error_rate)}): {'; '.join(e.reasons)}"
            )
        if level.winner is not None:
            lines.extend(launch_lines((launches or {}).get(level.winner.config_label)))
            if level.winner.config_label in (lossy or {}):
                lines.append(
                    f"   {LOSSY_MARK}: the winner's greedy outputs are not the baseline's (lossless check "
                    "below); --emit refuses it without --allow-lossy"
                )
    return "\n".join(lines)


def format_confirmation(confirmation: Confirmation, selection: Selection) -> str:
    """The measured adaptive server against the per-level winners and on the load mix."""
    lines = [
        "",
        f"== confirmation: {confirmation.config_label!r} ({confirmation.schedule}), measured on every level",
    ]
    for lc in confirmation.levels:
        chain = (
            f"; {lc.of_best_chain:.3f} of the best topk-1 chain or baseline {lc.best_chain_label!r}"
            if lc.of_best_chain is not None
            else ""
        )
        ci = f" [{_fixed(lc.objective_ci.low)}, {_fixed(lc.objective_ci.high)}]" if lc.objective_ci else ""
        lines.append(
            f"   {lc.load_level}: {selection.objective} {_fixed(lc.objective)}{ci}, "
            f"{lc.of_winner:.3f} of the winner {lc.winner_label!r}{chain}"
        )
        if lc.gives_up:
            lines.append(f"      gives up: {lc.gives_up}")
    mix_ci = (
        f" [{confirmation.mix_ci.low:.3f}, {confirmation.mix_ci.high:.3f}]" if confirmation.mix_ci else ""
    )
    lines.append(
        f"   load mix {confirmation.weights}: adaptive {confirmation.mix_score:.3f}{mix_ci} of the per-level best; "
        f"best static {confirmation.static.config_label!r} {confirmation.static.mix_score:.3f}"
        + (
            f"; best static topk-1 {confirmation.chain_static.config_label!r} {confirmation.chain_static.mix_score:.3f}"
            if confirmation.chain_static
            else ""
        )
    )
    lines.append(f"   recommended: {confirmation.recommended} (the higher measured mix score)")
    return "\n".join(lines)


def _undecided(level: LevelChoice, confidence: str) -> list[str]:
    """Say so when the winner is not distinguishable from the runner-up, instead of a winner by a hair."""
    if len(level.ranked) < 2 or not level.ranked[1].tie:
        return []
    winner, second = level.ranked[0], level.ranked[1]
    diff = second.difference_ci
    span = f" (difference {_num(diff.low)} to {_num(diff.high)})" if diff else ""
    more = (
        f"about {second.more_repeats} more repeat(s) of each would likely separate them"
        if second.more_repeats is not None
        else "more repeats are unlikely to separate them: for practical purposes they are equal"
    )
    return [
        f"   not distinguishable at {confidence}: {winner.config_label!r} and {second.config_label!r}{span}; {more}"
    ]


COMMAND = Command(
    name="best",
    help="the best config per load level under SLOs, its speedup with a 95% interval, and its command",
    add_arguments=add_arguments,
    run=run,
)
