"""The search under launch-to-launch noise, judged against a world it did not compute.

The world is written here with its own forms, sharing no code with ``harness.search.model``: a verify
step padded up to the CUDA-graph batch sizes the launch reports, eager (slower) above the largest, a
roofline knee where a step stops being bound by reading the weights, a running-request cap, acceptance
that holds on a plateau and then falls off a cliff, siblings worth a geometrically falling share of a
first candidate, and one noise factor per launch moving all of its levels together. Each level's true
best comes from brute force over the whole grid in that world.
"""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from harness.plan import unchecked_plan
from harness.results import Output, commit_jobs_row, output_for
from harness.search.model import (
    Candidate,
    Capacity,
    LevelResult,
    Observation,
    Prediction,
    Z,
    fit_steps,
    launch_noise,
    measured_interval,
    residual_at,
    residual_inputs,
)
from harness.search.session import read_capacity
from harness.search.strategy import (
    GAIN_SHARE,
    Budget,
    Decision,
    SearchState,
    _expected_gain,
    answer_interval,
    propose,
)
from harness.spec import parse_spec
from tests.harness.search_worlds import accept_length_of, histogram_of
from workers.job import JobSpec
from workers.node.records import AttemptFacts, job_record
from workers.sglang.capacity import reported_capacity

TOLERANCE = 0.01
LEVELS = (("concurrency=1", 1), ("concurrency=16", 16), ("concurrency=48", 48))
SPEC_CAPTURED = (1, 2, 3, 4, 5, 6, 7, 8, 12, 16, 24, 32)  # the launch reports these; eager above 32
SPEC_CAP = 40  # ... and at most 40 running requests
BASE_CAPTURED = (1, 2, 4, 8, 16, 32, 64)


def grid() -> tuple[Candidate, ...]:
    """The baseline, chains of depth 2..7 and ten trees: 17 configs."""
    items = [Candidate("base", "baseline", None, None, None)]
    items += [Candidate(f"c{d}", f"chain d={d}", d - 1, 1, d) for d in range(2, 8)]
    items += [
        Candidate(f"t{s}-{k}-{n}", f"tree s={s} k={k} n={n}", s, k, n)
        for s in (2, 3, 4)
        for k in (2, 4)
        for n in (6, 8, 12)
        if s + 1 < n <= s * k + 1
    ]
    return tuple(items)


# --- the world ----------------------------------------------------------------------------------------


def world_q(position: int) -> float:
    """Acceptance of a draft position once the ones before it were: a plateau, then a cliff."""
    return 0.86 - 0.01 * position if position <= 3 else 0.45 * 0.9 ** (position - 4)


def world_depth_accepts(cand: Candidate) -> list[float]:
    """Per depth, the chance one of its nodes is accepted: the i-th sibling is worth 0.5**i of a first;
    the deepest depths get one node each, the rest go to depth 1 first, topk at most."""
    if cand.steps is None or cand.topk is None or cand.draft_tokens is None:
        return []
    left = cand.draft_tokens - 1
    depth = min(cand.steps, left)
    chances = []
    for j in range(depth):
        nodes = min(cand.topk, left - (depth - j - 1))
        left -= nodes
        chances.append(1.0 - math.prod(1.0 - world_q(j + 1) * 0.5**i for i in range(nodes)))
    return chances


def world_capacity(cand: Candidate) -> Capacity:
    return Capacity(SPEC_CAPTURED, SPEC_CAP) if cand.speculative else Capacity(BASE_CAPTURED, 256)


def world_throughput(cand: Candidate, clients: int) -> float:
    """Tokens/s: the running batch padded up to a captured size, a roofline step (weights read once, or
    the verified tokens' compute past the knee), draft passes, eager launches above the largest size."""
    captured, cap = world_capacity(cand).captured, world_capacity(cand).running_cap or clients
    running = min(clients, cap)
    padded = next((size for size in captured if size >= running), running)
    eager = running > captured[-1]
    verified = padded * (cand.draft_tokens or 1)
    passes = (cand.steps or 0) + 1
    step = max(0.014, 4e-5 * verified) + (0.0006 * passes * (1 + 0.03 * padded) if cand.speculative else 0.0)
    step += 0.003 * passes if eager else 0.0
    accept = accept_length_of(world_depth_accepts(cand))
    return accept * running / (step + 0.0003 * accept)


