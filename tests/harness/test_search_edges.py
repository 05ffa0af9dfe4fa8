"""The search's rules where the usual worlds do not reach them, each judged against a truth worked here.

Found by re-measuring the search's mutation score after its rework (#32): the expected loss of stopping
is checked against the log-normal's closed form and a numeric integral (not against another sample), the
launch-noise probes under the smallest repeat budget that allows them, and a drafter that is never
accepted, whose true best (the baseline) is known without any model.
"""

from __future__ import annotations

import math
import random
import sqlite3
from pathlib import Path

import numpy as np
import pytest

from harness.plan import unchecked_plan
from harness.queue import QUEUE_FILE, JobQueue
from harness.results import output_for
from harness.search.model import (
    Candidate,
    Capacity,
    LevelResult,
    Observation,
    Prediction,
    StepFit,
    fit_residual,
    fit_steps,
    launch_noise,
    residual_at,
    residual_inputs,
)
from harness.search.session import SearchSession
from harness.search.strategy import (
    Budget,
    SearchState,
    _expected_gain,
    _expected_loss,
    _shortfall,
    predictions,
    propose,
    seed_order,
)
from harness.spec import parse_spec
from tests.harness.test_search_noise import commit_reported_and_silent
from tests.harness.test_search_session import SPEC as SESSION_SPEC
from tests.harness.test_search_truths import LEVELS, TOLERANCE, grid, world_step_s


def _normal_cdf(x: float) -> float:
    return 0.5 * math.erfc(-x / math.sqrt(2.0))


def _lognormal_cdf(x: float, median: float, sd: float) -> float:
    return _normal_cdf((math.log(x) - math.log(median)) / sd)


def _contender(point: float, sd: float) -> Prediction:
    """An unlaunched config predicted at ``point`` whose interval's upper half is ``Z = 2`` log-sds."""
    return Prediction(point, point * math.exp(-2.0 * sd), point * math.exp(2.0 * sd), False)


def test_expected_gain_is_what_the_best_contender_may_beat_the_incumbent_by_when_contenders_are_lognormal() -> (
    None
):
    """E[max(0, X - K)] for X log-normal (median 100, log-sd 0.1: high = 100 e^0.2) and K = 105, a tie set
    of one config measured once with no launch noise (its true mean is K itself), has a closed form: e^(mu + s^2/2) Phi(d1) - K Phi(d2), d1 = (ln(100/105) + 0.01) / 0.1
    = -0.3879, d2 = -0.4879: 100.501 x 0.34904 - 105 x 0.31281 = 2.2344. With a second contender
    (median 98, log-sd 0.15) the gain is that of the larger of the two, the integral from K up of
    1 - F1(x) F2(x) (the two independent), 5.3555 by the midpoint rule. The search samples 4000 draws,
    so within 5%. No contender: nothing to gain; one whose interval is unbounded: an unbounded gain."""
    one = _expected_gain([[105.0]], 0.0, [_contender(100.0, 0.1)])
    assert one == pytest.approx(2.2344, rel=0.05)
    steps, top = 20_000, 400.0
    width = (top - 105.0) / steps
    integral = sum(
        (1.0 - _lognormal_cdf(x, 100.0, 0.1) * _lognormal_cdf(x, 98.0, 0.15)) * width
        for x in (105.0 + (i + 0.5) * width for i in range(steps))
    )
    assert integral == pytest.approx(5.3555, abs=1e-3)
    two = _expected_gain([[105.0]], 0.0, [_contender(100.0, 0.1), _contender(98.0, 0.15)])
    assert two == pytest.approx(integral, rel=0.05)
    assert _expected_gain([[105.0]], 0.0, []) == 0.0
    assert (
        _expected_gain([[105.0]], 0.0, [_contender(100.0, 0.1), Prediction(90.0, 0.0, math.inf, False)])
        == math.inf
    )


