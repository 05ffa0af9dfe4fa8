"""Configs ranked by capacity under SLO: the highest load each one carried with its SLOs met.

The numbers come from the ``capacity_results`` view (one row per job with a capacity search). A config
with repeats is credited with its smallest capacity over its launches: a team deploys one launch and
the SLO must hold on whichever it gets.

Each config's bracket [low, high] holds its capacity on a launch of its own: from its smallest passing
load to its highest lowest failing load over its launches (high unknown when some launch failed no
probe), widened by launch noise, z x sigma of the load on each side (sigma the spec's ``launch_noise``,
``analysis.select``: a launch a few percent slower carries a few percent less load within the SLO).
Configs whose brackets overlap the best's are tied with it: not separable, so ranks 1 and 2 of a tie
are no ranking.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING

from analysis.select import DEFAULT_CONFIDENCE, spec_launch_noise
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True, slots=True)
class CapacityChoice:
    """One config's capacity: the load (rate in requests/s or concurrency), how sure its bound is, and
    the probes its launches made."""

    rank: int
    config_label: str
    kind: str  # rate or concurrency
    slo: str
    capacity: float | None  # None: no probe passed, capacity is below lowest_fail
    bound: str  # bracketed, at_least or below (see analysis.views)
    lowest_fail: float | None
    launches: int
    probes: int  # most probes one launch made
    launch_command: str | None
    low: float  # the bracket of its capacity on a launch of its own, launch noise included (see above)
    high: float | None  # None: no launch found a failing load, so no upper end is known
    tie: bool  # its bracket overlaps the best's (the best: when another's does)
    launch_noise: float  # the relative sd the bracket was widened by


_RANK_SQL = """
WITH ordered AS (
    SELECT *, row_number() OVER (
        PARTITION BY config_label ORDER BY capacity ASC NULLS FIRST, repeat_index) AS worst
    FROM capacity_results
)
SELECT config_label, capacity_kind, capacity_slo, capacity, bound, lowest_fail,
       (SELECT count(*) FROM capacity_results r WHERE r.config_label = o.config_label) AS launches,
       (SELECT max(probes) FROM capacity_results r WHERE r.config_label = o.config_label) AS probes,
       launch_command,
       (SELECT coalesce(min(capacity), 0) FROM capacity_results r WHERE r.config_label = o.config_label) AS low,
       (SELECT CASE WHEN bool_or(lowest_fail IS NULL) THEN NULL ELSE max(lowest_fail) END
        FROM capacity_results r WHERE r.config_label = o.config_label) AS high
FROM ordered o WHERE worst = 1
ORDER BY capacity DESC NULLS LAST, config_label
"""


def rank_by_capacity(con: duckdb.DuckDBPyConnection) -> list[CapacityChoice]:
    """Every config with a capacity search, highest capacity first (``ResultsError`` when none has one)."""
    rows = con.sql(_RANK_SQL).fetchall()
    if not rows:
        raise ResultsError(
            "no capacity search in these results",
            where="--objective capacity",
            fix="add `load.capacity` (kind, slo, lo, hi) to the sweep spec and run it (docs/config.md)",
        )
    noise = spec_launch_noise(con)
    widen = NormalDist().inv_cdf(1 - (1 - DEFAULT_CONFIDENCE) / 2) * noise
    choices = []
    for i, (
        label,
        kind,
        slo,
        capacity,
        bound,
        lowest_fail,
        launches,
        probes,
        command,
        low,
        high,
    ) in enumerate(rows):
        choices.append(
            CapacityChoice(
                i + 1, label, kind, slo, capacity, bound, lowest_fail, launches, probes, command,
                low=low * (1 - widen), high=_up(high, widen), tie=False, launch_noise=noise,
            )
        )  # fmt: skip
    best = choices[0]
    tied = {c.config_label for c in choices[1:] if best.capacity is not None and _overlap(c, best)}
    return [dataclasses.replace(c, tie=c.config_label in tied or (c is best and bool(tied))) for c in choices]


def _up(high: float | None, widen: float) -> float | None:
    return None if high is None else high * (1 + widen)


def _overlap(a: CapacityChoice, b: CapacityChoice) -> bool:
    """Whether two brackets [low, high) share a load (an unknown high is unbounded)."""
    return (a.high is None or b.low < a.high) and (b.high is None or a.low < b.high)


def bracket_text(choice: CapacityChoice) -> str:
    """The bracket as ``[19.2, 25]`` (``?`` where no launch found a failing load)."""
    high = "?" if choice.high is None else f"{choice.high:.3g}"
    return f"[{choice.low:.3g}, {high}]"


def tie_text(choices: list[CapacityChoice]) -> str | None:
    """The configs tied with the best as one line; None when the best stands alone."""
    tied = [c.config_label for c in choices if c.tie]
    if not tied:
        return None
    return (
        f"tie: {', '.join(tied)} - brackets overlap the best's, not separable at {DEFAULT_CONFIDENCE:.0%} "
        f"(launch noise {choices[0].launch_noise:.1%} assumed: the spec's launch_noise)"
    )


def capacity_text(choice: CapacityChoice) -> str:
    """The capacity as a phrase: ``12.5 req/s``, ``at least 64 in flight``, ``below 4 req/s``."""
    unit = "req/s" if choice.kind == "rate" else "in flight"
    if choice.capacity is None:
        return f"below {choice.lowest_fail:.4g} {unit}" if choice.lowest_fail is not None else "-"
    prefix = "at least " if choice.bound == "at_least" else ""
    return f"{prefix}{choice.capacity:.4g} {unit}"
