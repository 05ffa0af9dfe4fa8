"""Two or more sweeps side by side: did drafter v2 beat v1, where, and by how much?

The first sweep is the reference A; every other sweep B is compared with it, per load level (or per
level and request category) and per config (configs are matched by ``config_label``, levels by name).
For each metric the ratio is B / A of the values ``best`` ranks by (the median over repeats), and its
interval comes from ``best``'s own bootstrap (``analysis.select.measure_configs``): each sweep's
replicates resample the requests within each launch and carry that sweep's launch noise (estimated from
its repeats, else the spec's ``launch_noise``; each sweep's note says which), so launch-to-launch noise
widens the interval; A and B are independent runs, so their replicates are drawn apart (a seed per
sweep) and divided pairwise. An interval that holds 1 is a tie: not distinguishable at the confidence.
``verdict`` reads the ratio the metric's way (higher throughput, lower latency is better for B).

What changed between A and B is listed beside the numbers: software versions, the input digests of the
sweep row (prompts, drafter, target, engine), the spec's fields, and the launch flags of configs both
ran (``flags_of``: the harness passes SGLang's knowledge of which flags say where, not what, a server ran).

``Comparison`` is the data model: ``as_json`` (the ``--format json`` shape, ``COMPARE_JSON_VERSION``),
``csv_rows``, ``format_text`` (the terminal) and ``render_html`` (a section the report can embed).
"""

from __future__ import annotations

import html
import io
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.select import (
    DEFAULT_CONFIDENCE,
    DEFAULT_REPLICATES,
    Measured,
    check_bootstrap,
    measure_configs,
)
from analysis.store import ResultStore
from analysis.views import readable_results

if TYPE_CHECKING:
    import duckdb

COMPARE_JSON_VERSION = 1
DEFAULT_METRICS = ("output_tok_s_per_gpu", "tpot_p50_ms", "ttft_p99_ms")
NO_CATEGORY = "(none)"  # as the category_results view names requests without a category
DIGEST_CHARS = 12  # digests are shown cut to this many characters; JSON keeps them whole
CSV_COLUMNS = (
    "reference",
    "sweep",
    "load_level",
    "category",
    "config_label",
    "metric",
    "better",
    "a",
    "b",
    "a_repeats",
    "b_repeats",
    "ratio",
    "ratio_low",
    "ratio_high",
    "verdict",
)

FlagsOf = Callable[[Sequence[str]], dict[str, str]]


@dataclass(frozen=True)
class SweepInfo:
    """One compared sweep: where it is and what it ran."""

    location: str
    sweep_id: str
    sglang_version: str | None
    specsweep_version: str | None
    ray_version: str | None
    input_digests: dict[str, str]
    notes: tuple[str, ...]


@dataclass(frozen=True)
class Change:
    """One thing that differs between the reference A and a sweep B (null: absent on that side)."""

    what: str  # e.g. "sglang version", "input drafter", "spec drafter.path", "flag --chunked-prefill-size"
    a: str | None
    b: str | None
    configs: tuple[str, ...] = ()  # for a flag: the configs whose launches differ so


@dataclass(frozen=True)
class RatioRow:
    """One config at one level (and category) under one metric: A, B, and B / A with its interval."""

    load_level: str
    category: str | None  # null when compared per level
    config_label: str
    metric: str
    better: str  # "higher" or "lower": which way of the metric is better
    a: float | None  # median over A's repeats
    b: float | None
    a_repeats: int
    b_repeats: int
    ratio: float | None  # b / a; null when either is missing or a is 0
    ratio_low: float | None
    ratio_high: float | None
    verdict: str  # for B against A: "better", "worse", "tie" (the interval holds 1) or "unknown"


@dataclass(frozen=True)
class PairComparison:
    """A sweep B against the reference A."""

    reference: str  # A's location
    sweep: str  # B's location
    changes: tuple[Change, ...]
    rows: tuple[RatioRow, ...]
    only_in_reference: tuple[str, ...]  # "config @ level" measured by A alone
    only_in_sweep: tuple[str, ...]