def _launch(cid: str, repeat: int, throughput: float) -> Observation:
    return Observation(cid, repeat, 600.0, (LevelResult("L0", 8, throughput, None),))


def _three_configs(done: list[Observation], repeats: int) -> SearchState:
    """The baseline and chains of depth 2 and 3 (all seeds, so nothing is left to predict), one level."""
    space = (
        Candidate("base", "baseline", None, None, None),
        Candidate("c2", "chain d=2", 1, 1, 2),
        Candidate("c3", "chain d=3", 2, 1, 3),
    )
    return SearchState(space, (("L0", 8),), repeats, tuple(done), frozenset(), frozenset(), 600.0 * len(done))


def test_propose_repeats_the_incumbent_to_measure_launch_noise_when_the_spec_allows_two_repeats() -> None:
    """One launch each (baseline 60, c2 80, c3 100): c3 is clearly best under the prior noise, and no
    repeat has measured the noise yet. A spec of ``repeats: 2`` allows one more launch of a config, so
    the search spends it on the incumbent c3 (its second launch, repeat index 1) to measure the noise;
    with ``repeats: 1`` there is nothing to repeat and the level is settled."""
    done = [_launch("base", 0, 60.0), _launch("c2", 0, 80.0), _launch("c3", 0, 100.0)]
    two = propose(_three_configs(done, repeats=2), 2, Budget(), TOLERANCE)
    assert (two.launches, two.reason) == ((("c3", 1),), "repeat to measure launch noise")
    one = propose(_three_configs(done, repeats=1), 2, Budget(), TOLERANCE)
    assert (one.launches, one.reason, one.finished) == ((), "settled", True)


def test_propose_probes_the_incumbent_of_the_largest_tie_set_first_when_levels_tie_differently() -> None:
    """Two levels, one launch each. At 8 clients c3 100, c2 60, baseline 40: a tie of c3 alone (each gap
    over its 95% half-width under the prior noise, 2% with 4 dof, Bonferroni over 2 differences: t =
    3.495, half 3.495 x 0.02 x sqrt(100**2 + 60**2) = 8.2 < 40). At 64 clients baseline 100, c2 98, c3
    50: a tie of the baseline and c2 (half 3.495 x 0.02 x sqrt(100**2 + 98**2) = 9.8 > 2; c3's 7.8 < 50).
    Nothing is left to launch, no repeat has measured the noise, ``repeats: 2``: both incumbents are
    noise probes, the largest tie set's first (its incumbent's lead is the most in doubt), so one free
    slot goes to the baseline, not to c3, whose level comes first and whose id sorts last."""
    space = _three_configs([], repeats=2).candidates
    levels = {"base": (40.0, 100.0), "c2": (60.0, 98.0), "c3": (100.0, 50.0)}
    done = [
        Observation(cid, 0, 600.0, (LevelResult("L0", 8, low, None), LevelResult("L1", 64, high, None)))
        for cid, (low, high) in levels.items()
    ]
    state = SearchState(space, (("L0", 8), ("L1", 64)), 2, tuple(done), frozenset(), frozenset(), 1800.0)
    assert [level.tie for level in propose(state, 1, Budget(), TOLERANCE).levels] == [("c3",), ("base", "c2")]
    for free, launches in ((1, (("base", 1),)), (2, (("base", 1), ("c3", 1)))):
        decision = propose(state, free, Budget(), TOLERANCE)
        assert (decision.launches, decision.reason) == (launches, "repeat to measure launch noise")


def _never_accepted(cand: Candidate, batch: int, rng: random.Random) -> LevelResult:
    """A level of a launch whose drafter is never accepted: every verify step yields the bonus token
    alone (histogram: all steps accepted 0 drafts), so a step of ``cand`` makes one token a request,
    at the step time of the test world's own formula (test_search_truths) plus the same per-token
    prefill share, with 0.5% noise."""
    seconds = world_step_s(cand, batch) + 0.00025 * batch
    histogram = (20_000,) + (0,) * (cand.steps or 0) if cand.speculative else None
    return LevelResult(
        f"concurrency={batch}", batch, batch / seconds * (1.0 + rng.gauss(0.0, 0.005)), histogram
    )


