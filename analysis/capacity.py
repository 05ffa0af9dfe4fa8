"""Configs ranked by capacity under SLO: the highest load each one carried with its SLOs met.

The numbers come from the ``capacity_results`` view (one row per job with a capacity search). A config
with repeats is credited with its smallest capacity over its launches: a team deploys one launch and
the SLO must hold on whichever it gets.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

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


_RANK_SQL = """
WITH ordered AS (
    SELECT *, row_number() OVER (
        PARTITION BY config_label ORDER BY capacity ASC NULLS FIRST, repeat_index) AS worst
    FROM capacity_results
)
SELECT config_label, capacity_kind, capacity_slo, capacity, bound, lowest_fail,
       (SELECT count(*) FROM capacity_results r WHERE r.config_label = o.config_label) AS launches,
       (SELECT max(probes) FROM capacity_results r WHERE r.config_label = o.config_label) AS probes,
       launch_command
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
    return [CapacityChoice(i + 1, *row) for i, row in enumerate(rows)]


def capacity_text(choice: CapacityChoice) -> str:
    """The capacity as a phrase: ``12.5 req/s``, ``at least 64 in flight``, ``below 4 req/s``."""
    unit = "req/s" if choice.kind == "rate" else "in flight"
    if choice.capacity is None:
        return f"below {choice.lowest_fail:.4g} {unit}" if choice.lowest_fail is not None else "-"
    prefix = "at least " if choice.bound == "at_least" else ""
    return f"{prefix}{choice.capacity:.4g} {unit}"
