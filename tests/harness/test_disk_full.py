"""A sweep whose output disk fills up mid-run stops with one line (DiskFullError, exit 5), leaves
nothing half-written and its queue intact, and ``--resume`` finishes it once there is space, every
row exactly once. The disk is a real small tmpfs (tests/conftest.py's ``small_disk``) filled by the test.
Two server slots: the disk fills while a job is in flight either way, and the resume's jobs take half the
rounds of one slot's."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml

from harness.queue import open_read_only, read_counts, read_jobs
from tests.conftest import fill
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
JOBS = 6  # the baseline, four chains (topk 1) and one tree (2 steps, topk 2, 3 draft tokens)
LEVELS = 2
REQUESTS = 3


def _counts(out: Path) -> dict[str, int]:
    conn = open_read_only(out)
    try:
        return read_counts(conn)
    finally:
        conn.close()


def _rows(out: Path, table: str) -> list[dict[str, object]]:
    return ds.dataset(out / table, format="parquet", partitioning="hive").to_table().to_pylist()


def test_run_stops_with_one_line_and_resumes_when_the_output_disk_fills(
    small_disk: Path, tmp_path: Path
) -> None:
    out = small_disk / "out"
    root = tmp_path / "models"
    spec = {
        "engine": "sim",
        "model_path": str(write_target_config(root / "target", TINY)),
        "drafter": {
            "path": str(write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")),
            "format": "speculators",
        },
        "base_args": ["--tp-size", "8"],
        "speculative": {"chain_depths": [2, 3, 4, 5], "num_steps": [2], "topk": [2], "num_draft_tokens": [3]},
        "baseline": True,
        "max_servers": 2,
        "load": {
            "concurrency": [1, 2],
            "requests_per_level": REQUESTS,
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 24, "vocab_size": 256},
        },
        "retries": 1,
        "timeouts": {"startup_s": 60, "level_s": 60, "stop_s": 5, "placement_s": 120},
        "env": {"SPECSWEEP_SIM_TIME_SCALE": "0.05"},
        "output_dir": str(out),
    }
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "SPECSWEEP_PID_DIR": str(tmp_path / "pids"),
        "SPECSWEEP_DRAFTER_CACHE": str(tmp_path / "drafters"),
    }
    argv = [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        str(spec_file),
        "--ray-address",
        "local",
        "--no-validate",
    ]
    log = tmp_path / "driver.log"
    with open(log, "wb") as log_file:
        driver = subprocess.Popen(argv, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 240
        while time.monotonic() < deadline and driver.poll() is None:
            try:
                if (out / "queue.sqlite").exists() and _counts(out)["done"] >= 1:
                    break
            except sqlite3.OperationalError:
                pass
            time.sleep(0.2)
        filler = fill(small_disk)
        _, stderr = driver.communicate(timeout=240)
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    err = stderr.decode()
    assert driver.returncode == 5, f"{err}\n{log.read_text()[-3000:]}"
    (line,) = [line for line in err.splitlines() if line.startswith("specsweep run: error: ")]
    assert "Traceback" not in err and "disk is full" in line and "No space left on device" in line, err
    assert line.startswith(f"specsweep run: error: {out}: ") and "--resume" in err, err
    counts = _counts(out)
    assert 1 <= counts["done"] < JOBS and counts["failed"] == 0, counts
    conn = open_read_only(out)
    try:
        assert conn.execute("PRAGMA integrity_check").fetchone() == ("ok",)
        assert [job.failures for job in read_jobs(conn)] == [0] * JOBS  # the disk is not the config's fault
    finally:
        conn.close()
    assert sorted(p.name for p in out.rglob("*.tmp")) == []

    filler.unlink()
    resumed = subprocess.run(
        [*argv, "--resume"], cwd=REPO, env=env, capture_output=True, text=True, timeout=400
    )
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert _counts(out) == {"pending": 0, "leased": 0, "done": JOBS, "failed": 0}
    assert len(_rows(out, "jobs")) == JOBS
    assert len(_rows(out, "levels")) == JOBS * LEVELS
    requests = _rows(out, "requests")
    assert len(requests) == JOBS * LEVELS * REQUESTS
    assert len({(r["job"], r["load_level"], r["request_id"]) for r in requests}) == len(requests)
