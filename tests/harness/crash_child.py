"""The child process of the crash-window tests (tests/harness/test_crash_windows.py).

``python -m tests.harness.crash_child OUT STATE SCENARIO RETRIES`` leases the next pending job of the
sweep in OUT (a directory or an object-store URI; STATE: the driver's state directory, OUT itself for a
directory) and settles one attempt of it through the driver's own code (harness.settle), as the driver
does with a worker's answer. The parent sets SPECSWEEP_CRASH_AT so that this process dies (os._exit, as by
kill -9) right after one rename or one queue transition.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from analysis import layout
from analysis.schema import jobs_table, levels_table, requests_table, write_parquet_atomic
from harness.driver import lost_attempt
from harness.queue import JobQueue, Lease
from harness.results import Output, output_for
from harness.settle import Failure, settle_failure, settle_success
from specsweep.error_classes import ErrorClass
from workers.job import AttemptResult, JobSpec
from workers.node.records import AttemptFacts, job_record

# scenario -> the error class of the attempt (None: success) and whether the worker answered at all
SCENARIOS: dict[str, tuple[ErrorClass | None, bool]] = {
    "success": (None, True),
    "final_failure": (ErrorClass.BAD_ARGS, True),  # deterministic: final at once, the worker's own jobs row
    "lost_final": (ErrorClass.NODE_LOST, False),  # no worker left: the driver writes the row (retries 0)
    "retry": (ErrorClass.CRASH, True),  # transient with retries left: back to pending, nothing committed
}


def worker_answer(state: Path, job: JobSpec, lease: Lease, error_class: ErrorClass | None) -> AttemptResult:
    """What a worker leaves for one attempt: its files under the state's _attempts/ (all three tables on
    success, only the jobs row on failure) and the result that names them."""
    record = job_record(
        job,
        attempt=lease.attempt,
        error_class=error_class,
        error_message=f"{error_class} in the test" if error_class else None,
        facts=AttemptFacts(node_host="node-test", finished_unix_ns=time.time_ns()),
    )
    tables = {"jobs": jobs_table([record])}
    if error_class is None:
        tables |= {"requests": requests_table([]), "levels": levels_table([])}
    files: dict[str, bytes] = {}
    for table, data in tables.items():
        path = layout.attempt_path(state, job.job_id, lease.attempt, table)
        write_parquet_atomic(data, path)
        files[table] = path.read_bytes()
    return AttemptResult(
        job_id=job.job_id,
        attempt=lease.attempt,
        lease_token=lease.token,
        error_class=error_class,
        error_text=record.error_message,
        log_tail=None,
        node_host="node-test",
        worker_s=0.1,
        files=files,
    )


def run_attempt(out: Output, queue: JobQueue, scenario: str, retries: int) -> str | None:
    """Lease the next pending job and settle one attempt of it; the job's new state (None: none left)."""
    lease = queue.lease(0, other_slots=False)
    if lease is None:
        return None
    job = JobSpec.model_validate_json(lease.payload)
    error_class, answered = SCENARIOS[scenario]
    result = worker_answer(out.state, job, lease, error_class) if answered else None
    if error_class is None:
        assert result is not None
        settle_success(out, queue, job, lease, result)
    else:
        message = f"{error_class} in the test"
        failure = (
            Failure(error_class, message, None, result)
            if result is not None
            else lost_attempt(job, lease, error_class, message)
        )
        settle_failure(out, queue, job, lease, failure, retries=retries)
    return next(j.state for j in queue.jobs() if j.id == job.job_id)


def main(argv: list[str]) -> int:
    out, scenario, retries = output_for(argv[0], argv[1]), argv[2], int(argv[3])
    queue = JobQueue(out.state)
    try:
        run_attempt(out, queue, scenario, retries)
    finally:
        queue.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