def test_propose_settles_on_the_baseline_when_the_draft_is_never_accepted() -> None:
    """With acceptance 0 every speculative config decodes one token per step, like the baseline, and
    pays for drafting and verifying on top: brute force over the world's grid makes the baseline the
    best at every level. After the seeds (the baseline, the deepest and shallowest chains, the largest
    tree) the search knows acceptance is 0 at the first position, so every other config's accept length
    is exactly 1 and its step no cheaper than those measured: it settles on the baseline at once,
    instead of launching the other twelve configs. The contenders are the measured tie sets alone: at
    one client the chain d=2 (72.3) is 9% behind the baseline (79.4), within the half-width of one launch
    each under the prior noise, Bonferroni over three differences (t(4) at 1 - 0.025 / 3 = 3.96: 3.96 x
    0.02 x sqrt(79.4**2 + 72.3**2) = 8.5); at 16 and 64 clients the baseline alone."""
    rng = random.Random(3)
    for _, batch in LEVELS:
        best = max(grid(), key=lambda c: batch / (world_step_s(c, batch) + 0.00025 * batch))
        assert best.config_id == "base"
    seeds = seed_order(grid())
    assert [c.config_id for c in seeds] == ["base", "c7", "c2", "t2-4-8"]
    done = [
        Observation(c.config_id, 0, 600.0, tuple(_never_accepted(c, batch, rng) for _, batch in LEVELS))
        for c in seeds
    ]
    state = SearchState(grid(), LEVELS, 1, tuple(done), frozenset(), frozenset(), 600.0 * len(done))
    decision = propose(state, 1, Budget(), TOLERANCE)
    assert (decision.launches, decision.reason, decision.finished) == ((), "settled", True)
    assert [(level.best_label, level.contenders) for level in decision.levels] == [
        ("baseline", ("baseline", "chain d=2")),
        ("baseline", ("baseline",)),
        ("baseline", ("baseline",)),
    ]


def test_predictions_fit_each_server_axis_setting_on_its_own_when_the_space_has_two() -> None:
    """Two settings of a server axis (``a=1``, ``a=2``), each with a baseline and chains of depth 2, 3
    and 4; everything but the depth-4 chains measured, ``a=2`` twice as fast. Every config of both
    settings has a prediction at the level, the measured ones their launch's throughput; the ``a=1``
    depth-4 chain's prediction is the same whether or not ``a=2`` was measured (the model has no term
    for the axis, so nothing carries across); the answer is ``a=2``'s depth-3 chain, 200 against 160."""
    space = tuple(
        cand
        for axis in ("a=1", "a=2")
        for cand in (
            Candidate(f"base{axis}", f"baseline {axis}", None, None, None, axis),
            *(Candidate(f"c{d}{axis}", f"chain d={d} {axis}", d - 1, 1, d, axis) for d in (2, 3, 4)),
        )
    )
    scale = {"a=1": 1.0, "a=2": 2.0}
    measured = {"base": (60.0, None), "c2": (80.0, (2_000, 8_000)), "c3": (100.0, (2_000, 1_500, 6_500))}
    done = [
        Observation(f"{cid}{axis}", 0, 600.0, (LevelResult("L0", 8, value * scale[axis], histogram),))
        for axis in scale
        for cid, (value, histogram) in measured.items()
    ]

    def state(observations: list[Observation]) -> SearchState:
        return SearchState(space, (("L0", 8),), 1, tuple(observations), frozenset(), frozenset(), 600.0)

    both = predictions(state(done))
    assert set(both) == {(cand.config_id, "L0") for cand in space}
    assert [both[(f"c3{axis}", "L0")].point for axis in scale] == [100.0, 200.0]
    alone = predictions(state([o for o in done if o.config_id.endswith("a=1")]))
    assert alone[("c4a=1", "L0")] == both[("c4a=1", "L0")]
    decision = propose(state(done), 1, Budget(), TOLERANCE)
    assert decision.levels[0].best_label == "chain d=3 a=2"


