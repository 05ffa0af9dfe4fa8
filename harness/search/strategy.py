"""The model-based search: from the results so far to the next launches, and what it believes now.

Pure: the input is the space (every config the plan kept), the levels, what finished, what is in
flight, and the budget; the output is a ``Decision`` (launches for the free slots plus the belief per
level). The driver calls it whenever slots are free and the queue has nothing pending; a resumed
driver calls it with the same finished results and so continues the same search.

Rounds, in order:

1. Seeds, which make the model identifiable: the baseline, the deepest chain (its acceptance by
   position predicts every shallower chain), the shallowest chain (step time's slope), the largest
   tree (the sibling gain).
2. Contention: a config not yet launched stays in contention while its predicted interval reaches
   above the best measured throughput (times ``1 + tolerance``) at some level and that level is still
   open: the expected loss of stopping there (``_expected_gain``: what the best of its contenders may
   beat the best true mean of the level's tie set by, under their predictions and the launch noise)
   exceeds ``GAIN_SHARE`` of ``tolerance`` of the best. Those are launched, highest predicted gain first.
3. Repeats of the tie sets that matter: a level's tie set is its best measured config and every
   measured config whose shortfall from it is not resolved at 95% with launch noise; while answering
   the best may cost more than ``tolerance`` (the expected shortfall summed over its tie set), the
   tied configs one more launch of which lowers that by ``REPEAT_SHARE`` of ``tolerance`` are
   repeated, fewest launches first (up to the spec's ``repeats``).

The search ends when nothing is in contention and nothing is in flight, or when the budget is spent;
each level's answer is its tie set of measured configs (never a prediction), best first, and the
interval of its first config's mean is widened for having been picked as the largest of the tie set
(``answer_interval``).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from threadpoolctl import threadpool_limits

from harness.search.model import (
    NOISE_PRIOR,
    NOISE_PRIOR_DOF,
    UNKNOWN_CAPACITY,
    Candidate,
    Capacity,
    Observation,
    Prediction,
    Z,
    accept_length,
    chain_acceptance,
    fit_gain,
    fit_steps,
    fit_tree_correction,
    launch_noise,
    measured_interval,
    quantile,
    residual_at,
    tree_inputs,
)

LOSS_DRAWS = 4000  # samples of a tie set's true means when its expected loss is estimated
NOISE_PROBES = 3  # repeats that measure the launch noise before the prior is left to decide ties
GAIN_SHARE = 0.1  # a level stays open while stopping may cost more than this share of the tolerance
# a tied config is repeated only where its launch lowers the tie's expected loss by this share of the
# tolerance: with a tenth, bench/search.py's noisiest flat optima bought 5-7 repeats a run that seldom
# decided anything (two launches cannot separate 1% under 3-5% launch noise): up to 43% of the grid
REPEAT_SHARE = 0.5


@dataclass(frozen=True, slots=True)
class Budget:
    """Limits on what the search may spend; None: no limit of that kind."""

    max_launches: int | None = None
    max_node_s: float | None = None


@dataclass(frozen=True, slots=True)
class SearchState:
    """Everything the search decides from (what a real sweep knows at that moment)."""

    candidates: tuple[Candidate, ...]  # the plan's configs, in plan order
    levels: tuple[tuple[str, int], ...]  # (load_level, concurrency) of every closed-loop level
    repeats: int  # most launches of one config
    observations: tuple[Observation, ...]
    in_flight: frozenset[tuple[str, int]]  # (config_id, repeat_index) queued or running
    failed: frozenset[str]  # config_ids whose launch failed for good: never proposed again
    spent_node_s: float  # node time of every attempt so far, startup included


@dataclass(frozen=True, slots=True)
class LevelBelief:
    """The search's view of one level."""

    level: str
    best_label: str | None  # best measured config (None: nothing measured yet)
    best_throughput: float | None
    contenders: tuple[str, ...]  # labels whose interval still reaches the best (launched or not)
    # config_ids of the answer set, best first: the best measured and every measured config whose
    # difference from it is not resolved at 95% with launch noise (one when decided; empty: none measured)
    tie: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Decision:
    """The next launches and why, plus the belief per level."""

    launches: tuple[tuple[str, int], ...]  # (config_id, repeat_index)
    reason: str
    finished: bool  # nothing more to launch and nothing in flight
    levels: tuple[LevelBelief, ...]
    launch_noise: float = NOISE_PRIOR  # relative sd of one launch's mean (repeats pooled with the prior)


