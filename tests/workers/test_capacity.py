"""The capacity search's bisection on loads whose verdicts are known, and the spec's capacity checks."""

from __future__ import annotations

import math

import pytest

from analysis.schema import LevelRecord
from analysis.slo import Slo
from harness.spec import parse_spec
from specsweep.errors import SpecError
from workers.job import CapacitySearch
from workers.load.capacity import Verdict, search_capacity, verdict


def searched(kind: str, truth: float, **fields: float) -> tuple[float | None, str, list[float]]:
    """Search against a server whose SLOs hold exactly up to ``truth``."""
    search = CapacitySearch.model_validate(
        {"kind": kind, "slo": "tpot_p99_ms<=50", "lo": 1.0, "hi": 64.0, **fields}
    )
    outcome = search_capacity(search, lambda load: Verdict(load <= truth, (truth - load) / truth))
    return outcome.capacity, outcome.bound, [p.load for p in outcome.probes]


@pytest.mark.parametrize("truth", [1.37, 3.0, 7.3, 22.2, 41.9, 60.0])
def test_rate_search_lands_within_tolerance_below_the_truth_when_truth_in_bracket(truth: float) -> None:
    """Eight geometric bisections of a 64x bracket end within 2% under the true capacity."""
    capacity, bound, loads = searched("rate", truth)
    assert bound == "bracketed" and len(loads) <= 8
    assert capacity is not None and truth / 1.02 <= capacity <= truth


@pytest.mark.parametrize("truth", [1, 2, 5, 23, 40, 60])
def test_concurrency_search_finds_the_exact_integer_when_truth_in_bracket(truth: int) -> None:
    """Integers: the search ends on adjacent pass/fail concurrencies, the pass being the truth."""
    capacity, bound, loads = searched("concurrency", truth + 0.5, max_probes=8)
    assert capacity == truth and bound == "bracketed" and len(loads) <= 8
    assert all(float(load).is_integer() for load in loads) and len(set(loads)) == len(loads)


def test_search_reports_a_bound_when_capacity_is_outside_the_bracket() -> None:
    """No failing probe: at least the highest pass; no passing probe: no capacity, bound below."""
    capacity, bound, loads = searched("rate", 500.0)
    assert bound == "at_least" and capacity == max(loads) and capacity > 60
    capacity, bound, loads = searched("rate", 0.5)
    assert bound == "below" and capacity is None and min(loads) < 1.05
    capacity, bound, loads = searched("concurrency", 0.5)
    assert bound == "below" and capacity is None and loads[-1] == 1.0  # lo itself is probed last


def test_search_stops_early_when_the_bracket_is_narrow() -> None:
    """A loose tolerance spends fewer probes than max_probes."""
    _, _, loads = searched("rate", 10.0, tolerance=0.2, max_probes=20)
    assert len(loads) < 8


def _level(**values: float | None) -> LevelRecord:
    fields = {name: None for name in LevelRecord.__dataclass_fields__}
    return LevelRecord(**{**fields, **values})  # type: ignore[arg-type]


def test_verdict_margin_is_the_tightest_relative_slack_when_several_clauses() -> None:
    """tpot at 40 of 50 (20% slack), ttft at 1900 of 2000 (5%): passes with margin 0.05; an error
    rate above 1% fails; a missing value fails with no margin."""
    slos = (Slo("tpot_p99_ms", "<=", 50.0), Slo("ttft_p99_ms", "<=", 2000.0))
    judged = verdict(slos, _level(tpot_p99_ms=40.0, ttft_p99_ms=1900.0, error_rate=0.0))
    assert judged.passed and math.isclose(judged.margin or 0, 0.05)
    assert not verdict(slos, _level(tpot_p99_ms=40.0, ttft_p99_ms=1900.0, error_rate=0.02)).passed
    failed = verdict(slos, _level(tpot_p99_ms=55.0, ttft_p99_ms=1900.0, error_rate=0.0))
    assert not failed.passed and math.isclose(failed.margin or 0, -0.1)
    assert verdict(slos, _level(tpot_p99_ms=None, ttft_p99_ms=1.0, error_rate=0.0)) == Verdict(False, None)


@pytest.mark.parametrize(
    ("capacity", "message"),
    [
        ({"lo": 8, "hi": 4}, "load.capacity: lo (8) must be below hi (4)"),
        (
            {"kind": "concurrency", "lo": 4, "hi": 4.5},
            "load.capacity: a concurrency bracket needs hi at least lo + 1",
        ),
        ({"slo": "tpot_p99<=50"}, "load.capacity: slo: unknown metric 'tpot_p99'; did you mean tpot_p99_ms"),
        ({"slo": "goodput_rps>=3"}, "load.capacity: slo: unknown metric 'goodput_rps'"),
        ({"slo": " "}, "load.capacity: slo: it is empty; give level SLOs"),
        ({"slo": "tpot_p99_ms<="}, "load.capacity: slo: malformed SLO at character 14: expected a number"),
    ],
)
def test_spec_names_the_capacity_mistake_when_invalid(capacity: dict[str, object], message: str) -> None:
    search = {"kind": "rate", "slo": "tpot_p99_ms<=50", "lo": 1, "hi": 64, **capacity}
    with pytest.raises(SpecError) as err:
        parse_spec({"model_path": "/m", "load": {"requests_per_level": 10, "capacity": search}})
    assert message in str(err.value)


def test_spec_takes_a_capacity_search_without_fixed_levels() -> None:
    spec = parse_spec(
        {
            "model_path": "/m",
            "load": {
                "requests_per_level": 10,
                "capacity": {"kind": "rate", "slo": "ttft_p99_ms<=900", "lo": 1, "hi": 32},
            },
        }
    )
    assert spec.load.levels(seed=0, request_timeout_s=60.0) == []
    probe = spec.load.probe_level(12.5, seed=0, request_timeout_s=60.0)
    assert probe.label == "rate=12.5" and probe.requests == 10 and probe.flush_cache
