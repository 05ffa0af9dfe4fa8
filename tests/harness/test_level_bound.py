"""`timeouts.level_s` bounds a load level's wall time: a server that hangs mid-stream is stopped and the
attempt ends within 30 s of the hang (not after every request's own timeout), then the retry policy runs.

One embedded Ray (``--ray-address local``, started and stopped by the sweep itself) and the simulated
SGLang server with its ``hang_mid_stream`` fault: request 2 of each attempt stalls the scheduler for good.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
import yaml

from harness.driver import run_sweep
from harness.plan import unchecked_plan
from harness.progress import LogProgress
from harness.queue import open_read_only, read_attempts, read_counts
from harness.spec import parse_spec
from workers.convert.fixtures import TINY, write_target_config

pytestmark = pytest.mark.ray

HANG_BOUND_S = 30.0


@pytest.fixture
def node_dirs(tmp_path: Path) -> Iterator[None]:
    """Node-local dirs (pid files, drafter cache) private to this test; the raylets inherit them."""
    saved = {k: os.environ.get(k) for k in ("SPECSWEEP_PID_DIR", "SPECSWEEP_DRAFTER_CACHE")}
    os.environ["SPECSWEEP_PID_DIR"] = str(tmp_path / "pids")
    os.environ["SPECSWEEP_DRAFTER_CACHE"] = str(tmp_path / "drafters")
    yield
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def test_sweep_ends_each_attempt_within_30_s_of_a_hang_when_level_s_is_15(
    tmp_path: Path, node_dirs: None
) -> None:
    """hang_mid_stream with level_s 15 and retries 1: two attempts, each failed as health_lost or
    level_timeout, each over within 30 s of its server becoming ready (the hang follows at once)."""
    out = tmp_path / "out"
    data: dict[str, Any] = {
        "engine": "sim",
        "model_path": str(write_target_config(tmp_path / "target", TINY)),
        "base_args": ["--tp-size", "1"],
        "gpus_per_server": 1,
        "max_servers": 1,
        "load": {
            "concurrency": [1],
            "requests_per_level": 4,
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 64, "vocab_size": 256},
        },
        "retries": 1,
        "timeouts": {"startup_s": 60, "level_s": 15, "stop_s": 5, "placement_s": 60},
        "env": {
            "SPECSWEEP_SIM_TIME_SCALE": "0.05",
            "SPECSWEEP_SIM_FAULT": "hang_mid_stream",
            "SPECSWEEP_SIM_FAULT_AFTER": "1",
        },
        "output_dir": str(out),
    }
    spec = parse_spec(data)
    log = io.StringIO()
    summary = run_sweep(
        spec,
        yaml.safe_dump(data),
        unchecked_plan(spec),
        out,
        ray_address="local",
        resume=False,
        progress=LogProgress(log),
    )
    assert summary.counts == {"pending": 0, "leased": 0, "done": 0, "failed": 1}, log.getvalue()
    conn = open_read_only(out)
    try:
        assert read_counts(conn)["failed"] == 1
        attempts = read_attempts(conn)
    finally:
        conn.close()
    assert len(attempts) == 2, log.getvalue()
    (row,) = pq.read_table(next(out.glob("jobs/*/*/part-0.parquet"))).to_pylist()
    startup_s = row["startup_s"]
    assert startup_s is not None and startup_s < 30
    for attempt in attempts:
        assert attempt.error_class in ("health_lost", "level_timeout"), attempt
        assert attempt.worker_s is not None
        # launch + startup, then the hang at request 2, then at most 30 s until the attempt is over
        assert attempt.worker_s < startup_s + 5 + HANG_BOUND_S, (attempt, log.getvalue())
