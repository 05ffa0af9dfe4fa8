"""Launch-to-launch noise: repeats widen intervals, and a near-tie is reported, not crowned."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

from analysis.select import Selection, select_best
from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep
from analysis.views import connect

LEVEL = 16


def _sweep(out: Path, launch_factors: tuple[float, ...]) -> Selection:
    """Two chains 2% apart and the baseline, two launches each, every launch's TPOT scaled by a factor."""
    configs = (
        SyntheticConfig("baseline", repeats=2, launch_tpot_factors=launch_factors),
        SyntheticConfig(
            "chain d=4",
            "EAGLE3",
            3,
            1,
            4,
            accept_length=2.65,
            step_cost=1.1,
            repeats=2,
            launch_tpot_factors=launch_factors,
        ),
        SyntheticConfig(
            "chain d=5",
            "EAGLE3",
            4,
            1,
            5,
            accept_length=2.6,
            step_cost=1.1,
            repeats=2,
            launch_tpot_factors=tuple(reversed(launch_factors)),
        ),
    )
    write_sweep(out, SyntheticSweep(configs=configs, concurrencies=(LEVEL,), requests_per_level=2000, seed=3))
    return select_best(connect(out), out)


def _width(selection: Selection, label: str) -> float:
    ranked = {r.config_label: r for r in selection.levels[0].ranked}
    ci = ranked[label].objective_ci
    assert ci is not None
    return (ci.high - ci.low) / ranked[label].objective


def test_select_best_widens_intervals_when_launches_differ(tmp_path: Path) -> None:
    """Launches 12% apart widen every config's interval several-fold over launches that agree."""
    alike = _sweep(tmp_path / "alike", (1.0, 1.0))
    differ = _sweep(tmp_path / "differ", (0.94, 1.06))
    for label in ("baseline", "chain d=4", "chain d=5"):
        assert _width(differ, label) > 3 * _width(alike, label)


def test_select_best_reports_near_tie_as_not_distinguishable_when_launches_differ(tmp_path: Path) -> None:
    """Configs 2% apart are told apart when launches agree, and are a tie, with a repeats estimate, when
    launches differ by more than that; the clearly slower baseline is never a tie."""
    alike = _sweep(tmp_path / "alike", (1.0, 1.0)).levels[0]
    differ_out = tmp_path / "differ"
    differ = _sweep(differ_out, (0.94, 1.06)).levels[0]
    for level in (alike, differ):
        assert [r.config_label for r in level.ranked][:2] == ["chain d=4", "chain d=5"]
        assert not level.ranked[2].tie and level.ranked[2].is_baseline
    assert not alike.ranked[1].tie and alike.ranked[1].more_repeats is None
    second = differ.ranked[1]
    assert second.tie and second.difference_ci is not None and second.difference_ci.low <= 0
    assert second.more_repeats is not None and second.more_repeats >= 1
    text = subprocess.run(
        [sys.executable, "-m", "harness.cli", "best", str(differ_out)],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    assert "tie: chain d=4, chain d=5 - not separable at 95%" in text
    assert re.search(r"about \d+ more launches of each would separate a 1% difference", text)
