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
    OUT/capacity/sweep=<sweep_id>/job=<job_id>/part-0.parquet           probes of a capacity search
    OUT/lossless/sweep=<sweep_id>/job=<job_id>/part-0.parquet           the lossless check's output ids
    OUT/server_metrics/sweep=<sweep_id>/job=<job_id>/part-0.parquet     time series per level
    OUT/gpu_metrics/sweep=<sweep_id>/job=<job_id>/part-0.parquet
    OUT/jobs/sweep=<sweep_id>/job=<job_id>/part-0.parquet               moved last: commit marker
    OUT/sweep/sweep=<sweep_id>/part-0.parquet                           one row per sweep

A job is committed iff its ``jobs`` file exists; readers show requests and levels only for committed
jobs, so a crash between the renames never shows partial data.

In an object store (``analysis.store``) the same keys hold the same files under the URI's prefix, with
two differences: ``queue.sqlite`` there is a snapshot the driver publishes for ``specsweep status``
(the live queue stays on the driver's disk, in its state directory), and the driver marks each attempt
it hands out with an empty ``_attempts/<job_id>/attempt-<n>/leased`` object (the workers' own attempt
files stay on their nodes). The ``jobs`` object is the attempt's commit object: it is written after
the attempt's other objects, and a reader lists the commits before the data, so it never pairs a commit
with missing data nor shows data without a commit.

Every path function takes the root and returns the same kind of path: a local ``Path``, or, with
``ROOT`` (an empty ``PurePosixPath``), a store key.
"""

from __future__ import annotations

from pathlib import Path, PurePath, PurePosixPath
from typing import TYPE_CHECKING, TypeVar

if TYPE_CHECKING:
    from analysis.store import ResultStore

P = TypeVar("P", bound=PurePath)
ROOT = PurePosixPath()  # the root of store keys: layout.job_part_path(ROOT, ...) is a key

PART = "part-0.parquet"
JOB_TABLES: tuple[str, ...] = (
    "requests",
    "levels",
    "capacity",
    "lossless",
    "server_metrics",
    "gpu_metrics",
    "jobs",
)
# The order the driver moves an attempt's tables into place: the jobs row last, it marks the commit.
COMMIT_ORDER: tuple[str, ...] = JOB_TABLES
ATTEMPTS_DIR = "_attempts"
SPEC_COPY = "sweep.yaml"
QUEUE_SNAPSHOT = "queue.sqlite"  # in an object store: the driver's latest copy of its queue
LEASED_MARK = "leased"


def job_part_path(out: P, table: str, sweep_id: str, job_id: str) -> P:
    """The committed file of ``table`` (one of JOB_TABLES) for one job."""
    if table not in JOB_TABLES:
        raise ValueError(f"unknown job table {table!r}; expected one of {JOB_TABLES}")
    return out / table / f"sweep={sweep_id}" / f"job={job_id}" / PART


def sweep_part_path(out: P, sweep_id: str) -> P:
    """The one-row ``sweep`` file of a sweep."""
    return out / "sweep" / f"sweep={sweep_id}" / PART


def attempt_path(out: P, job_id: str, attempt: int, table: str) -> P:
    """A worker attempt's uncommitted file of ``table``."""
    return out / ATTEMPTS_DIR / job_id / f"attempt-{attempt}" / f"{table}.parquet"


def job_table_glob(out: Path, table: str) -> str:
    """Glob matching every committed file of a job table (hive partitions sweep=, job=)."""
    return str(out / table / "sweep=*" / "job=*" / PART)


def sweep_table_glob(out: Path) -> str:
    """Glob matching every sweep row file."""
    return str(out / "sweep" / "sweep=*" / PART)


def leased_mark(job_id: str, attempt: int) -> PurePosixPath:
    """The key of the driver's mark that it handed out this attempt (object stores only)."""
    return ROOT / ATTEMPTS_DIR / job_id / f"attempt-{attempt}" / LEASED_MARK


def part_ids(key: str, table: str) -> tuple[str, str] | None:
    """(sweep_id, job_id) of a committed file's key ``table/sweep=S/job=J/part-0.parquet``, else None."""
    parts = key.split("/")
    if (
        len(parts) != 4
        or parts[0] != table
        or parts[3] != PART
        or not parts[1].startswith("sweep=")
        or not parts[2].startswith("job=")
    ):
        return None
    return parts[1].removeprefix("sweep="), parts[2].removeprefix("job=")


def attempted_job_ids(out: Path | ResultStore) -> set[str]:
    """Job ids with at least one attempt (committed or not): a worker attempt directory in a local
    OUT, the driver's leased marks in an object store."""
    if isinstance(out, Path) or out.local_dir is not None:
        attempts = (out if isinstance(out, Path) else out.local(ROOT)) / ATTEMPTS_DIR
        if not attempts.is_dir():
            return set()
        return {p.name for p in attempts.iterdir() if p.is_dir()}
    return {key.split("/")[1] for key in out.list_files(ATTEMPTS_DIR) if key.count("/") >= 2}


def committed_job_ids(out: Path | ResultStore) -> set[str]:
    """Job ids whose jobs file exists (the commit marker), from the file names alone."""
    if isinstance(out, Path):
        return {p.parent.name.removeprefix("job=") for p in (out / "jobs").glob(f"sweep=*/job=*/{PART}")}
    return {ids[1] for key in out.list_files("jobs") if (ids := part_ids(key, "jobs"))}


def log_dir(out: Path, job_id: str, attempt: int) -> Path:
    """The directory of one attempt's server log (and its metrics snapshot)."""
    return out / "logs" / job_id / f"attempt-{attempt}"


def telemetry_samples(out: Path, job_id: str, attempt: int) -> Path:
    """The telemetry sampler's raw samples of one attempt (cut into levels by the node worker)."""
    return log_dir(out, job_id, attempt) / "telemetry.parquet"


def server_log(out: Path, job_id: str, attempt: int) -> Path:
    """One attempt's server log."""
    return log_dir(out, job_id, attempt) / "server.log"