def _subspaces(candidates: tuple[Candidate, ...]) -> list[tuple[Candidate, ...]]:
    """The candidates of each server-axis setting, in plan order (one group without axes)."""
    groups: dict[str, list[Candidate]] = {}
    for cand in candidates:
        groups.setdefault(cand.subspace, []).append(cand)
    return [tuple(group) for group in groups.values()]


def predictions(
    state: SearchState, noise: tuple[float, int] | None = None
) -> dict[tuple[str, str], Prediction]:
    """Throughput interval of every candidate at every level: measured ones from their launches and
    the launch noise (``noise``: relative sd and its degrees of freedom; estimated from the repeats when
    None), the others from the model (see harness.search.model), fitted within each server-axis setting
    on its own: the model has no term for an axis, so it carries nothing from one setting to another."""
    noise = noise or launch_noise(list(state.observations))
    out: dict[tuple[str, str], Prediction] = {}
    with threadpool_limits(limits=1):  # matrices of a few hundred rows: BLAS threads only contend
        for group in _subspaces(state.candidates):
            ids = {c.config_id for c in group}
            own = tuple(o for o in state.observations if o.config_id in ids)
            out |= _predictions_within(dataclasses.replace(state, candidates=group, observations=own), noise)
    return out


def _capacities(cands: dict[str, Candidate], obs: list[Observation]) -> dict[str, Capacity]:
    """Each candidate's batches: what its own launch reported, else what a launch of the same kind
    (speculative or not) reported in this setting (SGLang pads and caps by kind), else unknown."""
    reported = {o.config_id: o.capacity for o in obs if o.capacity is not None}
    by_kind: dict[bool, Capacity] = {}
    for cid, capacity in reported.items():
        by_kind.setdefault(cands[cid].speculative, capacity)
    return {
        cid: reported.get(cid) or by_kind.get(cand.speculative, UNKNOWN_CAPACITY)
        for cid, cand in cands.items()
    }


def _predictions_within(state: SearchState, noise: tuple[float, int]) -> dict[tuple[str, str], Prediction]:
    """``predictions`` for candidates that share one server-axis setting."""
    cands = {c.config_id: c for c in state.candidates}
    obs = list(state.observations)
    names = tuple(name for name, _ in state.levels)
    q_by_level = {name: chain_acceptance(cands, obs, name) for name in names}
    gain, gain_low, gain_high = fit_gain(cands, obs, q_by_level)
    correction = fit_tree_correction(cands, obs, q_by_level, gain, noise[0])
    capacity_of = _capacities(cands, obs)
    fit = fit_steps(cands, obs, names, noise[0], capacity_of)
    measured: dict[tuple[str, str], list[float]] = defaultdict(list)
    for o in obs:
        for result in o.levels:
            measured[(o.config_id, result.level)].append(result.throughput)
    trees = [c for c in state.candidates if c.speculative and not c.is_chain]
    tree_shift = dict.fromkeys((c.config_id for c in trees), (0.0, 0.0))
    if correction is not None and trees:  # the tree law, as wrong as on the measured trees
        shifts, spreads = residual_at(correction, np.array([tree_inputs(c) for c in trees]))
        tree_shift = {
            c.config_id: (float(a), float(b)) for c, a, b in zip(trees, shifts, spreads, strict=True)
        }
    out: dict[tuple[str, str], Prediction] = {}
    queries: list[tuple[Candidate, str, int, float, Capacity]] = []
    bounds: list[tuple[float, float]] = []
    for cand in state.candidates:
        capacity = capacity_of[cand.config_id]
        for name, clients in state.levels:
            values = measured.get((cand.config_id, name))
            if values:
                out[(cand.config_id, name)] = measured_interval(values, *noise)
                continue
            q = q_by_level[name]
            last = q[-1] if q else 1.0
            if cand.speculative:
                shift, spread = tree_shift.get(cand.config_id, (0.0, 0.0))
                a_point = accept_length(cand, q, gain, extrapolate=last) * math.exp(shift)
                a_low = accept_length(cand, q, gain_low, extrapolate=0.0) * math.exp(shift - Z * spread)
                a_high = accept_length(cand, q, gain_high, extrapolate=last) * math.exp(shift + Z * spread)
            else:
                a_point = a_low = a_high = 1.0
            queries.append((cand, name, clients, a_point, capacity))
            bounds.append((a_low, a_high))
    for (cand, name, clients, a_point, capacity), (a_low, a_high), (y, rel) in zip(
        queries, bounds, fit.predict_many(queries), strict=True
    ):
        if y <= 0 or a_low <= 0:
            out[(cand.config_id, name)] = Prediction(math.inf, 0.0, math.inf, False)
            continue
        # acceptance and step time are independent errors: their log half-widths add in quadrature
        point = a_point * capacity.running(clients) / y
        up = math.hypot(math.log(a_high / a_point), Z * rel)
        down = math.hypot(math.log(a_point / a_low), Z * rel)
        high = point * math.exp(up) if Z * rel < 1.0 else math.inf  # a step that may take no time
        out[(cand.config_id, name)] = Prediction(point, point * math.exp(-down), high, False)
    return out


