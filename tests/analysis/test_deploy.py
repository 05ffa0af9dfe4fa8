"""The load mix, worked by hand: mix scores, what deploy_weights change, and the measured confirmation.

Two closed-loop levels and three configs whose objectives are chosen so every score is a short
fraction; each test's docstring works the numbers the assertions check, so none repeats the code's
formula to compute what it expects.
"""

from __future__ import annotations

import dataclasses

import pytest

from analysis.confirmation import confirm
from analysis.deploy import ConfigShape, plan_deployment
from analysis.select import Interval, LevelChoice, RankedConfig, Selection

LOW, HIGH = "concurrency=1", "concurrency=64"
SHAPES = {
    "baseline": ConfigShape("baseline", True, None, None),
    "chain d=4": ConfigShape("chain d=4", False, 3, 1),
    "tree s=3 k=4": ConfigShape("tree s=3 k=4", False, 3, 4),
    "adaptive": ConfigShape("adaptive", False, 3, 1),
}
CONCURRENCY: dict[str, int | None] = {LOW: 1, HIGH: 64}
# Throughput (higher is better) per level, best first: the tree wins the low level, the baseline the high.
THROUGHPUT = {
    LOW: {"tree s=3 k=4": 125.0, "chain d=4": 100.0, "baseline": 50.0},
    HIGH: {"baseline": 200.0, "chain d=4": 150.0, "tree s=3 k=4": 100.0},
}
# The same ranking as a latency (lower is better): each value is 10000 / the throughput above.
LATENCY = {
    level: {label: 10_000.0 / value for label, value in row.items()} for level, row in THROUGHPUT.items()
}


def _ranked(label: str, objective: float, rank: int) -> RankedConfig:
    return RankedConfig(
        rank=rank, config_label=label, is_baseline=label == "baseline", repeats=1, job_ids=(label,),
        objective=objective, objective_mad=None, objective_ci=Interval(objective * 0.98, objective * 1.02),
        speedup=None, speedup_ci=None, tie=False, difference_ci=None, more_repeats=None, error_rate=0.0,
        goodput_rps=None, goodput_share=None, slo_values={}, launch_command=None, sglang_argv=None,
    )  # fmt: skip


def _selection(values: dict[str, dict[str, float]], better: str) -> Selection:
    levels = tuple(
        LevelChoice(
            load_level=level,
            baseline_label="baseline",
            baseline_objective=row["baseline"],
            ranked=tuple(
                _ranked(label, value, rank)
                for rank, (label, value) in enumerate(
                    sorted(row.items(), key=lambda item: item[1], reverse=better == "higher"), start=1
                )
            ),
            excluded=(),
        )
        for level, row in values.items()
    )
    return Selection(
        sweep_id="s", objective="output_tok_s_per_gpu" if better == "higher" else "e2e_p50_ms",
        objective_unit="", better=better, slos=(), request_slos=(), confidence=0.95, max_error_rate=0.01,
        replicates=100, levels=levels, notes=(),
    )  # fmt: skip


SELECTIONS = {"higher": _selection(THROUGHPUT, "higher"), "lower": _selection(LATENCY, "lower")}


@pytest.mark.parametrize("better", ["higher", "lower"])
def test_plan_deployment_scores_the_mix_by_hand_when_levels_weigh_alike(better: str) -> None:
    """Level scores are each config's share of the level's winner (winner / value for a latency):
    low level tree 1, chain 100/125 = 0.8, baseline 50/125 = 0.4; high level baseline 1, chain
    150/200 = 0.75, tree 100/200 = 0.5. Equal weights: tree 0.75, chain (0.8 + 0.75) / 2 = 0.775,
    baseline 0.7, so the static choice is the chain at 0.775. The adaptive schedule runs the best chain
    or baseline per level, the chain at the low level and the baseline at the high one:
    (0.8 + 1) / 2 = 0.9, so it is recommended; batches from ceil(sqrt(1 x 64)) = 8 run the baseline's
    depth 0, smaller ones the chain's 3 steps, and at the low level it gives up the tree's 1/0.8 = 1.25x."""
    deployment = plan_deployment(SELECTIONS[better], SHAPES, CONCURRENCY)
    assert deployment.weights == {LOW: 1.0, HIGH: 1.0}  # no deploy_weights: each level weighs 1
    assert deployment.static.config_label == "chain d=4"
    assert deployment.static.mix_score == pytest.approx(0.775)
    assert deployment.static.level_scores == pytest.approx({LOW: 0.8, HIGH: 0.75})
    adaptive = deployment.adaptive
    assert adaptive is not None
    assert adaptive.mix_score == pytest.approx(0.9)
    assert adaptive.chosen == {LOW: "chain d=4", HIGH: "baseline"}
    assert adaptive.thresholds == {LOW: 1, HIGH: 8} and adaptive.steps_by_batch_size == {1: 3, 8: 0}
    assert adaptive.gives_up == {LOW: "'tree s=3 k=4' (1.250x of the schedule's 'chain d=4')"}
    assert deployment.recommended == "adaptive"


