"""A driver that started an embedded Ray (``--ray-address local``, ``demo``) leaves none of its processes behind
when it is killed with SIGKILL: Ray's own fate-sharing takes the GCS and the raylet, the reaper
(harness.reaper) takes the dashboard and runtime-env agents, the workers and the servers, which
otherwise hold their ports for a minute or more."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import psutil
import pytest
import yaml

from harness.demo import simulated_cluster
from workers.convert.fixtures import TINY, write_target_config

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
GONE_WITHIN_S = 20.0  # Ray 2.60's agents alone outlive a killed driver by 37 s or more (measured)


def _running(process: psutil.Process) -> bool:
    """Alive and not a zombie (pid and start time checked, so a reused pid does not count)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def _cmdlines(processes: list[psutil.Process]) -> list[str]:
    found = []
    for process in processes:
        try:
            found.append(" ".join(process.cmdline())[:200])
        except psutil.NoSuchProcess:
            continue
    return found


def _names(processes: list[psutil.Process]) -> set[str]:
    return set(_cmdlines(processes))


def _run_argv(tmp_path: Path) -> list[str]:
    """`specsweep run --ray-address local` of a one-job sweep whose level lasts minutes."""
    out = tmp_path / "out"
    spec = {
        "engine": "sim",
        "model_path": str(write_target_config(tmp_path / "target", TINY)),
        "base_args": ["--tp-size", "8"],
        "load": {"concurrency": [1], "duration_s": 300, "warmup_requests": 0},
        "timeouts": {"startup_s": 60, "level_s": 600, "stop_s": 5, "placement_s": 120},
        "max_servers": 1,
        "output_dir": str(out),
    }
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    return [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        str(spec_file),
        "--ray-address",
        "local",
        "--no-validate",
    ]


def _demo_argv(tmp_path: Path) -> list[str]:
    """`specsweep demo` on one simulated node (its own embedded cluster: a head and one node)."""
    return [sys.executable, "-m", "harness.cli", "demo", "--out", str(tmp_path / "demo"), "--nodes", "1"]


@pytest.mark.parametrize("command", [_run_argv, _demo_argv], ids=["run-local", "demo"])
def test_killed_driver_leaves_no_ray_process_when_it_started_ray_itself(
    command: Callable[[Path], list[str]], tmp_path: Path
) -> None:
    """SIGKILL a driver that started Ray itself (`run --ray-address local`, `demo`) while a job runs:
    every process under it (GCS, raylets, dashboard, both agents, workers, the simulated server) is
    gone within GONE_WITHIN_S. The processes are the driver's own descendants, recorded before the kill
    (other tests' clusters are not looked at); the agents and the server are among them, so the check
    cannot pass vacuously."""
    argv = command(tmp_path)
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SPECSWEEP_PID_DIR": str(tmp_path / "pids"),
        "SPECSWEEP_DRAFTER_CACHE": str(tmp_path / "drafters"),
    }
    log = tmp_path / "driver.log"
    with open(log, "wb") as log_file:
        driver = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        tree: list[psutil.Process] = []
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline and driver.poll() is None:
            tree = psutil.Process(driver.pid).children(recursive=True)
            names = " ".join(_names(tree))
            if all(part in names for part in ("ray::DashboardAgent", "ray::RuntimeEnvAgent", "workers.sim")):
                break
            time.sleep(0.5)
        names = " ".join(_names(tree))
        for part in ("gcs_server", "raylet", "ray::DashboardAgent", "ray::RuntimeEnvAgent", "workers.sim"):
            assert part in names, f"{part} not running under the driver:\n{log.read_text()[-3000:]}"
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()
    killed = time.monotonic()
    while time.monotonic() - killed < GONE_WITHIN_S and any(_running(p) for p in tree):
        time.sleep(0.2)
    left = [p for p in tree if _running(p)]
    for process in left:  # leave nothing for the next test either way
        process.kill()
    assert not left, f"left running {GONE_WITHIN_S:.0f} s after the driver's SIGKILL: {_names(left)}"


def test_simulated_cluster_leaves_no_process_when_it_ends_normally() -> None:
    """The demo's embedded cluster on a normal exit: once `simulated_cluster` returns, no process it
    started (both agents of both raylets among them, checked present, and the reaper itself) is still
    running, with no waiting. Ray's own shutdown stops the agents on this path (without the reaper the
    test passes too); it guards the reaper's close: it returns, and leaves nothing of its own."""
    me = psutil.Process()
    before = {p.pid for p in me.children(recursive=True)}
    with simulated_cluster(nodes=1, gpus_per_node=8, cpus_per_node=2):
        deadline = time.monotonic() + 60
        while True:  # the node's agents start a moment after it registers
            tree = [p for p in me.children(recursive=True) if p.pid not in before]
            agents = [
                c for c in _cmdlines(tree) if c.startswith(("ray::DashboardAgent", "ray::RuntimeEnvAgent"))
            ]
            if len(agents) == 4 or time.monotonic() > deadline:
                break
            time.sleep(0.2)
        assert len(agents) == 4, _names(tree)
    left = [p for p in tree if _running(p)]
    for process in left:
        process.kill()
    assert not left, f"left running after the cluster's shutdown: {_names(left)}"
