"""The driver's side of the output: claim it, copy the spec, commit attempts.

An output is a result store (``analysis.store``: a local directory or an object-store prefix) plus the
driver's local state directory (``harness.state``: the queue, the driver's lock, attempts staged by
workers on this host); for a local OUT the two are the same directory. Workers write each attempt's
tables under the state's ``_attempts/``; the driver publishes them into the partitioned tables,
requests and levels first and the jobs row (the commit object) last, and only while the job's lease
token still holds (checked by the caller). A local OUT gets them by ``os.replace``; an object store by
one PUT each of the bytes that came back with the result, which is also how a local OUT is written when
the driver cannot see a worker's disk (another host, no shared filesystem).
"""

from __future__ import annotations

import os
import shutil
import socket
import sqlite3
import uuid
from dataclasses import dataclass
from pathlib import Path

from analysis import layout
from analysis.layout import ROOT
from analysis.schema import JobRecord, SweepRecord, jobs_table, sweep_table
from analysis.store import ResultStore, as_store, write_local_atomic
from harness.queue import QUEUE_FILE, JobQueue, holds_sweep
from harness.state import state_dir
from specsweep import __version__
from specsweep.crash_points import crash_point
from specsweep.errors import ResultsError
from workers.job import AttemptResult


@dataclass(frozen=True)
class Output:
    """Where a sweep publishes its results (``store``) and where its driver keeps its local state."""

    store: ResultStore
    state: Path

    @property
    def remote(self) -> bool:
        return not self.store.is_local


def output_for(location: Output | ResultStore | str | os.PathLike[str], state: str | None = None) -> Output:
    """The output a location names; ``state`` overrides where an object store's driver state lives."""
    if isinstance(location, Output):
        return location
    store = as_store(location)
    return Output(store, state_dir(store, state))


def check_output_dir(out: Path) -> None:
    """Refuse, before any work, an output path that is a file or a directory this user cannot write."""
    if out.exists() and not out.is_dir():
        raise ResultsError(
            "the output path is a file, not a directory", where=str(out), fix="pass a directory with --out"
        )
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_local_atomic(out / ".write-check", b"")
        (out / ".write-check").unlink()
    except OSError as err:
        raise ResultsError(
            f"cannot write to the output directory: {err.strerror}",
            where=str(out),
            fix="choose a writable directory with --out (or free space on its disk)",
        ) from None


def check_output(out: Output) -> None:
    """Refuse, before any work, an output that cannot be written: a local directory as above; an object
    store that cannot be reached, has no such bucket, or takes no write with these credentials; a state
    directory that cannot be written."""
    if out.store.local_dir is not None:
        check_output_dir(out.store.local_dir)
        return
    out.store.check(write=True)
    check_output_dir(out.state)


def claim_output_dir(out: Output | Path, sweep_id: str, spec_text: str, *, resume: bool) -> None:
    """Refuse an output that holds another sweep (or this one, without --resume); copy the spec."""
    out = output_for(out)
    check_claim(out, sweep_id, resume=resume)
    out.store.write_bytes(layout.SPEC_COPY, spec_text.encode())


def check_claim(out: Output, sweep_id: str, *, resume: bool) -> None:
    """``claim_output_dir``'s refusals, writing nothing: ``run`` makes them in its first second. A queue
    whose driver died before its sweep started holds no sweep (``holds_sweep``): a plain run takes it
    over, and --resume starts it."""
    where = out.store.describe()
    has_queue = (out.state / QUEUE_FILE).exists()
    has_sweep = holds_sweep(out.state)
    if not has_sweep and layout.committed_job_ids(out.store):
        missing = (
            "queue.sqlite is missing"
            if not out.remote
            else f"no queue in the local state directory {out.state}"
        )
        raise ResultsError(
            f"the output holds committed results but no sweep queue ({missing}); running here would "
            "overwrite them",
            where=where,
            fix="restore OUT/queue.sqlite to resume, or choose another directory with --out"
            if not out.remote
            else "resume on the host that ran the sweep, or pass its queue's directory with --state-dir; "
            "or choose another --out",
        )
    if has_sweep and not resume:
        raise ResultsError(
            "the output directory already holds a sweep",
            where=where,
            fix="pass --resume to continue it, or choose another directory with --out",
        )
    if resume and not has_queue:
        raise ResultsError(
            "nothing to resume: the output directory holds no sweep"
            + (f" (no queue in the state directory {out.state})" if out.remote else ""),
            where=where,
            fix="run without --resume" + (", or pass the sweep's --state-dir" if out.remote else ""),
        )
    if has_sweep:
        held = _sweep_ids(out.store)
        if held and sweep_id not in held:
            raise ResultsError(
                f"the output directory holds sweep {', '.join(sorted(held))}, but this spec is sweep {sweep_id} "
                "(the spec changed since that sweep started)",
                where=where,
                fix="resume with the spec stored in OUT/sweep.yaml, or start the new spec in another --out",
            )


def _sweep_ids(store: ResultStore) -> set[str]:
    return {key.split("/")[1].removeprefix("sweep=") for key in store.list_files("sweep") if "/sweep=" in key}


