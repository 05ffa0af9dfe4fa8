"""The SQLite job queue: leases with tokens, retries by slot, requeue, readable while written."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from harness.queue import (
    QUEUE_FILE,
    JobQueue,
    open_read_only,
    read_attempts,
    read_counts,
    read_jobs,
    read_meta,
)
from specsweep.error_classes import ErrorClass
from specsweep.errors import ResultsError


def filled(tmp_path: Path, n: int = 3) -> JobQueue:
    queue = JobQueue(tmp_path)
    queue.add_jobs([(f"job{i}", f"label{i}", f'{{"n": {i}}}') for i in range(n)])
    return queue


def test_queue_hands_jobs_in_plan_order_when_leased(tmp_path: Path) -> None:
    """Jobs come out in the order they were added, each with its own token and attempt 1."""
    queue = filled(tmp_path)
    leases = [queue.lease(slot, other_slots=True) for slot in range(3)]
    assert [lease.job_id for lease in leases if lease] == ["job0", "job1", "job2"]
    assert len({lease.token for lease in leases if lease}) == 3
    assert queue.lease(0, other_slots=True) is None
    assert queue.counts()["leased"] == 3


def test_queue_ignores_result_when_lease_token_is_stale(tmp_path: Path) -> None:
    """A result under an old token (the job was requeued and leased again) changes nothing."""
    queue = filled(tmp_path, 1)
    first = queue.lease(0, other_slots=True)
    assert first is not None
    queue.requeue(("leased",), "driver restarted")
    second = queue.lease(1, other_slots=True)
    assert second is not None and second.attempt == 2
    assert not queue.complete(first, node="a")
    assert queue.counts()["leased"] == 1
    assert queue.complete(second, node="b")
    assert queue.counts()["done"] == 1


def test_queue_retries_on_another_slot_then_fails_when_failures_exceed_limit(tmp_path: Path) -> None:
    """A failed job avoids its slot while another exists, and fails once past its retry limit."""
    queue = filled(tmp_path, 1)
    lease = queue.lease(0, other_slots=True)
    assert lease is not None
    assert (
        queue.fail(lease, error_class="crash", error_text="boom", log_tail="tail", node="n0", retry_limit=1)
        == "pending"
    )
    assert queue.lease(0, other_slots=True) is None  # waits for the other slot
    retry = queue.lease(1, other_slots=True)
    assert retry is not None and retry.attempt == 2
    assert (
        queue.fail(retry, error_class="crash", error_text="boom", log_tail=None, node="n1", retry_limit=1)
        == "failed"
    )
    reader = open_read_only(tmp_path)
    attempts = read_attempts(reader, "job0")
    reader.close()
    assert [(a.slot, a.outcome, a.error_class) for a in attempts] == [
        (0, "failed", "crash"),
        (1, "failed", "crash"),
    ]


def test_queue_reuses_same_slot_when_it_is_the_only_one(tmp_path: Path) -> None:
    """With no other slot alive, a retry may run where it failed."""
    queue = filled(tmp_path, 1)
    lease = queue.lease(0, other_slots=False)
    assert lease is not None
    queue.fail(lease, error_class="crash", error_text="x", log_tail=None, node=None, retry_limit=2)
    assert queue.lease(0, other_slots=False) is not None


def test_queue_keeps_done_jobs_when_jobs_are_added_again(tmp_path: Path) -> None:
    """Resume adds the plan again: known ids keep their state."""
    queue = filled(tmp_path, 2)
    lease = queue.lease(0, other_slots=True)
    assert lease is not None and queue.complete(lease, node=None)
    queue.close()
    again = filled(tmp_path, 3)
    assert again.counts() == {"pending": 2, "leased": 0, "done": 1, "failed": 0}


def test_queue_is_readable_by_another_connection_when_driver_writes(tmp_path: Path) -> None:
    """`specsweep status` reads a consistent view while the driver holds the file open (WAL)."""
    queue = filled(tmp_path, 2)
    reader = open_read_only(tmp_path)
    assert read_counts(reader)["pending"] == 2
    lease = queue.lease(0, other_slots=True)
    assert lease is not None
    assert read_counts(reader) == {"pending": 1, "leased": 1, "done": 0, "failed": 0}
    reader.close()


def test_queue_file_appears_with_its_tables_when_created(tmp_path: Path) -> None:
    """The queue is built under a temporary name and linked into place: the first moment
    ``queue.sqlite`` exists, a reader (``status``, a test polling it) finds the jobs table, and no
    temporary file is left behind."""
    queue = JobQueue(tmp_path)
    queue.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["queue.sqlite"]
    conn = open_read_only(tmp_path)
    assert read_counts(conn) == {"pending": 0, "leased": 0, "done": 0, "failed": 0}
    conn.close()


def test_queue_keeps_the_existing_file_when_another_process_created_it_first(tmp_path: Path) -> None:
    """Two processes racing to create the queue: the loser's file is dropped, the winner's jobs stay."""
    from harness.queue import _create_queue_file

    filled(tmp_path, 2).close()
    _create_queue_file(tmp_path / "queue.sqlite")
    conn = open_read_only(tmp_path)
    assert read_counts(conn)["pending"] == 2
    conn.close()
    assert not [p for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def _events(path: Path) -> list[tuple[str | None, str, str | None]]:
    """The queue file's event log (job, kind, detail) in order, as sqlite3 shows it to a user."""
    with sqlite3.connect(path / QUEUE_FILE) as con:
        return con.execute(
            "SELECT job_id, kind, detail FROM events WHERE kind != 'jobs_added' ORDER BY seq"
        ).fetchall()