def test_residual_process_stays_unsure_of_an_unmeasured_config_when_the_structure_misses_without_pattern() -> (
    None
):
    """Eight configs at batches 1 .. 128 (log2 0 .. 7), the structure off by +10% and -10% in turn
    (log residuals of sd 0.1 that nothing in the inputs explains). A ninth config's miss may be as large
    as theirs, so the residual process must not claim to know it within the launch noise: its sd there is
    at least half the misses' (0.05), not the 0.01 floor it would keep if the white-noise term, bounded at
    four times the launch noise's variance (4 x 0.02**2), were free to take the misses as noise."""
    inputs = np.array([[batch, config] for config, batch in enumerate(range(8))], dtype=float)
    misses = np.array([0.1 if i % 2 else -0.1 for i in range(8)])
    gp = fit_residual(inputs, misses, 0.02, (1,))
    mean, sd = residual_at(gp, np.array([[3.5, 20.0], [10.0, 21.0]]))
    assert np.all(np.abs(mean) < 0.01)
    assert np.all(sd >= 0.05)


def test_fit_steps_corrects_by_its_residuals_when_four_configs_and_levels_are_measured() -> None:
    """The residual process needs four (config, level) measurements, a config's repeats at a level
    pooled into one: the baseline and chains of depth 2 and 3 at one level, the chain d=2 launched twice,
    are three: none. The chain d=4 at the same level makes four: fitted."""
    cands = {
        "base": Candidate("base", "baseline", None, None, None),
        **{f"c{d}": Candidate(f"c{d}", f"chain d={d}", d - 1, 1, d) for d in (2, 3, 4)},
    }
    three = [_launch("base", 0, 60.0), _launch("c2", 0, 80.0), _launch("c2", 1, 82.0), _launch("c3", 0, 90.0)]
    assert fit_steps(cands, three, ("L0",), 0.02).residual is None
    four = [*three, _launch("c4", 0, 95.0)]
    assert fit_steps(cands, four, ("L0",), 0.02).residual is not None


def test_step_fit_predicts_the_relative_sd_of_a_step_when_costs_are_set_by_hand() -> None:
    """The baseline with 8 clients and no reported capacity: regressors (1, D 0, P D k 0, P V 8, P 8,
    eager 0, knee 0) and accept length 1 for the level's constant. Costs 10 ms, 1 ms per verified token,
    0.5 ms per request and 2 ms of per-token prefill: y = 10 + 8 + 4 + 2 = 24 ms. Only the 10 ms is
    uncertain, sd 1.2 ms: the prediction's relative sd is 1.2 / 24 = 0.05, what the interval's half-width
    is made of (not 1.2 ms times 24 ms)."""
    mean = np.array([0.010, 0.0, 0.0, 0.001, 0.0005, 0.0, 0.0, 0.002])
    cov = np.zeros((8, 8))
    cov[0, 0] = 0.0012**2
    fit = StepFit(("L0",), mean, cov, None, None)
    y, rel = fit.predict(Candidate("base", "baseline", None, None, None), "L0", 8, 1.0)
    assert (y, rel) == (pytest.approx(0.024), pytest.approx(0.05))


def _finish_with_attempt_of(tmp_path: Path, queue: JobQueue, seconds: float) -> None:
    """Lease and complete the next pending job, its attempt lasting ``seconds`` (set in the queue's rows)."""
    lease = queue.lease(0, other_slots=False)
    assert lease is not None and queue.complete(lease, node="n1", worker_s=1.0)
    with sqlite3.connect(tmp_path / QUEUE_FILE) as con:
        con.execute(
            "UPDATE attempts SET started_ns = 0, finished_ns = ? WHERE job_id = ?",
            (int(seconds * 1e9), lease.job_id),
        )


