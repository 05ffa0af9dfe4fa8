"""Server axes in the results: which axes a sweep swept, their values, and the jobs at one value.

``jobs.axes`` holds each job's axis values as a JSON object (``docs/results.md``); the ``job_axes`` view
has one row per job and axis. ``best --axis NAME`` ranks the jobs of each value of NAME on their own,
so every config is compared with the baseline measured at the same value (an algorithm comparison's
one baseline, which has no algorithm, in every algorithm's ranking).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb


def axis_values(con: duckdb.DuckDBPyConnection, axis: str) -> list[str]:
    """The values of ``axis`` the committed jobs ran, in the order the sweep first ran them; a
    ResultsError naming the sweep's axes when it has no such axis."""
    rows = con.execute(
        "SELECT value FROM job_axes a JOIN jobs j USING (sweep_id, job_id) WHERE a.axis = ? "
        "GROUP BY value ORDER BY min(j.started_unix_ns) NULLS LAST, value",
        [axis],
    ).fetchall()
    if rows:
        return [str(row[0]) for row in rows]
    names = [row[0] for row in con.sql("SELECT DISTINCT axis FROM job_axes ORDER BY 1").fetchall()]
    raise ResultsError(
        f"the sweep has no server axis {axis!r}",
        where="--axis",
        fix=f"use one of: {', '.join(names)}" if names else "the sweep swept no server axes: drop --axis",
    )


def jobs_elsewhere(con: duckdb.DuckDBPyConnection, axis: str, value: str) -> set[str]:
    """The committed jobs that ran ``axis`` at another value (what a ranking at that value skips). A job
    without the axis is in every value's ranking: the one baseline of an algorithm comparison, which
    runs no algorithm (the server axes, which every job has, are unaffected)."""
    rows = con.execute(
        "SELECT job_id FROM job_axes WHERE axis = ? AND value <> ?",
        [axis, value],
    ).fetchall()
    return {str(row[0]) for row in rows}
