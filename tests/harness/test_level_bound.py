"""`timeouts.level_s` bounds a load level's wall time: a server that hangs mid-stream is stopped and the
attempt ends within 30 s of the hang (not after every request's own timeout), then the retry policy runs.

One embedded Ray (``--ray-address local``, started and stopped by the sweep itself) and the simulated
SGLang server with its ``hang_mid_stream`` fault: request 2 of each attempt stalls the scheduler for good.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq
import pytest

from harness.queue import open_read_only, read_attempts, read_counts
from tests.harness.sim_sweeps import one_slot_sim_spec, run_unchecked

pytestmark = pytest.mark.ray

HANG_BOUND_S = 30.0


def test_sweep_ends_each_attempt_within_30_s_of_a_hang_when_level_s_is_15(
    tmp_path: Path, node_dirs: None
) -> None:
    """hang_mid_stream with level_s 15 and retries 1: two attempts, each failed as health_lost or
    level_timeout, each over within 30 s of its server becoming ready (the hang follows at once)."""
    data = one_slot_sim_spec(
        tmp_path,
        requests=4,
        output_tokens=64,
        level_s=15,
        env={
            "SPECSWEEP_SIM_TIME_SCALE": "0.05",
            "SPECSWEEP_SIM_FAULT": "hang_mid_stream",
            "SPECSWEEP_SIM_FAULT_AFTER": "1",
        },
    )
    out = Path(data["output_dir"])
    summary, log = run_unchecked(data)
    assert summary.counts == {"pending": 0, "leased": 0, "done": 0, "failed": 1}, log
    conn = open_read_only(out)
    try:
        assert read_counts(conn)["failed"] == 1
        attempts = read_attempts(conn)
    finally:
        conn.close()
    assert len(attempts) == 2, log
    (row,) = pq.read_table(next(out.glob("jobs/*/*/part-0.parquet"))).to_pylist()
    startup_s = row["startup_s"]
    assert startup_s is not None and startup_s < 30
    for attempt in attempts:
        assert attempt.error_class in ("health_lost", "level_timeout"), attempt
        assert attempt.worker_s is not None
        # launch + startup, then the hang at request 2, then at most 30 s until the attempt is over
        assert attempt.worker_s < startup_s + 5 + HANG_BOUND_S, (attempt, log)