def world_measure(cand: Candidate, repeat: int, rng: random.Random, noise: float) -> Observation:
    """One launch: one noise factor for all of its levels, plus 0.2% per level."""
    factor = 1.0 + rng.gauss(0.0, noise)
    levels = tuple(
        LevelResult(
            name,
            clients,
            world_throughput(cand, clients) * factor * (1.0 + rng.gauss(0.0, 0.002)),
            histogram_of(world_depth_accepts(cand)) if cand.speculative else None,
        )
        for name, clients in LEVELS
    )
    return Observation(cand.config_id, repeat, 1200.0, levels, world_capacity(cand))


def _true_best(clients: int) -> Candidate:
    return max(grid(), key=lambda cand: world_throughput(cand, clients))


def _state(
    done: list[Observation], repeats: int, in_flight: frozenset[tuple[str, int]] = frozenset()
) -> SearchState:
    return SearchState(grid(), LEVELS, repeats, tuple(done), in_flight, frozenset(), 1200.0 * len(done))


def _search(seed: int, noise: float, repeats: int) -> tuple[list[Observation], Decision]:
    """The search from nothing to its end, two launches at a time, in the world with launch noise."""
    rng = random.Random(seed)
    cands = {c.config_id: c for c in grid()}
    done: list[Observation] = []
    while True:
        decision = propose(_state(done, repeats), 2, Budget(), TOLERANCE)
        if decision.finished:
            return done, decision
        done += [world_measure(cands[cid], repeat, rng, noise) for cid, repeat in decision.launches]


# --- launch noise and the tie rule, by hand -----------------------------------------------------------


def _launch(cid: str, repeat: int, *throughputs: float) -> Observation:
    levels = tuple(LevelResult(f"L{i}", 8, value, None) for i, value in enumerate(throughputs))
    return Observation(cid, repeat, 600.0, levels)


def test_launch_noise_pools_repeats_with_the_prior_when_configs_were_repeated() -> None:
    """Prior 2% worth 4 degrees of freedom: 4 x 0.02**2 = 0.0016. Config a ran twice: 100 and 104 at L0
    (mean 102, squared relative deviations 2 x (2/102)**2 = 7.6894e-4) and 50 and 50 at L1 (0): the
    mean over its levels, 3.8447e-4, for one degree of freedom (a launch moves every level at once).
    Config b ran three times, 99/100/101 at L0: 2 x 0.01**2 = 2e-4 for two. (0.0016 + 3.8447e-4 +
    2e-4) / 7 = 3.1207e-4, sd 0.017665 with 7 degrees of freedom; with no repeats, the prior alone.
    The 95% interval of a's mean at L0 from its two launches: t(7) = 2.364624, half-width 2.364624 x
    0.017665 x 102 / sqrt(2) = 3.0128."""
    done = [_launch("a", 0, 100, 50), _launch("a", 1, 104, 50)]
    done += [_launch("b", r, value) for r, value in enumerate((99, 100, 101))]
    noise, dof = launch_noise(done)
    assert noise == pytest.approx(0.017665, abs=1e-6) and dof == 7
    prior, prior_dof = launch_noise(done[:1] + done[2:3])
    assert prior == pytest.approx(0.02) and prior_dof == 4
    interval = measured_interval([100.0, 104.0], noise, dof)
    assert [interval.low, interval.high] == pytest.approx([102 - 3.0128, 102 + 3.0128], abs=1e-3)


def _small_space() -> tuple[Candidate, ...]:
    """The baseline and chains of depth 2 and 3: all three are seeds, so nothing is left to predict."""
    return (
        Candidate("base", "baseline", None, None, None),
        Candidate("c2", "chain d=2", 1, 1, 2),
        Candidate("c3", "chain d=3", 2, 1, 3),
    )


def _small_state(done: list[Observation], repeats: int = 3) -> SearchState:
    return SearchState(
        _small_space(), (("L0", 8),), repeats, tuple(done), frozenset(), frozenset(), 600.0 * len(done)
    )


