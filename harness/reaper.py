"""Stop an embedded Ray's processes when the driver that started it dies, however it dies.

``ray.init(address="local")`` starts Ray's GCS, raylet, dashboard and monitors as children of the
driver, and the raylet starts the dashboard and runtime-env agents and the workers (which start the
servers). Ray ties the GCS and the raylet to the driver, but after a ``kill -9`` of the driver the
agents outlive it by a minute or more (measured with Ray 2.60), holding their ports (52365, ...), and a
worker's server can outlive it too. The driver therefore starts a reaper beside Ray: a small process in
its own session that every ``POLL_S`` records the process tree under the Ray processes this driver
started (its children whose command line names the Ray session), and once the driver is
gone (the pipe it holds closes: a normal exit, an exception, or ``kill -9``) stops every recorded
process still running (SIGTERM, then SIGKILL after ``GRACE_S``). Processes are matched by pid and start
time, so a reused pid is never hit; nothing outside that tree (another cluster, a test's servers) is.
"""

from __future__ import annotations

import os
import select
import subprocess
import sys

import psutil

POLL_S = 0.5
GRACE_S = 3.0


class Reaper:
    """The reaper process of one embedded Ray session; ``close`` tells it the driver is done."""

    def __init__(self, session: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "harness.reaper", str(os.getpid()), session],
            stdin=subprocess.PIPE,
            start_new_session=True,  # a Ctrl-C of the driver's terminal does not stop it before its work
        )

    def close(self) -> None:
        """After ``ray.shutdown()``: stop whatever of the session is still running, and wait for it."""
        assert self._process.stdin is not None
        self._process.stdin.close()
        self._process.wait()


def _ray_processes(driver: psutil.Process, session: str, ray: set[psutil.Process]) -> list[psutil.Process]:
    """The driver's Ray processes (its children whose command line names ``session``, less this reaper, whose
    command line names it too) and all their descendants, from one pass over the process table.

    ``ray`` holds the children already found to be Ray's (a process keeps its command line once it names the
    session), so a poll reads no command line of those; a child that does not name it yet is read again at the
    next poll (a forked child shows the driver's command line until it execs)."""
    children: dict[int, list[psutil.Process]] = {}
    for process in psutil.process_iter(["ppid"]):  # cached Process objects: one read of each /proc/<pid>/stat
        children.setdefault(process.info["ppid"], []).append(process)
    found = []
    for child in children.get(driver.pid, []):
        try:
            if child not in ray and child.pid != os.getpid() and any(session in a for a in child.cmdline()):
                ray.add(child)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
        if child in ray:
            found += _descendants(child, children)
    return found


def _descendants(root: psutil.Process, children: dict[int, list[psutil.Process]]) -> list[psutil.Process]:
    """``root`` and every process below it in ``children`` (parent pid -> processes); like
    ``Process.children(recursive=True)``, a child that started before its parent is a reused pid's, not kept."""
    found, stack = [root], [root]
    while stack:
        parent = stack.pop()
        for child in children.get(parent.pid, []):
            try:
                if child.create_time() >= parent.create_time():
                    found.append(child)
                    stack.append(child)
            except psutil.NoSuchProcess:
                continue
    return found


def _stop(processes: list[psutil.Process]) -> None:
    """SIGTERM every process still running (the same pid and start time), SIGKILL what outlives GRACE_S."""
    alive = []
    for process in processes:
        try:
            if process.is_running():
                process.terminate()
                alive.append(process)
        except psutil.NoSuchProcess:
            continue
    _, survivors = psutil.wait_procs(alive, timeout=GRACE_S)
    for process in survivors:
        try:
            process.kill()
        except psutil.NoSuchProcess:
            continue
    psutil.wait_procs(survivors, timeout=GRACE_S)


def main(argv: list[str]) -> int:
    """Watch ``argv = [driver_pid, session_name]`` until standard input closes, then stop the session."""
    session = argv[1]
    try:
        driver = psutil.Process(int(argv[0]))
    except psutil.NoSuchProcess:
        return 0
    seen: dict[tuple[int, float], psutil.Process] = {}
    ray: set[psutil.Process] = set()
    stdin = sys.stdin.fileno()
    while driver.is_running():
        try:
            processes = _ray_processes(driver, session, ray)
        except psutil.NoSuchProcess:  # the driver is gone
            break
        for process in processes:
            try:
                seen.setdefault((process.pid, process.create_time()), process)
            except psutil.NoSuchProcess:
                continue
        ready, _, _ = select.select([stdin], [], [], POLL_S)
        if ready and not os.read(stdin, 4096):  # EOF: the driver closed the pipe or died
            break
    _stop(list(seen.values()))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