@pytest.mark.parametrize("better", ["higher", "lower"])
def test_plan_deployment_changes_its_verdict_when_deploy_weights_favour_the_low_level(better: str) -> None:
    """deploy_weights {low: 3, high: 1}: tree (3 x 1 + 0.5) / 4 = 0.875, chain (3 x 0.8 + 0.75) / 4 =
    0.7875, baseline (3 x 0.4 + 1) / 4 = 0.55, adaptive (3 x 0.8 + 1) / 4 = 0.85: the static choice
    becomes the tree and the recommendation static (alike weights chose the chain and adaptive). A
    weight of 0 leaves its level out: {low: 1, high: 0} scores the tree 1 and recommends it."""
    selection = SELECTIONS[better]
    weighted = plan_deployment(selection, SHAPES, CONCURRENCY, {LOW: 3.0, HIGH: 1.0})
    assert weighted.static.config_label == "tree s=3 k=4"
    assert weighted.static.mix_score == pytest.approx(0.875)
    assert weighted.adaptive is not None and weighted.adaptive.mix_score == pytest.approx(0.85)
    assert weighted.recommended == "static"
    only_low = plan_deployment(selection, SHAPES, CONCURRENCY, {LOW: 1.0, HIGH: 0.0})
    assert only_low.weights == {LOW: 1.0}
    assert (only_low.static.config_label, only_low.static.mix_score) == ("tree s=3 k=4", 1.0)


def _with_confirmation(sweep: Selection, measured: dict[str, float]) -> Selection:
    """``sweep`` ranked again with the confirmation launch ("adaptive") at ``measured`` objectives."""
    levels = []
    for level in sweep.levels:
        row = {r.config_label: r.objective for r in level.ranked} | {"adaptive": measured[level.load_level]}
        levels.append(_selection({level.load_level: row}, sweep.better).levels[0])
    return dataclasses.replace(sweep, levels=tuple(levels))


@pytest.mark.parametrize("better", ["higher", "lower"])
def test_confirm_recommends_static_when_the_measured_schedule_falls_short_of_its_prediction(
    better: str,
) -> None:
    """The plan predicts the adaptive server at 0.9 on the mix (chain at the low level, baseline at the
    high). Measured, it reaches 80 of the tree's 125 (0.64) and 150 of the baseline's 200 (0.75) (for a
    latency 10000/80 and 10000/150): (0.64 + 0.75) / 2 = 0.695 < the best static config's 0.775, so the
    confirmation recommends static; its interval comes from the levels' intervals (value x 0.98..1.02):
    (0.6272 + 0.735) / 2 = 0.6811 .. (0.6528 + 0.765) / 2 = 0.7089 for a throughput."""
    sweep = SELECTIONS[better]
    measured = {LOW: 80.0, HIGH: 150.0} if better == "higher" else {LOW: 10_000 / 80, HIGH: 10_000 / 150}
    confirmation = confirm(
        sweep, _with_confirmation(sweep, measured), "adaptive", "{1: 3, 8: 0}", SHAPES, CONCURRENCY, None
    )
    assert plan_deployment(sweep, SHAPES, CONCURRENCY).recommended == "adaptive"
    assert confirmation.mix_score == pytest.approx(0.695)
    assert {lc.load_level: lc.of_winner for lc in confirmation.levels} == pytest.approx(
        {LOW: 0.64, HIGH: 0.75}
    )
    assert {lc.load_level: lc.of_best_chain for lc in confirmation.levels} == pytest.approx(
        {LOW: 0.8, HIGH: 0.75}
    )
    assert confirmation.static.config_label == "chain d=4"
    assert confirmation.recommended == "static"
    if better == "higher":
        assert confirmation.mix_ci is not None
        assert (confirmation.mix_ci.low, confirmation.mix_ci.high) == pytest.approx((0.6811, 0.7089))


