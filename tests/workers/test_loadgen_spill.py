"""`specsweep load --out OUT` writes the rows of finished requests to OUT.partial/ as the level runs, so
a load killed with SIGKILL (or by the OOM killer) keeps every request it had measured a second before;
a finished load replaces that directory with OUT, and a later load refuses to overwrite a killed one's
rows."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.schema import REQUESTS_SCHEMA
from harness.commands.load import spill_dir
from tests.launch_args import chain_launch_args
from workers.load.generator import SPILL_INTERVAL_S
from workers.node.launcher import ServerProcess, start_sim

FIXTURES = Path(__file__).parents[1] / "fixtures"


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerProcess]:
    """Answers of up to a few hundred ms, so a level of 400 requests runs for minutes."""
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 3)
    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "0.2"}) as server:
        yield server


def _argv(url: str, out: Path, requests: int) -> list[str]:
    argv = [sys.executable, "-m", "harness.cli", "load", "--url", url, "--concurrency", "2"]
    argv += ["--requests", str(requests), "--input-tokens", "8", "--output-tokens", "8"]
    return [*argv, "--output-tokens-max", "200", "--seed", "3", "--processes", "1", "--out", str(out)]


def _spilled_rows(spill: Path) -> list[dict[str, object]]:
    parts = sorted(spill.glob("*.parquet"))
    return [row for part in parts for row in pq.read_table(part).to_pylist()]


def test_killed_load_leaves_its_measured_rows_on_disk_when_out_is_given(
    sim: ServerProcess, tmp_path: Path
) -> None:
    """SIGKILL mid-level, once at least 10 rows were spilled: OUT.partial/ holds them as requests-table
    Parquet parts (distinct request ids, each a complete successful request), OUT was never written,
    and a new load on the same OUT is refused (exit 2) naming the directory, leaving it untouched."""
    out = tmp_path / "records.parquet"
    spill = spill_dir(out)
    proc = subprocess.Popen(_argv(sim.url, out, 400), stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if spill.is_dir() and len(_spilled_rows(spill)) >= 10:
                break
            time.sleep(SPILL_INTERVAL_S / 4)
        assert proc.poll() is None, proc.communicate()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    rows = _spilled_rows(spill)
    assert len(rows) >= 10
    assert len({r["request_id"] for r in rows}) == len(rows)
    assert all(r["error_type"] is None and r["completion_tokens"] for r in rows)
    for part in spill.glob("*.parquet"):
        assert pq.read_schema(part).remove_metadata().equals(REQUESTS_SCHEMA.remove_metadata())
    assert not out.exists() and not list(tmp_path.glob(".*.tmp"))

    again = subprocess.run(_argv(sim.url, out, 4), capture_output=True, text=True, timeout=60)
    assert again.returncode == 2 and "Traceback" not in again.stderr
    assert str(spill) in again.stderr and "killed" in again.stderr
    assert _spilled_rows(spill) == rows and not out.exists()


def test_finished_load_replaces_its_spill_with_the_file(sim: ServerProcess, tmp_path: Path) -> None:
    """A load that ends writes every row to OUT and leaves no OUT.partial/."""
    out = tmp_path / "records.parquet"
    done = subprocess.run(_argv(sim.url, out, 6), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert pq.read_table(out).num_rows == 6
    assert not spill_dir(out).exists()