def seed_order(candidates: tuple[Candidate, ...]) -> list[Candidate]:
    """The launches that make the model identifiable, most informative first (see the module doc), for
    each server-axis setting in turn (each is fitted on its own)."""
    return [pick for group in _subspaces(candidates) for pick in _seeds_within(group)]


def _seeds_within(candidates: tuple[Candidate, ...]) -> list[Candidate]:
    """``seed_order`` for candidates that share one server-axis setting."""
    chains = [c for c in candidates if c.is_chain]  # topk 1, or a tree too small to branch
    trees = [c for c in candidates if c.speculative and not c.is_chain]
    picks: list[Candidate | None] = [
        next((c for c in candidates if not c.speculative), None),
        max(chains, key=lambda c: (c.depth, c.topk == 1)) if chains else None,
        min(chains, key=lambda c: (c.depth, c.topk != 1)) if chains else None,
        max(trees, key=lambda c: (c.draft_tokens or 0, c.topk or 0)) if trees else None,
    ]
    seen: dict[str, Candidate] = {}
    for pick in picks:
        if pick is not None:
            seen.setdefault(pick.config_id, pick)
    return list(seen.values())


def _launches_so_far(state: SearchState) -> int:
    return len(state.observations) + len(state.in_flight) + len(state.failed)


def _budget_left(state: SearchState, budget: Budget) -> int | None:
    """Launches the budget still allows (None: unlimited); node time counts in-flight launches at
    the mean node time of the finished ones."""
    left: int | None = None
    if budget.max_launches is not None:
        left = max(0, budget.max_launches - _launches_so_far(state))
    if budget.max_node_s is not None and state.observations:
        per_launch = sum(o.node_s for o in state.observations) / len(state.observations)
        committed = state.spent_node_s + per_launch * len(state.in_flight)
        by_time = max(0, math.floor((budget.max_node_s - committed) / per_launch)) if per_launch > 0 else None
        if by_time is not None:
            left = by_time if left is None else min(left, by_time)
    return left


