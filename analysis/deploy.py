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

The recommendation is whichever expects the higher mix score; the adaptive one is a prediction until a
confirmation run measures it.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
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

    @property
    def is_chain(self) -> bool:
        return not self.is_baseline and self.topk == 1 and self.steps is not None


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
        "any_value(effective_speculative_num_steps), any_value(effective_speculative_eagle_topk) "
        "FROM current_jobs WHERE role = 'sweep' GROUP BY config_label"
    ).fetchall()
    return {label: ConfigShape(label, bool(base), steps, topk) for label, base, steps, topk in rows}


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
    static = _best_static(levels, weights, lower)
    adaptive, note = _adaptive(levels, weights, lower, shapes, concurrency)
    recommended = "adaptive" if adaptive is not None and adaptive.mix_score >= static.mix_score else "static"
    return Deployment(weights, static, adaptive, note, recommended)


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
    return max(choices, key=lambda c: c.mix_score)


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