def test_session_stops_at_the_node_hour_budget_when_it_binds_before_the_launch_budget(tmp_path: Path) -> None:
    """max_node_hours 0.25 is 900 node-seconds and max_launches 10: after the baseline's one 600 s
    attempt, 300 s are left, under the 600 s the next launch is estimated to take, so nothing more is
    queued and the budget is spent (the launch budget would allow nine more); with max_node_hours 1
    (3000 s left: five launches) the next seed is queued."""
    labels = []
    for hours in (0.25, 1):
        spec = parse_spec(
            SESSION_SPEC | {"search": {"strategy": "model", "max_launches": 10, "max_node_hours": hours}}
        )
        queue = JobQueue(tmp_path / str(hours))
        session = SearchSession(spec, unchecked_plan(spec), tmp_path / str(hours))
        _, first = session.next_jobs(queue, 1)
        _finish_with_attempt_of(tmp_path / str(hours), queue, 600.0)
        decision, more = session.next_jobs(queue, 1)
        queue.close()
        labels.append(([job.config_label for job in (*first, *more)], decision.reason))
    assert labels == [(["baseline"], "budget spent"), (["baseline", "chain d=4"], "seed")]


def test_session_state_carries_what_each_launch_reported_when_its_jobs_row_is_committed(
    tmp_path: Path,
) -> None:
    """The baseline and chain d=4 done; the chain's committed jobs row holds SGLang's resolved args
    (decode graphs up to batch 16, at most 12 running requests), the baseline's none. The search's
    state gives the chain's launch the captured sizes 1..8, 10, 12 (16's list, clamped to the cap of 12)
    and the cap 12, and the baseline's launch no capacity (unknown: its own kind's report or none)."""
    spec = parse_spec(SESSION_SPEC)
    plan = unchecked_plan(spec)
    queue = JobQueue(tmp_path)
    session = SearchSession(spec, plan, tmp_path)
    _, (baseline, chain) = session.next_jobs(queue, 2)
    assert [baseline.config_label, chain.config_label] == ["baseline", "chain d=4"]
    for _ in range(2):
        _finish_with_attempt_of(tmp_path, queue, 600.0)
    out = output_for(tmp_path)
    commit_reported_and_silent(out, chain, baseline)
    state = session.state(queue)
    queue.close()
    assert {o.config_id: o.capacity for o in state.observations} == {
        chain.config_id: Capacity((1, 2, 3, 4, 5, 6, 7, 8, 10, 12), 12),
        baseline.config_id: None,
    }


def _positive_part_of_normal(mean: float, sd: float, steps: int = 20_000) -> float:
    """E[max(0, D)] for D ~ N(mean, sd), by the midpoint rule over [0, mean + 12 sd]."""
    width = (mean + 12.0 * sd) / steps
    return sum(
        x * math.exp(-0.5 * ((x - mean) / sd) ** 2) / (sd * math.sqrt(2.0 * math.pi)) * width
        for x in ((i + 0.5) * width for i in range(steps))
    )


