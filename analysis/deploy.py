"""One config for all of a team's traffic: the static config best over the load mix, and an adaptive schedule.

A team runs one server, so per-level winners are not an answer by themselves. Two candidates:

- **static**: one measured config. Its score at a level is its objective as a fraction of that level's
  winner (``winner / value`` for lower-is-better objectives), so levels of very different scale weigh
  only by the team's weights; the mix score is the weighted mean over the weighted levels. A config
  that misses an SLO (is not ranked) at any weighted level is not a candidate.
- **adaptive** (closed-loop levels only): per level, the best of the topk-1 chains and the baseline
  (depth 0); each level owns the batch sizes nearer (geometrically) to its concurrency than to its
  neighbours': thresholds are 1 for the lowest level and ``ceil(sqrt(previous x this))`` above it
  (levels 1/16/64: batch >= 1, >= 4, >= 32), so a batch a request short of its level's concurrency,
  as happens between a finish and the next admission, still runs that level's depth. Its expected mix score assumes each level runs as its chosen config did; where a tree
  (topk > 1) won a level, the schedule gives up the difference, which is reported.

The recommendation is whichever expects the higher mix score, unless the two are tied; the adaptive one
is a prediction until a confirmation run measures it.

Ties on the mix: each config's score at a level is uncertain by its objective's interval (launch noise
included, ``analysis.select``), read as a relative sd (half-width / z). Two candidates' mix scores
differ by sum_l w_l (a_l - b_l) / W, with variance sum_l (w_l / W)^2 (a_l^2 v_a,l + b_l^2 v_b,l), and a
level where both run the same config adds nothing. Within 95% (z sd) of the best they are tied, and
inside a tie the simpler launch is preferred and said so: static over adaptive (the adaptive schedule
is recommended only when its mix score is separably higher), then the baseline, topk 1 over trees,
fewer draft tokens, fewer steps.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from analysis.select import LevelChoice, RankedConfig, Selection
from specsweep.errors import NoConfigMeetsSlosError, ResultsError

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True)
class ConfigShape:
    """What a config runs: the no-speculation baseline, a topk-1 chain of ``steps``, or a tree."""

    config_label: str
    is_baseline: bool
    steps: int | None
    topk: int | None
    draft_tokens: int | None = None

    @property
    def is_chain(self) -> bool:
        return not self.is_baseline and self.topk == 1 and self.steps is not None

    @property
    def simplicity(self) -> tuple[int, int, int, int, str]:
        """Sort key, simplest first: the baseline, then topk 1 before trees, fewer draft tokens, fewer
        steps (the label last, so the order is total)."""
        tree = int((self.topk or 1) > 1)
        return (int(not self.is_baseline), tree, self.draft_tokens or 0, self.steps or 0, self.config_label)


@dataclass(frozen=True)
class StaticChoice:
    """The measured config best over the load mix."""

    config_label: str
    mix_score: float  # weighted mean over levels of objective / level winner's (1 = wins every level)
    level_scores: dict[str, float]


@dataclass(frozen=True)
class AdaptiveChoice:
    """A per-batch-size depth schedule built from the per-level winners among chains and the baseline."""

    steps_by_batch_size: dict[int, int]
    thresholds: dict[str, int]  # load level -> the smallest batch size its depth serves
    chosen: dict[str, str]  # load level -> the config whose depth the schedule uses there
    mix_score: float
    level_scores: dict[str, float]
    gives_up: dict[str, str]  # load level -> what a tree winner there does better, in words
    chain_label: str  # the deepest scheduled chain: its launch is the adaptive launch's base


@dataclass(frozen=True)
class Deployment:
    """The answer to deploy, and the alternative."""

    weights: dict[str, float]
    static: StaticChoice
    adaptive: AdaptiveChoice | None
    adaptive_note: str | None  # why there is no adaptive schedule
    recommended: str  # "static" or "adaptive"
    tie: tuple[str, ...] = ()  # the candidates tied on the mix with the best ("adaptive" for the schedule)
    preference: tuple[str, ...] = ()  # why the simpler launch was taken inside a tie, in words


def spec_weights(con: duckdb.DuckDBPyConnection) -> dict[str, float] | None:
    """The spec's ``deploy_weights`` (None: every level alike), read from the sweep row's YAML."""
    import yaml

    rows = con.sql("SELECT spec_text FROM sweep").fetchall()
    spec = yaml.safe_load(rows[0][0]) if rows and rows[0][0] else None
    weights = spec.get("deploy_weights") if isinstance(spec, dict) else None
    return {str(k): float(v) for k, v in weights.items()} if isinstance(weights, dict) and weights else None


def config_shapes(con: duckdb.DuckDBPyConnection) -> dict[str, ConfigShape]:
    """Per config label, what its done jobs ran (effective settings)."""
    rows = con.sql(
        "SELECT config_label, any_value(effective_speculative_algorithm IS NULL), "
        "any_value(effective_speculative_num_steps), any_value(effective_speculative_eagle_topk), "
        "any_value(effective_speculative_num_draft_tokens) "
        "FROM current_jobs WHERE role = 'sweep' GROUP BY config_label"
    ).fetchall()
    return {label: ConfigShape(label, bool(base), *shape) for label, base, *shape in rows}


def level_concurrency(con: duckdb.DuckDBPyConnection) -> dict[str, int | None]:
    """Per load level, its closed-loop concurrency (null for an open-loop level)."""
    return {
        level: c
        for level, c in con.sql("SELECT load_level, min(concurrency) FROM levels GROUP BY 1").fetchall()
    }


def plan_deployment(
    selection: Selection,
    shapes: dict[str, ConfigShape],
    concurrency: dict[str, int | None],
    weights: dict[str, float] | None = None,
) -> Deployment:
    """The static and adaptive candidates over ``weights`` (default: every measured level alike)."""
    levels = {level.load_level: level for level in selection.levels}
    weights = _check_weights(weights or dict.fromkeys(levels, 1.0), levels)
    lower = selection.better == "lower"
    static, tie, preference = _simplest_static(selection, levels, weights, shapes)
    adaptive, note = _adaptive(levels, weights, lower, shapes, concurrency)
    recommended = "static"
    if adaptive is not None:
        static_scored = scored(selection, {level: static.config_label for level in weights})
        adaptive_scored = scored(selection, adaptive.chosen)
        recommended, why = prefer_static(
            "adaptive", adaptive_scored, static.config_label, static_scored, weights, selection.confidence
        )
        if why:
            tie, preference = (*(tie or (static.config_label,)), "adaptive"), (*preference, why)
    return Deployment(weights, static, adaptive, note, recommended, tie, preference)


Scored = dict[str, tuple[str, float, float]]  # level -> (config, score of the level's winner, rel. variance)


def scored(
    selection: Selection, chosen: dict[str, str], measured: dict[str, RankedConfig] | None = None
) -> Scored:
    """Per level, the config ``chosen`` there (or its ``measured`` ranking), its score and the relative
    variance of its objective (from its interval: ((high - low) / 2 / z / objective)^2); 0 and 0 where
    it is not ranked (it missed an SLO)."""
    z = NormalDist().inv_cdf(1 - (1 - selection.confidence) / 2)
    lower = selection.better == "lower"
    out: Scored = {}
    for level in selection.levels:
        if level.load_level not in chosen or level.winner is None:
            continue
        ranked = {r.config_label: r for r in level.ranked}
        r = (measured or {}).get(level.load_level) or ranked.get(chosen[level.load_level])
        if r is None:  # it missed an SLO there: it scores 0
            out[level.load_level] = (chosen[level.load_level], 0.0, 0.0)
            continue
        ci = r.objective_ci
        variance = ((ci.high - ci.low) / 2 / z / r.objective) ** 2 if ci and r.objective else 0.0
        out[level.load_level] = (r.config_label, score(r.objective, level.winner.objective, lower), variance)
    return out


def separated(a: Scored, b: Scored, weights: dict[str, float], confidence: float) -> bool:
    """Whether ``a``'s mix score is higher than ``b``'s beyond their noise (see the module docstring)."""
    total = sum(weights.values())
    difference = variance = 0.0
    for level, w in weights.items():
        (label_a, score_a, var_a), (label_b, score_b, var_b) = a[level], b[level]
        if label_a == label_b:
            continue  # the same launch's measurement: no difference, no noise
        difference += w / total * (score_a - score_b)
        variance += (w / total) ** 2 * (score_a**2 * var_a + score_b**2 * var_b)
    z = NormalDist().inv_cdf(1 - (1 - confidence) / 2)
    return difference > z * math.sqrt(variance)


def prefer_static(
    name: str,
    candidate: Scored,
    static_label: str,
    static: Scored,
    weights: dict[str, float],
    confidence: float,
) -> tuple[str, str | None]:
    """("adaptive", None) when the adaptive ``candidate`` (called ``name``) scores separably higher on the
    mix than the static config; else ("static", why) when they are tied, ("static", None) when the
    static config is simply better."""
    if separated(candidate, static, weights, confidence):
        return "adaptive", None
    if separated(static, candidate, weights, confidence):
        return "static", None
    a, b = mix_of(candidate, weights), mix_of(static, weights)
    return "static", (
        f"{name} ({a:.3f}) and static {static_label!r} ({b:.3f}) are not separable at {confidence:.0%} on the "
        "mix: static recommended, the simpler launch"
    )


def mix_of(values: Scored, weights: dict[str, float]) -> float:
    """The mix score of per-level scored configs."""
    return mix({level: values[level][1] for level in weights}, weights)


def _simplest_static(
    selection: Selection,
    levels: dict[str, LevelChoice],
    weights: dict[str, float],
    shapes: dict[str, ConfigShape],
) -> tuple[StaticChoice, tuple[str, ...], tuple[str, ...]]:
    """The simplest static config among those tied on the mix with the best one; the tie set (best mix
    score first) and, when the simpler one was taken, why."""
    choices = _static_choices(levels, weights, selection.better == "lower")
    best = choices[0]
    best_scored = scored(selection, dict.fromkeys(weights, best.config_label))
    tied = [
        c
        for c in choices
        if c is best
        or not separated(
            best_scored,
            scored(selection, dict.fromkeys(weights, c.config_label)),
            weights,
            selection.confidence,
        )
    ]
    simplest = min(tied, key=lambda c: _simplicity(shapes, c.config_label))
    tie = tuple(c.config_label for c in tied) if len(tied) > 1 else ()
    if simplest is best:
        return best, tie, ()
    why = (
        f"static {simplest.config_label!r} ({simplest.mix_score:.3f}) is the simplest of the configs tied on the "
        f"mix with {best.config_label!r} ({best.mix_score:.3f}; tie: {', '.join(tie)}, not separable at "
        f"{selection.confidence:.0%}): preferred, the simpler launch"
    )
    return simplest, tie, (why,)


def _simplicity(shapes: dict[str, ConfigShape], label: str) -> tuple[int, int, int, int, str]:
    shape = shapes.get(label)
    return shape.simplicity if shape else (1, 1, 0, 0, label)


def batch_thresholds(concurrency: dict[str, int]) -> dict[str, int]:
    """Per level, the smallest batch size its depth serves (see the module docstring)."""
    ordered = sorted(concurrency.items(), key=lambda item: item[1])
    thresholds = {ordered[0][0]: 1}
    for (_, previous), (level, current) in itertools.pairwise(ordered):
        thresholds[level] = math.ceil(math.sqrt(previous * current))
    return thresholds


def _check_weights(weights: dict[str, float], levels: dict[str, LevelChoice]) -> dict[str, float]:
    unknown = sorted(set(weights) - set(levels))
    if unknown:
        raise ResultsError(
            f"load mix weights name levels that were not ranked: {', '.join(unknown)}",
            where="deploy_weights",
            fix=f"use level names of this sweep: {', '.join(levels)}",
        )
    weights = {level: w for level, w in weights.items() if w > 0}
    if not weights:
        raise ResultsError(
            "load mix weights are all 0", where="deploy_weights", fix="give some level a weight"
        )
    return weights


def score(value: float, best: float, lower: bool) -> float:
    """``value`` as a fraction of the level's ``best`` (1 = as good as the winner)."""
    if lower:
        return best / value if value > 0 else 0.0
    return value / best if best > 0 else 0.0


