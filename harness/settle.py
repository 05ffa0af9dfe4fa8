"""The exactly-once rules in one place: how an attempt's answer becomes committed files and a queue
state, and how a resume settles what a dead driver left behind.

Files first, queue second: an attempt's ``requests`` and ``levels`` files are renamed into place, then
its ``jobs`` row (the commit marker, also written for a final failure), and only then does the queue
record the outcome. A driver can die after any of those steps, so a resume reads the committed files
(in a local OUT or an object store: the same keys, analysis.store) for every job it finds leased:

======================================  ============================================================
what the dead driver left               what the resume does
======================================  ============================================================
no jobs row of this attempt             remove any requests/levels file of the job, run it again
                                        (the attempt is abandoned: not counted as a failure)
a ``done`` row of this attempt          the job is done (the queue had not recorded it yet)
a ``failed`` row of this attempt        the job is failed with the row's class (a final failure)
======================================  ============================================================

Jobs the queue already shows done, failed or pending were settled before the crash and stay as they
are. A row counts only when it belongs to the job's latest attempt.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.schema import JobRecord
from harness.queue import JobQueue, Lease
from harness.results import Output, commit_attempt, commit_jobs_row, committed_row, drop_uncommitted_parts
from harness.retry import allowed_failures
from specsweep.error_classes import ErrorClass
from workers.job import AttemptResult, JobSpec


@dataclass(frozen=True, slots=True)
class Failure:
    """How an attempt failed. ``result`` is the worker's answer when there was one (it holds the worker's
    own jobs row); when the worker or its node was lost, ``lost_record`` is the jobs row the driver built
    for the attempt (the driver alone knows the node wing that builds it)."""

    error_class: ErrorClass
    message: str
    log_tail: str | None
    result: AttemptResult | None
    lost_record: JobRecord | None = None

    def __post_init__(self) -> None:
        if (self.result is None) == (self.lost_record is None):
            raise ValueError("a Failure holds either the worker's result or the driver's lost_record")


def settle_success(out: Output, queue: JobQueue, job: JobSpec, lease: Lease, result: AttemptResult) -> bool:
    """Commit a successful attempt (requests, levels, then the jobs row) and mark the job done, while the
    lease still holds; False (nothing written) for a stale lease."""
    if not queue.holds(lease.job_id, lease.token):
        queue.event("stale_result", f"attempt {lease.attempt} ignored: lease gone", lease.job_id)
        return False
    commit_attempt(out, job.sweep_id, result, tuple(result.files))
    return queue.complete(lease, node=result.node_host, worker_s=result.worker_s)


def settle_failure(
    out: Output, queue: JobQueue, job: JobSpec, lease: Lease, failure: Failure, *, retries: int
) -> str | None:
    """Apply the retry policy to a failed attempt. A final failure first gets its jobs row (and loses any
    requests/levels file an earlier crashed commit left), then the queue state. Returns the job's new
    state (pending for a retry, failed), None for a stale lease."""
    if not queue.holds(lease.job_id, lease.token):
        queue.event("stale_result", f"attempt {lease.attempt} ignored: lease gone", lease.job_id)
        return None
    allowed = allowed_failures(failure.error_class, retries)
    if queue.failures(lease.job_id) + 1 > allowed:
        drop_uncommitted_parts(out, job.sweep_id, job.job_id)
        if failure.result is not None:
            commit_attempt(out, job.sweep_id, failure.result, ("jobs",))
        elif failure.lost_record is not None:
            commit_jobs_row(out, failure.lost_record)
    return queue.fail(
        lease,
        error_class=failure.error_class,
        error_text=failure.message,
        log_tail=failure.log_tail,
        node=failure.result.node_host if failure.result else None,
        retry_limit=allowed,
        worker_s=failure.result.worker_s if failure.result else None,
    )


def settle_leftovers(queue: JobQueue, out: Output, sweep_id: str) -> None:
    """On resume: give every job a dead driver left leased the state its committed row says (see the
    table above), and put the others back to pending with their partial files removed."""
    for job_id in queue.ids_in("leased"):
        row = committed_row(out, sweep_id, job_id)
        if row is None or row.attempt != queue.attempts_of(job_id):
            drop_uncommitted_parts(out, sweep_id, job_id)
        elif row.status == "done":
            queue.mark_done(job_id, "results were committed before the previous driver stopped")
        else:
            queue.mark_failed(
                job_id,
                error_class=row.error_class or ErrorClass.CRASH,
                error_text=row.error_message or "",
                reason="its final failure was committed before the previous driver stopped",
            )
    queue.requeue(("leased",), "the previous driver stopped while the job ran")