@dataclass(frozen=True)
class Comparison:
    """Every sweep against the first, under the same metrics, confidence and bootstrap."""

    by: str  # "level" or "category"
    metrics: tuple[str, ...]
    confidence: float
    replicates: int
    seed: int
    sweeps: tuple[SweepInfo, ...]
    pairs: tuple[PairComparison, ...]

    def as_json(self) -> dict[str, Any]:
        """The ``compare --format json`` object (docs/results.md); non-finite numbers become null."""
        return {"version": COMPARE_JSON_VERSION, **_finite(asdict(self))}

    def csv_rows(self) -> list[tuple[object, ...]]:
        """One row per pair x level x category x config x metric, in ``CSV_COLUMNS`` order."""
        return [
            (pair.reference, pair.sweep, *(getattr(row, c) for c in CSV_COLUMNS[2:]))
            for pair in self.pairs
            for row in pair.rows
        ]


@dataclass(frozen=True)
class _Loaded:
    info: SweepInfo
    spec: dict[str, Any]
    argv: dict[str, tuple[str, ...]]  # config label -> the launch of its first job
    # (metric, level, category) -> config label -> measured
    measured: dict[tuple[str, str, str | None], dict[str, Measured]]
    better: dict[str, str]


def compare_sweeps(
    sweeps: Sequence[tuple[ResultStore, duckdb.DuckDBPyConnection]],
    *,
    metrics: Sequence[str] = DEFAULT_METRICS,
    by: str = "level",
    replicates: int = DEFAULT_REPLICATES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    allow_partial: bool = False,
    flags_of: FlagsOf | None = None,
) -> Comparison:
    """Every sweep after the first against the first (see the module docstring). ``sweeps``: each
    sweep's store and a connection to its results (``analysis.views.connect``)."""
    check_bootstrap(confidence, replicates)
    loaded = []
    for i, (store, con) in enumerate(sweeps):
        with readable_results(store):
            loaded.append(_load(store, con, metrics, by, replicates, _seed(seed, i), allow_partial))
    reference = loaded[0]
    pairs = tuple(_pair(reference, other, confidence, flags_of) for other in loaded[1:])
    return Comparison(
        by=by,
        metrics=tuple(metrics),
        confidence=confidence,
        replicates=replicates,
        seed=seed,
        sweeps=tuple(s.info for s in loaded),
        pairs=pairs,
    )


def _seed(seed: int, index: int) -> int:
    """A seed per sweep: the same seed for A and B would correlate their resamples and narrow the ratio's
    interval below the truth."""
    return int(np.random.SeedSequence([seed, index]).generate_state(1)[0])


def _load(
    store: ResultStore,
    con: duckdb.DuckDBPyConnection,
    metrics: Sequence[str],
    by: str,
    replicates: int,
    seed: int,
    allow_partial: bool,
) -> _Loaded:
    categories: list[str | None] = [None]
    if by == "category":
        categories = [
            row[0]
            for row in con.sql(
                f"SELECT DISTINCT coalesce(category, '{NO_CATEGORY}') FROM requests "
                "WHERE in_window AND NOT warmup ORDER BY 1"
            ).fetchall()
        ]
    measured: dict[tuple[str, str, str | None], dict[str, Measured]] = {}
    better: dict[str, str] = {}
    notes: tuple[str, ...] = ()
    noise: dict[str, str] = {}  # metric -> its launch noise, as the note says it
    sweep_id = ""
    for name in metrics:
        for category in categories:
            result = measure_configs(
                con,
                store,
                name,
                replicates=replicates,
                seed=seed,
                allow_partial=allow_partial,
                category=category,
            )
            sweep_id, notes = result.sweep_id, result.notes
            noise[result.metric.name] = result.launch_noise.text
            better[result.metric.name] = result.metric.better or "higher"
            for level, configs in result.levels.items():
                measured[(result.metric.name, level, category)] = configs
    row = con.sql(
        "SELECT sglang_version, specsweep_version, ray_version, input_digests, spec_text FROM sweep"
    ).fetchall()
    sglang, specsweep, ray, digests, spec_text = row[0] if row else (None, None, None, None, None)
    argv = {
        label: tuple(job_argv)
        for label, job_argv in con.sql(
            "SELECT config_label, any_value(sglang_argv ORDER BY repeat_index) FROM jobs "
            "WHERE status = 'done' AND role = 'sweep' AND sglang_argv IS NOT NULL GROUP BY 1"
        ).fetchall()
    }
    info = SweepInfo(
        location=store.location,
        sweep_id=sweep_id,
        sglang_version=sglang,
        specsweep_version=specsweep,
        ray_version=ray,
        input_digests=_digests(digests),
        notes=(*notes, *(f"{metric}: {text}" for metric, text in noise.items())),
    )
    return _Loaded(info, _spec(spec_text), argv, measured, better)


