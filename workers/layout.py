"""Where every file of a sweep lives under the output directory (the layout agreed with analysis).

::

    OUT/sweep.yaml                                        the spec as run
    OUT/queue.sqlite                                      the durable queue (driver only)
    OUT/logs/<job>/attempt-<n>/server.log                 each attempt's server log
    OUT/_attempts/<job>/attempt-<n>/<table>.parquet       written by the worker (temp name + rename)
    OUT/<table>/sweep=<sweep>/job=<job>/part-0.parquet    committed by the driver; jobs LAST
    OUT/sweep/sweep=<sweep>/part-0.parquet                one row per sweep

A job is committed iff its ``jobs`` file exists; readers semi-join on it, so a crash mid-commit never
shows partial data, and a re-run overwrites the same paths (job ids are deterministic).
"""

from __future__ import annotations

from pathlib import Path

from analysis.layout import JOB_TABLES, attempt_path, job_part_path, sweep_part_path

SPEC_COPY = "sweep.yaml"
# The order the driver moves an attempt's tables into place: the jobs row last, it marks the commit.
COMMIT_ORDER: tuple[str, ...] = JOB_TABLES
__all__ = [
    "COMMIT_ORDER",
    "SPEC_COPY",
    "attempt_path",
    "job_part_path",
    "log_dir",
    "server_log",
    "sweep_part_path",
]


def log_dir(out: Path, job_id: str, attempt: int) -> Path:
    return out / "logs" / job_id / f"attempt-{attempt}"


def server_log(out: Path, job_id: str, attempt: int) -> Path:
    return log_dir(out, job_id, attempt) / "server.log"