def test_queue_records_a_retried_and_a_final_failure_in_jobs_attempts_and_events(tmp_path: Path) -> None:
    """``specsweep status`` reads the jobs and attempts rows: a retried failure leaves the job pending with
    no finish time; the final one stamps it; each attempt keeps its node, error, log tail and worker time;
    the event log says retry, then failed, and that a stale result was ignored."""
    queue = filled(tmp_path, 1)
    first = queue.lease(0, other_slots=True)
    assert first is not None
    state = queue.fail(
        first,
        error_class=ErrorClass.CRASH,
        error_text="boom",
        log_tail="tail 1",
        node="n0",
        retry_limit=1,
        worker_s=1.5,
    )
    assert state == "pending"
    (job,) = queue.jobs()
    assert (job.state, job.failures, job.error_class, job.error_text, job.finished_ns) == (
        "pending",
        1,
        "crash",
        "boom",
        None,
    )
    second = queue.lease(1, other_slots=True)
    assert second is not None
    assert (
        queue.fail(
            first, error_class=ErrorClass.HEALTH_LOST, error_text="x", log_tail=None, node="n9", retry_limit=1
        )
        is None
    )
    state = queue.fail(
        second,
        error_class=ErrorClass.CUDA_OOM,
        error_text="out of memory",
        log_tail="tail 2",
        node="n1",
        retry_limit=1,
    )
    assert state == "failed"
    (job,) = queue.jobs()
    assert (job.state, job.failures, job.error_class, job.error_text) == (
        "failed",
        2,
        "cuda_oom",
        "out of memory",
    )
    assert job.finished_ns is not None and job.leased_ns is not None and job.finished_ns >= job.leased_ns
    attempts = queue.attempts()
    assert [
        (a.attempt, a.slot, a.node, a.outcome, a.error_class, a.error_text, a.log_tail, a.worker_s)
        for a in attempts
    ] == [
        (1, 0, "n0", "failed", "crash", "boom", "tail 1", 1.5),
        (2, 1, "n1", "failed", "cuda_oom", "out of memory", "tail 2", None),
    ]
    assert all(a.finished_ns is not None and a.finished_ns >= a.started_ns for a in attempts)
    queue.close()
    assert _events(tmp_path) == [
        ("job0", "leased", "attempt 1 on slot 0"),
        ("job0", "retry", "crash: boom"),
        ("job0", "leased", "attempt 2 on slot 1"),
        ("job0", "stale_result", "attempt 1 ignored: lease gone"),
        ("job0", "failed", "cuda_oom: out of memory"),
    ]


def test_queue_marks_a_committed_job_done_on_resume_with_its_running_attempt(tmp_path: Path) -> None:
    """Resume found the job's results committed: the job and its running attempt are done, stamped, and
    the event log gives the reason; other jobs and attempts are untouched."""
    queue = filled(tmp_path, 2)
    lease = queue.lease(0, other_slots=True)
    other = queue.lease(1, other_slots=True)
    assert lease is not None and other is not None
    queue.mark_done("job0", "committed before the driver died")
    jobs = {job.id: job for job in queue.jobs()}
    assert jobs["job0"].state == "done" and jobs["job0"].finished_ns is not None
    assert jobs["job1"].state == "leased" and jobs["job1"].finished_ns is None
    assert not queue.holds("job0", lease.token)
    attempts = {a.job_id: a for a in queue.attempts()}
    assert attempts["job0"].outcome == "done" and attempts["job0"].finished_ns is not None
    assert attempts["job1"].outcome == "running" and attempts["job1"].finished_ns is None
    queue.close()
    assert _events(tmp_path)[-1] == ("job0", "done", "committed before the driver died")


