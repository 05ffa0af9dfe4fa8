"""The lossless check's verdicts, read from the ``lossless_*`` views: the measured noise floor per server-axis
setting and, per speculative config, whether it is lossy and why (docs/results.md, the lossless check).

A config is lossy when any of its launches is: lossy by design (an accept threshold below 1.0, known before
it ran) or checked with a divergence rate above its setting's floor. ``best`` and ``report`` rank lossy
configs as usual with a visible mark; ``--emit`` refuses to deploy one unless ``--allow-lossy``.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from analysis.select import share_text
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb

LOSSY_MARK = "LOSSY"  # the mark `best` and `report` put on a flagged config


@dataclass(frozen=True, slots=True)
class Floor:
    """The baseline against itself at two batch sizes, at one server-axis setting."""

    axes: str | None  # the jobs.axes JSON of the setting; None without axes
    prompts: int
    diverged: int
    rate: float


@dataclass(frozen=True, slots=True)
class ConfigVerdict:
    """One speculative config (over its launches) against the baseline."""

    config_label: str
    compared: int  # mode x prompt pairs compared with the baseline, over the config's launches
    diverged: int
    divergence_rate: float | None  # None: not checked
    floor_rate: float | None
    first_diverging_positions: tuple[int, ...]  # of the diverged pairs, by launch, mode, prompt
    lossy_by_design: str | None
    lossy: bool

    @property
    def reason(self) -> str:
        """Why the config is (or is not) flagged, in one clause."""
        parts = [self.lossy_by_design] if self.lossy_by_design else []
        if self.divergence_rate is not None:
            floor = share_text(self.floor_rate) if self.floor_rate is not None else "-"
            measured = (
                f"greedy outputs differ from the baseline's in {self.diverged} of {self.compared} prompt runs "
                f"({share_text(self.divergence_rate)}, floor {floor})"
            )
            if self.first_diverging_positions:
                counts = Counter(self.first_diverging_positions)
                shown = ", ".join(f"{position} ({n}x)" for position, n in sorted(counts.items())[:8])
                more = ", ..." if len(counts) > 8 else ""
                measured += f", first diverging at token {shown}{more}"
            parts.append(measured)
        return "; ".join(parts) or "not checked"


@dataclass(frozen=True, slots=True)
class LosslessSummary:
    """The check's floors and each speculative config's verdict."""

    floors: tuple[Floor, ...]
    configs: tuple[ConfigVerdict, ...]

    def flagged(self) -> dict[str, str]:
        """Lossy config label -> why."""
        return {c.config_label: c.reason for c in self.configs if c.lossy}


def lossless_summary(con: duckdb.DuckDBPyConnection) -> LosslessSummary | None:
    """The check's summary; None when the sweep neither ran the check nor has a config lossy by design."""
    floors = tuple(
        Floor(axes, prompts, diverged, rate)
        for axes, prompts, diverged, rate in con.sql(
            "SELECT axes, prompts, diverged, floor_rate FROM lossless_floor ORDER BY axes"
        ).fetchall()
    )
    rows = con.sql(
        """
        SELECT config_label, sum(compared)::BIGINT, sum(diverged)::BIGINT,
               sum(diverged) / nullif(sum(compared), 0), max(floor_rate),
               flatten(list(first_diverging_positions ORDER BY repeat_index, job_id)),
               any_value(lossy_by_design), bool_or(lossy)
        FROM lossless_results GROUP BY config_label ORDER BY config_label
        """
    ).fetchall()
    configs = tuple(
        ConfigVerdict(label, compared, diverged, rate, floor, tuple(positions), by_design, lossy)
        for label, compared, diverged, rate, floor, positions, by_design, lossy in rows
    )
    if not floors and not any(c.lossy_by_design for c in configs):
        return None
    return LosslessSummary(floors, configs)


def format_lossless(summary: LosslessSummary) -> list[str]:
    """The check as text lines for ``best``: the floors, then every speculative config's verdict."""
    lines = ["", "== lossless check (temperature-0 outputs against the baseline's)"]
    for floor in summary.floors:
        setting = f" at {_axes_text(floor.axes)}" if floor.axes else ""
        lines.append(
            f"   noise floor{setting}: the baseline one prompt at a time vs all at once differs in "
            f"{floor.diverged} of {floor.prompts} prompts ({share_text(floor.rate)})"
        )
    for config in summary.configs:
        verdict = LOSSY_MARK if config.lossy else "lossless"
        lines.append(f"   {verdict:<8} {config.config_label}: {config.reason}")
    return lines


def _axes_text(axes: str) -> str:
    values = json.loads(axes)
    return ", ".join(f"{name}={value}" for name, value in values.items())


def refuse_lossy(labels: list[str], flagged: dict[str, str], *, allow_lossy: bool) -> None:
    """``--emit`` deploys none of ``labels`` that the check flagged, unless told to."""
    lossy = [label for label in labels if label in flagged]
    if lossy and not allow_lossy:
        label = lossy[0]
        raise LossyConfigError(
            f"the config to deploy, {label!r}, is flagged lossy: {flagged[label]}",
            where="--emit",
            fix="deploy another config (`best` marks the lossy ones), or pass --allow-lossy to emit it anyway",
        )


class LossyConfigError(ResultsError):
    """``--emit`` was asked to deploy a config the lossless check flagged."""
