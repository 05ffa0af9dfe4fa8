"""A stale server on the port never yields a ``done`` job (issue #26, finding 1).

One embedded Ray (``--ray-address local``) and the simulated SGLang server with a bind delay, as real
SGLang binds its HTTP port only after loading the weights. While the job's server is still "loading", a
stale server (an orphan of an earlier run: same config, another seed, time scale and launch tag) binds
the very port the worker launched on and answers ``/health``. Before the fix the sweep measured and
committed the stale server's numbers as ``done``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.queue import open_read_only, read_attempts
from harness.spec import parse_spec
from tests.harness.sim_sweeps import one_slot_sim_spec, run_unchecked
from workers.node.launcher import kill_group, pid_dir
from workers.sglang import api

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
STALE_SEED = 999


class StaleServer:
    """Waits for the worker's first launch (its pid file), then starts a copy of that launch with another
    seed, time scale and tag on the same port, in its own session, as an earlier run would have left it."""

    def __init__(self, log_path: Path) -> None:
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.port: int | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._take_port, daemon=True)
        self._thread.start()

    def _take_port(self) -> None:
        while not self._stop.is_set():
            for path in pid_dir().glob("*.json"):
                try:
                    args = list(json.loads(path.read_text())["argv"][3:])
                except (FileNotFoundError, json.JSONDecodeError):
                    continue
                args[args.index(api.LAUNCH_TAG_FLAG) + 1] = "specsweep-an-earlier-run"
                self.port = int(args[args.index("--port") + 1])
                env = {
                    **os.environ,
                    "PYTHONPATH": str(REPO),
                    "SPECSWEEP_SIM_SEED": str(STALE_SEED),
                    "SPECSWEEP_SIM_TIME_SCALE": "0.04",
                }
                with open(self.log_path, "ab") as log:
                    self.proc = subprocess.Popen(
                        [sys.executable, "-m", "workers.sim", *args],
                        env=env,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                return
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)
        if self.proc is not None:
            kill_group(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def test_sweep_retries_on_another_port_and_measures_only_its_server_when_a_stale_server_takes_the_port(
    tmp_path: Path, node_dirs: None
) -> None:
    """The stale server answers first: the attempt fails as port_taken naming it (not done, not
    config_mismatch), the retry on another port measures the job's own server (its seed, its tag), and the
    stale server is left alone (the harness stops only what it launched)."""
    data = one_slot_sim_spec(
        tmp_path,
        requests=3,
        output_tokens=16,
        level_s=60,
        env={"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_BIND_DELAY_S": "8"},
    )
    out, seed = Path(data["output_dir"]), parse_spec(data).seed
    stale = StaleServer(tmp_path / "stale.log")
    try:
        summary, log = run_unchecked(data)
        stale_alive = stale.proc is not None and stale.proc.poll() is None
    finally:
        stale.stop()
    assert stale.proc is not None and stale_alive, (tmp_path / "stale.log").read_text()
    (row,) = pq.read_table(next(out.glob("jobs/*/*/part-0.parquet"))).to_pylist()
    info = json.loads(row["server_info_json"])
    assert info["simulator"]["seed"] == seed != STALE_SEED, log
    argv = list(row["sglang_argv"])
    assert info[api.LAUNCH_TAG] == argv[argv.index(api.LAUNCH_TAG_FLAG) + 1]
    assert int(argv[argv.index("--port") + 1]) != stale.port
    assert row["status"] == "done" and summary.counts["done"] == 1
    conn = open_read_only(out)
    try:
        attempts = read_attempts(conn)
    finally:
        conn.close()
    assert [a.error_class for a in attempts] == ["port_taken", None], log
    assert f"pid {stale.proc.pid}" in (attempts[0].error_text or "")
    assert "specsweep-an-earlier-run" in (attempts[0].error_text or "")