def test_queue_release_puts_a_leased_job_back_without_a_failure_and_ignores_a_stale_lease(
    tmp_path: Path,
) -> None:
    """A driver that stops hands its jobs back: pending, no failure counted, the attempt released with the
    reason; a release under a token the job no longer holds changes nothing."""
    queue = filled(tmp_path, 1)
    lease = queue.lease(0, other_slots=True)
    assert lease is not None
    queue.release(lease, "driver stopped (SIGTERM)")
    (job,) = queue.jobs()
    assert (job.state, job.failures, job.attempts) == ("pending", 0, 1)
    assert queue.failures("job0") == 0
    (attempt,) = queue.attempts()
    assert (attempt.outcome, attempt.error_class, attempt.error_text, attempt.node) == (
        "released",
        None,
        "driver stopped (SIGTERM)",
        None,
    )
    assert attempt.finished_ns is not None
    again = queue.lease(0, other_slots=True)  # no failure, so its own slot is not avoided
    assert again is not None and again.attempt == 2
    queue.release(lease, "stale")
    assert [j.state for j in queue.jobs()] == ["leased"]
    assert [a.outcome for a in queue.attempts()] == ["released", "running"]
    queue.close()
    assert [e for e in _events(tmp_path) if e[1] == "released"] == [
        ("job0", "released", "driver stopped (SIGTERM)")
    ]


def test_queue_counts_failures_per_job_and_shows_meta_and_sweep_events_to_status(tmp_path: Path) -> None:
    """``failures`` is what the settle step compares with the retry limit; meta and events are in the file."""
    queue = filled(tmp_path, 2)
    for slot in (0, 1):
        lease = queue.lease(slot, other_slots=False)
        assert lease is not None and lease.job_id == "job0"
        queue.fail(
            lease, error_class=ErrorClass.CRASH, error_text="boom", log_tail=None, node=None, retry_limit=5
        )
    assert (queue.failures("job0"), queue.failures("job1")) == (2, 0)
    queue.set_meta("sweep_id", "s1")
    queue.event("slot_lost", "node n3 left", job_id="job1")
    queue.event("driver_stopped", "SIGTERM")
    queue.close()
    reader = open_read_only(tmp_path)
    try:
        assert read_meta(reader) == {"sweep_id": "s1"}
    finally:
        reader.close()
    assert _events(tmp_path)[-2:] == [
        ("job1", "slot_lost", "node n3 left"),
        (None, "driver_stopped", "SIGTERM"),
    ]


def test_queue_marks_a_committed_failure_failed_on_resume_counting_its_running_attempt(
    tmp_path: Path,
) -> None:
    """Resume found the job's final failed row committed: the job fails with that error, the running
    attempt becomes that failure and counts as one; other jobs keep their state."""
    queue = filled(tmp_path, 2)
    first = queue.lease(0, other_slots=True)
    assert first is not None
    queue.fail(
        first, error_class=ErrorClass.CRASH, error_text="boom", log_tail=None, node="n0", retry_limit=3
    )
    second = queue.lease(1, other_slots=True)
    assert second is not None and second.job_id == "job0" and queue.attempts_of("job0") == 2
    assert queue.lease(0, other_slots=True) is not None  # job1, left running
    queue.mark_failed("job0", error_class="cuda_oom", error_text="out of memory", reason="committed row")
    jobs = {job.id: job for job in queue.jobs()}
    job0 = jobs["job0"]
    assert (job0.state, job0.failures, job0.error_class, job0.error_text) == (
        "failed",
        2,
        "cuda_oom",
        "out of memory",
    )
    assert job0.finished_ns is not None and not queue.holds("job0", second.token)
    assert (jobs["job1"].state, jobs["job1"].failures) == ("leased", 0)
    attempts = [(a.job_id, a.attempt, a.outcome, a.error_class, a.error_text) for a in queue.attempts()]
    assert attempts == [
        ("job0", 1, "failed", "crash", "boom"),
        ("job0", 2, "failed", "cuda_oom", "out of memory"),
        ("job1", 1, "running", None, None),
    ]
    assert all(a.finished_ns is not None for a in queue.attempts() if a.job_id == "job0")
    assert (
        queue.ids_in("failed") == ["job0"]
        and queue.ids_in("leased") == ["job1"]
        and queue.ids_in("done") == []
    )
    assert queue.attempts_of("job1") == 1
    queue.close()
    assert _events(tmp_path)[-1] == ("job0", "failed", "cuda_oom: out of memory (committed row)")


def test_queue_meta_reads_back_and_a_backup_is_a_whole_copy(tmp_path: Path) -> None:
    """Meta values read back (None when unset, replaced when set again); a backup holds jobs and meta."""
    queue = filled(tmp_path / "q", 2)
    assert queue.get_meta("sweep_id") is None
    queue.set_meta("sweep_id", "s1")
    queue.set_meta("sweep_id", "s2")
    assert queue.get_meta("sweep_id") == "s2"
    with sqlite3.connect(tmp_path / "copy.sqlite") as copy:
        queue.backup(copy)
        assert copy.execute("SELECT id FROM jobs ORDER BY position").fetchall() == [("job0",), ("job1",)]
        assert read_meta(copy) == {"sweep_id": "s2"}
    queue.close()