def test_tie_losses_are_what_answering_the_best_may_cost_when_two_configs_are_tied() -> None:
    """c3 measured 100 and c2 98, one launch each, launch noise 2%: each true mean normal around its
    launch with sd 2 and 1.96, so c2's lead over c3, D, is N(-2, sqrt(2**2 + 1.96**2) = 2.8003), and
    answering c3 may cost E[max(0, D)] = 0.39056 (numeric integral). With c2's mean from two launches its
    sd is 1.96 / sqrt(2): D's sd 2.4333, 0.28136. ``_shortfall`` is exact; ``_expected_loss`` samples
    4000 draws, so within 5%."""
    one = _positive_part_of_normal(-2.0, math.sqrt(2.0**2 + 1.96**2))
    assert one == pytest.approx(0.39056, abs=1e-4)
    two = _positive_part_of_normal(-2.0, math.sqrt(2.0**2 + 1.96**2 / 2))
    assert two == pytest.approx(0.28136, abs=1e-4)
    assert _shortfall([100.0], [98.0], 0.02) == pytest.approx(one, rel=1e-4)
    assert _shortfall([100.0], [98.0, 98.0], 0.02) == pytest.approx(two, rel=1e-4)
    assert _expected_loss([[100.0], [98.0]], 0.02) == pytest.approx(one, rel=0.05)
    assert _expected_loss([[100.0], [98.0]], 0.02, more=1) == pytest.approx(two, rel=0.05)


def test_predictions_extrapolate_the_last_measured_acceptance_when_the_deepest_chain_is_still_running() -> (
    None
):
    """The baseline (60) and the depth-1 chain (80; 20000 verify steps, half accepted their draft: q1 =
    0.5) measured at one level of 8 clients, the depth-3 chain still running. The depth-2 chain's second
    position was never measured: acceptance does not rise with depth, so its point takes q1 again, accept
    length 1 + 0.5 + 0.5 x 0.5 = 1.75 (not 1 + 0.5 + 0.5 = 2, which assumes every draft past the measured
    depth accepted). Its throughput point is that accept length times the 8 running requests over the step
    fit's time for it: 1.75 x 8 / y(1.75)."""
    space = (
        Candidate("base", "baseline", None, None, None),
        *(Candidate(f"c{d}", f"chain d={d}", d - 1, 1, d) for d in (2, 3, 4)),
    )
    done = [
        Observation("base", 0, 600.0, (LevelResult("L0", 8, 60.0, None),)),
        Observation("c2", 0, 600.0, (LevelResult("L0", 8, 80.0, (10_000, 10_000)),)),
    ]
    state = SearchState(space, (("L0", 8),), 1, tuple(done), frozenset({("c4", 0)}), frozenset(), 1200.0)
    noise = launch_noise(done)
    fit = fit_steps({c.config_id: c for c in space}, done, ("L0",), noise[0])
    y, _ = fit.predict(space[2], "L0", 8, 1.75)
    assert predictions(state)[("c3", "L0")].point == pytest.approx(1.75 * 8 / y)


def test_seed_order_seeds_the_largest_tree_when_a_chain_has_more_draft_tokens_than_any_tree() -> None:
    """Chains of depth 1..6 (up to 7 draft tokens) and trees of 6 draft tokens only: the seeds are the
    baseline, the deepest chain (d=7), the shallowest (d=2) and the largest tree, the one of 6 tokens with
    the widest topk (steps 3, topk 4); the chain d=7, larger than every tree, is no tree seed."""
    space = (
        Candidate("base", "baseline", None, None, None),
        *(Candidate(f"c{d}", f"chain d={d}", d - 1, 1, d) for d in range(2, 8)),
        Candidate("t4-2-6", "tree s=4 k=2 n=6", 4, 2, 6),
        Candidate("t3-4-6", "tree s=3 k=4 n=6", 3, 4, 6),
        Candidate("t3-2-6", "tree s=3 k=2 n=6", 3, 2, 6),
    )
    assert [c.config_id for c in seed_order(space)] == ["base", "c7", "c2", "t3-4-6"]


