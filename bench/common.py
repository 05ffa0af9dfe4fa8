"""What every benchmark shares: one JSON line per result, tagged with the git sha and host."""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import psutil

REPO = Path(__file__).resolve().parents[1]


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def emit(
    name: str, unit: str, value: float, samples: list[float] | None = None, **extra: Any
) -> dict[str, Any]:
    """Print one result line: ``{"name", "unit", "value", "n", "p50", "p99", "git_sha", "host", ...}``."""
    data = np.asarray(samples if samples else [value], dtype=float)
    line = {
        "name": name,
        "unit": unit,
        "value": value,
        "n": int(data.size),
        "p50": float(np.percentile(data, 50)),
        "p99": float(np.percentile(data, 99)),
        "git_sha": git_sha(),
        "host": platform.node(),
        **extra,
    }
    print(json.dumps(line), flush=True)
    return line


def python() -> str:
    """The interpreter running the benchmark (the project venv's under `make bench`)."""
    return sys.executable


class OtherCpu:
    """CPU that processes outside this benchmark used while it ran, in cores (a context manager).

    A benchmark that runs in real time on a shared machine measures the machine as well: a busy process
    elsewhere delays the simulated server and the client, and their latency tails grow with it. The
    processes already running at entry that are not this one or its children are watched; ``by_pid`` is
    each one's CPU seconds over the wall seconds between entry and exit, ``cores`` their sum (0.0 on an
    otherwise idle machine). Processes that start later (and are not ours) are not counted: check the
    machine is quiet first.
    """

    def __init__(self) -> None:
        self.by_pid: dict[int, float] = {}
        self._start: list[tuple[psutil.Process, float]] = []
        self._t0 = 0.0

    @property
    def cores(self) -> float:
        return sum(self.by_pid.values())

    def __enter__(self) -> OtherCpu:
        ours = {os.getpid()} | {p.pid for p in psutil.Process().children(recursive=True)}
        for process in psutil.process_iter():
            if process.pid not in ours:
                with contextlib.suppress(psutil.Error):
                    self._start.append((process, _cpu_seconds(process)))
        self._t0 = time.monotonic()
        return self

    def __exit__(self, *exc: object) -> None:
        wall = max(time.monotonic() - self._t0, 1e-9)
        for process, before in self._start:
            with contextlib.suppress(psutil.Error):
                if process.is_running():
                    self.by_pid[process.pid] = (_cpu_seconds(process) - before) / wall


def _cpu_seconds(process: psutil.Process) -> float:
    times = process.cpu_times()
    return float(times.user + times.system)
