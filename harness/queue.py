"""The durable job queue: SQLite in WAL mode in the output directory, written only by the driver.

Ray keeps nothing durable, so the sweep's state lives here: one row per job (state, attempts, the
current lease token, the last error), one row per attempt (slot, outcome, error class, log tail) and an
append-only events table. A lease token fences completions: a result is accepted only while the job is
still leased under the token it was handed out with, so a late answer from a worker the driver gave up
on is ignored. ``specsweep status`` reads the same file while a sweep runs (WAL lets it).
"""

from __future__ import annotations

import contextlib
import os
import sqlite3
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from specsweep.crash_points import crash_point
from specsweep.error_classes import ErrorClass
from specsweep.errors import ResultsError

QUEUE_FILE = "queue.sqlite"
STARTED_KEY = "created_ns"  # meta: set once the sweep's jobs were first added (the sweep has started)
PHASE_KEY = "driver_phase"  # meta: what the driver is doing, as JSON (harness.startup)
JOB_STATES: tuple[str, ...] = ("pending", "leased", "done", "failed")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE IF NOT EXISTS jobs (
    id TEXT PRIMARY KEY,
    position INTEGER NOT NULL,
    label TEXT NOT NULL,
    payload TEXT NOT NULL,
    state TEXT NOT NULL CHECK (state IN ('pending', 'leased', 'done', 'failed')),
    attempts INTEGER NOT NULL DEFAULT 0,
    failures INTEGER NOT NULL DEFAULT 0,
    lease_token TEXT,
    slot INTEGER,
    avoid_slot INTEGER,
    error_class TEXT,
    error_text TEXT,
    created_ns INTEGER NOT NULL,
    leased_ns INTEGER,
    finished_ns INTEGER,
    updated_ns INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS jobs_state_position ON jobs (state, position);
CREATE TABLE IF NOT EXISTS attempts (
    job_id TEXT NOT NULL,
    attempt INTEGER NOT NULL,
    slot INTEGER NOT NULL,
    lease_token TEXT NOT NULL,
    node TEXT,
    outcome TEXT NOT NULL,
    error_class TEXT,
    error_text TEXT,
    log_tail TEXT,
    worker_s REAL,
    started_ns INTEGER NOT NULL,
    finished_ns INTEGER,
    PRIMARY KEY (job_id, attempt)
);
CREATE TABLE IF NOT EXISTS events (
    seq INTEGER PRIMARY KEY AUTOINCREMENT,
    ts_ns INTEGER NOT NULL,
    job_id TEXT,
    kind TEXT NOT NULL,
    detail TEXT
);
"""


@dataclass(frozen=True, slots=True)
class Lease:
    """A job handed to one slot: the token that must come back with its result."""

    job_id: str
    token: str
    attempt: int
    slot: int
    payload: str


@dataclass(frozen=True, slots=True)
class JobRow:
    """One job as ``specsweep status`` shows it."""

    id: str
    position: int
    label: str
    state: str
    attempts: int
    failures: int
    slot: int | None
    error_class: str | None
    error_text: str | None
    leased_ns: int | None
    finished_ns: int | None


@dataclass(frozen=True, slots=True)
class AttemptRow:
    """One attempt of one job: where it ran and how it ended."""

    job_id: str
    attempt: int
    slot: int
    node: str | None
    outcome: str
    error_class: str | None
    error_text: str | None
    log_tail: str | None
    worker_s: float | None  # the worker's own time for the attempt (None: no answer came)
    started_ns: int
    finished_ns: int | None


@contextmanager
def readable_queue(path: Path) -> Iterator[None]:
    """Turn SQLite's "file is not a database" / "no such table" into one line naming the file."""
    try:
        yield
    except sqlite3.DatabaseError as err:
        raise ResultsError(
            f"the sweep queue is damaged or empty ({err})",
            where=str(path),
            fix="restore OUT/queue.sqlite from a copy; the committed results in OUT are intact and "
            "readable with `specsweep best/report/sql`",
        ) from None


def _connect(path: Path, *, read_only: bool) -> sqlite3.Connection:
    if read_only:
        conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True, timeout=10.0, isolation_level=None)
    else:
        conn = sqlite3.connect(path, timeout=10.0, isolation_level=None)
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA busy_timeout=10000")
    return conn