def propose(state: SearchState, free: int, budget: Budget, tolerance: float) -> Decision:
    """The next at most ``free`` launches (see the module docstring for the rounds)."""
    noise = launch_noise(list(state.observations))
    preds = predictions(state, noise)
    ties = {name: tie_set(state, name, noise) for name, _ in state.levels}
    beliefs, contention = _beliefs(state, preds, ties, tolerance, noise[0])
    touched = {cid for cid, _ in state.in_flight} | {o.config_id for o in state.observations} | state.failed
    allowed = free if (left := _budget_left(state, budget)) is None else min(free, left)
    idle = not state.in_flight

    def decision(launches: list[tuple[str, int]], reason: str, finished: bool) -> Decision:
        return Decision(tuple(launches), reason, finished, beliefs, noise[0])

    if left == 0:
        return decision([], "budget spent", idle)
    if allowed <= 0:
        return decision([], "no free slot", False)
    seeds = [(c.config_id, 0) for c in seed_order(state.candidates) if c.config_id not in touched]
    if seeds:
        return decision(seeds[:allowed], "seed", False)
    fresh = [(cid, 0) for cid in contention if cid not in touched]
    if fresh:
        return decision(fresh[:allowed], "in contention", False)
    probes = _noise_probes(state, ties, noise)
    if probes:
        return decision(probes[:allowed], "repeat to measure launch noise", False)
    repeats = _next_repeats(state, ties, noise, tolerance)
    if repeats:
        return decision(repeats[:allowed], "repeat of a tied config", False)
    return decision([], "settled" if idle else "waiting for launches in flight", idle)


def _launches_at(state: SearchState, level: str) -> dict[str, list[float]]:
    """Each measured config's throughputs at ``level``, one per launch (configs failed for good left out)."""
    values: dict[str, list[float]] = defaultdict(list)
    for o in state.observations:
        if o.config_id in state.failed:
            continue
        for result in o.levels:
            if result.level == level:
                values[o.config_id].append(result.throughput)
    return values


def _unresolved(
    best: list[float], other: list[float], noise: tuple[float, int], compared: int = 1
) -> tuple[float, float]:
    """(difference of the means, its 95% half-width with launch noise, Bonferroni over ``compared``
    differences) of two configs' launches."""
    mb, mo = sum(best) / len(best), sum(other) / len(other)
    half = quantile(noise[1], compared) * noise[0] * math.sqrt(mb**2 / len(best) + mo**2 / len(other))
    return mb - mo, half


def tie_set(state: SearchState, level: str, noise: tuple[float, int]) -> tuple[str, ...]:
    """The answer at ``level``, best first: the best measured config and every measured config whose
    shortfall from it is within the 95% half-width of a difference of two means with launch noise."""
    values = _launches_at(state, level)
    order = sorted(values, key=lambda cid: -sum(values[cid]) / len(values[cid]))
    if not order:
        return ()
    best = values[order[0]]
    return (
        order[0],
        *(
            cid
            for cid in order[1:]
            if (gap := _unresolved(best, values[cid], noise, len(order) - 1))[0] < gap[1]
        ),
    )


def answer_interval(state: SearchState, level: str, noise: tuple[float, int]) -> Prediction | None:
    """The 95% interval of the true mean of the answer's first config at ``level`` (None: nothing
    measured). It was picked as the largest of its tie set's means, which biases it upward (the winner's
    curse): the interval is Bonferroni-adjusted over the tie set's size (``model.quantile``). Configs
    outside the tie set are resolved below it and do not widen it; a decided level keeps plain 95%."""
    tie = tie_set(state, level, noise)
    if not tie:
        return None
    return measured_interval(_launches_at(state, level)[tie[0]], *noise, tied=len(tie))


def _expected_gain(tie: list[list[float]], noise: float, contenders: list[Prediction]) -> float:
    """E[max(0, the largest true throughput of ``contenders`` - the largest true mean of the tie set)]:
    what stopping now may cost at a level. The answer is the tie set, so an unlaunched config costs only
    what it may beat the best of the whole set by, not its first config (in a flat optimum of many
    near-equal tied configs the first is one draw of several). Each unlaunched contender is log-normal
    around its prediction with the sd its interval's upper half implies, each tied config's true mean
    normal around its launches' mean with launch noise (``_mean_draws``; all independent: an upper bound
    for errors the model shares). Sampled with a fixed seed (LOSS_DRAWS draws), so the same results give
    the same decision."""
    if not contenders:
        return 0.0
    if any(math.isinf(p.high) for p in contenders):
        return math.inf
    rng = np.random.default_rng(0)
    answer = _mean_draws(tie, noise, rng).max(axis=0)
    points = np.log([p.point for p in contenders])
    sds = np.array([math.log(p.high / p.point) / Z for p in contenders])
    draws = np.exp(rng.standard_normal((len(contenders), LOSS_DRAWS)) * sds[:, None] + points[:, None])
    return float(np.mean(np.maximum(draws.max(axis=0) - answer, 0.0)))