def test_seed_order_seeds_true_chains_when_a_tree_too_small_to_branch_has_the_same_depth() -> None:
    """Depths 1 and 2 each come as a true chain (topk 1: c2, c3) and as a topk-4 tree with one draft token
    a depth (k2, k3: too few tokens to branch, so chain-like by position); a 6-token tree (depth 3) is
    the only real tree. The chain seeds are the true chains, whatever the space's order: the deepest c3
    (not k3) and the shallowest c2 (not k2), then the tree."""
    space = (
        Candidate("base", "baseline", None, None, None),
        Candidate("k2", "tree s=1 k=4 n=2", 1, 4, 2),
        Candidate("c2", "chain d=2", 1, 1, 2),
        Candidate("k3", "tree s=2 k=4 n=3", 2, 4, 3),
        Candidate("c3", "chain d=3", 2, 1, 3),
        Candidate("t3-2-6", "tree s=3 k=2 n=6", 3, 2, 6),
    )
    assert [c.is_chain for c in space[1:]] == [True, True, True, True, False]
    assert [c.config_id for c in seed_order(space)] == ["base", "c3", "c2", "t3-2-6"]


def test_residual_inputs_place_a_config_by_its_batch_and_verified_tokens_when_worked_by_hand() -> None:
    """Where the residual process puts a (config, level): log2 of the batch, log2 of the tokens a step
    verifies, then depth, topk, draft tokens. 8 clients, no reported capacity: the baseline verifies
    one token a request, (3, 3, 0, 0, 0) (no drafts: zeros, not ones); the chain d=3 verifies 3 a
    request, 24 in all: (3, log2 24 = 4.585, 2, 1, 3). Capped at 4 running requests and padded to the
    captured 4: (2, log2 12 = 3.585, 2, 1, 3)."""
    base = Candidate("base", "baseline", None, None, None)
    chain = Candidate("c3", "chain d=3", 2, 1, 3)
    unknown = Capacity((), None)
    assert residual_inputs(base, unknown, 8).tolist() == [3.0, 3.0, 0.0, 0.0, 0.0]
    assert residual_inputs(chain, unknown, 8).tolist() == pytest.approx([3.0, 4.5849625, 2.0, 1.0, 3.0])
    capped = Capacity((1, 2, 4), 4)
    assert residual_inputs(chain, capped, 8).tolist() == pytest.approx([2.0, 3.5849625, 2.0, 1.0, 3.0])


def test_step_fit_adds_the_residual_spread_in_quadrature_when_the_structure_missed_measured_configs() -> None:
    """The hand-set costs of the test above (y = 24 ms, relative sd 0.05) with a residual process fitted
    to eight configs the structure missed by +-10% in turn. At the baseline the process says: shift s,
    sd r (r about 0.09, the misses' size: the process is unsure there). The prediction is corrected to
    24 ms x e^s and its relative sd combines both independent errors, sqrt(0.05**2 + r**2) (about 0.10),
    not the 0.056 that sqrt(0.05**2 + r**3) would give."""
    mean = np.array([0.010, 0.0, 0.0, 0.001, 0.0005, 0.0, 0.0, 0.002])
    cov = np.zeros((8, 8))
    cov[0, 0] = 0.0012**2
    inputs = np.array([[b, b + 1.0, d, 1.0, d + 1.0] for d, b in enumerate(range(8))], dtype=float)
    gp = fit_residual(inputs, np.array([0.1 if i % 2 else -0.1 for i in range(8)]), 0.02, (2, 3, 4))
    base = Candidate("base", "baseline", None, None, None)
    (shift,), (spread,) = residual_at(gp, np.array([[3.0, 3.0, 0.0, 0.0, 0.0]]))
    assert spread > 0.05
    y, rel = StepFit(("L0",), mean, cov, None, gp).predict(base, "L0", 8, 1.0)
    assert (y, rel) == (pytest.approx(0.024 * math.exp(shift)), pytest.approx(math.sqrt(0.05**2 + spread**2)))


