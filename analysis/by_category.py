"""``best --by category``: per load level and request category, the config whose requests of that category
decode fastest.

A level mixes categories in one batch, so its throughput cannot be split by category; what each request
carries is its own decode speed. Per (level, category) the configs are ranked by the mean TPOT of their
successful requests of that category sent inside the level's window (``category_results``, repeats pooled),
with the speedup over the baseline's mean TPOT for the same requests' category and the accept length, so
a team sees where its drafter is strong and where another config serves a category better.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import duckdb


@dataclass(frozen=True, slots=True)
class CategoryRank:
    """One config's requests of one category at one level."""

    config_label: str
    tpot_ms: float
    speedup: float | None  # baseline mean TPOT / this config's, same level and category; null without one
    accept_length_mean: float | None  # token weighted; null for the baseline
    num_ok: int


@dataclass(frozen=True, slots=True)
class CategoryChoice:
    """The configs ranked for one (level, category), fastest decode first."""

    load_level: str
    category: str
    ranked: tuple[CategoryRank, ...]

    @property
    def winner(self) -> CategoryRank:
        return self.ranked[0]


def best_by_category(con: duckdb.DuckDBPyConnection, at: str | None = None) -> tuple[CategoryChoice, ...]:
    """Per level (by concurrency, then rate) and category (by name): configs by mean TPOT, lowest first.
    ``at`` keeps one level. Levels whose requests have no category show as category ``(none)``."""
    rows = con.sql(
        """
        WITH lv AS (SELECT load_level, min(concurrency) AS c, min(rate_rps) AS r FROM levels GROUP BY ALL)
        SELECT cr.load_level, cr.category, cr.config_label, cr.tpot_ms, cr.speedup,
               cr.accept_length_mean, cr.num_ok
        FROM category_results cr JOIN lv USING (load_level)
        WHERE cr.tpot_ms IS NOT NULL AND ($at IS NULL OR cr.load_level = $at)
        ORDER BY lv.c NULLS LAST, lv.r NULLS LAST, cr.load_level, cr.category, cr.tpot_ms, cr.config_label
        """,
        params={"at": at},
    ).fetchall()
    groups: dict[tuple[str, str], list[CategoryRank]] = {}
    for level, category, label, tpot_ms, speedup, accept, num_ok in rows:
        groups.setdefault((level, category), []).append(
            CategoryRank(label, float(tpot_ms), speedup, accept, int(num_ok))
        )
    return tuple(CategoryChoice(level, category, tuple(ranks)) for (level, category), ranks in groups.items())


def format_by_category(choices: tuple[CategoryChoice, ...]) -> str:
    """One line per level x category: its winner, the winner's speedup and accept length, the runner-up."""
    if not choices:
        return "no successful requests with a TPOT: nothing to rank per category"
    lines = [
        "per category: the config whose requests of that category decode fastest (mean TPOT of the "
        "window's successful requests; speedup over the baseline's for the same category)",
        f"{'level':<18} {'category':<14} {'winner':<22} {'TPOT ms':>8} {'speedup':>8} {'accept':>7} "
        f"{'n':>6}  runner-up",
    ]
    for choice in choices:
        w = choice.winner
        speedup = f"{w.speedup:.3f}x" if w.speedup is not None else "-"
        accept = f"{w.accept_length_mean:.2f}" if w.accept_length_mean is not None else "-"
        second = choice.ranked[1] if len(choice.ranked) > 1 else None
        runner = f"{second.config_label} ({second.tpot_ms:.2f} ms)" if second else "-"
        lines.append(
            f"{choice.load_level:<18} {choice.category:<14} {w.config_label:<22} {w.tpot_ms:>8.2f} "
            f"{speedup:>8} {accept:>7} {w.num_ok:>6}  {runner}"
        )
    return "\n".join(lines)
