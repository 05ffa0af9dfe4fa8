"""Sequential levels: the stopping rule, and a closed loop against the simulated server that uses it."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.launch_args import chain_launch_args
from workers.job import LoadLevel, LoadPlan
from workers.load.generator import run_load
from workers.load.sequential import precise_enough, relative_width
from workers.load.workloads import RandomIdsWorkload
from workers.node.launcher import ServerProcess, start_sim

FIXTURES = Path(__file__).parents[1] / "fixtures"
WORKLOAD = RandomIdsWorkload(input_tokens=8, output_tokens=32)


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerProcess]:
    """A depth-3 chain at half of real time: a request takes about 160 ms, so a busy machine's late
    wake-ups (tens of ms on 2 cores beside the suite's other pytest process) are small against it. At 1/20
    of real time (16 ms requests) a level run beside the Ray tests sent all 400 requests without its
    throughput's interval reaching 5%: the box's jitter, not the server, set the requests' spread."""
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 3)
    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "0.5"}) as server:
        yield server


def test_relative_width_shrinks_as_sqrt_n_when_requests_accumulate() -> None:
    """The interval of tokens/latency narrows like 1/sqrt(n); equal ratios give width 0."""
    rng = random.Random(0)
    latencies = [1.0 + rng.gauss(0.0, 0.1) for _ in range(400)]
    tokens = [32.0] * 400
    wide, narrow = relative_width(tokens[:100], latencies[:100]), relative_width(tokens, latencies)
    assert narrow == pytest.approx(wide / 2, rel=0.2)
    assert 2 * 1.96 * 0.1 / math.sqrt(400) == pytest.approx(narrow, rel=0.2)
    assert relative_width([32.0] * 5, [2.0] * 5) == 0.0
    assert relative_width([32.0], [1.0]) == math.inf


def test_precise_enough_waits_for_three_rounds_of_streams_when_width_is_already_small() -> None:
    """Even a zero-width interval needs max(10, 3 x streams) requests before a level may stop."""
    assert not precise_enough([32.0] * 23, [1.0] * 23, 8, 0.05)
    assert precise_enough([32.0] * 24, [1.0] * 24, 8, 0.05)
    assert not precise_enough([32.0] * 9, [1.0] * 9, 1, 0.05)


def test_run_load_stops_a_closed_loop_early_when_its_throughput_is_precise(sim: ServerProcess) -> None:
    """precision 0.05: a 400-request level stops once precise, in-flight requests finish (no errors),
    and says why; without precision the same level's smaller twin runs its full count. The rule decided on
    the requests finished at the stop, so the interval is narrow enough over the records in finish order
    without the last ones, up to one per stream, that were still in flight then and joined afterwards."""
    level = LoadLevel(concurrency=4, requests=400, precision=0.05)
    result = run_load(sim.url, level, WORKLOAD, calibration_streams=4)
    assert result.num_errors == 0 and 12 <= len(result.records) < 400
    assert result.stop_reason == "precision"
    finished = sorted(result.records, key=lambda r: r.end_ns or 0)
    tokens = [float(r.completion_tokens or 0) for r in finished]
    latencies = [(r.end_ns or 0) / 1e9 - r.start_ns / 1e9 for r in finished]
    at_stop = range(max(2, len(finished) - level.concurrency), len(finished) + 1)
    assert min(relative_width(tokens[:k], latencies[:k]) for k in at_stop) <= 0.05
    full = run_load(sim.url, LoadLevel(concurrency=4, requests=12), WORKLOAD, calibration_streams=4)
    assert len(full.records) == 12 and full.stop_reason == "limit"


def test_run_load_ends_a_duration_level_before_its_time_when_precise(sim: ServerProcess) -> None:
    """A 60 s level with precision 0.05 ends well before 60 s, with reason precision."""
    level = LoadLevel(concurrency=2, duration_s=60.0, precision=0.05)
    result = run_load(sim.url, level, WORKLOAD, calibration_streams=4)
    assert result.duration_s < 30 and result.stop_reason == "precision" and result.num_errors == 0


def test_load_plan_gives_precision_to_closed_loop_levels_only_when_set() -> None:
    """load.precision reaches every concurrency level; rate levels run their schedule."""
    plan = LoadPlan(concurrency=[1, 8], rates=[2.0], duration_s=10.0, precision=0.02)
    levels = plan.levels(seed=0, request_timeout_s=60.0)
    assert [lv.precision for lv in levels] == [0.02, 0.02, None]
    with pytest.raises(ValueError, match="precision stops a closed loop early"):
        LoadLevel(rate_rps=2.0, requests=4, precision=0.02)
