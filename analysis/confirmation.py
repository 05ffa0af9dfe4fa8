"""The measured adaptive server against the sweep: what the confirmation job (jobs.role = confirmation) got.

Per load level the confirmation's objective is read from a ranking that holds it beside the sweep's
configs (the same statistics: median over repeats, bootstrap interval), and compared with

- the level's winner among the sweep's configs (its score: confirmation / winner, inverted for
  lower-is-better objectives), and where that winner is a tree (topk > 1), what the schedule gives up;
- the best topk-1 chain or baseline at that level: the configs an adaptive schedule switches between.

On the load mix (the spec's ``deploy_weights``) its measured score is the weighted mean of its level
scores, with an interval from its levels' intervals (each over that level's winner as measured); it is
compared with the best static config overall and the best static topk-1 chain. The recommendation is
the measured adaptive server only when it scores separably higher on the mix than the static config
``best --emit`` recommends (``analysis.deploy.prefer_static``, launch noise included); tied, the static
launch, the simpler one, and the output says so.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from analysis.deploy import (
    ConfigShape,
    StaticChoice,
    best_chain_static,
    mix,
    plan_deployment,
    prefer_static,
    score,
    scored,
)
from analysis.select import Interval, RankedConfig, Selection

if TYPE_CHECKING:
    import duckdb

CONFIRMATION_ROLE = "confirmation"


@dataclass(frozen=True)
class LevelConfirmation:
    """The confirmation at one load level."""

    load_level: str
    objective: float | None  # null when it missed an SLO there (then its score is 0)
    objective_ci: Interval | None
    winner_label: str
    of_winner: float  # objective / winner's (1 = as good as the level's best sweep config)
    best_chain_label: str | None  # the best topk-1 chain or baseline here
    of_best_chain: float | None
    gives_up: str | None  # where a tree wins the level: what the schedule leaves on the table, in words


@dataclass(frozen=True)
class Confirmation:
    """The measured adaptive server on every level and on the load mix."""

    config_label: str
    schedule: str  # the schedule it ran, as the jobs row's requested_points says
    weights: dict[str, float]
    levels: tuple[LevelConfirmation, ...]
    mix_score: float
    mix_ci: Interval | None
    static: StaticChoice  # the best static config on the mix (any shape)
    chain_static: StaticChoice | None  # the best static topk-1 chain or baseline on the mix
    recommended: str  # "adaptive" or "static": static unless adaptive is separably higher on the mix
    preference: str | None = None  # why static was taken over a tied adaptive server, in words


def confirmation_label(con: duckdb.DuckDBPyConnection) -> tuple[str, str] | None:
    """The done confirmation job's (config label, schedule), or None when there is none."""
    rows = con.execute(
        "SELECT config_label, requested_points[1] FROM current_jobs WHERE role = ? LIMIT 1",
        [CONFIRMATION_ROLE],
    ).fetchall()
    return (str(rows[0][0]), str(rows[0][1])) if rows else None


def confirm(
    sweep: Selection,
    with_confirmation: Selection,
    label: str,
    schedule: str,
    shapes: dict[str, ConfigShape],
    concurrency: dict[str, int | None],
    weights: dict[str, float] | None,
) -> Confirmation:
    """Compare the confirmation (``label``, ranked in ``with_confirmation``) with ``sweep``'s rankings."""
    deployment = plan_deployment(sweep, shapes, concurrency, weights)
    lower = sweep.better == "lower"
    ranked_with = {
        level.load_level: {r.config_label: r for r in level.ranked} for level in with_confirmation.levels
    }
    levels = []
    measured_at: dict[str, RankedConfig] = {}
    for level in sweep.levels:
        if level.winner is None:
            continue
        measured: RankedConfig | None = ranked_with.get(level.load_level, {}).get(label)
        if measured is not None:
            measured_at[level.load_level] = measured
        best_chain = next(
            (
                r
                for r in level.ranked
                if shapes[r.config_label].is_baseline or shapes[r.config_label].is_chain
            ),
            None,
        )
        value = measured.objective if measured else None
        of_winner = score(value, level.winner.objective, lower) if value is not None else 0.0
        tree_wins = not (
            shapes[level.winner.config_label].is_baseline or shapes[level.winner.config_label].is_chain
        )
        levels.append(
            LevelConfirmation(
                load_level=level.load_level,
                objective=value,
                objective_ci=measured.objective_ci if measured else None,
                winner_label=level.winner.config_label,
                of_winner=of_winner,
                best_chain_label=best_chain.config_label if best_chain else None,
                of_best_chain=score(value, best_chain.objective, lower)
                if best_chain and value is not None
                else None,
                gives_up=f"{level.winner.config_label!r} wins here; the adaptive server reaches {of_winner:.3f} of it"
                if tree_wins
                else None,
            )
        )
    by_level = {lc.load_level: lc for lc in levels}
    weights_used = deployment.weights
    scores = {level: by_level[level].of_winner if level in by_level else 0.0 for level in weights_used}
    mix_score = mix(scores, weights_used)
    mix_ci = _mix_interval(sweep, by_level, weights_used, lower)
    static_label = deployment.static.config_label
    recommended, preference = prefer_static(
        "the measured adaptive server",
        scored(sweep, dict.fromkeys(weights_used, label), measured_at),
        static_label,
        scored(sweep, dict.fromkeys(weights_used, static_label)),
        weights_used,
        sweep.confidence,
    )
    return Confirmation(
        config_label=label,
        schedule=schedule,
        weights=weights_used,
        levels=tuple(levels),
        mix_score=mix_score,
        mix_ci=mix_ci,
        static=deployment.static,
        chain_static=best_chain_static(sweep, shapes, weights_used),
        recommended=recommended,
        preference=preference,
    )


def _mix_interval(
    sweep: Selection, by_level: dict[str, LevelConfirmation], weights: dict[str, float], lower: bool
) -> Interval | None:
    """The mix score's interval from each level's interval of the confirmation's objective."""
    winners = {level.load_level: level.winner.objective for level in sweep.levels if level.winner}
    lows, highs = {}, {}
    for level in weights:
        lc = by_level.get(level)
        if lc is None or lc.objective_ci is None:
            return None
        a, b = (
            score(lc.objective_ci.low, winners[level], lower),
            score(lc.objective_ci.high, winners[level], lower),
        )
        lows[level], highs[level] = min(a, b), max(a, b)
    return Interval(mix(lows, weights), mix(highs, weights))