def _beliefs(
    state: SearchState,
    preds: dict[tuple[str, str], Prediction],
    ties: dict[str, tuple[str, ...]],
    tolerance: float,
    noise: float,
) -> tuple[tuple[LevelBelief, ...], list[str]]:
    """Per level, the best measured config, its tie set and the contenders (the tie set plus the
    unlaunched configs that may beat the best); plus the unlaunched contenders of any level, highest
    predicted gain over the best first. A launch in flight predicted to beat a contender raises that
    contender's bar: it is launched only if it may still beat the launch in flight."""
    labels = {c.config_id: c.label for c in state.candidates}
    flying = {cid for cid, _ in state.in_flight}
    gain: dict[str, float] = {}
    beliefs = []
    for name, _ in state.levels:
        best = _best_measured(preds, name, state.failed)
        tied = set(ties[name])
        awaited = max((preds[(cid, name)].point for cid in flying), default=0.0)
        live = [preds[(c.config_id, name)] for c in state.candidates if c.config_id not in state.failed]
        unlaunched = [p for p in live if not p.measured]
        values = _launches_at(state, name)
        tied_runs = [values[cid] for cid in ties[name]]
        open_ = (
            best is None
            or _expected_gain(tied_runs, noise, unlaunched) > GAIN_SHARE * tolerance * best[1].point
        )
        contenders = []
        for cand in state.candidates:
            p = preds[(cand.config_id, name)]
            if cand.config_id in state.failed:
                continue
            if best is None:
                in_play, ratio = True, math.inf
            elif p.measured:
                in_play, ratio = cand.config_id in tied, 0.0
            else:
                in_play, ratio = open_ and p.high > best[1].point * (1.0 + tolerance), p.point / best[1].point
            if not in_play:
                continue
            contenders.append(labels[cand.config_id])
            if not p.measured and p.high > awaited * (1.0 + tolerance):
                gain[cand.config_id] = max(gain.get(cand.config_id, -math.inf), ratio)
        beliefs.append(
            LevelBelief(
                level=name,
                best_label=labels[best[0]] if best else None,
                best_throughput=best[1].point if best else None,
                contenders=tuple(contenders),
                tie=ties[name],
            )
        )
    order = sorted(gain, key=lambda cid: -gain[cid])
    return tuple(beliefs), order


def _next_repeats(
    state: SearchState, ties: dict[str, tuple[str, ...]], noise: tuple[float, int], tolerance: float
) -> list[tuple[str, int]]:
    """The next repeat of the configs of every tie that matters: one where the expected loss of answering
    the best measured config (``_expected_loss``: against the best of the others) exceeds ``tolerance``
    of its mean. The best is repeated too (its lead may be its own launch's luck). Fewest launches
    first, then the largest shortfall against the best (``_shortfall``)."""
    runs: dict[str, int] = defaultdict(int)
    for o in state.observations:
        runs[o.config_id] += 1
    flying = {cid for cid, _ in state.in_flight}
    wanted: dict[str, float] = {}
    for name, _ in state.levels:
        tie = ties[name]
        values = _launches_at(state, name)
        best = values[tie[0]] if tie else []
        losses = {cid: _shortfall(best, values[cid], noise[0]) for cid in tie[1:]}
        if not losses:
            continue
        runs_of_tie, mean = [values[c] for c in tie], sum(best) / len(best)
        if (loss := _expected_loss(runs_of_tie, noise[0])) <= tolerance * mean:
            continue
        for i, cid in enumerate(tie):  # worth a launch: one more of it lowers the loss by enough
            if loss - _expected_loss(runs_of_tie, noise[0], more=i) > REPEAT_SHARE * tolerance * mean:
                wanted[cid] = max(wanted.get(cid, 0.0), losses.get(cid, max(losses.values())))
    eligible = [cid for cid in wanted if runs[cid] < state.repeats and cid not in flying]
    return [(cid, runs[cid]) for cid in sorted(eligible, key=lambda c: (runs[c], -wanted[c]))]