def test_tie_set_is_the_best_alone_when_the_winner_is_clear_and_both_when_not() -> None:
    """One launch each, prior noise (2%, t(4) = 2.776): c3 at 100 and c2 at 98 differ by 2, under the
    half-width 2.776 x 0.02 x sqrt(100**2 + 98**2) = 7.77: tie (c3, c2), best first. c2 at 80 instead:
    20 > 7.11, decided, a tie set of one; the baseline at 60 is in neither. Nothing has measured the
    launch noise yet, so the next launch repeats the incumbent c3 to measure it. The best is the largest
    of three means, so t is Bonferroni-adjusted over the two differences to it: c2 at 92 falls 8 short,
    more than one pairwise half-width (2.776 x 0.02 x sqrt(100**2 + 92**2) = 7.55) but less than the
    adjusted one (t(4) at 1 - 0.025 / 2, 3.4954: 9.50): tied."""
    tied = propose(
        _small_state([_launch("base", 0, 60), _launch("c2", 0, 98), _launch("c3", 0, 100)]),
        2,
        Budget(),
        TOLERANCE,
    )
    assert tied.levels[0].tie == ("c3", "c2")
    clear = propose(
        _small_state([_launch("base", 0, 60), _launch("c2", 0, 80), _launch("c3", 0, 100)]),
        2,
        Budget(),
        TOLERANCE,
    )
    assert clear.levels[0].tie == ("c3",)
    assert (clear.launches, clear.reason) == ((("c3", 1),), "repeat to measure launch noise")
    adjusted = _small_state([_launch("base", 0, 60), _launch("c2", 0, 92), _launch("c3", 0, 100)])
    assert propose(adjusted, 2, Budget(), TOLERANCE).levels[0].tie == ("c3", "c2")


def test_answer_interval_widens_for_the_pick_of_the_tie_set_when_the_level_is_undecided() -> None:
    """The answer's first config is the largest of its tie set's means, biased upward (winner's curse):
    its 95% interval is Bonferroni-adjusted over the tie set's size. One launch each, prior noise (2%,
    4 degrees of freedom): c3 at 100 and c2 at 98 are tied (k = 2), so the quantile is t(4) at
    1 - 0.025 / 2 = 0.9875, 3.4954 (a t table's 0.0125 column), half-width 3.4954 x 0.02 x 100 = 6.991,
    not the plain 2.7764 x 2 = 5.553. With c2 at 80 the level is decided (k = 1): the plain 5.553."""
    tied = _small_state([_launch("base", 0, 60), _launch("c2", 0, 98), _launch("c3", 0, 100)])
    noise = launch_noise(list(tied.observations))
    interval = answer_interval(tied, "L0", noise)
    assert interval is not None
    assert (interval.point, interval.low, interval.high) == pytest.approx((100.0, 93.009, 106.991), abs=1e-3)
    clear = _small_state([_launch("base", 0, 60), _launch("c2", 0, 80), _launch("c3", 0, 100)])
    interval = answer_interval(clear, "L0", noise)
    assert interval is not None
    assert (interval.low, interval.high) == pytest.approx((94.447, 105.553), abs=1e-3)
    assert answer_interval(_small_state([]), "L0", noise) is None


def test_propose_repeats_the_least_launched_tied_config_when_the_budget_binds() -> None:
    """The baseline ran five times (60, 61, 60, 61, 60) and c3 twice (100, 101): five repeats measured
    the launch noise (sd 1.48%, more than the three noise probes). c3 and c2 (99) are tied, the baseline
    is not. Answering c3 may cost a fraction of a token/s against c2 (the expected shortfall): under a
    tolerance of 1% of 100.5 that is settled; under 0.01% it is not. Then, with no budget, only c2 and c3
    are repeated, fewest launches first; with max_launches 9 (8 spent) the one launch left goes to c2,
    the tied config with the fewest launches, not to the incumbent with the higher mean, and never to
    the baseline. Before c3's second launch, c2 and c3 are both repeated (one launch each)."""
    tight = 0.0001
    first = [_launch("base", r, value) for r, value in enumerate((60, 61, 60, 61, 60))]
    first += [_launch("c2", 0, 99), _launch("c3", 0, 100)]
    assert set(propose(_small_state(first), 3, Budget(), tight).launches) == {("c3", 1), ("c2", 1)}
    done = [*first, _launch("c3", 1, 101)]
    assert propose(_small_state(done), 3, Budget(), TOLERANCE).reason == "settled"
    assert propose(_small_state(done), 3, Budget(), tight).launches == (("c2", 1), ("c3", 2))
    decision = propose(_small_state(done), 3, Budget(max_launches=9), tight)
    assert (decision.launches, decision.reason) == ((("c2", 1),), "repeat of a tied config")


