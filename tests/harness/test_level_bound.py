"""`timeouts.level_s` bounds a load level's wall time: a server that hangs mid-stream is stopped and the
attempt ends within level_s plus 15 s of the hang (not after every request's own timeout, 600 s by
default), then the retry policy runs.

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

LEVEL_S = 4.0
# level_s plus the stop (SIGTERM to a server that exits at once) and the worker's reporting; a harness
# that waited for the requests' own timeout (request_s, 600 s) would be far past it
HANG_BOUND_S = LEVEL_S + 15.0


def test_sweep_ends_each_attempt_within_19_s_of_a_hang_when_level_s_is_4(
    tmp_path: Path, node_dirs: None
) -> None:
    """hang_mid_stream with level_s 4 and retries 1: two attempts, each failed as health_lost or
    level_timeout, each over within 19 s of its server becoming ready (the hang follows at once). The rule
    is the harness's reaction to the hang, not a wall time: level_s 4 (was 15) bounds the same path as any
    other value and keeps the two attempts' wait short (the other 15 s were idle time)."""
    data = one_slot_sim_spec(
        tmp_path,
        requests=4,
        output_tokens=64,
        level_s=LEVEL_S,
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