def _noise_probes(
    state: SearchState, ties: dict[str, tuple[str, ...]], noise: tuple[float, int]
) -> list[tuple[str, int]]:
    """Repeats of the levels' best configs until NOISE_PROBES repeats measure the launch noise (when the
    spec allows repeats): without them the prior alone would set every tie, and a prior below the real
    noise would declare coin flips decided. Incumbents of the largest tie sets first; an incumbent is
    the config most worth a second launch anyway (its lead may be its launch's luck)."""
    pending = sum(1 for _, repeat in state.in_flight if repeat > 0)
    needed = NOISE_PROBES - (noise[1] - NOISE_PRIOR_DOF) - pending
    if state.repeats <= 1 or needed <= 0:
        return []
    runs: dict[str, int] = defaultdict(int)
    for o in state.observations:
        runs[o.config_id] += 1
    flying = {cid for cid, _ in state.in_flight}
    picks: list[str] = []
    for tie in sorted(ties.values(), key=len, reverse=True):
        if tie and tie[0] not in picks and tie[0] not in flying and runs[tie[0]] < state.repeats:
            picks.append(tie[0])
    return [(cid, runs[cid]) for cid in picks[:needed]]


def _expected_loss(tie: list[list[float]], noise: float, more: int | None = None) -> float:
    """E[max(0, best true mean of the others - the first's true mean)]: what answering the first config of
    a tie set may cost (``_mean_draws``); with ``more``, as if config ``more`` of the tie had one launch
    more at the same mean (what its repeat is worth). Sampled with a fixed seed (LOSS_DRAWS draws), so
    the same results give the same decision and two losses compared draw by draw."""
    draws = _mean_draws(tie, noise, np.random.default_rng(0), more)
    return float(np.mean(np.maximum(draws[1:].max(axis=0) - draws[0], 0.0)))


def _mean_draws(
    tie: list[list[float]], noise: float, rng: np.random.Generator, more: int | None = None
) -> np.ndarray:
    """LOSS_DRAWS draws of each tied config's true mean (one row each): normal around its launches' mean
    with launch noise over the root of its launches (one more for config ``more``)."""
    means = np.array([sum(v) / len(v) for v in tie])
    counts = [len(v) + (i == more) for i, v in enumerate(tie)]
    sds = np.array([noise * m / math.sqrt(n) for m, n in zip(means, counts, strict=True)])
    draws: np.ndarray = rng.standard_normal((len(tie), LOSS_DRAWS)) * sds[:, None] + means[:, None]
    return draws


def _shortfall(best: list[float], other: list[float], noise: float) -> float:
    """E[max(0, other's true mean - best's true mean)]: what answering ``best`` may cost against
    ``other``, the difference of the means normal with launch noise."""
    mb, mo = sum(best) / len(best), sum(other) / len(other)
    sd = noise * math.sqrt(mb**2 / len(best) + mo**2 / len(other))
    if sd <= 0:
        return max(0.0, mo - mb)
    z = (mo - mb) / sd
    return sd * math.exp(-0.5 * z * z) / math.sqrt(2.0 * math.pi) + (mo - mb) * 0.5 * math.erfc(
        -z / math.sqrt(2.0)
    )


def _best_measured(
    preds: dict[tuple[str, str], Prediction], level: str, failed: frozenset[str] = frozenset()
) -> tuple[str, Prediction] | None:
    """The measured config with the highest mean throughput at ``level``; a config that measured nothing
    there (no output: throughput 0) is no incumbent, so every other config stays in play."""
    measured = [
        (cid, p)
        for (cid, lv), p in preds.items()
        if lv == level and p.measured and cid not in failed and p.point > 0
    ]
    return max(measured, key=lambda item: item[1].point, default=None)
