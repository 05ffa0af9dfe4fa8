"""SLO parsing: clauses in, positioned errors out."""

from __future__ import annotations

import pytest

from analysis.select import SLO_METRICS
from analysis.slo import Slo, parse_slos
from specsweep.errors import ResultsError


def test_parse_slos_reads_clauses_when_well_formed() -> None:
    """Comma-separated METRIC OP NUMBER with optional spaces and exponents."""
    assert parse_slos(" ttft_p99_ms <= 2000 , tpot_p99_ms<5e1,output_tok_s_per_gpu>=1", SLO_METRICS) == (
        Slo("ttft_p99_ms", "<=", 2000.0),
        Slo("tpot_p99_ms", "<", 50.0),
        Slo("output_tok_s_per_gpu", ">=", 1.0),
    )
    assert parse_slos("", SLO_METRICS) == ()


@pytest.mark.parametrize(
    ("text", "position", "expected"),
    [
        ("ttft_p99_ms<=2000,tpot_p99_ms=>50", 30, "one of <=, >=, <, >"),
        ("ttft_p99_ms<=abc", 14, "a number"),
        ("ttft_p99_ms<=20 ms", 17, "',' or the end"),
        ("<=3", 1, "a metric name"),
        ("ttft_p99_ms<=1,", 16, "a metric name"),
    ],
)
def test_parse_slos_points_at_position_when_malformed(text: str, position: int, expected: str) -> None:
    """The error names the 1-based character and draws a caret under it."""
    with pytest.raises(ResultsError) as err:
        parse_slos(text, SLO_METRICS)
    message = str(err.value)
    assert f"at character {position}: expected {expected}" in message
    lines = message.splitlines()
    caret_line = lines[2]
    assert caret_line.index("^") - 2 == position - 1 and lines[1].strip() == text.strip()


def test_parse_slos_suggests_names_when_metric_unknown() -> None:
    """An unknown metric lists close names."""
    with pytest.raises(ResultsError, match="unknown metric 'ttf_p99_ms'") as err:
        parse_slos("ttf_p99_ms<=1", SLO_METRICS)
    assert "did you mean ttft_p99_ms" in str(err.value)


def test_slo_fails_when_value_null() -> None:
    """An unknown value never meets an SLO."""
    assert not Slo("ttft_p99_ms", "<=", 1.0).holds(None)
    assert Slo("ttft_p99_ms", "<=", 1.0).holds(1.0) and not Slo("ttft_p99_ms", "<", 1.0).holds(1.0)
