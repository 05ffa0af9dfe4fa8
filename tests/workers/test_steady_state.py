"""A loaded level's latencies are the server's steady state only with the ramp-up and the window.

The simulated server's ``steady_state`` truth is a closed loop whose streams are spread out; the load
generator reaches it by starting its streams over ``ramp_up_s`` and measuring inside the level's window.
All streams starting at once (ramp 0, the old behaviour) measures the start-up burst of simultaneous
prefills instead, whose TTFT tail is several times the steady one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from workers.job import LoadLevel
from workers.load.generator import LoadResult, run_load
from workers.load.workloads import RandomIdsWorkload
from workers.node.launcher import ServerProcess, start_sim
from workers.sglang import SpecParams
from workers.sim.model import RANDOM_IDS, Load, steady_state
from workers.sim.presets import DEFAULT_PRESET
from workers.sim.reported import server_launch_factor

FIXTURES = Path(__file__).parents[1] / "fixtures"
CONCURRENCY = 64
PROMPT, OUTPUT = 40, 64
TOLERANCE = 0.25  # the acceptance bound of issue 14
# Real seconds per simulated second. At real time the server and 64 streams need ~3,000 chunks/s of a
# shared 2-core box, and a TTFT tail of 50 ms is lost in its scheduling delays (measured: +15% idle, up to
# 5x at a load average of 12); three times slower leaves a third of the work and triples the scale.
SCALE = 3.0


@pytest.fixture(scope="module")
def baseline_sim() -> Iterator[ServerProcess]:
    """The baseline (no drafter) on the default preset: its decode step at 64 requests is 33 ms
    (simulated), and 64 prompts prefilled together take about 81 ms, as long as two and a half steps."""
    args = ["--model-path", str(FIXTURES / "kimi-k25"), "--max-running-requests", str(CONCURRENCY)]
    env = {"SPECSWEEP_SIM_SEED": "3", "SPECSWEEP_SIM_TIME_SCALE": str(SCALE)}
    with start_sim(args, env=env) as server:
        yield server


# Simulated seconds of the ramped level: a request takes 2.2, so the window holds about 160 requests and its
# p99 is the second or third largest TTFT, not the largest (one scheduling hiccup of the box is not the tail).
RAMPED_S = 9.0
# Of the burst level (all streams at once): the baseline has no acceptance noise, so its 64 streams stay in
# step and each wave of 64 replacement requests is prefilled together, the start-up burst again; the p99 is
# a burst's whatever the level's length (a wave is a third to a fifth of the requests, the p99 the two or
# three largest). Measured back to back, the same server: 5 s, p99 123.7 ms (waves' largest 123.8, 97.5 and
# 90.5 ms); 9 s, p99 101.8 ms (92.9, 82.5, 101.9, 99.2, 79.7), against 54 ms of truth. 5 s hold three
# waves (192 requests, 2.2 s apart), more than the two streams' worth the p99 needs.
BURST_S = 5.0


def _run(sim: ServerProcess, ramp_up_s: float, duration_s: float) -> LoadResult:
    """A level of ``duration_s`` simulated seconds whose streams start over ``ramp_up_s``."""
    level = LoadLevel(
        concurrency=CONCURRENCY,
        duration_s=duration_s * SCALE,
        ramp_up_s=ramp_up_s * SCALE,
        warmup_requests=2,
        flush_cache=True,
    )
    workload = RandomIdsWorkload(input_tokens=PROMPT, output_tokens=OUTPUT, vocab_size=163840)
    return run_load(sim.url, level, workload, calibration_streams=4)


def _ttft_p99_ms(result: LoadResult, *, window: bool) -> float:
    """In simulated milliseconds."""
    ttfts = [r.ttft_ms for r in result.records if r.ttft_ms is not None and (r.in_window or not window)]
    assert len(ttfts) >= 2 * CONCURRENCY  # enough requests that the p99 is a tail, not one request
    return float(np.percentile(ttfts, 99)) / SCALE


def test_ttft_p99_at_64_is_steady_state_truth_only_with_ramp_up_and_window(
    baseline_sim: ServerProcess,
) -> None:
    """With a 1 s ramp-up (simulated), TTFT p99 over the window's requests is within 25% of the simulator's
    steady-state truth at the launch's factor (54 ms at factor 1); with all 64 streams starting at once,
    TTFT p99 over the level is far above it (a shorter level than the ramped one: every wave of the burst
    level is a burst, see BURST_S)."""
    spec = SpecParams(None, None, None, None, CONCURRENCY)
    load = Load(CONCURRENCY, PROMPT, OUTPUT, 0, mix=((RANDOM_IDS, 1.0),))
    factor = server_launch_factor(baseline_sim.url)
    truth_ms = 1e3 * steady_state(DEFAULT_PRESET, spec, load, ramp_up_s=1.0, factor=factor).ttft_p99_s
    ramped = _run(baseline_sim, ramp_up_s=1.0, duration_s=RAMPED_S)
    assert ramped.num_errors == 0 and ramped.window_start_s == SCALE
    assert _ttft_p99_ms(ramped, window=True) == pytest.approx(truth_ms, rel=TOLERANCE)
    burst = _run(baseline_sim, ramp_up_s=0.0, duration_s=BURST_S)
    assert _ttft_p99_ms(burst, window=False) > (1 + TOLERANCE) * truth_ms