def _level_scores(level: LevelChoice, lower: bool) -> dict[str, float]:
    best = level.winner.objective if level.winner else 0.0
    return {r.config_label: score(r.objective, best, lower) for r in level.ranked}


def mix(scores: dict[str, float], weights: dict[str, float]) -> float:
    """The weighted mean of per-level scores."""
    return sum(weights[level] * scores[level] for level in weights) / sum(weights.values())


def best_chain_static(
    selection: Selection, shapes: dict[str, ConfigShape], weights: dict[str, float]
) -> StaticChoice | None:
    """The static config best over ``weights`` among the topk-1 chains and the baseline (the configs an
    adaptive schedule switches between); None when none of them is ranked at every weighted level."""
    levels = {level.load_level: level for level in selection.levels}
    eligible = {label for label, shape in shapes.items() if shape.is_baseline or shape.is_chain}
    try:
        return _best_static(levels, weights, selection.better == "lower", eligible)
    except ResultsError:
        return None


def _best_static(
    levels: dict[str, LevelChoice], weights: dict[str, float], lower: bool, only: set[str] | None = None
) -> StaticChoice:
    return _static_choices(levels, weights, lower, only)[0]


def _static_choices(
    levels: dict[str, LevelChoice], weights: dict[str, float], lower: bool, only: set[str] | None = None
) -> list[StaticChoice]:
    """Every config ranked at every weighted level, best mix score first (ties by label)."""
    per_level = {level: _level_scores(levels[level], lower) for level in weights}
    candidates = set.intersection(*(set(scores) for scores in per_level.values()))
    if only is not None:
        candidates &= only
    if not candidates:
        raise NoConfigMeetsSlosError(
            "no config meets every SLO at every weighted load level",
            where="--emit",
            fix="relax the SLOs, or weight only the levels the deployment must serve",
        )
    choices = [
        StaticChoice(
            label,
            mix({lv: per_level[lv][label] for lv in weights}, weights),
            {lv: per_level[lv][label] for lv in weights},
        )
        for label in sorted(candidates)
    ]
    return sorted(choices, key=lambda c: -c.mix_score)