def _digests(text: str | None) -> dict[str, str]:
    value = json.loads(text) if text else {}
    return {str(k): str(v) for k, v in sorted(value.items())} if isinstance(value, dict) else {}


def _spec(text: str | None) -> dict[str, Any]:
    import yaml

    value = yaml.safe_load(text) if text else None
    return value if isinstance(value, dict) else {}


def _pair(a: _Loaded, b: _Loaded, confidence: float, flags_of: FlagsOf | None) -> PairComparison:
    rows: list[RatioRow] = []
    only_a: set[str] = set()
    only_b: set[str] = set()
    for key in [*a.measured, *(k for k in b.measured if k not in a.measured)]:
        metric, level, category = key
        side_a, side_b = a.measured.get(key, {}), b.measured.get(key, {})
        only_a |= {f"{label} @ {level}" for label in side_a.keys() - side_b.keys()}
        only_b |= {f"{label} @ {level}" for label in side_b.keys() - side_a.keys()}
        for label in sorted(side_a.keys() & side_b.keys()):
            rows.append(
                _ratio_row(
                    level, category, label, metric, a.better[metric], side_a[label], side_b[label], confidence
                )
            )
    levels = list(dict.fromkeys(level for _, level, _ in [*a.measured, *b.measured]))
    metrics = list(a.better)
    rows.sort(
        key=lambda r: (levels.index(r.load_level), r.category or "", r.config_label, metrics.index(r.metric))
    )
    return PairComparison(
        reference=a.info.location,
        sweep=b.info.location,
        changes=_changes(a, b, flags_of),
        rows=tuple(rows),
        only_in_reference=tuple(sorted(only_a)),
        only_in_sweep=tuple(sorted(only_b)),
    )


def _ratio_row(
    level: str,
    category: str | None,
    label: str,
    metric: str,
    better: str,
    a: Measured,
    b: Measured,
    confidence: float,
) -> RatioRow:
    ratio = b.value / a.value if a.value and b.value is not None else None
    low = high = None
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = b.replicates / a.replicates
    finite = ratios[np.isfinite(ratios)]
    if ratio is not None and finite.size:
        tail = (1 - confidence) / 2 * 100
        low, high = (float(x) for x in np.percentile(finite, [tail, 100 - tail]))
    return RatioRow(
        load_level=level,
        category=category,
        config_label=label,
        metric=metric,
        better=better,
        a=a.value,
        b=b.value,
        a_repeats=len(a.job_ids),
        b_repeats=len(b.job_ids),
        ratio=ratio,
        ratio_low=low,
        ratio_high=high,
        verdict=_verdict(low, high, better),
    )


def _verdict(low: float | None, high: float | None, better: str) -> str:
    if low is None or high is None:
        return "unknown"
    if low <= 1 <= high:
        return "tie"
    return "better" if (low > 1) == (better == "higher") else "worse"


def _changes(a: _Loaded, b: _Loaded, flags_of: FlagsOf | None) -> tuple[Change, ...]:
    changes = [
        Change(f"{name} version", x, y)
        for name, x, y in (
            ("sglang", a.info.sglang_version, b.info.sglang_version),
            ("specsweep", a.info.specsweep_version, b.info.specsweep_version),
            ("ray", a.info.ray_version, b.info.ray_version),
        )
        if x != y
    ]
    da, db = a.info.input_digests, b.info.input_digests
    changes += [
        Change(f"input {kind}", da.get(kind), db.get(kind))
        for kind in sorted(da.keys() | db.keys())
        if da.get(kind) != db.get(kind)
    ]
    sa, sb = _flatten(a.spec), _flatten(b.spec)
    changes += [
        Change(f"spec {key}", sa.get(key), sb.get(key))
        for key in sorted(sa.keys() | sb.keys())
        if sa.get(key) != sb.get(key)
    ]
    if flags_of is not None:
        changes += _flag_changes(a.argv, b.argv, flags_of)
    return tuple(changes)