def test_propose_repeats_only_the_tied_configs_worth_a_launch_when_the_tie_matters() -> None:
    """The baseline ran five times (60, 72, 60, 72, 60): launch noise 6.89% (9 degrees of freedom). c3
    ran once (100), c2 twice (99, 99): tied, and answering c3 may cost 2.97 tokens/s (the expected loss),
    over the 1% tolerance of 100, so the tie matters. One more launch of c3 (its mean from one launch)
    lowers that loss by 0.63, over half the tolerance (0.5, REPEAT_SHARE): repeated. A third launch of c2
    lowers it by 0.20: not worth a launch (a tenth of the tolerance would have bought it), so it is not
    repeated although the spec allows three."""
    done = [_launch("base", r, value) for r, value in enumerate((60, 72, 60, 72, 60))]
    done += [_launch("c2", 0, 99), _launch("c2", 1, 99), _launch("c3", 0, 100)]
    decision = propose(_small_state(done), 3, Budget(), TOLERANCE)
    assert decision.levels[0].tie == ("c3", "c2")
    assert (decision.launches, decision.reason) == ((("c3", 1),), "repeat of a tied config")


def test_expected_gain_is_against_the_best_of_the_tie_set_when_the_level_is_undecided() -> None:
    """What stopping may cost is what an unlaunched config may beat the answer by, and an undecided
    level's answer is its whole tie set. One contender predicted at 98 (2% log sd), one config measured
    at 100 without noise: E[max(0, X - 100)] = 0.17, over the bar of a tenth of the 1% tolerance (0.1):
    the level stays open. The same 100 among five tied configs (100, 99.8, 99.6, 99.4, 99.2, one launch
    each, 2% launch noise): the best of their true means is about 102, and the gain, 0.045, is under the
    bar: the level closes (against the first config alone it would stay open, 0.41)."""
    contender = Prediction(98.0, 98.0 * math.exp(-Z * 0.02), 98.0 * math.exp(Z * 0.02), False)
    bar = GAIN_SHARE * TOLERANCE * 100.0
    tie = [[100.0], [99.8], [99.6], [99.4], [99.2]]
    alone, first, whole = (
        _expected_gain(tie[:1], 0.0, [contender]),
        _expected_gain(tie[:1], 0.02, [contender]),
        _expected_gain(tie, 0.02, [contender]),
    )
    assert (alone, first, whole) == pytest.approx((0.171, 0.406, 0.045), abs=0.01)
    assert alone > bar and first > bar and whole < bar
    assert _expected_gain(tie, 0.02, []) == 0.0


# --- what a launch reports about its batches ----------------------------------------------------------


def test_capacity_pads_caps_and_runs_eagerly_when_the_launch_reports_its_batches() -> None:
    """SGLang's resolved args as /server_info returns them: a generated list up to max bs 16 for a
    speculative launch (1..8, 10, 12, 14, 16) clamped to its cap of 12 (which is always captured).
    13 clients run 12 requests, padded to 12; 9 clients pad to 10; with the cap of 40 and sizes up
    to 32, 35 clients run eagerly at 35. disable_cuda_graph: nothing captured, nothing padded."""
    info = {"cuda_graph_max_bs_decode": 16, "max_running_requests": 12, "speculative_algorithm": "EAGLE3"}
    captured, cap = reported_capacity(info)
    assert (captured, cap) == ((1, 2, 3, 4, 5, 6, 7, 8, 10, 12), 12)
    capacity = Capacity(captured, cap)
    assert [capacity.padded(capacity.running(n)) for n in (13, 9)] == [(12, False), (10, False)]
    assert Capacity(SPEC_CAPTURED, SPEC_CAP).padded(35) == (35, True)
    assert reported_capacity({**info, "disable_cuda_graph": True}) == ((), 12)


# --- the residual process ----------------------------------------------------------------------------


