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
   above the best measured throughput (times ``1 + tolerance``) at some level; those are launched,
   highest predicted gain first.
3. Successive halving over repeats: measured configs whose interval still overlaps the best's at some
   level get their next repeat (up to the spec's ``repeats``); the others are settled.

The search ends when nothing is in contention and nothing is in flight, or when the budget is spent;
each level's answer is its best measured config (never a prediction).
"""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from dataclasses import dataclass

from harness.search.model import (
    Candidate,
    Observation,
    Prediction,
    Z,
    accept_length,
    chain_acceptance,
    fit_gain,
    fit_steps,
)

MEASUREMENT_NOISE = 0.02  # relative sd of one launch's throughput at one level, before residuals say more


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


@dataclass(frozen=True, slots=True)
class Decision:
    """The next launches and why, plus the belief per level."""

    launches: tuple[tuple[str, int], ...]  # (config_id, repeat_index)
    reason: str
    finished: bool  # nothing more to launch and nothing in flight
    levels: tuple[LevelBelief, ...]


def _subspaces(candidates: tuple[Candidate, ...]) -> list[tuple[Candidate, ...]]:
    """The candidates of each server-axis setting, in plan order (one group without axes)."""
    groups: dict[str, list[Candidate]] = {}
    for cand in candidates:
        groups.setdefault(cand.subspace, []).append(cand)
    return [tuple(group) for group in groups.values()]


def predictions(state: SearchState, noise: float = MEASUREMENT_NOISE) -> dict[tuple[str, str], Prediction]:
    """Throughput interval of every candidate at every level: measured ones from their launches,
    the others from the model (see harness.search.model), fitted within each server-axis setting on its
    own: the model has no term for an axis, so it carries nothing from one setting to another."""
    out: dict[tuple[str, str], Prediction] = {}
    for group in _subspaces(state.candidates):
        ids = {c.config_id for c in group}
        own = tuple(o for o in state.observations if o.config_id in ids)
        out |= _predictions_within(dataclasses.replace(state, candidates=group, observations=own), noise)
    return out


def _predictions_within(state: SearchState, noise: float) -> dict[tuple[str, str], Prediction]:
    """``predictions`` for candidates that share one server-axis setting."""
    cands = {c.config_id: c for c in state.candidates}
    obs = list(state.observations)
    names = tuple(name for name, _ in state.levels)
    q_by_level = {name: chain_acceptance(cands, obs, name) for name in names}
    gain, gain_low, gain_high = fit_gain(cands, obs, q_by_level)
    fit = fit_steps(cands, obs, names, noise)
    measured: dict[tuple[str, str], list[float]] = defaultdict(list)
    for o in obs:
        for result in o.levels:
            measured[(o.config_id, result.level)].append(result.throughput)
    out: dict[tuple[str, str], Prediction] = {}
    for cand in state.candidates:
        for name, batch in state.levels:
            values = measured.get((cand.config_id, name))
            if values:
                mean = sum(values) / len(values)
                half = Z * noise * mean / math.sqrt(len(values))
                out[(cand.config_id, name)] = Prediction(mean, mean - half, mean + half, True)
                continue
            q = q_by_level[name]
            last = q[-1] if q else 1.0
            if cand.speculative:
                a_point = accept_length(cand, q, gain, extrapolate=last)
                a_low = accept_length(cand, q, gain_low, extrapolate=0.0)
                a_high = accept_length(cand, q, gain_high, extrapolate=last)
            else:
                a_point = a_low = a_high = 1.0
            y, sd = fit.predict(cand, name, batch, a_point)
            point = a_point * batch / y if y > 0 else math.inf
            low = a_low * batch / (y + Z * sd) if y + Z * sd > 0 else 0.0
            high = a_high * batch / (y - Z * sd) if y - Z * sd > 0 else math.inf
            out[(cand.config_id, name)] = Prediction(point, min(low, point), max(high, point), False)
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
    preds = predictions(state)
    beliefs, contention = _beliefs(state, preds, tolerance)
    touched = {cid for cid, _ in state.in_flight} | {o.config_id for o in state.observations} | state.failed
    allowed = free if (left := _budget_left(state, budget)) is None else min(free, left)
    idle = not state.in_flight
    if left == 0:
        return Decision((), "budget spent", idle, beliefs)
    if allowed <= 0:
        return Decision((), "no free slot", False, beliefs)
    seeds = [(c.config_id, 0) for c in seed_order(state.candidates) if c.config_id not in touched]
    if seeds:
        return Decision(tuple(seeds[:allowed]), "seed", False, beliefs)
    fresh = [cid for cid in contention if cid not in touched]
    if fresh:
        return Decision(tuple((cid, 0) for cid in fresh[:allowed]), "in contention", False, beliefs)
    repeats = _next_repeats(state, preds, tolerance)
    if repeats:
        return Decision(tuple(repeats[:allowed]), "repeat of a tied config", False, beliefs)
    return Decision((), "settled" if idle else "waiting for launches in flight", idle, beliefs)


def _beliefs(
    state: SearchState, preds: dict[tuple[str, str], Prediction], tolerance: float
) -> tuple[tuple[LevelBelief, ...], list[str]]:
    """Per level, the best measured config and the contenders; plus the unlaunched contenders of any
    level, highest predicted gain over the best first. A launch in flight predicted to beat a contender
    raises that contender's bar: it is launched only if it may still beat the launch in flight."""
    labels = {c.config_id: c.label for c in state.candidates}
    flying = {cid for cid, _ in state.in_flight}
    gain: dict[str, float] = {}
    beliefs = []
    for name, _ in state.levels:
        best = _best_measured(preds, name)
        awaited = max((preds[(cid, name)].point for cid in flying), default=0.0)
        contenders = []
        for cand in state.candidates:
            p = preds[(cand.config_id, name)]
            if cand.config_id in state.failed:
                continue
            if best is None:
                in_play, ratio = True, math.inf
            elif p.measured:
                in_play, ratio = cand.config_id == best[0] or p.high >= best[1].low, 0.0
            else:
                in_play, ratio = p.high > best[1].point * (1.0 + tolerance), p.point / best[1].point
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
            )
        )
    order = sorted(gain, key=lambda cid: -gain[cid])
    return tuple(beliefs), order


