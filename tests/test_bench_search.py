"""bench.search.evaluate on a truth written here (not the simulator's): containment and node-hours by hand."""

from __future__ import annotations

import dataclasses
import json

import pytest

from bench.search import Noise, TrueLevel, evaluate, grid_ties, main
from harness.search.model import Candidate
from harness.search.strategy import Budget, Decision, SearchState, propose

SPACE = (Candidate("baseline", "baseline", None, None, None), Candidate("chain2", "chain d=2", 1, 1, 2))
# concurrency 1: the chain is 1.5x the baseline; concurrency 8: the baseline is within 1% of the chain
TABLE = {
    ("baseline", 1): TrueLevel(100.0, None),
    ("baseline", 8): TrueLevel(400.0, None),
    ("chain2", 1): TrueLevel(150.0, (0.3, 0.7)),
    ("chain2", 8): TrueLevel(404.0, (0.3, 0.7)),
}
EXACT = Noise(
    launch_sigma=0.0, level_sigma=0.0, startup_s=1000.0, startup_jitter=0.0, requests=10, output_len=100
)


def hand_truth(cand: Candidate, concurrency: int) -> TrueLevel:
    return TABLE[(cand.config_id, concurrency)]


def baseline_only(state: SearchState, free: int, budget: Budget, tolerance: float) -> Decision:
    """The model search, but it never launches anything except the baseline."""
    decision = propose(state, free, budget, tolerance)
    return dataclasses.replace(decision, launches=tuple(x for x in decision.launches if x[0] == "baseline"))


def test_evaluate_contains_only_when_every_level_does_when_truth_is_hand_written() -> None:
    """An answer contains the truth when, at every level, one of its configs is within 2% of the true
    best; the grid's node-hours are each launch's startup plus requests x output / throughput per level."""
    full = evaluate(hand_truth, SPACE, (1, 8), noise=EXACT, seed=1, repeats=1)
    partial = evaluate(hand_truth, SPACE, (1, 8), noise=EXACT, seed=1, repeats=1, strategy=baseline_only)

    # by hand: baseline 1000 + 1000/100 + 1000/400 s; chain 1000 + 1000/150 + 1000/404 s
    grid_hours = (2000 + 10 + 2.5 + 1000 / 150 + 1000 / 404) / 3600
    # one repeat: no launch variance to pool, the assumed 2% ties 400 with 404 at concurrency 8
    assert [(o.launches, o.contains, o.tie_sizes) for o in full.grid] == [(2, True, (1, 2))]
    assert full.grid[0].node_hours == pytest.approx(grid_hours)
    assert [(o.launches, o.contains) for o in full.search] == [(2, True)]
    # the baseline is within 2% at concurrency 8 (400 >= 0.98 x 404) but not at 1 (100 < 0.98 x 150)
    assert [(o.launches, o.contains) for o in partial.search] == [(1, False)]
    assert partial.search[0].node_hours == pytest.approx(1012.5 / 3600)


def test_grid_ties_keeps_configs_whose_intervals_overlap_the_best_when_noise_is_pooled() -> None:
    """The grid's tie set: every config whose 95% interval of the mean (1.96 sigma / sqrt(n), log scale)
    overlaps the best's, best first: 3% below ties at 2% launch noise and 2 repeats, 10% below does not."""
    means = {"c": (90.0, 2), "b": (97.0, 2), "a": (100.0, 2)}
    assert grid_ties(means, 0.02) == ("a", "b")
    assert grid_ties(means, 0.0) == ("a",)


def test_main_runs_only_the_named_scenario_when_only_is_given(capsys: pytest.CaptureFixture[str]) -> None:
    """``--only 8 --draws 1`` runs scenario 8 of the default 20 and no other (iterating on the slow
    scenarios without the 7-10 minute run); the totals count its one run."""
    assert main(["--only", "8", "--draws", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(" seed=")[0] for line in lines if line.startswith("scenario-")] == [
        "scenario-8 (llama-3.3-70b-h100x8)"
    ]
    assert json.loads(lines[-1])["runs"] == 1
