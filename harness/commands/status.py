"""``specsweep status OUT``: where a sweep stands, read from its queue (safe while the sweep runs)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from harness.commands.base import Command
from harness.queue import AttemptRow, JobRow, open_read_only, read_attempts, read_counts, read_jobs, read_meta
from specsweep.errors import ResultsError


def run(args: argparse.Namespace) -> int:
    try:
        conn = open_read_only(args.out)
    except FileNotFoundError:
        raise ResultsError(
            "no sweep queue here (queue.sqlite)",
            where=args.out,
            fix="pass the --out directory of a `specsweep run`",
        ) from None
    try:
        counts, jobs, meta = read_counts(conn), read_jobs(conn), read_meta(conn)
        attempts = read_attempts(conn)
    finally:
        conn.close()
    if args.json:
        body = {
            "sweep_id": meta.get("sweep_id"),
            "counts": counts,
            "jobs": [asdict(j) for j in jobs],
            "attempts": [asdict(a) for a in attempts],
        }
        print(json.dumps(body, indent=2))
        return 0
    _print(meta.get("sweep_id"), counts, jobs, attempts)
    return 0


def _print(
    sweep_id: str | None, counts: dict[str, int], jobs: list[JobRow], attempts: list[AttemptRow]
) -> None:
    from rich.console import Console
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
    console = Console()
    console.print(table)
    failed = [a for a in attempts if a.outcome == "failed"]
    for attempt in failed[-5:]:
        console.print(
            f"[bold]{attempt.job_id} attempt {attempt.attempt}[/] {attempt.error_class}: {attempt.error_text}"
        )
        if attempt.log_tail:
            console.print("\n".join(attempt.log_tail.splitlines()[-8:]), highlight=False, markup=False)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("out", metavar="OUT", help="the sweep's results directory")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


COMMAND = Command(
    name="status",
    help="show a sweep's jobs, attempts and errors (works while it runs)",
    add_arguments=add_arguments,
    run=run,
)
