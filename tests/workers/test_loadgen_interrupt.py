"""Ctrl-C during `specsweep load`: the requests in flight become `cut_off` rows (not `connection_reset`),
every row measured so far is written, the exit code is 130, and no traceback is printed."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.launch_args import chain_launch_args
from workers.node.launcher import ServerProcess, start_sim
from workers.sglang import api

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def slow_sim() -> Iterator[ServerProcess]:
    """Real time: a 2000-token answer takes many seconds, so requests are surely in flight at Ctrl-C."""
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 3, "--enable-metrics")
    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "1"}) as server:
        yield server


def test_load_writes_cut_off_rows_without_a_traceback_when_interrupted(
    slow_sim: ServerProcess, tmp_path: Path
) -> None:
    """SIGINT while requests stream: exit 130, the file holds the finished rows and one cut_off row per
    request in flight, none labelled connection_reset; stderr has no traceback."""
    out = tmp_path / "records.parquet"
    argv = [sys.executable, "-m", "harness.cli", "load", "--url", slow_sim.url, "--concurrency", "4"]
    argv += ["--requests", "400", "--input-tokens", "8", "--output-tokens", "4"]
    argv += ["--output-tokens-max", "2000", "--seed", "1", "--processes", "1", "--out", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _wait_until_requests_run(slow_sim.url, 4, proc)  # all four streams in flight: the level has begun
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=120)
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr and "Task exception" not in stderr, stderr
    assert not out.with_name(out.name + ".partial").exists()  # the spilled rows are all in the file
    rows = pq.read_table(out).to_pylist()
    kinds = {r["error_type"] for r in rows}
    assert "connection_reset" not in kinds, kinds
    cut = [r for r in rows if r["error_type"] == "cut_off"]
    assert 1 <= len(cut) <= 4 and kinds <= {None, "cut_off"}, kinds


def _wait_until_requests_run(url: str, running: int, proc: subprocess.Popen[str]) -> None:
    """Poll the server's own gauge of running requests until it reaches ``running`` (or the client exits)."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        with urllib.request.urlopen(url + api.METRICS, timeout=10) as response:
            text = response.read().decode()
        gauge = next(line for line in text.splitlines() if line.startswith(api.METRIC_NUM_RUNNING + "{"))
        if float(gauge.rsplit(" ", 1)[1]) >= running:
            return
        time.sleep(0.05)
    proc.kill()
    raise AssertionError(f"the server never had {running} requests running (client exit {proc.poll()})")
