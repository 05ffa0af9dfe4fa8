"""Open-loop schedules are the arrival processes they claim, judged by their inter-arrival statistics."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest

from workers.job import LoadLevel, LoadPlan
from workers.load.generator import arrival_offsets_ns

N = 20_000
RATE = 50.0


def gaps_s(level: LoadLevel, count: int = N) -> np.ndarray:
    offsets = np.fromiter(itertools.islice(arrival_offsets_ns(level), count), dtype=np.int64, count=count)
    return np.diff(np.concatenate([[0], offsets])) / 1e9


def ks_distance_to_exponential(gaps: np.ndarray, rate: float) -> float:
    """Kolmogorov-Smirnov distance between the gaps' empirical CDF and Exp(rate)'s."""
    x = np.sort(gaps)
    cdf = 1.0 - np.exp(-rate * x)
    n = len(x)
    return float(max((np.arange(1, n + 1) / n - cdf).max(), (cdf - np.arange(n) / n).max()))


@pytest.mark.parametrize("size", [{"requests": N}, {"duration_s": 10.0}], ids=["count", "duration"])
def test_poisson_schedule_has_exponential_independent_gaps_when_rate_given(size: dict[str, float]) -> None:
    """Poisson arrivals: gaps of mean 1/rate, coefficient of variation 1, exponentially distributed
    (KS distance below the 1% critical value) and uncorrelated; constant arrivals fail every one of
    these checks but the mean, so a schedule that only hits the rate cannot pass."""
    gaps = gaps_s(LoadLevel(rate_rps=RATE, seed=3, **size))
    assert gaps.mean() == pytest.approx(1 / RATE, rel=0.03)
    assert gaps.std() / gaps.mean() == pytest.approx(1.0, abs=0.03)
    assert ks_distance_to_exponential(gaps, RATE) < 1.63 / math.sqrt(N)
    assert abs(np.corrcoef(gaps[:-1], gaps[1:])[0, 1]) < 0.03
    constant = gaps_s(LoadLevel(rate_rps=RATE, arrival="constant", **size))
    assert constant.std() / constant.mean() < 1e-6
    assert ks_distance_to_exponential(constant, RATE) > 0.3


def test_poisson_schedule_last_arrival_is_a_draw_when_count_given() -> None:
    """A count does not pin the last arrival to n/rate: across seeds it varies by about sqrt(n)/rate."""
    ends = [
        max(arrival_offsets_ns(LoadLevel(rate_rps=RATE, requests=400, seed=seed))) / 1e9 for seed in range(40)
    ]
    assert np.mean(ends) == pytest.approx(400 / RATE, rel=0.03)
    assert np.std(ends) == pytest.approx(math.sqrt(400) / RATE, rel=0.35)


@pytest.mark.parametrize("burstiness", [0.25, 4.0])
def test_gamma_schedule_has_coefficient_of_variation_of_its_burstiness_when_gamma(burstiness: float) -> None:
    """Gamma arrivals keep the mean gap 1/rate; burstiness b gives CV 1/sqrt(b): 2 (bursty), 0.5 (regular)."""
    gaps = gaps_s(LoadLevel(rate_rps=RATE, arrival="gamma", burstiness=burstiness, requests=N, seed=5))
    assert gaps.mean() == pytest.approx(1 / RATE, rel=0.04)
    assert gaps.std() / gaps.mean() == pytest.approx(1 / math.sqrt(burstiness), rel=0.05)


def test_load_level_refuses_burstiness_when_arrival_is_not_gamma() -> None:
    """Burstiness has no meaning for Poisson or constant arrivals: saying it there is a mistake."""
    with pytest.raises(ValueError, match="gamma"):
        LoadLevel(rate_rps=RATE, burstiness=0.5, requests=10)
    with pytest.raises(ValueError, match="gamma"):
        LoadPlan(rates=[1.0], burstiness=0.5, requests_per_level=10)


@pytest.mark.parametrize(
    ("order", "expected"),
    [
        ("ascending", ["concurrency=1", "concurrency=16", "concurrency=64", "rate=2", "rate=8"]),
        ("descending", ["rate=8", "rate=2", "concurrency=64", "concurrency=16", "concurrency=1"]),
    ],
)
def test_load_plan_orders_levels_when_level_order_set(order: str, expected: list[str]) -> None:
    """Levels run sorted by load (closed loop, then open loop) or reversed; every level warms up and
    flushes, and rate levels take the plan's arrival process."""
    plan = LoadPlan(
        concurrency=[64, 1, 16],
        rates=[8.0, 2.0],
        arrival="gamma",
        burstiness=0.5,
        requests_per_level=10,
        warmup_requests=3,
        level_order=order,  # type: ignore[arg-type]
    )
    levels = plan.levels(seed=0, request_timeout_s=60)
    assert [level.label for level in levels] == expected
    assert all(level.warmup_requests == 3 and level.flush_cache for level in levels)
    assert {(level.arrival, level.burstiness) for level in levels if level.rate_rps} == {("gamma", 0.5)}


def test_load_plan_shuffles_levels_by_seed_when_shuffled() -> None:
    """Shuffled order is a permutation fixed by the sweep's seed (the same run repeats it), and another
    seed gives another order."""
    plan = LoadPlan(concurrency=[1, 2, 4, 8, 16, 32], requests_per_level=10, level_order="shuffled")
    orders = {seed: [lvl.label for lvl in plan.levels(seed=seed, request_timeout_s=60)] for seed in range(4)}
    assert orders[0] == [lvl.label for lvl in plan.levels(seed=0, request_timeout_s=60)]
    assert sorted(orders[0]) == sorted(f"concurrency={c}" for c in (1, 2, 4, 8, 16, 32))
    assert len({tuple(o) for o in orders.values()}) > 1


@pytest.mark.parametrize("arrival", ["poisson", "gamma"])
def test_random_schedule_is_fixed_by_the_level_s_seed(arrival: str) -> None:
    """The same seed repeats a schedule (a level can be rerun as it was), another seed gives another."""

    def schedule(seed: int) -> list[int]:
        burstiness = 0.5 if arrival == "gamma" else 1.0
        return list(
            arrival_offsets_ns(
                LoadLevel(rate_rps=RATE, arrival=arrival, burstiness=burstiness, requests=50, seed=seed)
            )
        )

    assert schedule(7) == schedule(7)
    assert schedule(7) != schedule(8)
