"""The search model's pooled chain acceptance on histograms small enough to work by hand."""

from __future__ import annotations

from harness.search.model import Candidate, LevelResult, Observation, chain_acceptance

CANDIDATES = {
    "base": Candidate("base", "baseline", None, None, None),
    "c2": Candidate("c2", "chain d=2", 1, 1, 2),
    "c4": Candidate("c4", "chain d=4", 3, 1, 4),
}


def test_chain_acceptance_pools_only_the_asked_levels_histograms_and_stops_where_no_step_reached() -> None:
    """At 1 client chain d=2 accepted its one draft in 2 of 4 verify steps (2, 2) and chain d=4 never
    accepted one in 6 (6, 0, 0, 0): position 1 was reached 4 + 6 = 10 times and passed 2 + 0 = 2, so
    q_1 = 0.2; no step reached position 2, so the list stops there. At 8 clients chain d=4 accepted all
    three drafts in all 10 steps (0, 0, 0, 10): q = 1, 1, 1; chain d=2 has no histogram there and the
    baseline is no chain; neither counts, and no level's counts leak into the other's."""
    observations = [
        Observation("base", 0, 1.0, (LevelResult("concurrency=1", 1, 50.0, None),)),
        Observation(
            "c2",
            0,
            1.0,
            (LevelResult("concurrency=1", 1, 80.0, (2, 2)), LevelResult("concurrency=8", 8, 300.0, None)),
        ),
        Observation(
            "c4",
            0,
            1.0,
            (
                LevelResult("concurrency=1", 1, 40.0, (6, 0, 0, 0)),
                LevelResult("concurrency=8", 8, 400.0, (0, 0, 0, 10)),
            ),
        ),
    ]
    assert chain_acceptance(CANDIDATES, observations, "concurrency=1") == [0.2]
    assert chain_acceptance(CANDIDATES, observations, "concurrency=8") == [1.0, 1.0, 1.0]
    assert chain_acceptance(CANDIDATES, observations, "concurrency=64") == []
