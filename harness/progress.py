"""What the user sees while a sweep runs: a live table on a terminal, plain log lines otherwise."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Protocol, TextIO

PLAIN_INTERVAL_S = 5.0  # without a terminal, a long step prints its state this often (logs stay short)
LIVE_INTERVAL_S = 0.5  # on a terminal, the step's line is redrawn this often


@dataclass(frozen=True, slots=True)
class SlotView:
    """One server slot as the progress display shows it."""

    index: int
    state: str  # placing | idle | busy | lost
    node: str | None
    job: str | None  # "label (job id) attempt n"
    since: float  # time.monotonic() when the state began


@dataclass(frozen=True, slots=True)
class SweepView:
    """The whole sweep at one moment."""

    counts: dict[str, int]
    slots: tuple[SlotView, ...]
    eta_s: float | None


class Progress(Protocol):
    def event(self, line: str) -> None: ...
    def update(self, view: SweepView) -> None: ...
    def close(self) -> None: ...


def _summary(view: SweepView) -> str:
    c = view.counts
    eta = "?" if view.eta_s is None else f"{view.eta_s:.0f}s"
    return f"done {c['done']}  running {c['leased']}  failed {c['failed']}  pending {c['pending']}  ETA {eta}"


class LogProgress:
    """Plain, timestamped lines (job events), for logs and pipes."""

    def __init__(self, stream: TextIO) -> None:
        self._stream = stream

    def event(self, line: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {line}", file=self._stream, flush=True)

    def update(self, view: SweepView) -> None:
        """Plain output shows events only; the summary comes with each job's end."""

    def close(self) -> None:
        """Nothing to tear down."""


class LiveProgress:
    """A rich live table: job counts, ETA, and each slot's node, state and job."""

    def __init__(self, stream: TextIO) -> None:
        from rich.console import Console
        from rich.live import Live

        self._console = Console(file=stream)
        self._live = Live(console=self._console, refresh_per_second=4, transient=False)
        self._live.start()

    def event(self, line: str) -> None:
        self._live.console.print(f"{time.strftime('%H:%M:%S')} {line}", highlight=False)

    def update(self, view: SweepView) -> None:
        from rich.table import Table

        table = Table(title=_summary(view), title_justify="left")
        for column in ("slot", "node", "state", "for", "job"):
            table.add_column(column)
        now = time.monotonic()
        for slot in view.slots:
            table.add_row(
                str(slot.index), slot.node or "-", slot.state, f"{now - slot.since:.0f}s", slot.job or "-"
            )
        self._live.update(table)

    def close(self) -> None:
        self._live.stop()


def progress_for(stream: TextIO = sys.stdout) -> Progress:
    """A live table on a terminal, log lines otherwise."""
    return LiveProgress(stream) if stream.isatty() else LogProgress(stream)


@contextmanager
def ticking(
    describe: Callable[[], str], stream: TextIO = sys.stderr, *, quiet_s: float = 0.0
) -> Iterator[None]:
    """While the body runs, show where a long step stands (``describe()``, read from another thread): one
    line redrawn in place with a spinner on a terminal; otherwise a timestamped line when it starts, every
    ``PLAIN_INTERVAL_S`` and when it ends. With ``quiet_s``, a step that ends sooner shows nothing (its
    output stays what it was without a progress display) and a longer one starts showing then."""
    if quiet_s > 0:
        with _after(quiet_s, describe, stream):
            yield
        return
    stop = threading.Event()
    if stream.isatty():
        from rich.console import Console

        status = Console(file=stream).status(describe())

        def show(final: bool) -> None:
            if final:
                status.stop()
                status.console.print(f"{time.strftime('%H:%M:%S')} {describe()}", highlight=False)
            else:
                status.update(describe())

        status.start()
        interval = LIVE_INTERVAL_S
    else:

        def show(final: bool) -> None:
            print(f"{time.strftime('%H:%M:%S')} {describe()}", file=stream, flush=True)

        show(False)
        interval = PLAIN_INTERVAL_S

    def tick() -> None:
        while not stop.wait(interval):
            show(False)

    ticker = threading.Thread(target=tick, daemon=True)
    ticker.start()
    try:
        yield
    finally:
        stop.set()
        ticker.join()
        show(True)


@contextmanager
def _after(quiet_s: float, describe: Callable[[], str], stream: TextIO) -> Iterator[None]:
    """``ticking`` from ``quiet_s`` into the body on, and not at all when the body ends first."""
    done = threading.Event()

    def watch() -> None:
        if not done.wait(quiet_s):
            with ticking(describe, stream):
                done.wait()

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        yield
    finally:
        done.set()
        watcher.join()


STEP_QUIET_S = 2.0  # a command's step shorter than this shows no progress line


@contextmanager
def long_step(what: str, stream: TextIO) -> Iterator[None]:
    """``ticking`` for one step of a command, named ``what``, with the seconds it has taken so far; shown
    only once it has run ``STEP_QUIET_S``."""
    began = time.monotonic()
    with ticking(lambda: f"{what}: {time.monotonic() - began:.0f} s", stream, quiet_s=STEP_QUIET_S):
        yield
