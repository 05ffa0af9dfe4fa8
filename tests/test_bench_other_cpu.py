"""bench.common.OtherCpu: the cores other processes used while a benchmark ran, its own children left out."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from bench.common import OtherCpu

BUSY_S = 30  # the busy loops end by themselves if a test dies before killing them
WATCH_S = 1.5

_BUSY = f"import time\nend = time.monotonic() + {BUSY_S}\nwhile time.monotonic() < end: pass\n"
# Forks, and the fork runs the loop after its parent exits: it is re-parented, no longer our descendant.
_DETACHED_BUSY = (
    "import os, sys\n"
    "if os.fork():\n"
    "    sys.exit(0)\n"
    "os.setsid()\n"
    "open(sys.argv[1], 'w').write(str(os.getpid()))\n" + _BUSY
)


@contextmanager
def _detached_busy_process(tmp_path: Path) -> Iterator[int]:
    pid_file = tmp_path / "busy.pid"
    subprocess.run([sys.executable, "-c", _DETACHED_BUSY, str(pid_file)], check=True)
    deadline = time.monotonic() + 10
    while not pid_file.exists() or not pid_file.read_text():
        assert time.monotonic() < deadline, "the detached busy loop did not start"
        time.sleep(0.01)
    pid = int(pid_file.read_text())
    try:
        yield pid
    finally:
        os.kill(pid, signal.SIGKILL)


def test_a_busy_process_that_is_not_ours_counts_about_one_core(tmp_path: Path) -> None:
    """Counted per process (the suite's other pytest process runs beside this one, so the total is not
    this loop's alone); the total is the sum."""
    with _detached_busy_process(tmp_path) as pid, OtherCpu() as others:
        time.sleep(WATCH_S)
    assert 0.5 <= others.by_pid[pid] <= 1.2
    assert others.cores == sum(others.by_pid.values()) >= others.by_pid[pid]


def test_a_busy_child_of_the_benchmark_is_not_counted() -> None:
    child = subprocess.Popen([sys.executable, "-c", _BUSY])
    try:
        time.sleep(0.2)  # started: psutil lists it among our children
        with OtherCpu() as others:
            time.sleep(WATCH_S)
    finally:
        child.kill()
        child.wait()
    assert child.pid not in others.by_pid and os.getpid() not in others.by_pid
