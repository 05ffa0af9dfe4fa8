"""The driver's side of the results directory: claim it, copy the spec, commit attempts.

Workers write each attempt's tables under ``_attempts/``; the driver moves them into the partitioned
tables with ``os.replace``, requests and levels first and the jobs row last, and only while the job's
lease token still holds (checked by the caller). When the driver cannot see a worker's disk (another
host, no shared filesystem) it writes the files from the bytes that came back with the result.
"""

from __future__ import annotations

import os
import socket
import uuid
from pathlib import Path

from analysis import layout
from analysis.schema import JobRecord, SweepRecord, jobs_table, sweep_table, write_parquet_atomic
from harness.queue import QUEUE_FILE
from specsweep import __version__
from specsweep.errors import ResultsError
from workers.job import AttemptResult


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` via a temporary name in the same directory and a rename."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def claim_output_dir(out: Path, sweep_id: str, spec_text: str, *, resume: bool) -> None:
    """Refuse an output directory that holds another sweep (or this one, without --resume); copy the spec."""
    spec_copy = out / layout.SPEC_COPY
    has_sweep = (out / QUEUE_FILE).exists()
    if has_sweep and not resume:
        raise ResultsError(
            "the output directory already holds a sweep",
            where=str(out),
            fix="pass --resume to continue it, or choose another directory with --out",
        )
    if resume and not has_sweep:
        raise ResultsError(
            "nothing to resume: the output directory holds no sweep",
            where=str(out),
            fix="run without --resume",
        )
    if has_sweep:
        held = _sweep_ids(out)
        if held and sweep_id not in held:
            raise ResultsError(
                f"the output directory holds sweep {', '.join(sorted(held))}, but this spec is sweep {sweep_id} "
                "(the spec changed since that sweep started)",
                where=str(out),
                fix="resume with the spec stored in OUT/sweep.yaml, or start the new spec in another --out",
            )
    write_atomic(spec_copy, spec_text.encode())


def _sweep_ids(out: Path) -> set[str]:
    folder = out / "sweep"
    if not folder.is_dir():
        return set()
    return {p.name.removeprefix("sweep=") for p in folder.iterdir() if p.name.startswith("sweep=")}


def write_sweep_row(
    out: Path,
    sweep_id: str,
    spec_text: str,
    *,
    sglang_version: str | None,
    created_ns: int,
    client_delay_us: tuple[float | None, float | None] = (None, None),
) -> None:
    """The sweep table's row: spec, versions, host, and (once levels exist) the client-delay calibration."""
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
    )
    write_parquet_atomic(sweep_table([record]), layout.sweep_part_path(out, sweep_id))


def is_committed(out: Path, sweep_id: str, job_id: str) -> bool:
    """A job is committed iff its jobs row is in place."""
    return layout.job_part_path(out, "jobs", sweep_id, job_id).exists()


def commit_attempt(out: Path, sweep_id: str, result: AttemptResult, tables: tuple[str, ...]) -> None:
    """Move an attempt's ``tables`` into place, in ``layout.COMMIT_ORDER`` (the jobs row last)."""
    for table in (t for t in layout.COMMIT_ORDER if t in tables):
        source = layout.attempt_path(out, result.job_id, result.attempt, table)
        if not source.exists():  # the worker ran on a host whose disk this one does not share
            write_atomic(source, result.files[table])
        target = layout.job_part_path(out, table, sweep_id, result.job_id)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(source, target)


def commit_jobs_row(out: Path, record: JobRecord) -> None:
    """Write a job's final ``jobs`` row (its commit marker) when no worker attempt file holds it: the
    attempt's worker is gone (node lost, timed out)."""
    write_parquet_atomic(
        jobs_table([record]), layout.job_part_path(out, "jobs", record.sweep_id, record.job_id)
    )


def median_client_delay_us(out: Path, sweep_id: str) -> tuple[float | None, float | None]:
    """Median over the committed levels of the load generator's calibration (p50, p99 in us)."""
    import pyarrow.dataset as ds

    root = out / "levels" / f"sweep={sweep_id}"
    if not root.is_dir():
        return None, None
    table = ds.dataset(root, format="parquet").to_table(
        columns=["client_delay_p50_us", "client_delay_p99_us"]
    )

    def median(column: str) -> float | None:
        values = sorted(v for v in table.column(column).to_pylist() if v is not None)
        return values[len(values) // 2] if values else None

    return median("client_delay_p50_us"), median("client_delay_p99_us")