def test_confirm_scores_a_level_zero_when_the_confirmation_has_no_ranking_there() -> None:
    """The confirmation is ranked at the low level only (it missed an SLO at the high one): measured 100
    of the tree's 125 there (0.8) and as good as the best chain, chain d=4 at 100 (1.0); at the high
    level no objective, no interval, a score of 0 and no share of a chain. Mix (0.8 + 0) / 2 = 0.4, under
    the static chain's 0.775: static; no mix interval (a level has none)."""
    sweep = SELECTIONS["higher"]
    with_low = _with_confirmation(sweep, {LOW: 100.0, HIGH: 0.0})
    only_low = dataclasses.replace(
        with_low,
        levels=tuple(
            dataclasses.replace(level, ranked=tuple(r for r in level.ranked if r.config_label != "adaptive"))
            if level.load_level == HIGH
            else level
            for level in with_low.levels
        ),
    )
    confirmation = confirm(sweep, only_low, "adaptive", "{1: 3, 8: 0}", SHAPES, CONCURRENCY, None)
    by_level = {lc.load_level: lc for lc in confirmation.levels}
    assert (by_level[LOW].objective, by_level[LOW].of_winner, by_level[LOW].of_best_chain) == (
        100.0,
        0.8,
        1.0,
    )
    assert by_level[LOW].best_chain_label == "chain d=4"
    high = by_level[HIGH]
    assert (high.objective, high.objective_ci, high.of_winner, high.of_best_chain) == (None, None, 0.0, None)
    assert confirmation.mix_score == pytest.approx(0.4) and confirmation.mix_ci is None
    assert confirmation.recommended == "static"


def test_confirm_names_no_chain_and_what_it_gives_up_when_only_a_tree_is_ranked_at_a_level() -> None:
    """At the high level only the tree (100) is ranked (the baseline and the chain missed an SLO): the
    confirmation at 50 reaches 0.5 of it, there is no best chain or baseline to compare with, and the
    tree's win is what the schedule gives up: "'tree s=3 k=4' wins here; the adaptive server reaches
    0.500 of it". At the low level (125 tree, 100 chain) it measured 125: 1.0 of the tree, 1.25 of the
    chain, and again the tree's win is named (at 1.000)."""
    sweep = SELECTIONS["higher"]
    tree_only = dataclasses.replace(
        sweep,
        levels=tuple(
            dataclasses.replace(level, ranked=(_ranked("tree s=3 k=4", 100.0, 1),)) if level.load_level == HIGH
            else level
            for level in sweep.levels
        ),
    )  # fmt: skip
    measured = {LOW: 125.0, HIGH: 50.0}
    with_confirmation = dataclasses.replace(
        tree_only,
        levels=tuple(
            dataclasses.replace(
                level, ranked=(*level.ranked, _ranked("adaptive", measured[level.load_level], 9))
            )
            for level in tree_only.levels
        ),
    )
    confirmation = confirm(tree_only, with_confirmation, "adaptive", "{}", SHAPES, CONCURRENCY, None)
    by_level = {lc.load_level: lc for lc in confirmation.levels}
    assert (by_level[HIGH].best_chain_label, by_level[HIGH].of_best_chain) == (None, None)
    assert by_level[HIGH].of_winner == 0.5
    assert by_level[HIGH].gives_up == "'tree s=3 k=4' wins here; the adaptive server reaches 0.500 of it"
    assert (by_level[LOW].of_winner, by_level[LOW].of_best_chain) == (1.0, 1.25)
    assert by_level[LOW].gives_up == "'tree s=3 k=4' wins here; the adaptive server reaches 1.000 of it"


@pytest.mark.parametrize("better", ["higher", "lower"])
def test_confirm_compares_with_the_best_chain_or_baseline_when_a_tree_is_the_best_static(better: str) -> None:
    """deploy_weights {low: 3, high: 1}: the best static config is the tree (0.875, as worked above), the
    best static chain or baseline is the chain, (3 x 0.8 + 0.75) / 4 = 0.7875 (the baseline scores
    (3 x 0.4 + 1) / 4 = 0.55). The confirmation keeps the schedule it ran and measured the chain's own
    values (100, 150): its mix (3 x 0.8 + 0.75) / 4 = 0.7875 is under the tree's: static."""
    sweep = SELECTIONS[better]
    values = {LOW: 100.0, HIGH: 150.0}
    measured = values if better == "higher" else {level: 10_000 / v for level, v in values.items()}
    weights = {LOW: 3.0, HIGH: 1.0}
    confirmation = confirm(
        sweep, _with_confirmation(sweep, measured), "adaptive", "{1: 3, 8: 0}", SHAPES, CONCURRENCY, weights
    )
    assert confirmation.schedule == "{1: 3, 8: 0}" and confirmation.weights == weights
    assert (confirmation.static.config_label, confirmation.static.mix_score) == (
        "tree s=3 k=4",
        pytest.approx(0.875),
    )
    assert confirmation.chain_static is not None
    assert confirmation.chain_static.config_label == "chain d=4"
    assert confirmation.chain_static.mix_score == pytest.approx(0.7875)
    assert confirmation.mix_score == pytest.approx(0.7875) and confirmation.recommended == "static"