def write_sweep_row(
    store: ResultStore,
    sweep_id: str,
    spec_text: str,
    *,
    sglang_version: str | None,
    created_ns: int,
    client_delay_us: tuple[float | None, float | None] = (None, None),
    input_digests: str | None = None,
) -> None:
    """The sweep table's row: spec, versions, host, the input digests (JSON) the sweep now measures with,
    and (once levels exist) the client-delay calibration."""
    import ray

    record = SweepRecord(
        sweep_id=sweep_id,
        spec_text=spec_text,
        specsweep_version=__version__,
        sglang_version=sglang_version,
        ray_version=ray.__version__,
        host=socket.gethostname(),
        client_delay_p50_us=client_delay_us[0],
        client_delay_p99_us=client_delay_us[1],
        created_unix_ns=created_ns,
        input_digests=input_digests,
    )
    store.write_table(layout.sweep_part_path(ROOT, sweep_id), sweep_table([record]))


def commit_attempt(out: Output, sweep_id: str, result: AttemptResult, tables: tuple[str, ...]) -> None:
    """Publish an attempt's ``tables`` in ``layout.COMMIT_ORDER`` (the jobs row, its commit, last)."""
    for table in (t for t in layout.COMMIT_ORDER if t in tables):
        source = layout.attempt_path(out.state, result.job_id, result.attempt, table)
        target = layout.job_part_path(ROOT, table, sweep_id, result.job_id)
        out.store.publish(target, source, result.files[table])
        crash_point(f"commit:{table}")


def commit_jobs_row(out: Output, record: JobRecord) -> None:
    """Write a job's final ``jobs`` row (its commit marker) when no worker attempt file holds it: the
    attempt's worker is gone (node lost, timed out)."""
    out.store.write_table(
        layout.job_part_path(ROOT, "jobs", record.sweep_id, record.job_id), jobs_table([record])
    )
    crash_point("commit:jobs")


def mark_leased(out: Output, job_id: str, attempt: int) -> None:
    """Record in an object store that this attempt was handed out (``best`` then knows the sweep is
    unfinished); a local OUT has the workers' attempt directories for that."""
    if out.remote:
        out.store.write_bytes(layout.leased_mark(job_id, attempt), b"")


def publish_queue(out: Output, queue: JobQueue) -> None:
    """Put a consistent copy of the queue into an object store, for ``specsweep status`` from any host
    (SQLite's online backup, then one PUT); a local OUT holds the queue itself."""
    if not out.remote:
        return
    copy = out.state / f".queue-snapshot.{os.getpid()}.{uuid.uuid4().hex}.tmp"
    try:
        target = sqlite3.connect(copy)
        try:
            queue.backup(target)
        finally:
            target.close()
        out.store.write_bytes(layout.QUEUE_SNAPSHOT, copy.read_bytes())
    finally:
        copy.unlink(missing_ok=True)


@dataclass(frozen=True, slots=True)
class CommittedRow:
    """The verdict of a job's committed ``jobs`` row: which attempt wrote it and how that attempt ended."""

    attempt: int
    status: str  # done | failed
    error_class: str | None
    error_message: str | None


def committed_row(out: Output, sweep_id: str, job_id: str) -> CommittedRow | None:
    """The job's committed ``jobs`` row, or None when there is none (or it cannot be read: a file that
    a rename or one PUT put in place is whole, so an unreadable one was damaged later and is run again)."""
    table = out.store.read_table(
        layout.job_part_path(ROOT, "jobs", sweep_id, job_id),
        columns=["attempts", "status", "error_class", "error_message"],
    )
    if table is None or table.num_rows != 1:
        return None
    (row,) = table.to_pylist()
    return CommittedRow(row["attempts"], row["status"], row["error_class"], row["error_message"])


def drop_uncommitted_parts(out: Output, sweep_id: str, job_id: str) -> None:
    """Remove the requests/levels files of a job that has no successful commit (left by a driver that
    died between the renames), so no reader ever pairs them with a later failed or missing jobs row."""
    for table in layout.COMMIT_ORDER:
        if table != "jobs":
            out.store.delete(layout.job_part_path(ROOT, table, sweep_id, job_id))


def drop_attempts(out: Output, job_id: str) -> None:
    """Remove a withdrawn job's attempt files and leased marks: it will not run or commit under this id, so
    ``best`` must not take it for a job of an unfinished sweep (``analysis.layout.attempted_job_ids``)."""
    folder = out.state / layout.ATTEMPTS_DIR / job_id
    if folder.is_dir():
        shutil.rmtree(folder)
    if out.remote:
        for key in out.store.list_files(f"{layout.ATTEMPTS_DIR}/{job_id}"):
            out.store.delete(key)


def median_client_delay_us(store: ResultStore, sweep_id: str) -> tuple[float | None, float | None]:
    """Median over the committed levels of the load generator's calibration (p50, p99 in us)."""
    import pyarrow as pa

    columns = ["client_delay_p50_us", "client_delay_p99_us"]
    parts = [
        store.read_table(key, columns=columns)
        for key in store.list_files(f"levels/sweep={sweep_id}")
        if layout.part_ids(key, "levels")
    ]
    found = [part for part in parts if part is not None]
    if not found:
        return None, None
    table = pa.concat_tables(found)

    def median(column: str) -> float | None:
        values = sorted(v for v in table.column(column).to_pylist() if v is not None)
        return values[len(values) // 2] if values else None

    return median("client_delay_p50_us"), median("client_delay_p99_us")
