"""`ray job submit` against a head started with `ray start --head`: the driver runs as a Ray job.

The head is started in the foreground (`--block`) in its own session, so the test stops exactly the
processes it started (SIGTERM, then SIGKILL of that process group), never other Ray clusters.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pyarrow.dataset as ds
import pytest
import yaml

from harness.queue import open_read_only, read_counts
from workers.convert.fixtures import TINY, write_target_config
from workers.node.launcher import group_members
from workers.node.preflight import pick_free_port

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
RAY = str(Path(sys.executable).with_name("ray"))


@pytest.fixture(scope="module")
def head(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A Ray head with 8 simulated GPUs and the job server; yields the dashboard address."""
    port, dashboard = pick_free_port("127.0.0.1"), pick_free_port("127.0.0.1")
    log = tmp_path_factory.mktemp("head") / "ray-start.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [
                RAY,
                "start",
                "--head",
                "--block",
                f"--port={port}",
                "--num-cpus=3",
                "--num-gpus=8",
                "--include-dashboard=true",
                "--dashboard-host=127.0.0.1",
                f"--dashboard-port={dashboard}",
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    address = f"http://127.0.0.1:{dashboard}"
    try:
        _wait_for_job_server(address, proc, log)
        yield address
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        deadline = time.monotonic() + 15
        while group_members(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.2)
        if group_members(proc.pid):
            os.killpg(proc.pid, signal.SIGKILL)


def _wait_for_job_server(address: str, proc: subprocess.Popen[bytes], log: Path) -> None:
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"ray start exited:\n{log.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(f"{address}/api/version", timeout=2):
                return
        except urllib.error.HTTPError:  # answering (401 without the token): up
            return
        except OSError:
            pass
        time.sleep(1)
    raise AssertionError(f"the job server did not come up:\n{log.read_text()[-2000:]}")


def test_job_submit_runs_a_small_sweep_when_submitted_to_a_started_head(head: str, tmp_path: Path) -> None:
    """`ray job submit --working-dir . -- specsweep run sweep.yaml` completes a sweep on the head."""
    out = tmp_path / "out"
    spec = {
        "engine": "sim",
        "model_path": str(write_target_config(tmp_path / "target", TINY)),
        "base_args": ["--tp-size", "8"],
        "load": {
            "concurrency": [2],
            "requests_per_level": 3,
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 16, "vocab_size": 256},
        },
        "timeouts": {"startup_s": 60, "level_s": 60, "stop_s": 5, "placement_s": 60},
        "env": {"SPECSWEEP_SIM_TIME_SCALE": "0.05"},
        "output_dir": str(out),
    }
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(spec))
    env = {**os.environ, "RAY_AUTH_MODE": "token"}
    submitted = subprocess.run(
        [
            RAY,
            "job",
            "submit",
            "--address",
            head,
            "--working-dir",
            str(REPO),
            "--",
            sys.executable,
            "-m",
            "harness.cli",
            "run",
            str(spec_file),
            "--ray-address",
            "auto",
            "--builtin-only",
        ],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert submitted.returncode == 0, submitted.stdout[-3000:] + submitted.stderr[-3000:]
    assert "done 1, failed 0, pending 0" in submitted.stdout + submitted.stderr
    conn = open_read_only(out)
    try:
        assert read_counts(conn) == {"pending": 0, "leased": 0, "done": 1, "failed": 0}
    finally:
        conn.close()
    assert ds.dataset(out / "requests", partitioning="hive").count_rows() == 3