def _adaptive(
    levels: dict[str, LevelChoice],
    weights: dict[str, float],
    lower: bool,
    shapes: dict[str, ConfigShape],
    concurrency: dict[str, int | None],
) -> tuple[AdaptiveChoice | None, str | None]:
    open_loop = sorted(level for level in weights if concurrency.get(level) is None)
    if open_loop:
        return None, f"open-loop levels ({', '.join(open_loop)}) give no batch size to key a schedule by"
    chosen: dict[str, RankedConfig] = {}
    for level in weights:
        eligible = [
            r
            for r in levels[level].ranked
            if shapes[r.config_label].is_baseline or shapes[r.config_label].is_chain
        ]
        if not eligible:
            return None, f"{level}: no topk-1 chain or baseline meets every SLO"
        chosen[level] = eligible[0]  # ranked best first
    chains = [shapes[r.config_label] for r in chosen.values() if shapes[r.config_label].is_chain]
    if not chains:
        return None, "no topk-1 chain wins any weighted level: deploy without speculation"
    deepest = max(chains, key=lambda s: s.steps or 0)
    thresholds = batch_thresholds({level: int(concurrency[level]) for level in chosen})  # type: ignore[arg-type]
    steps = {
        thresholds[level]: (shapes[r.config_label].steps or 0) if shapes[r.config_label].is_chain else 0
        for level, r in chosen.items()
    }
    scores = {level: _level_scores(levels[level], lower)[r.config_label] for level, r in chosen.items()}
    gives_up = {
        level: f"{levels[level].winner.config_label!r} ({1 / scores[level]:.3f}x of the schedule's {r.config_label!r})"  # type: ignore[union-attr]
        for level, r in chosen.items()
        if scores[level] < 1 and scores[level] > 0
    }
    adaptive = AdaptiveChoice(
        steps_by_batch_size=dict(sorted(steps.items())),
        thresholds=thresholds,
        chosen={level: r.config_label for level, r in chosen.items()},
        mix_score=mix(scores, weights),
        level_scores=scores,
        gives_up=gives_up,
        chain_label=deepest.config_label,
    )
    return adaptive, None