def _next_repeats(
    state: SearchState, preds: dict[tuple[str, str], Prediction], tolerance: float
) -> list[tuple[str, int]]:
    """The next repeat of every measured config still tied with its level's best, most promising first."""
    if state.repeats <= 1:
        return []
    runs: dict[str, int] = defaultdict(int)
    for o in state.observations:
        runs[o.config_id] += 1
    flying = {cid for cid, _ in state.in_flight}
    wanted: dict[str, float] = {}
    for name, _ in state.levels:
        best = _best_measured(preds, name)
        if best is None:
            continue
        tied = [
            (cid, p)
            for (cid, lv), p in preds.items()
            if lv == name
            and p.measured
            and cid not in state.failed
            and p.high >= best[1].low * (1.0 + tolerance)
        ]
        if len(tied) < 2:  # the best alone: nothing to tell apart
            continue
        for cid, p in tied:
            if runs[cid] < state.repeats and cid not in flying:
                wanted[cid] = max(wanted.get(cid, 0.0), p.point / best[1].point)
    return [(cid, runs[cid]) for cid in sorted(wanted, key=lambda c: -wanted[c])]


def _best_measured(preds: dict[tuple[str, str], Prediction], level: str) -> tuple[str, Prediction] | None:
    """The measured config with the highest mean throughput at ``level``."""
    measured = [(cid, p) for (cid, lv), p in preds.items() if lv == level and p.measured]
    return max(measured, key=lambda item: item[1].point, default=None)
