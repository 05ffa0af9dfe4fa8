"""Exactly once through a driver death at every step of the commit sequence.

For each way an attempt can end (success, final failure with the worker's row, final failure of a lost
worker, a failure that is retried) and each step of settling it (every rename of the attempt's files,
every queue transition), a child process runs the driver's own commit path and dies right after that
step (the SPECSWEEP_CRASH_AT hook: os._exit, like kill -9; no sleeps). The test then resumes as
``specsweep run --resume`` does and checks, for every job: its queue state, its attempts, and which
committed files it has; then finishes the sweep and checks that every job ended exactly once, its
committed row agreeing with the queue. The windows that publish files run again with the results in an
object store (moto's S3 server): there the files are PUTs of whole objects and the jobs row is the
commit object, so the same table must hold.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path

import pytest

from analysis import layout
from harness.driver import _prepare_queue
from harness.plan import Plan, unchecked_plan
from harness.progress import LogProgress
from harness.queue import AttemptRow, JobQueue, open_read_only, read_attempts
from harness.results import Output, output_for
from harness.spec import parse_spec
from specsweep.crash_points import CRASH_ENV, CRASH_EXIT_CODE
from tests.harness.crash_child import run_attempt
from tests.object_store import S3Server

REPO = Path(__file__).resolve().parents[2]

# (scenario, crash point) -> the crashed job after the resume: state, attempt outcomes, failures, files
WINDOWS: dict[tuple[str, str], tuple[str, list[str], int, set[str]]] = {
    ("success", "queue:lease"): ("pending", ["abandoned"], 0, set()),
    ("success", "commit:requests"): ("pending", ["abandoned"], 0, set()),
    ("success", "commit:levels"): ("pending", ["abandoned"], 0, set()),
    ("success", "commit:jobs"): ("done", ["done"], 0, {"requests", "levels", "jobs"}),
    ("success", "queue:complete"): ("done", ["done"], 0, {"requests", "levels", "jobs"}),
    ("final_failure", "commit:jobs"): ("failed", ["failed"], 1, {"jobs"}),
    ("final_failure", "queue:fail"): ("failed", ["failed"], 1, {"jobs"}),
    ("lost_final", "commit:jobs"): ("failed", ["failed"], 1, {"jobs"}),
    ("lost_final", "queue:fail"): ("failed", ["failed"], 1, {"jobs"}),
    ("retry", "queue:fail"): ("pending", ["failed"], 1, set()),
}
ERROR_CLASS = {"final_failure": "bad_args", "lost_final": "node_lost", "retry": "crash"}
# The windows between object writes, run against the bucket too.
STORE_WINDOWS = [
    ("success", "commit:requests"),
    ("success", "commit:levels"),
    ("success", "commit:jobs"),
    ("final_failure", "commit:jobs"),
    ("lost_final", "commit:jobs"),
]
CASES = [(s, p, "local") for s, p in WINDOWS] + [(s, p, "s3") for s, p in STORE_WINDOWS]


def sweep_plan(tmp_path: Path, retries: int) -> Plan:
    """Two jobs (a baseline-only sweep run twice); planning is pure, no server is involved."""
    spec = parse_spec(
        {
            "engine": "sim",
            "model_path": str(tmp_path / "target"),
            "load": {"concurrency": [1], "requests_per_level": 2},
            "repeats": 2,
            "retries": retries,
        }
    )
    return unchecked_plan(spec)


def resume(out: Output, plan: Plan) -> JobQueue:
    queue = JobQueue(out.state)
    _prepare_queue(queue, plan, out, LogProgress(io.StringIO()), search=False)
    return queue


def files_of(out: Output, sweep_id: str, job_id: str) -> set[str]:
    return {
        t
        for t in layout.COMMIT_ORDER
        if out.store.exists(layout.job_part_path(layout.ROOT, t, sweep_id, job_id))
    }


def row_status(out: Output, sweep_id: str, job_id: str) -> str | None:
    table = out.store.read_table(layout.job_part_path(layout.ROOT, "jobs", sweep_id, job_id))
    return table.column("status")[0].as_py() if table is not None else None


def queue_attempts(out: Output, job_id: str) -> list[AttemptRow]:
    conn = open_read_only(out.state)
    try:
        return read_attempts(conn, job_id)
    finally:
        conn.close()


@pytest.mark.parametrize(("scenario", "point", "where"), CASES, ids=[f"{s}@{p}-{w}" for s, p, w in CASES])
def test_resume_settles_each_job_exactly_once_when_the_driver_dies_after_a_commit_step(
    scenario: str, point: str, where: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """After a death at ``point`` the resumed queue, attempts and files say what happened; the finished
    sweep has every job done or failed once, with a committed row that agrees and results only for done."""
    retries = 0 if scenario == "lost_final" else 1
    plan = sweep_plan(tmp_path, retries)
    if where == "s3":
        s3: S3Server = request.getfixturevalue("s3")
        out = output_for(f"s3://{s3.new_bucket()}/sweep", str(tmp_path / "state"))
    else:
        out = output_for(tmp_path / "out")
    first, crashed = (job.job_id for job in plan.jobs)
    queue = resume(out, plan)
    assert run_attempt(out, queue, "success", retries) == "done"  # the first job, settled before the crash
    queue.close()

    child = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.harness.crash_child",
            out.store.describe(),
            str(out.state),
            scenario,
            str(retries),
        ],
        cwd=REPO,
        env={**os.environ, CRASH_ENV: point},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert child.returncode == CRASH_EXIT_CODE, child.stderr[-2000:]  # it died exactly there

    queue = resume(out, plan)
    try:
        state, outcomes, failures, files = WINDOWS[(scenario, point)]
        jobs = {j.id: j for j in queue.jobs()}
        assert (jobs[first].state, jobs[first].attempts, jobs[first].failures) == ("done", 1, 0)
        assert files_of(out, plan.sweep_id, first) == {"requests", "levels", "jobs"}
        assert (jobs[crashed].state, jobs[crashed].failures) == (state, failures)
        attempts = queue_attempts(out, crashed)
        assert [a.outcome for a in attempts] == outcomes
        if state == "failed":
            assert attempts[0].error_class == jobs[crashed].error_class == ERROR_CLASS[scenario]
        assert files_of(out, plan.sweep_id, crashed) == files

        while run_attempt(out, queue, "success", retries) is not None:  # finish the sweep
            pass
        for job in queue.jobs():
            assert job.state in ("done", "failed")
            assert row_status(out, plan.sweep_id, job.id) == job.state
            done_files = {"requests", "levels", "jobs"} if job.state == "done" else {"jobs"}
            assert files_of(out, plan.sweep_id, job.id) == done_files
            assert [a.outcome for a in queue_attempts(out, job.id)].count("done") == (job.state == "done")
    finally:
        queue.close()