def test_queue_life_of_a_sweep_as_status_and_the_event_log_show_it(tmp_path: Path) -> None:
    """Jobs added (again), leased with their payload, completed (a stale completion ignored), requeued
    from two states at once after a driver death: the rows and the events say each step."""
    queue = JobQueue(tmp_path)
    jobs = [(f"job{i}", f"label{i}", f'{{"n": {i}}}') for i in range(3)]
    assert queue.add_jobs(jobs) == 3
    assert queue.add_jobs([*jobs, ("job3", "label3", "{}")]) == 1
    done = queue.lease(0, other_slots=True)
    crashed = queue.lease(1, other_slots=True)
    assert (
        done is not None
        and crashed is not None
        and (done.payload, crashed.payload) == ('{"n": 0}', '{"n": 1}')
    )
    assert queue.complete(done, node="n0", worker_s=2.5)
    assert not queue.complete(done, node="n0")
    failed = queue.lease(0, other_slots=True)
    assert failed is not None and failed.job_id == "job2"
    queue.fail(
        failed, error_class=ErrorClass.CRASH, error_text="boom", log_tail=None, node=None, retry_limit=0
    )
    assert queue.requeue(("leased", "failed"), "driver restarted") == ["job1", "job2"]
    assert [(j.id, j.state, j.failures, j.finished_ns) for j in queue.jobs()][1:3] == [
        ("job1", "pending", 0, None),
        ("job2", "pending", 0, None),
    ]
    queue.close()
    reader = open_read_only(tmp_path)
    try:
        (first,) = read_attempts(reader, "job0")
        assert (first.node, first.outcome, first.worker_s, first.error_class) == ("n0", "done", 2.5, None)
        everything = read_attempts(reader)
    finally:
        reader.close()
    assert [(a.job_id, a.outcome) for a in everything] == [
        ("job0", "done"),
        ("job1", "abandoned"),
        ("job2", "failed"),
    ]
    with sqlite3.connect(tmp_path / QUEUE_FILE) as con:
        log = con.execute("SELECT job_id, kind, detail FROM events ORDER BY seq").fetchall()
    assert log == [
        (None, "jobs_added", "3 new of 3"),
        (None, "jobs_added", "1 new of 4"),
        ("job0", "leased", "attempt 1 on slot 0"),
        ("job1", "leased", "attempt 1 on slot 1"),
        ("job0", "done", "attempt 1 on slot 0"),
        ("job0", "stale_result", "attempt 1 ignored: lease gone"),
        ("job2", "leased", "attempt 1 on slot 0"),
        ("job2", "failed", "crash: boom"),
        ("job1", "requeued", "driver restarted"),
        ("job2", "requeued", "driver restarted"),
    ]


def test_queue_adds_jobs_all_or_nothing_when_one_cannot_be_stored(tmp_path: Path) -> None:
    """A write that fails half way leaves the queue as it was, and the queue takes the next write."""
    queue = JobQueue(tmp_path / "new" / "out")  # its directory is made, parents too
    with pytest.raises(sqlite3.Error):
        queue.add_jobs([("job0", "label0", "{}"), ("job1", "label1", object())])  # type: ignore[list-item]
    assert queue.jobs() == []
    assert queue.add_jobs([("job0", "label0", "{}")]) == 1
    queue.close()
    reader = open_read_only(tmp_path / "new" / "out")
    try:
        assert [job.id for job in read_jobs(reader)] == ["job0"]
        with pytest.raises(sqlite3.OperationalError, match="readonly"):  # status only reads
            reader.execute("DELETE FROM jobs")
    finally:
        reader.close()


def test_queue_refuses_an_empty_queue_file_and_a_missing_one_naming_the_file(tmp_path: Path) -> None:
    """An empty queue.sqlite (a copy cut short) is a one-line error with the fix; status on a directory
    without a queue names the file it looked for."""
    path = tmp_path / QUEUE_FILE
    path.write_bytes(b"")
    with pytest.raises(ResultsError) as err:
        JobQueue(tmp_path)
    assert str(err.value) == (
        f"{path}: the sweep queue is damaged or empty (the file is empty)\n"
        "  fix: restore OUT/queue.sqlite from a copy; the committed results in OUT are intact and readable "
        "with `specsweep best/report/sql`"
    )
    with pytest.raises(FileNotFoundError) as missing:
        open_read_only(tmp_path / "elsewhere")
    assert str(missing.value) == str(tmp_path / "elsewhere" / QUEUE_FILE)