def _flatten(value: Any, prefix: str = "") -> dict[str, str]:
    """A spec as dotted keys to values (lists and scalars as compact JSON)."""
    if isinstance(value, dict) and value:
        out: dict[str, str] = {}
        for key, item in value.items():
            out.update(_flatten(item, f"{prefix}.{key}" if prefix else str(key)))
        return out
    return {prefix: value if isinstance(value, str) else json.dumps(value, default=str)}


def _flag_changes(
    a: dict[str, tuple[str, ...]], b: dict[str, tuple[str, ...]], flags_of: FlagsOf
) -> list[Change]:
    """Launch flags that differ between the configs both sweeps ran, one change per (flag, A, B) with
    the configs it concerns."""
    found: dict[tuple[str, str | None, str | None], list[str]] = {}
    for label in sorted(a.keys() & b.keys()):
        fa, fb = flags_of(a[label]), flags_of(b[label])
        for flag in sorted(fa.keys() | fb.keys()):
            if fa.get(flag) != fb.get(flag):
                found.setdefault((flag, fa.get(flag), fb.get(flag)), []).append(label)
    return [Change(f"flag {flag}", x, y, tuple(labels)) for (flag, x, y), labels in found.items()]


def _finite(value: Any) -> Any:
    """``value`` with every non-finite float as None (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(v) for v in value]
    return value


# --- rendering --------------------------------------------------------------------------------------


def number(value: float | None) -> str:
    """A measured value with two decimals ("-" when unknown)."""
    return "-" if value is None else f"{value:,.2f}"


def ratio_text(row: RatioRow) -> tuple[str, str]:
    """The ratio and its interval as shown: "0.503x" and "[0.489, 0.517]"."""
    if row.ratio is None:
        return "-", "-"
    interval = "-" if row.ratio_low is None else f"[{row.ratio_low:.3f}, {row.ratio_high:.3f}]"
    return f"{row.ratio:.3f}x", interval


def change_text(change: Change) -> str:
    """One change as a line: what, A's value, B's value (digests cut), and the configs of a flag."""

    def side(value: str | None) -> str:
        if value is None:
            return "(absent)"
        return value[:DIGEST_CHARS] if change.what.startswith("input ") else value

    configs = f"  ({', '.join(change.configs)})" if change.configs else ""
    return f"{change.what}: {side(change.a)} -> {side(change.b)}{configs}"


def _verdict_text(row: RatioRow) -> str:
    return {"better": "B better", "worse": "B worse"}.get(row.verdict, row.verdict)


def _columns(comparison: Comparison) -> list[str]:
    """The comparison table's header, the terminal's and the HTML's."""
    by = ["level"] + (["category"] if comparison.by == "category" else [])
    return [*by, "config", "metric", "A", "B", "B / A", f"{comparison.confidence:.0%} CI", "verdict"]


def _cells(row: RatioRow, by: str) -> list[str]:
    """One ratio row as the table's cells, in ``_columns`` order."""
    ratio, interval = ratio_text(row)
    where = [row.load_level] + ([row.category or ""] if by == "category" else [])
    return [
        *where,
        row.config_label,
        row.metric,
        number(row.a),
        number(row.b),
        ratio,
        interval,
        _verdict_text(row),
    ]