def _least_squares_oracle(
    cands: dict[str, Candidate], done: list[Observation], noise: float
) -> tuple[float | None, np.ndarray, np.ndarray]:
    """The step fit written again from its documentation, shared with no code of the model: rows
    (1, D, P D k, P V, P, eager 0, max(0, P V - knee), accept) for y = accept P / T (accept 1: no
    histograms), weights 1 / (noise y)^2, a N(0, (100 median y)^2) prior on every cost solved as an
    augmented least-squares problem (prior rows appended, numpy's lstsq, not normal equations); each knee
    of 64 .. 4096 kept when it lowers the weighted squared residuals by more than 6 from the fit kept
    before it; the covariance scaled by SSE / dof (at least 1 under 5 dof, else at least 0.25)."""
    rows: list[tuple[list[float], float]] = []
    ys = []
    for o in done:
        c = cands[o.config_id]
        for r in o.levels:
            p = float(r.concurrency)
            if c.steps is None or c.topk is None or c.draft_tokens is None:
                rows.append(([1.0, 0.0, 0.0, p, p], p))
            else:
                rows.append(
                    (
                        [1.0, c.steps + 1.0, p * (c.steps + 1) * c.topk, p * c.draft_tokens, p],
                        p * c.draft_tokens,
                    )
                )
            ys.append(p / r.throughput)
    y = np.array(ys)
    w = 1.0 / (noise * y) ** 2
    prior = 100.0 * float(np.median(y))

    def solve(knee: float | None) -> tuple[np.ndarray, np.ndarray, np.ndarray, float]:
        x = np.array([[*f, 0.0, max(0.0, t - knee) if knee else 0.0, 1.0] for f, t in rows])
        a = np.vstack([x * np.sqrt(w)[:, None], np.eye(x.shape[1]) / prior])
        beta = np.linalg.lstsq(a, np.concatenate([y * np.sqrt(w), np.zeros(x.shape[1])]), rcond=None)[0]
        return x, beta, np.linalg.inv(a.T @ a), float(np.sum(w * (y - x @ beta) ** 2))

    kept: float | None = None
    x, beta, cov, sse = solve(None)
    for knee in (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0):
        xk, bk, ck, sk = solve(knee)
        if xk[:, 6].any() and sk < sse - 6.0:
            kept, x, beta, cov, sse = knee, xk, bk, ck, sk
    dof = len(y) - int(np.linalg.matrix_rank(x))
    return kept, beta, cov * max(1.0 if dof < 5 else 0.25, sse / dof)


def test_fit_steps_matches_a_separately_written_least_squares_when_a_compute_knee_is_kept() -> None:
    """The baseline and chains d=2..8 at 64 clients, three launches each, from a world whose step costs
    10 ms + 1 ms a forward pass + 0.02 ms a verified token + 0.08 ms a verified token past 256 (a
    roofline knee), each launch 4% off in turn: the fit keeps the 256 knee, and its costs and their
    covariance (scaled by the residuals: weighted SSE 94.1 over 20 dof) are the oracle's."""
    cands = {"base": Candidate("base", "baseline", None, None, None)}
    cands |= {f"c{d}": Candidate(f"c{d}", f"chain d={d}", d - 1, 1, d) for d in range(2, 9)}

    def step_s(c: Candidate) -> float:
        tokens = 64 * (c.draft_tokens or 1)
        return (
            0.01 + 0.001 * (c.steps + 1 if c.steps else 0) + 0.00002 * tokens + 0.00008 * max(0, tokens - 256)
        )

    done = [
        Observation(
            c.config_id,
            r,
            600.0,
            (LevelResult("L0", 64, 64 / step_s(c) * (1 + 0.04 * (-1) ** (r + i)), None),),
        )
        for r in range(3)
        for i, c in enumerate(cands.values())
    ]
    knee, mean, cov = _least_squares_oracle(cands, done, 0.02)
    fit = fit_steps(cands, done, ("L0",), 0.02)
    assert fit.knee == knee == 256.0
    assert np.abs(fit.mean - mean).max() < 1e-3 * np.abs(mean).max()
    assert np.abs(fit.cov - cov).max() < 1e-6 * np.abs(cov).max()