def _create_queue_file(path: Path) -> None:
    """Build the schema under a temporary name, then link it into place, so a reader (``status``, a
    second driver) never opens a queue file that has no tables yet. ``os.link`` refuses to replace: if
    another process created the queue first, its file stays and this one is dropped."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        conn = _connect(tmp, read_only=False)
        try:
            conn.executescript(_SCHEMA)
        finally:
            conn.close()
        with contextlib.suppress(FileExistsError):
            os.link(tmp, path)
    finally:
        for leftover in (tmp, tmp.with_name(tmp.name + "-wal"), tmp.with_name(tmp.name + "-shm")):
            leftover.unlink(missing_ok=True)


class JobQueue:
    """The driver's handle on the queue. One instance, one thread: the driver is the only writer."""

    def __init__(self, out_dir: str | Path) -> None:
        self.path = Path(out_dir) / QUEUE_FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with readable_queue(self.path):
            if not self.path.exists():
                _create_queue_file(self.path)
            elif self.path.stat().st_size == 0:
                raise sqlite3.DatabaseError("the file is empty")
            self._conn = _connect(self.path, read_only=False)
            self._conn.executescript(_SCHEMA)
            read_counts(self._conn)

    def close(self) -> None:
        self._conn.close()

    def backup(self, target: sqlite3.Connection) -> None:
        """Copy the whole queue into ``target`` as of one moment (SQLite's online backup)."""
        self._conn.backup(target)

    # --- setup ---------------------------------------------------------------------------------------

    def get_meta(self, key: str) -> str | None:
        row = self._conn.execute("SELECT value FROM meta WHERE key = ?", (key,)).fetchone()
        return None if row is None else row[0]

    def set_meta(self, key: str, value: str) -> None:
        self._conn.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", (key, value))

    def add_jobs(self, jobs: list[tuple[str, str, str]]) -> int:
        """Insert (id, label, payload) jobs in order; ids already present are kept as they are."""
        now = time.time_ns()
        with self._transaction():
            start = self._conn.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM jobs").fetchone()[0]
            added = 0
            for offset, (job_id, label, payload) in enumerate(jobs):
                cur = self._conn.execute(
                    "INSERT OR IGNORE INTO jobs (id, position, label, payload, state, created_ns, updated_ns)"
                    " VALUES (?, ?, ?, ?, 'pending', ?, ?)",
                    (job_id, start + offset, label, payload, now, now),
                )
                added += cur.rowcount
            self._event(None, "jobs_added", f"{added} new of {len(jobs)}")
        return added

    def withdraw(self, job_ids: list[str], reason: str) -> list[str]:
        """Remove the pending jobs among ``job_ids`` (superseded: they will not run under these ids);
        jobs done, failed or leased stay. Returns the ids removed."""
        removed = []
        with self._transaction():
            for job_id in job_ids:
                cur = self._conn.execute("DELETE FROM jobs WHERE id = ? AND state = 'pending'", (job_id,))
                if cur.rowcount:
                    removed.append(job_id)
                    self._event(job_id, "withdrawn", reason)
        return removed

    # --- leasing -------------------------------------------------------------------------------------

    def lease(self, slot: int, *, other_slots: bool) -> Lease | None:
        """Hand the first pending job to ``slot``; a job that failed on this slot waits for another one
        while ``other_slots`` says there is one."""
        with self._transaction():
            row = self._conn.execute(
                "SELECT id, payload, attempts FROM jobs WHERE state = 'pending'"
                " AND (avoid_slot IS NULL OR avoid_slot != ? OR ?) ORDER BY position LIMIT 1",
                (slot, not other_slots),
            ).fetchone()
            if row is None:
                return None
            job_id, payload, attempts = row
            token = uuid.uuid4().hex
            now = time.time_ns()
            attempt = attempts + 1
            self._conn.execute(
                "UPDATE jobs SET state = 'leased', attempts = ?, lease_token = ?, slot = ?, leased_ns = ?,"
                " updated_ns = ? WHERE id = ?",
                (attempt, token, slot, now, now, job_id),
            )
            self._conn.execute(
                "INSERT OR REPLACE INTO attempts (job_id, attempt, slot, lease_token, outcome, started_ns)"
                " VALUES (?, ?, ?, ?, 'running', ?)",
                (job_id, attempt, slot, token, now),
            )
            self._event(job_id, "leased", f"attempt {attempt} on slot {slot}")
        crash_point("queue:lease")
        return Lease(job_id=job_id, token=token, attempt=attempt, slot=slot, payload=payload)

    def holds(self, job_id: str, token: str) -> bool:
        """Whether ``token`` is still the live lease of ``job_id`` (the fence for results)."""
        row = self._conn.execute(
            "SELECT 1 FROM jobs WHERE id = ? AND state = 'leased' AND lease_token = ?", (job_id, token)
        ).fetchone()
        return row is not None

    def complete(self, lease: Lease, *, node: str | None, worker_s: float | None = None) -> bool:
        """Mark the job done if the lease still holds; False (and nothing changed) for a stale lease."""
        with self._transaction():
            if not self.holds(lease.job_id, lease.token):
                self._event(lease.job_id, "stale_result", f"attempt {lease.attempt} ignored: lease gone")
                return False
            now = time.time_ns()
            self._conn.execute(
                "UPDATE jobs SET state = 'done', lease_token = NULL, error_class = NULL, error_text = NULL,"
                " finished_ns = ?, updated_ns = ? WHERE id = ?",
                (now, now, lease.job_id),
            )
            self._finish_attempt(lease, "done", node, None, None, None, worker_s)
            self._event(lease.job_id, "done", f"attempt {lease.attempt} on slot {lease.slot}")
        crash_point("queue:complete")
        return True

    def fail(
        self,
        lease: Lease,
        *,
        error_class: ErrorClass,
        error_text: str,
        log_tail: str | None,
        node: str | None,
        retry_limit: int,
        worker_s: float | None = None,
    ) -> str | None:
        """Record a failed attempt; the job goes back to pending (avoiding this slot) while it has
        failed at most ``retry_limit`` times, else to failed. Returns the new state, None if stale."""
        with self._transaction():
            if not self.holds(lease.job_id, lease.token):
                self._event(lease.job_id, "stale_result", f"attempt {lease.attempt} ignored: lease gone")
                return None
            failures = (
                self._conn.execute("SELECT failures FROM jobs WHERE id = ?", (lease.job_id,)).fetchone()[0]
                + 1
            )
            state = "pending" if failures <= retry_limit else "failed"
            now = time.time_ns()
            self._conn.execute(
                "UPDATE jobs SET state = ?, failures = ?, lease_token = NULL, avoid_slot = ?,"
                " error_class = ?, error_text = ?, finished_ns = ?, updated_ns = ? WHERE id = ?",
                (
                    state,
                    failures,
                    lease.slot,
                    error_class,
                    error_text,
                    now if state == "failed" else None,
                    now,
                    lease.job_id,
                ),
            )
            self._finish_attempt(lease, "failed", node, error_class, error_text, log_tail, worker_s)
            self._event(
                lease.job_id, "retry" if state == "pending" else "failed", f"{error_class}: {error_text}"
            )
        crash_point("queue:fail")
        return state

    def release(self, lease: Lease, reason: str, error_class: ErrorClass | None = None) -> None:
        """Put a leased job back to pending without counting a failure (the driver is stopping); with
        ``error_class`` the attempt and the job's last error say why (``status`` shows it)."""
        with self._transaction():
            if not self.holds(lease.job_id, lease.token):
                return
            self._conn.execute(
                "UPDATE jobs SET state = 'pending', lease_token = NULL, updated_ns = ?,"
                " error_class = coalesce(?, error_class), error_text = CASE WHEN ? IS NULL THEN error_text"
                " ELSE ? END WHERE id = ?",
                (time.time_ns(), error_class, error_class, reason, lease.job_id),
            )
            self._finish_attempt(lease, "released", None, error_class, reason, None, None)
            self._event(lease.job_id, "released", f"{error_class}: {reason}" if error_class else reason)
        crash_point("queue:release")

    def requeue(self, states: tuple[str, ...], reason: str) -> list[str]:
        """Move every job in ``states`` back to pending (resume after a dead driver, or a retry of the
        failed ones); failures are reset for failed jobs so they get their retries again."""
        placeholders = ",".join("?" for _ in states)
        with self._transaction():
            ids = [
                r[0]
                for r in self._conn.execute(
                    f"SELECT id FROM jobs WHERE state IN ({placeholders}) ORDER BY position", states
                )
            ]
            now = time.time_ns()
            for job_id in ids:
                self._conn.execute(
                    "UPDATE jobs SET failures = CASE WHEN state = 'failed' THEN 0 ELSE failures END,"
                    " state = 'pending', lease_token = NULL, finished_ns = NULL, updated_ns = ? WHERE id = ?",
                    (now, job_id),
                )
                self._conn.execute(
                    "UPDATE attempts SET outcome = 'abandoned', finished_ns = ? WHERE job_id = ?"
                    " AND outcome = 'running'",
                    (now, job_id),
                )
                self._event(job_id, "requeued", reason)
        crash_point("queue:requeue")
        return ids

    def mark_done(self, job_id: str, reason: str) -> None:
        """Mark a job done whose results are already committed (found on resume)."""
        now = time.time_ns()
        with self._transaction():
            self._conn.execute(
                "UPDATE jobs SET state = 'done', lease_token = NULL, finished_ns = ?, updated_ns = ?"
                " WHERE id = ?",
                (now, now, job_id),
            )
            self._conn.execute(
                "UPDATE attempts SET outcome = 'done', finished_ns = ? WHERE job_id = ? AND outcome = 'running'",
                (now, job_id),
            )
            self._event(job_id, "done", reason)
        crash_point("queue:mark_done")

    def mark_failed(self, job_id: str, *, error_class: str, error_text: str, reason: str) -> None:
        """Mark a job failed whose final failed ``jobs`` row is already committed (found on resume):
        the running attempt becomes that failure and counts as one."""
        now = time.time_ns()
        with self._transaction():
            self._conn.execute(
                "UPDATE jobs SET state = 'failed', failures = failures + 1, lease_token = NULL,"
                " error_class = ?, error_text = ?, finished_ns = ?, updated_ns = ? WHERE id = ?",
                (error_class, error_text, now, now, job_id),
            )
            self._conn.execute(
                "UPDATE attempts SET outcome = 'failed', error_class = ?, error_text = ?, finished_ns = ?"
                " WHERE job_id = ? AND outcome = 'running'",
                (error_class, error_text, now, job_id),
            )
            self._event(job_id, "failed", f"{error_class}: {error_text} ({reason})")
        crash_point("queue:mark_failed")

    def attempts_of(self, job_id: str) -> int:
        """Attempts of ``job_id`` so far (the number of its latest lease)."""
        return int(self._conn.execute("SELECT attempts FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])

    def event(self, kind: str, detail: str, job_id: str | None = None) -> None:
        """Record something that happened to the sweep (slot lost, driver stopped, ...)."""
        self._event(job_id, kind, detail)

    # --- reading -------------------------------------------------------------------------------------

    def counts(self) -> dict[str, int]:
        return read_counts(self._conn)

    def jobs(self) -> list[JobRow]:
        return read_jobs(self._conn)

    def attempts(self) -> list[AttemptRow]:
        return read_attempts(self._conn)

    def failures(self, job_id: str) -> int:
        """Failed attempts of ``job_id`` so far."""
        return int(self._conn.execute("SELECT failures FROM jobs WHERE id = ?", (job_id,)).fetchone()[0])

    def ids_in(self, state: str) -> list[str]:
        rows = self._conn.execute("SELECT id FROM jobs WHERE state = ? ORDER BY position", (state,))
        return [r[0] for r in rows]

    # --- internals -----------------------------------------------------------------------------------

    def _transaction(self) -> _Transaction:
        return _Transaction(self._conn)

    def _finish_attempt(
        self,
        lease: Lease,
        outcome: str,
        node: str | None,
        error_class: str | None,
        error_text: str | None,
        log_tail: str | None,
        worker_s: float | None,
    ) -> None:
        self._conn.execute(
            "UPDATE attempts SET outcome = ?, node = COALESCE(?, node), error_class = ?, error_text = ?,"
            " log_tail = ?, worker_s = ?, finished_ns = ? WHERE job_id = ? AND attempt = ?",
            (
                outcome,
                node,
                error_class,
                error_text,
                log_tail,
                worker_s,
                time.time_ns(),
                lease.job_id,
                lease.attempt,
            ),
        )

    def _event(self, job_id: str | None, kind: str, detail: str) -> None:
        self._conn.execute(
            "INSERT INTO events (ts_ns, job_id, kind, detail) VALUES (?, ?, ?, ?)",
            (time.time_ns(), job_id, kind, detail),
        )


class _Transaction:
    """BEGIN IMMEDIATE ... COMMIT (ROLLBACK on error); nested use joins the outer transaction."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._outer = False

    def __enter__(self) -> None:
        self._outer = not self._conn.in_transaction
        if self._outer:
            self._conn.execute("BEGIN IMMEDIATE")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        if not self._outer:
            return
        self._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")


# --- read-only access (specsweep status, tests) ------------------------------------------------------


def open_read_only(out_dir: str | Path) -> sqlite3.Connection:
    """A connection that only reads the queue of ``out_dir`` (safe while the driver writes)."""
    path = Path(out_dir) / QUEUE_FILE
    if not path.is_file():
        raise FileNotFoundError(path)
    return _connect(path, read_only=True)


def holds_sweep(out_dir: str | Path) -> bool:
    """Whether the queue of ``out_dir`` holds a sweep: any queue file does, except one whose driver
    recorded its start (``PHASE_KEY``) but never got to add the jobs (killed or refused while planning or
    starting Ray), which holds nothing to resume or to protect."""
    path = Path(out_dir) / QUEUE_FILE
    if not path.is_file():
        return False
    with readable_queue(path):
        conn = open_read_only(out_dir)
        try:
            meta = read_meta(conn)
        finally:
            conn.close()
    return STARTED_KEY in meta or PHASE_KEY not in meta


def read_counts(conn: sqlite3.Connection) -> dict[str, int]:
    counts = dict.fromkeys(JOB_STATES, 0)
    for state, n in conn.execute("SELECT state, COUNT(*) FROM jobs GROUP BY state"):
        counts[state] = n
    return counts


def read_jobs(conn: sqlite3.Connection) -> list[JobRow]:
    rows = conn.execute(
        "SELECT id, position, label, state, attempts, failures, slot, error_class, error_text, leased_ns,"
        " finished_ns FROM jobs ORDER BY position"
    )
    return [JobRow(*row) for row in rows]


def read_attempts(conn: sqlite3.Connection, job_id: str | None = None) -> list[AttemptRow]:
    query = (
        "SELECT job_id, attempt, slot, node, outcome, error_class, error_text, log_tail, worker_s, started_ns,"
        " finished_ns FROM attempts"
    )
    rows = (
        conn.execute(query + " WHERE job_id = ? ORDER BY attempt", (job_id,))
        if job_id is not None
        else conn.execute(query + " ORDER BY started_ns")
    )
    return [AttemptRow(*row) for row in rows]


def read_meta(conn: sqlite3.Connection) -> dict[str, str]:
    return dict(conn.execute("SELECT key, value FROM meta"))