def format_text(comparison: Comparison) -> str:
    """The terminal view: per pair, what changed, then one table of ratios (rich, no colours)."""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    buffer = io.StringIO()
    console = Console(width=200, color_system=None, file=buffer)
    confidence = f"{comparison.confidence:.0%}"
    console.print(
        f"B / A per {comparison.by} and config, medians over repeats; {confidence} intervals from "
        f"{comparison.replicates} bootstrap resamples of launches, then requests; tie: the interval holds 1",
        highlight=False,
    )
    for info in comparison.sweeps:
        console.print(
            f"sweep {info.sweep_id} at {info.location}" + "".join(f"\n  note: {note}" for note in info.notes),
            highlight=False,
        )
    for pair in comparison.pairs:
        console.print(f"\n== A = {pair.reference}\n   B = {pair.sweep}", highlight=False)
        console.print("what changed:" if pair.changes else "what changed: nothing recorded", highlight=False)
        for change in pair.changes:
            console.print(f"  {change_text(change)}", highlight=False, markup=False)
        table = Table(box=box.SIMPLE, show_edge=False, pad_edge=False)
        for column in _columns(comparison):
            table.add_column(
                column,
                no_wrap=True,
                justify="left" if column in ("level", "category", "config", "metric", "verdict") else "right",
            )
        for row in pair.rows:
            table.add_row(*_cells(row, comparison.by))
        console.print(table)
        if pair.only_in_reference:
            console.print(f"only in A: {', '.join(pair.only_in_reference)}", highlight=False, markup=False)
        if pair.only_in_sweep:
            console.print(f"only in B: {', '.join(pair.only_in_sweep)}", highlight=False, markup=False)
    return "\n".join(line.rstrip() for line in buffer.getvalue().splitlines())


def render_html(comparison: Comparison) -> str:
    """The comparison as one ``<section id="comparison">`` of plain HTML (no script, no fetch), for the
    report to embed or ``compare --html`` to wrap in a page."""
    esc = html.escape
    confidence = f"{comparison.confidence:.0%}"
    parts = [
        "<section id='comparison'><h2>Comparison with other sweeps</h2>",
        f"<p class='meta'>B / A per {esc(comparison.by)} and config: medians over repeats, {confidence} "
        f"intervals from {comparison.replicates} bootstrap resamples of launches, then requests; a tie's "
        "interval holds 1.</p>",
    ]
    for pair in comparison.pairs:
        parts.append(f"<h3>A = {esc(pair.reference)}<br>B = {esc(pair.sweep)}</h3>")
        if pair.changes:
            items = "".join(f"<li>{esc(change_text(c))}</li>" for c in pair.changes)
            parts.append(f"<p>What changed:</p><ul class='changes'>{items}</ul>")
        else:
            parts.append("<p>What changed: nothing recorded.</p>")
        head = _columns(comparison)
        rows = []
        for row in pair.rows:
            cells = _cells(row, comparison.by)
            rows.append(
                f"<tr class='{esc(row.verdict)}'>" + "".join(f"<td>{esc(c)}</td>" for c in cells) + "</tr>"
            )
        parts.append(
            "<table class='comparison'><tr>"
            + "".join(f"<th>{esc(h)}</th>" for h in head)
            + "</tr>"
            + "".join(rows)
            + "</table>"
        )
        for name, only in (("A", pair.only_in_reference), ("B", pair.only_in_sweep)):
            if only:
                parts.append(f"<p class='note'>only in {name}: {esc(', '.join(only))}</p>")
    parts.append("</section>")
    return "\n".join(parts)


COMPARISON_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
table { border-collapse: collapse; font-size: 0.9rem; } .meta { color: #666; } .note { color: #a60; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
td:nth-child(-n+3), th:nth-child(-n+3) { text-align: left; }
tr.better td { background: #eef8ee; } tr.worse td { background: #fbeeee; } tr.tie td { color: #555; }
"""


def comparison_page(comparison: Comparison) -> str:
    """A self-contained page holding only the comparison (``compare --html FILE``)."""
    csp = "default-src 'none'; style-src 'unsafe-inline'"
    title = "specsweep compare: " + " vs ".join(html.escape(s.sweep_id) for s in comparison.sweeps)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{csp}\">"
        f"<title>{title}</title><style>{COMPARISON_STYLE}</style></head><body>\n"
        f"<h1>{title}</h1>\n{render_html(comparison)}\n</body></html>\n"
    )
