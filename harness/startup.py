"""The first second of ``specsweep run``: lock the output, make its claim checks and give it its queue
before anything slow (planning with SGLang's resolver, hashing the inputs, starting Ray), so that
``specsweep status OUT`` can say what the driver is doing from the start.

What the driver is doing is one JSON value in the queue's meta table (``harness.queue.PHASE_KEY``): the
phase, a detail, and the driver's host, pid and process start time, so ``status`` on that host tells a
driver that is still planning from one that was killed while it planned. A run that stops before its
sweep started (a refused plan, Ctrl-C while planning) takes back the queue and the directory it made;
one killed outright leaves a queue that ``status`` reports as stopped, that a plain run takes over and
that ``--resume`` starts (``harness.queue.holds_sweep``).

This module does not import Ray: ``run`` enters it before the driver module is even imported.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import socket
import sqlite3
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass

import psutil

from analysis import layout
from harness.queue import PHASE_KEY, QUEUE_FILE, STARTED_KEY, JobQueue
from harness.results import Output, check_claim, check_output, publish_queue
from specsweep.crash_points import crash_point
from specsweep.errors import ClusterError

PLANNING = "planning"
HASHING = "hashing inputs"
STARTING_RAY = "starting Ray"
RUNNING = "running"
EXITED = "exited"
BEFORE_START = (PLANNING, HASHING, STARTING_RAY)  # phases in which no job has been added yet
LOCK_FILE = ".driver.lock"


@dataclass(frozen=True, slots=True)
class DriverPhase:
    """What the driver of a sweep is doing, as it recorded in the queue."""

    phase: str
    detail: str
    host: str
    pid: int
    pid_started: float  # the process's start time (psutil): a pid reused later is not this driver
    since_ns: int

    def alive(self) -> bool | None:
        """Whether the driver process is still there; None on another host (it cannot be told here)."""
        if self.host != socket.gethostname():
            return None
        try:
            process = psutil.Process(self.pid)
            return process.create_time() == self.pid_started and process.status() != psutil.STATUS_ZOMBIE
        except psutil.Error:
            return False

    def describe(self) -> str:
        """One line for ``status``: the phase and for how long, or that the driver is gone."""
        what = f"{self.phase}: {self.detail}" if self.detail else self.phase
        driver = f"driver pid {self.pid} on {self.host}"
        if self.alive() is False and self.phase != EXITED:
            return (
                f"stopped while {what} ({driver} is gone); run `specsweep run` on this OUT again "
                "(with --resume when it holds jobs)"
            )
        elapsed = (time.time_ns() - self.since_ns) / 1e9
        return f"{what} for {elapsed:.0f} s ({driver})"


def read_phase(meta: dict[str, str]) -> DriverPhase | None:
    """The phase recorded in a queue's meta table, or None (no driver recorded one)."""
    raw = meta.get(PHASE_KEY)
    return None if raw is None else DriverPhase(**json.loads(raw))


class Start:
    """A run's hold on its output from its first second: the locked state directory and the queue."""

    def __init__(self, out: Output, queue: JobQueue) -> None:
        self.out = out
        self.queue = queue

    def phase(self, phase: str, detail: str = "") -> None:
        """Record what the driver is doing now (and publish it, for an object-store OUT)."""
        me = psutil.Process()
        value = DriverPhase(phase, detail, socket.gethostname(), me.pid, me.create_time(), time.time_ns())
        self.queue.set_meta(PHASE_KEY, json.dumps(asdict(value)))
        publish_queue(self.out, self.queue)
        crash_point(f"phase:{phase}")

    @property
    def started(self) -> bool:
        """Whether the sweep's jobs were added (from then on the queue is the sweep's and is kept)."""
        return self.queue.get_meta(STARTED_KEY) is not None


@contextlib.contextmanager
def sweep_start(out: Output, sweep_id: str, *, resume: bool, detail: str = "") -> Iterator[Start]:
    """Check and lock ``out``, refuse a claim it cannot take (``check_claim``), open its queue and record
    the planning phase. On the way out the phase becomes ``exited``; a queue this run created for a
    sweep that never started is removed, with the directory when this run made it."""
    made_dir = not out.state.exists()
    check_output(out)  # before Ray and planning: a bad URI, bucket or directory is refused at once
    try:
        with _file_lock(out):
            check_claim(out, sweep_id, resume=resume)
            made_queue = not (out.state / QUEUE_FILE).exists()
            start = Start(out, JobQueue(out.state))
            try:
                if not start.started:
                    start.queue.set_meta("sweep_id", sweep_id)
                start.phase(PLANNING, detail)
                yield start
            finally:
                if made_queue and not start.started:
                    start.queue.close()
                    _remove_queue(out)
                else:
                    # Best effort: on a full disk the error on its way out (DiskFullError) is the news.
                    with contextlib.suppress(OSError, sqlite3.Error):
                        start.phase(EXITED)
                    start.queue.close()
    finally:
        if made_dir and not (out.state / QUEUE_FILE).exists():
            (out.state / LOCK_FILE).unlink(missing_ok=True)
            with contextlib.suppress(OSError):
                out.state.rmdir()  # only when nothing else was written there


def _remove_queue(out: Output) -> None:
    """Remove a queue that never held a sweep (and its published copy)."""
    path = out.state / QUEUE_FILE
    for name in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        name.unlink(missing_ok=True)
    if out.remote:
        out.store.delete(layout.QUEUE_SNAPSHOT)


@contextlib.contextmanager
def _file_lock(out: Output) -> Iterator[None]:
    """An exclusive lock on the state directory, so two drivers on one machine cannot share a queue."""
    out.state.mkdir(parents=True, exist_ok=True)
    with open(out.state / LOCK_FILE, "w") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise ClusterError(
                "another driver is running a sweep in this output directory",
                where=out.store.describe(),
                fix="wait for it to finish (specsweep status OUT), or stop it first",
            ) from None
        yield
