"""Error rates count: a config that fails many requests does not win, and every output shows the rate."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.report import render_report
from analysis.select import DEFAULT_MAX_ERROR_RATE, select_best
from analysis.synthetic import SyntheticConfig, write_sweep
from analysis.views import connect
from harness.deploy_launch import deploy_launches
from specsweep.errors import ResultsError

from .conftest import CLEAR_CONFIGS, clear_sweep

# Far ahead of every other config on throughput, but one request in three is an HTTP 500.
FLAKY = SyntheticConfig("chain d=16", "EAGLE3", 15, 1, 16, accept_length=6.0, step_cost=1.0, error_rate=0.33)


@pytest.fixture(scope="module")
def flaky_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("flaky")
    write_sweep(
        out, clear_sweep(configs=(*CLEAR_CONFIGS, FLAKY), concurrencies=(16,), requests_per_level=300)
    )
    return out


def test_select_best_excludes_a_config_when_its_error_rate_exceeds_the_default(flaky_results: Path) -> None:
    """The flaky config would win on throughput; by default (1%) it is excluded with its rate as the
    reason, and every ranked config carries its own error rate (0 here)."""
    (level,) = select_best(connect(flaky_results), flaky_results, replicates=200).levels
    assert DEFAULT_MAX_ERROR_RATE == 0.01
    assert level.winner is not None and level.winner.config_label != FLAKY.label
    (excluded,) = level.excluded
    assert excluded.config_label == FLAKY.label and excluded.error_rate is not None
    assert 0.25 < excluded.error_rate < 0.41
    assert any("error rate" in r and "above the limit 1.0%" in r for r in excluded.reasons)
    assert {r.error_rate for r in level.ranked} == {0.0}


def test_select_best_ranks_a_flaky_config_when_the_limit_allows_it(flaky_results: Path) -> None:
    """--max-error-rate 0.5 lets the same config rank (and win), its error rate shown with it."""
    (level,) = select_best(connect(flaky_results), flaky_results, replicates=200, max_error_rate=0.5).levels
    assert level.winner is not None and level.winner.config_label == FLAKY.label
    assert level.winner.error_rate is not None and level.winner.error_rate > 0.25
    with pytest.raises(ResultsError, match="max-error-rate"):
        select_best(connect(flaky_results), flaky_results, replicates=200, max_error_rate=1.5)


def test_best_and_report_show_the_error_rate_when_a_config_is_excluded(flaky_results: Path) -> None:
    """`best` prints an errors column and the excluded config's rate; the report's table has both."""
    best = subprocess.run(
        [sys.executable, "-m", "harness.cli", "best", str(flaky_results), "--bootstrap", "200"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert best.returncode == 0, best.stderr
    assert "errors" in best.stdout and "error rate at most 1.0%" in best.stdout
    excluded = [line for line in best.stdout.splitlines() if line.strip().startswith("excluded chain d=16")]
    assert len(excluded) == 1 and "%" in excluded[0] and "above the limit" in excluded[0]
    con = connect(flaky_results)
    page = render_report(con, select_best(con, flaky_results, replicates=200), launches=deploy_launches(con))
    assert "<th>errors</th>" in page and "0.0%" in page and "above the limit 1.0%" in page