def test_plan_deployment_says_why_there_is_no_adaptive_schedule_when_none_can_be_built() -> None:
    """Three ways to have no schedule, each said in words and each recommending the static choice: the
    baseline wins both levels (no chain to switch to); a level where only the tree is ranked (no chain or
    baseline met its SLOs); an open-loop level (no batch size to key a schedule by)."""
    baseline_wins = {
        LOW: {"baseline": 150.0, "chain d=4": 100.0, "tree s=3 k=4": 50.0},
        HIGH: {"baseline": 200.0, "chain d=4": 150.0, "tree s=3 k=4": 100.0},
    }
    plain = plan_deployment(_selection(baseline_wins, "higher"), SHAPES, CONCURRENCY)
    assert plain.adaptive is None and plain.recommended == "static"
    assert plain.adaptive_note == "no topk-1 chain wins any weighted level: deploy without speculation"
    sweep = SELECTIONS["higher"]
    tree_only = dataclasses.replace(
        sweep,
        levels=tuple(
            dataclasses.replace(level, ranked=(_ranked("tree s=3 k=4", 100.0, 1),)) if level.load_level == HIGH
            else level
            for level in sweep.levels
        ),
    )  # fmt: skip
    no_chain = plan_deployment(tree_only, SHAPES, CONCURRENCY)
    assert no_chain.adaptive is None and no_chain.recommended == "static"
    assert no_chain.adaptive_note == f"{HIGH}: no topk-1 chain or baseline meets every SLO"
    open_loop = plan_deployment(sweep, SHAPES, {LOW: 1, HIGH: None})
    assert open_loop.adaptive is None
    assert open_loop.adaptive_note == f"open-loop levels ({HIGH}) give no batch size to key a schedule by"


def test_plan_deployment_refuses_for_emit_in_one_line_when_no_config_is_ranked_at_every_level() -> None:
    """Only the tree is ranked at the low level and only the baseline at the high one: no config can be
    deployed for the whole mix, so the refusal names --emit, says why and how to fix it."""
    from specsweep.errors import NoConfigMeetsSlosError

    sweep = SELECTIONS["higher"]
    only = {LOW: "tree s=3 k=4", HIGH: "baseline"}
    disjoint = dataclasses.replace(
        sweep,
        levels=tuple(
            dataclasses.replace(level, ranked=(_ranked(only[level.load_level], 100.0, 1),))
            for level in sweep.levels
        ),
    )
    with pytest.raises(NoConfigMeetsSlosError) as caught:
        plan_deployment(disjoint, SHAPES, CONCURRENCY)
    error = caught.value
    assert (error.where, error.problem, error.fix) == (
        "--emit",
        "no config meets every SLO at every weighted load level",
        "relax the SLOs, or weight only the levels the deployment must serve",
    )


def test_plan_deployment_refuses_deploy_weights_in_one_line_when_a_level_is_unknown_or_all_are_zero() -> None:
    """A weight on a level the sweep did not rank, and weights that are all 0, are refusals naming
    deploy_weights, each with what is wrong and the fix (the levels there are; give a level a weight)."""
    from specsweep.errors import ResultsError

    sweep = SELECTIONS["higher"]
    with pytest.raises(ResultsError) as unknown:
        plan_deployment(sweep, SHAPES, CONCURRENCY, {"concurrency=2": 1.0, LOW: 1.0})
    assert (unknown.value.where, unknown.value.problem, unknown.value.fix) == (
        "deploy_weights",
        "load mix weights name levels that were not ranked: concurrency=2",
        f"use level names of this sweep: {LOW}, {HIGH}",
    )
    with pytest.raises(ResultsError) as zero:
        plan_deployment(sweep, SHAPES, CONCURRENCY, {LOW: 0.0, HIGH: 0.0})
    assert (zero.value.where, zero.value.problem, zero.value.fix) == (
        "deploy_weights",
        "load mix weights are all 0",
        "give some level a weight",
    )
