"""Where every file of a sweep lives under its output directory: the one results layout that the
driver, the node workers and the analysis share.

::

    OUT/sweep.yaml                                                       the spec as run
    OUT/queue.sqlite                                                     the durable queue (driver only)
    OUT/logs/<job_id>/attempt-<n>/server.log                             each attempt's server log
    OUT/logs/<job_id>/attempt-<n>/telemetry.parquet                     the sampler's raw samples
    OUT/_attempts/<job_id>/attempt-<n>/<table>.parquet                   one worker attempt
    OUT/requests/sweep=<sweep_id>/job=<job_id>/part-0.parquet           committed by the driver
    OUT/levels/sweep=<sweep_id>/job=<job_id>/part-0.parquet
    OUT/server_metrics/sweep=<sweep_id>/job=<job_id>/part-0.parquet     time series per level
    OUT/gpu_metrics/sweep=<sweep_id>/job=<job_id>/part-0.parquet
    OUT/jobs/sweep=<sweep_id>/job=<job_id>/part-0.parquet               moved last: commit marker
    OUT/sweep/sweep=<sweep_id>/part-0.parquet                           one row per sweep

A job is committed iff its ``jobs`` file exists; readers show requests and levels only for committed
jobs, so a crash between the renames never shows partial data.
"""

from __future__ import annotations

from pathlib import Path

PART = "part-0.parquet"
JOB_TABLES: tuple[str, ...] = ("requests", "levels", "server_metrics", "gpu_metrics", "jobs")
# The order the driver moves an attempt's tables into place: the jobs row last, it marks the commit.
COMMIT_ORDER: tuple[str, ...] = JOB_TABLES
ATTEMPTS_DIR = "_attempts"
SPEC_COPY = "sweep.yaml"


def job_part_path(out: Path, table: str, sweep_id: str, job_id: str) -> Path:
    """The committed file of ``table`` (one of JOB_TABLES) for one job."""
    if table not in JOB_TABLES:
        raise ValueError(f"unknown job table {table!r}; expected one of {JOB_TABLES}")
    return out / table / f"sweep={sweep_id}" / f"job={job_id}" / PART


def sweep_part_path(out: Path, sweep_id: str) -> Path:
    """The one-row ``sweep`` file of a sweep."""
    return out / "sweep" / f"sweep={sweep_id}" / PART


def attempt_path(out: Path, job_id: str, attempt: int, table: str) -> Path:
    """A worker attempt's uncommitted file of ``table``."""
    return out / ATTEMPTS_DIR / job_id / f"attempt-{attempt}" / f"{table}.parquet"


def job_table_glob(out: Path, table: str) -> str:
    """Glob matching every committed file of a job table (hive partitions sweep=, job=)."""
    return str(out / table / "sweep=*" / "job=*" / PART)


def sweep_table_glob(out: Path) -> str:
    """Glob matching every sweep row file."""
    return str(out / "sweep" / "sweep=*" / PART)


def attempted_job_ids(out: Path) -> set[str]:
    """Job ids that have at least one worker attempt directory (committed or not)."""
    attempts = out / ATTEMPTS_DIR
    if not attempts.is_dir():
        return set()
    return {p.name for p in attempts.iterdir() if p.is_dir()}


def committed_job_ids(out: Path) -> set[str]:
    """Job ids whose jobs file exists (the commit marker), from the directory names alone."""
    return {p.parent.name.removeprefix("job=") for p in (out / "jobs").glob(f"sweep=*/job=*/{PART}")}


def log_dir(out: Path, job_id: str, attempt: int) -> Path:
    """The directory of one attempt's server log (and its metrics snapshot)."""
    return out / "logs" / job_id / f"attempt-{attempt}"


def telemetry_samples(out: Path, job_id: str, attempt: int) -> Path:
    """The telemetry sampler's raw samples of one attempt (cut into levels by the node worker)."""
    return log_dir(out, job_id, attempt) / "telemetry.parquet"


def server_log(out: Path, job_id: str, attempt: int) -> Path:
    """One attempt's server log."""
    return log_dir(out, job_id, attempt) / "server.log"