def test_residual_process_is_less_sure_away_from_measurements_when_the_structure_fits_badly() -> None:
    """Chains and the baseline measured at 1 and 16 clients in the world (whose step is a roofline, not
    the structure's straight line): the residual process's sd at a far point (a 12-token tree at 48
    clients, eager, past the knee) is larger than at a measured (config, level)."""
    rng = random.Random(3)
    cands = {c.config_id: c for c in grid()}
    near = [world_measure(cands[cid], 0, rng, 0.01) for cid in ("base", "c2", "c4", "c7")]
    done = [
        Observation(o.config_id, 0, o.node_s, tuple(r for r in o.levels if r.concurrency < 48), o.capacity)
        for o in near
    ]
    fit = fit_steps(cands, done, tuple(name for name, _ in LEVELS), 0.02)
    assert fit.residual is not None
    where = [
        residual_inputs(cands[cid], world_capacity(cands[cid]), n) for cid, n in (("c4", 16), ("t4-4-12", 48))
    ]
    measured, far = residual_at(fit.residual, np.array(where))[1]
    assert measured < far and far > 0.0


# --- the search in the noisy world ---------------------------------------------------------------------


def test_search_answers_with_a_tie_set_holding_the_true_best_when_launches_are_noisy() -> None:
    """3% launch noise, up to 3 launches a config, six noise draws: at every level the tie set holds a
    config within 2% of the true best (brute force over the 17 configs), the true best itself in at
    least 16 of the 18 (draw, level) answers, and the search launches under 60% of the grid's 51."""
    held, launches = 0, []
    for seed in range(6):
        done, decision = _search(seed, 0.03, 3)
        launches.append(len(done))
        for (name, clients), level in zip(LEVELS, decision.levels, strict=True):
            truth = {c.config_id: world_throughput(c, clients) for c in grid()}
            best = max(truth.values())
            assert any(truth[cid] >= 0.98 * best for cid in level.tie), (seed, name, level.tie)
            held += _true_best(clients).config_id in level.tie
    assert held >= 16 and max(launches) < 0.6 * 3 * len(grid()), (held, launches)


REPORTED_INFO = {
    "cuda_graph_max_bs_decode": 16,
    "max_running_requests": 12,
    "speculative_algorithm": "EAGLE3",
}


def commit_reported_and_silent(out: Output, reporting: JobSpec, silent: JobSpec) -> None:
    """Commit two jobs rows as the driver does: ``reporting``'s attempt with SGLang's resolved args in its
    /server_info (graphs captured up to 16, a cap of 12), ``silent``'s without /server_info."""
    facts = AttemptFacts(server_info=REPORTED_INFO)
    commit_jobs_row(out, job_record(reporting, attempt=1, error_class=None, error_message=None, facts=facts))
    commit_jobs_row(
        out, job_record(silent, attempt=1, error_class=None, error_message=None, facts=AttemptFacts())
    )


def test_session_reads_what_a_launch_reported_when_its_jobs_row_is_committed(tmp_path: Path) -> None:
    """A job's committed jobs row (built by the worker's own job_record, written by the driver's own
    commit) with SGLang's resolved args in its /server_info: the session reads captured sizes 1..8,
    10, 12, 14, 16 clamped to the cap of 12, and the cap; a row without /server_info reads as None."""
    spec = parse_spec(
        {
            "engine": "sim",
            "model_path": "/m",
            "speculative": {"chain_depths": [2, 3]},
            "load": {"concurrency": [1, 4], "requests_per_level": 4},
            "search": {"strategy": "model"},
        }
    )
    plan = unchecked_plan(spec)
    job, other = plan.jobs[1], plan.jobs[2]
    out = output_for(tmp_path)
    commit_reported_and_silent(out, job, other)
    assert read_capacity(out.store, plan.sweep_id, job.job_id) == Capacity(
        (1, 2, 3, 4, 5, 6, 7, 8, 10, 12), 12
    )
    assert read_capacity(out.store, plan.sweep_id, other.job_id) is None


def test_propose_keeps_every_config_in_play_when_the_only_launch_measured_no_output() -> None:
    """The baseline's only launch produced no output at L0 (its throughput reads 0, as a level with a null
    rate does): it is no incumbent to beat, so the search goes on with the seeds instead of failing on a
    division by that 0, and the level has no best yet."""
    decision = propose(_small_state([_launch("base", 0, 0.0)]), 2, Budget(), 0.01)
    assert set(decision.launches) == {("c3", 0), ("c2", 0)} and decision.reason == "seed"
    (level,) = decision.levels
    assert level.best_label is None and level.best_throughput is None
