"""``specsweep status OUT``: where a sweep stands, read from its queue (safe while the sweep runs).

For an object-store OUT the queue is the driver's, in its state directory on this host
(``harness.state``); on any other host (or once that directory is gone) it is the copy the driver
publishes into the bucket every few seconds and at its end (``OUT/queue.sqlite``)."""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, astuple, fields
from pathlib import Path
from typing import Any

from harness.commands.base import Command
from harness.output import add_format_argument, print_csv, print_json, table_console
from harness.queue import (
    QUEUE_FILE,
    AttemptRow,
    JobRow,
    open_read_only,
    read_attempts,
    read_counts,
    read_jobs,
    read_meta,
    readable_queue,
)
from harness.search.session import BELIEF_KEY
from harness.startup import BEFORE_START, read_phase
from specsweep.errors import ResultsError


@contextmanager
def _queue_dir(args: argparse.Namespace) -> Iterator[tuple[Path, str | None]]:
    """The directory holding the sweep's queue, and a note when it is the bucket's published copy."""
    from analysis import layout
    from analysis.store import open_store
    from harness.state import state_dir

    store = open_store(args.out)
    state = state_dir(store, args.state_dir)
    if store.local_dir is not None or (state / QUEUE_FILE).is_file():
        yield state, None
        return
    store.check(write=False)
    data = store.read_bytes(layout.QUEUE_SNAPSHOT)
    if data is None:
        raise ResultsError(
            f"no sweep queue: none in the state directory {state} and no published copy in the bucket",
            where=store.describe(layout.QUEUE_SNAPSHOT),
            fix="pass the --out of a `specsweep run` (and its --state-dir, if it had one)",
        )
    with tempfile.TemporaryDirectory(prefix="specsweep-status-") as tmp:
        (Path(tmp) / QUEUE_FILE).write_bytes(data)
        yield Path(tmp), f"the driver's published copy of its queue ({store.describe(layout.QUEUE_SNAPSHOT)})"


def run(args: argparse.Namespace) -> int:
    with _queue_dir(args) as (folder, note):
        counts, jobs, meta, attempts = _read_queue(folder, args.out)
    hours = node_hours(attempts)
    search = json.loads(meta[BELIEF_KEY]) if BELIEF_KEY in meta else None
    phase = read_phase(meta)
    starting = phase if phase is not None and phase.phase in BEFORE_START else None
    if args.format == "csv":
        print_csv([f.name for f in fields(JobRow)], (astuple(j) for j in jobs))
        return 0
    if args.format == "json":
        body = {
            "sweep_id": meta.get("sweep_id"),
            "driver": None if phase is None else {**asdict(phase), "alive": phase.alive()},
            "counts": counts,
            "node_hours": hours,
            "search": search,
            "jobs": [asdict(j) for j in jobs],
            "attempts": [asdict(a) for a in attempts],
            "queue_copy": note,
        }
        print_json(body)
        return 0
    if note is not None:
        print(f"from {note}")
    if starting is not None:  # the driver has not added (or re-read) the jobs yet
        print(f"sweep {meta.get('sweep_id', '?')}: {starting.describe()}")
    if jobs or starting is None:
        _print(meta.get("sweep_id"), counts, jobs, attempts)
    print(f"node-hours spent: {hours:.3f} (every attempt, lease to answer: server startup included)")
    if search is not None:
        _print_search(search)
    return 0


def _read_queue(
    folder: Path, where: str
) -> tuple[dict[str, int], list[JobRow], dict[str, str], list[AttemptRow]]:
    try:
        conn = open_read_only(folder)
    except FileNotFoundError:
        raise ResultsError(
            "no sweep queue here (queue.sqlite)",
            where=where,
            fix="pass the --out directory of a `specsweep run`",
        ) from None
    try:
        with readable_queue(folder / QUEUE_FILE):
            return read_counts(conn), read_jobs(conn), read_meta(conn), read_attempts(conn)
    finally:
        conn.close()


def node_hours(attempts: list[AttemptRow]) -> float:
    """Server-slot hours of every attempt so far (a running one up to now), startup included."""
    now = time.time_ns()
    return sum(((a.finished_ns or now) - a.started_ns) for a in attempts) / 3.6e12


def _print_search(search: dict[str, Any]) -> None:
    """The search's current belief: per level the best measured config and who is still in contention."""
    state = "finished" if search["finished"] else "running"
    print(f"search ({state}: {search['reason']}):")
    for level in search["levels"]:
        best = (
            f"{level['best_label']} ({level['best_throughput']:.1f} tok/s)"
            if level["best_label"]
            else "none yet"
        )
        print(f"  {level['level']}: best so far {best}; in contention: {', '.join(level['contenders'])}")


def _print(
    sweep_id: str | None, counts: dict[str, int], jobs: list[JobRow], attempts: list[AttemptRow]
) -> None:
    from rich.table import Table

    summary = ", ".join(f"{state} {n}" for state, n in counts.items())
    table = Table(title=f"sweep {sweep_id}: {summary}", title_justify="left")
    for column in ("job", "config", "state", "attempts", "slot", "last error"):
        table.add_column(column, overflow="fold")
    for job in jobs:
        error = f"{job.error_class}: {job.error_text}" if job.error_class else ""
        table.add_row(
            job.id, job.label, job.state, str(job.attempts), "" if job.slot is None else str(job.slot), error
        )
    console = table_console()
    console.print(table)
    failed = [a for a in attempts if a.outcome == "failed"]
    for attempt in failed[-5:]:
        console.print(
            f"[bold]{attempt.job_id} attempt {attempt.attempt}[/] {attempt.error_class}: {attempt.error_text}"
        )
        if attempt.log_tail:
            console.print("\n".join(attempt.log_tail.splitlines()[-8:]), highlight=False, markup=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "out", metavar="OUT", help="the sweep's output: a directory, or the s3:// or gs:// URI it ran with"
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="object-store OUT: the driver's state directory, when `run` was given one (docs/cluster.md)",
    )
    add_format_argument(parser, json_alias=True)


COMMAND = Command(
    name="status",
    help="show a sweep's jobs, attempts and errors (works while it runs)",
    add_arguments=add_arguments,
    run=run,
)
