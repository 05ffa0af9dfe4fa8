"""The HTML report: one self-contained file with the winners, their deploy launches, tables, and plots.

Rendering only: the numbers come from ``analysis.select`` (the ranking) and the DuckDB views, the deploy
launches from the caller (the harness builds them from the spec; this layer knows no SGLang flags). Plots
are interactive plotly.js figures (hover, zoom, a legend that toggles a config); the plotly.js bundle
that the ``plotly`` package ships is inlined once, and a Content-Security-Policy forbids every fetch, so
the file opens the same offline, from an e-mail, or years later.
"""

from __future__ import annotations

import html
import json
import os
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from analysis.glossary import GLOSSARY
from analysis.schema import GPU_POWER_W, GPU_SM_CLOCK_MHZ
from analysis.select import Interval, Selection, order_levels, share_text
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb

    from analysis.capacity import CapacityChoice
    from analysis.confirmation import Confirmation

# Every plot the report draws: element id -> caption. Tests check each is present.
PLOTS: dict[str, str] = {
    "plot-throughput": "Output tokens/s per GPU vs concurrency (dashed: no-speculation baseline)",
    "plot-tpot": "Median TPOT vs concurrency (dashed: baseline)",
    "plot-accept-length": "Accept length distribution per config (all levels)",
    "plot-acceptance-position": "Per-position acceptance from the correct-drafts histogram",
    "plot-latency-cdf": "TTFT and TPOT CDFs per config",
    "plot-pareto": "Pareto front: per-user tokens/s vs tokens/s per GPU (each point a config x level)",
    "plot-server-timeline": "Server metrics over each level's measured window: the winner and the baseline "
    "(dashed), first repeat",
    "plot-gpu-timeline": "GPU power and SM clock over each level (mean over the slot's GPUs): the winner and "
    "the baseline (dashed), first repeat",
}
# Shown only for sweeps with a capacity search (load.capacity).
CAPACITY_PLOT = (
    "plot-capacity",
    "Capacity under SLO per config: every probe (filled: SLOs held, hollow: "
    "missed) and the capacity found (bar)",
)
TIMELINE_LEVELS = 6  # columns of the timeline plots at most: the highest loads run
CDF_POINTS = 101
# Inline scripts and styles only (plotly.js and each figure's data); nothing may be fetched.
_CSP = "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; img-src data:"
_STYLE = """
body { font-family: system-ui, sans-serif; margin: 2rem auto; max-width: 1100px; color: #222; }
h1 { margin-bottom: 0.2rem; } .meta { color: #666; }
table { border-collapse: collapse; margin: 0.5rem 0 1.5rem; font-size: 0.9rem; }
th, td { border-bottom: 1px solid #ddd; padding: 0.25rem 0.6rem; text-align: right; }
th:first-child, td:first-child, td.label, th.label { text-align: left; }
.winner { background: #eef8ee; border: 1px solid #9c9; padding: 0.8rem 1rem; margin: 0.8rem 0; }
pre { white-space: pre-wrap; word-break: break-all; background: #f6f6f6; padding: 0.6rem; }
.note { color: #a60; } figure { margin: 1.5rem 0; } figcaption { font-weight: 600; }
tr.tie td { color: #555; } tr.excluded td { color: #999; }
.measured, .drafter { color: #555; font-size: 0.9rem; margin: 0.2rem 0; }
dl.glossary dt { font-weight: 600; } dl.glossary dd { margin: 0 0 0.4rem 1.2rem; }
"""
# Every term the report (and `specsweep best`) prints without saying what it means.


class LaunchText(Protocol):
    """A config's launch to deploy as the harness built it (``harness.deploy_launch.DeployLaunch``)."""

    @property
    def command(self) -> str: ...
    @property
    def differed(self) -> str | None: ...
    @property
    def drafter_note(self) -> str | None: ...


def render_report(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    server_series: tuple[tuple[str, str], ...] = (),
    confirmation: Confirmation | None = None,
    *,
    launches: Mapping[str, LaunchText],
    extra_sections: Sequence[str] = (),
) -> str:
    """The report page for ``selection`` over the results behind ``con``. ``server_series`` are the
    ``server_metrics`` samples to plot over time as (metric name, axis label), and ``launches`` each
    config's launch to deploy: the server's names and flags are the caller's knowledge (the harness
    passes SGLang's), not this layer's. ``extra_sections`` (HTML) follow the deployment section: the
    place for a comparison with other sweeps."""
    styles = _config_styles(con)
    featured = _featured_jobs(con, selection)
    gpu_series = ((GPU_POWER_W, "GPU power (W)"), (GPU_SM_CLOCK_MHZ, "SM clock (MHz)"))
    sections = [
        _header(con, selection),
        _winners(selection, launches),
        _tables(selection),
        _categories(con),
        _deployment(con, selection, confirmation),
        _lossless(con, selection),
        *extra_sections,
        _capacity(con, styles),
        _figure("plot-throughput", _throughput_plot(con, styles)),
        _figure("plot-tpot", _tpot_plot(con, styles)),
        _figure("plot-accept-length", _accept_length_plot(con, styles)),
        _figure("plot-acceptance-position", _acceptance_position_plot(con, styles)),
        _figure("plot-latency-cdf", _latency_cdf_plot(con, styles, _cdf_level(selection))),
        _figure("plot-pareto", _pareto_plot(con, styles)),
        _figure(
            "plot-server-timeline",
            _timeline_plot(con, styles, featured, "plot-server-timeline", "server_metrics", server_series),
        ),
        _figure(
            "plot-gpu-timeline",
            _timeline_plot(con, styles, featured, "plot-gpu-timeline", "gpu_metrics", gpu_series),
        ),
        _glossary(),
    ]
    title = f"specsweep report: {html.escape(selection.sweep_id)}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\">"
        f"<title>{title}</title><style>{_STYLE}</style><script>{_plotly_js()}</script></head><body>\n"
        + "\n".join(section for section in sections if section)
        + "\n</body></html>\n"
    )


def write_report(page: str, path: Path) -> Path:
    """Write the page atomically (temporary name in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        tmp.write_text(page, encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# ---------------------------------------------------------------------------------------------------
# Text sections
# ---------------------------------------------------------------------------------------------------


def _header(con: duckdb.DuckDBPyConnection, selection: Selection) -> str:
    rows = con.sql(
        "SELECT specsweep_version, sglang_version, ray_version, host, client_delay_p50_us, "
        "client_delay_p99_us FROM sweep LIMIT 1"
    ).fetchall()
    meta = ""
    if rows:
        ver, sglang, ray, host, p50, p99 = rows[0]
        meta = (
            f"specsweep {ver}, SGLang {sglang}, Ray {ray}, host {host}; client-added delay "
            f"p50 {_fmt(p50)} µs, p99 {_fmt(p99)} µs"
        )
    slos = ", ".join(selection.slos) or "none"
    goodput = (
        f"; goodput: requests that succeeded with {' and '.join(selection.request_slos)}"
        if selection.request_slos
        else ""
    )
    notes = "".join(f"<p class='note'>note: {html.escape(n)}</p>" for n in selection.notes)
    return (
        f"<h1>specsweep report: {html.escape(selection.sweep_id)}</h1>"
        f"<p class='meta'>{html.escape(meta)}<br>generated {time.strftime('%Y-%m-%d %H:%M:%S')}; "
        f"ranked by {html.escape(selection.objective)} ({html.escape(selection.objective_unit)}, "
        f"{selection.better} is better); SLOs: {html.escape(slos)}{html.escape(goodput)}; error rate at most "
        f"{share_text(selection.max_error_rate)}; {selection.confidence:.0%} intervals from "
        f"{selection.replicates} bootstrap resamples of launches and requests</p>{notes}"
    )


def _winners(selection: Selection, launches: Mapping[str, LaunchText]) -> str:
    parts = [
        "<section id='winner'><h2>Winner per load level</h2><p class='meta'>Each launch is the one to "
        "deploy: the spec's model and drafter paths, no listen address; where the measured launch "
        "differed is said under it.</p>"
    ]
    for level in selection.levels:
        w = level.winner
        if w is None:
            parts.append(
                f"<div class='winner'><b>{html.escape(level.load_level)}</b>: no config meets every SLO</div>"
            )
            continue
        speedup = (
            f"{w.speedup:.3f}x vs baseline"
            + (f" ({selection.confidence:.0%} CI {_ci(w.speedup_ci)})" if w.speedup_ci else "")
            if w.speedup is not None
            else "no baseline measured"
        )
        ties = [r.config_label for r in level.ranked if r.tie]
        tie_text = f"; not distinguishable from {', '.join(ties)}" if ties else ""
        if w.goodput_rps is not None:
            tie_text = (
                f", goodput {_fmt(w.goodput_rps)} requests/s ({_fmt(w.goodput_share)} of requests)" + tie_text
            )
        parts.append(
            f"<div class='winner' data-level='{html.escape(level.load_level)}'>"
            f"<b>{html.escape(level.load_level)}</b>: "
            f"<span class='winner-label'>{html.escape(w.config_label)}</span>, "
            f"{html.escape(selection.objective)} = {_fmt(w.objective)}, {html.escape(speedup)}"
            f"{html.escape(tie_text)}{_launch_html(launches.get(w.config_label))}</div>"
        )
    parts.append("</section>")
    return "".join(parts)


def _lossless(con: duckdb.DuckDBPyConnection, selection: Selection) -> str:
    """The lossless check's floors and verdicts, lossy winners called out (empty when it did not run and
    no config is lossy by design)."""
    from analysis.lossless import LOSSY_MARK, format_lossless, lossless_summary

    summary = lossless_summary(con)
    if summary is None:
        return ""
    flagged = summary.flagged()
    warnings = "".join(
        f"<p class='lossy'>{LOSSY_MARK}: the winner at {html.escape(level.load_level)}, "
        f"{html.escape(level.winner.config_label)}, is flagged; <code>best --emit</code> refuses it without "
        "<code>--allow-lossy</code>.</p>"
        for level in selection.levels
        if level.winner is not None and level.winner.config_label in flagged
    )
    lines = "\n".join(line.strip() for line in format_lossless(summary)[2:])
    return (
        "<section id='lossless'><h2>Lossless check</h2><p class='meta'>Greedy (temperature-0) output token "
        "ids of a fixed prompt set against the baseline's; the noise floor is the baseline one prompt at a "
        f"time against all at once.</p>{warnings}<pre class='lossless'>{html.escape(lines)}</pre></section>"
    )


def _launch_html(launch: LaunchText | None) -> str:
    if launch is None:
        return "<pre class='launch'>(launch command unknown)</pre>"
    out = f"<pre class='launch'>{html.escape(launch.command)}</pre>"
    if launch.differed:
        out += f"<p class='measured'>measured launch differed: {html.escape(launch.differed)}</p>"
    if launch.drafter_note:
        out += f"<p class='drafter'>drafter: {html.escape(launch.drafter_note)}</p>"
    return out


def _glossary() -> str:
    terms = "".join(
        f"<dt>{html.escape(term)}</dt><dd>{html.escape(text)}</dd>" for term, text in GLOSSARY.items()
    )
    return f"<section id='glossary'><h2>Glossary</h2><dl class='glossary'>{terms}</dl></section>"


def _tables(selection: Selection) -> str:
    parts = ["<section id='configs'><h2>Configs per load level</h2>"]
    slo_names = [s.split("<")[0].split(">")[0] for s in selection.slos]
    goodput = bool(selection.request_slos)
    for level in selection.levels:
        head = "".join(f"<th>{html.escape(n)}</th>" for n in slo_names)
        if goodput:
            head += "<th>goodput_rps</th><th>goodput_share</th>"
        parts.append(
            f"<h3>{html.escape(level.load_level)}</h3><table><tr><th>#</th><th class='label'>config</th>"
            f"<th>{html.escape(selection.objective)}</th><th>MAD</th><th>repeats</th><th>errors</th>"
            f"<th>speedup</th><th>{selection.confidence:.0%} CI</th>{head}<th>note</th></tr>"
        )
        for r in level.ranked:
            note = "winner" if r.rank == 1 else ("tie" if r.tie else "")
            cells = "".join(f"<td>{_fmt(r.slo_values.get(n))}</td>" for n in slo_names)
            if goodput:
                cells += f"<td>{_fmt(r.goodput_rps)}</td><td>{_fmt(r.goodput_share)}</td>"
            speedup = f"{r.speedup:.3f}x" if r.speedup is not None else "-"
            parts.append(
                f"<tr class='{'tie' if r.tie else ''}'><td>{r.rank}</td>"
                f"<td class='label'>{html.escape(r.config_label)}</td><td>{_fmt(r.objective)}</td>"
                f"<td>{_fmt(r.objective_mad)}</td><td>{r.repeats}</td><td>{share_text(r.error_rate)}</td>"
                f"<td>{speedup}</td>"
                f"<td>{_ci(r.speedup_ci)}</td>{cells}<td>{note}{' baseline' if r.is_baseline else ''}</td></tr>"
            )
        for e in level.excluded:
            parts.append(
                f"<tr class='excluded'><td>-</td><td class='label'>{html.escape(e.config_label)}</td>"
                f"<td colspan='3'></td><td>{share_text(e.error_rate)}</td>"
                f"<td colspan='{2 + len(slo_names) + 2 * goodput}' class='label'>excluded: "
                f"{html.escape('; '.join(e.reasons))}</td><td></td></tr>"
            )
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _categories(con: duckdb.DuckDBPyConnection) -> str:
    """Accept length and speedup per request category, config and level: where the drafter is weak."""
    rows = con.sql(
        "SELECT load_level, config_label, category, accept_length_mean, speedup FROM category_results "
        "ORDER BY load_level, config_label, category"
    ).fetchall()
    if not rows:
        return ""  # no section to scroll past when no request carried a category
    categories = sorted({r[2] for r in rows})
    parts = [
        "<section id='categories'><h2>Accept length and speedup per category</h2>"
        "<p class='meta'>Token-weighted accept length / per-user decode speedup over the baseline "
        "(its mean TPOT over the config's) for the requests of each category.</p>"
    ]
    cells: dict[tuple[str, str], dict[str, str]] = {}
    for level, label, category, accept, speedup in rows:
        text = f"{_fmt(accept)} / {'-' if speedup is None else f'{speedup:.2f}x'}"
        cells.setdefault((level, label), {})[category] = text
    head = "".join(f"<th>{html.escape(c)}</th>" for c in categories)
    for level in order_levels(con, sorted({level for level, _ in cells})):  # by load, not as text
        parts.append(f"<h3>{html.escape(level)}</h3><table><tr><th class='label'>config</th>{head}</tr>")
        for (row_level, label), values in cells.items():
            if row_level == level:
                tds = "".join(f"<td>{values.get(c, '-')}</td>" for c in categories)
                parts.append(f"<tr><td class='label'>{html.escape(label)}</td>{tds}</tr>")
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _capacity(con: duckdb.DuckDBPyConnection, styles: dict[str, Style]) -> str:
    """The capacity search's answer per config, and its probes (empty without a capacity search)."""
    from analysis.capacity import capacity_text, rank_by_capacity

    if not con.sql("SELECT count(*) FROM capacity_results").fetchall()[0][0]:
        return ""
    choices = rank_by_capacity(con)
    parts = [
        "<section id='capacity'><h2>Capacity under SLO</h2>"
        f"<p class='meta'>Highest {html.escape(choices[0].kind)} at which {html.escape(choices[0].slo)} held, "
        "found by bisection on one launch per job (the smallest over a config's launches).</p>"
        "<table><tr><th>#</th><th class='label'>config</th><th>capacity</th><th>launches</th>"
        "<th>probes</th></tr>"
    ]
    for c in choices:
        parts.append(
            f"<tr><td>{c.rank}</td><td class='label'>{html.escape(c.config_label)}</td>"
            f"<td>{html.escape(capacity_text(c))}</td><td>{c.launches}</td><td>{c.probes}</td></tr>"
        )
    parts.append("</table>")
    element_id, caption = CAPACITY_PLOT
    parts.append(
        f"<figure id='{element_id}'><figcaption>{html.escape(caption)}</figcaption>"
        f"{_capacity_plot(con, styles, choices)}</figure></section>"
    )
    return "".join(parts)


def _capacity_plot(
    con: duckdb.DuckDBPyConnection, styles: dict[str, Style], choices: list[CapacityChoice]
) -> str:
    probes = con.sql(
        "SELECT j.config_label, c.probe_load, c.passed FROM capacity c "
        "JOIN current_jobs j USING (sweep_id, job_id) ORDER BY c.probe_index"
    ).fetchall()
    labels = [c.config_label for c in choices]
    traces: list[dict[str, Any]] = [
        {
            "type": "bar",
            "name": "capacity",
            "x": labels,
            "y": [c.capacity for c in choices],
            "marker": {"color": [_style(styles, label).color for label in labels], "opacity": 0.35},
            "hovertemplate": "%{x}: capacity %{y:.4g}<extra></extra>",
        }
    ]
    for choice in choices:
        style = _style(styles, choice.config_label)
        loads = [(load, passed) for label, load, passed in probes if label == choice.config_label]
        traces.append(
            {
                "type": "scatter",
                "mode": "markers",
                "name": choice.config_label,
                "x": [choice.config_label] * len(loads),
                "y": [load for load, _ in loads],
                "text": ["SLOs held" if passed else "missed" for _, passed in loads],
                "marker": {
                    "color": [style.color if passed else "rgba(0,0,0,0)" for _, passed in loads],
                    "line": {"color": style.color, "width": 1.5},
                    "size": 9,
                    "symbol": style.symbol,
                },
                "hovertemplate": "%{x} probe at %{y:.4g}: %{text}<extra></extra>",
            }
        )
    unit = "requests/s" if choices[0].kind == "rate" else "concurrency"
    layout = {"height": 360, "yaxis": {"title": {"text": f"load ({unit})"}}, "showlegend": False}
    return _plot(CAPACITY_PLOT[0], traces, layout)


def _deployment(
    con: duckdb.DuckDBPyConnection, selection: Selection, confirmation: Confirmation | None
) -> str:
    """One server for all the load: the static config best over the mix, the adaptive schedule, and
    the adaptive server as the confirmation job measured it."""
    from analysis.deploy import config_shapes, level_concurrency, plan_deployment, spec_weights

    parts = ["<section id='deploy'><h2>One server for every load level</h2>"]
    concurrency = level_concurrency(con)
    try:
        plan = plan_deployment(selection, config_shapes(con), concurrency, spec_weights(con))
    except ResultsError as err:
        parts.append(f"<p class='note'>{html.escape(err.problem)}</p></section>")
        return "".join(parts)
    weights = ", ".join(f"{level} x{w:g}" for level, w in plan.weights.items())
    parts.append(
        f"<p>Load mix: {html.escape(weights)}. Best static config: "
        f"<b>{html.escape(plan.static.config_label)}</b>, {plan.static.mix_score:.3f} of the per-level best "
        f"on the mix. Recommended: <b>{confirmation.recommended if confirmation else plan.recommended}</b> "
        "(<code>specsweep best --emit DIR</code> writes the launch).</p>"
    )
    if confirmation is not None:
        parts.append(_confirmation_table(confirmation))
    if plan.adaptive is None:
        parts.append(
            f"<p class='note'>No adaptive schedule: {html.escape(plan.adaptive_note or '')}</p></section>"
        )
        return "".join(parts)
    steps = plan.adaptive.steps_by_batch_size
    by_size = sorted(plan.adaptive.chosen.items(), key=lambda item: concurrency[item[0]] or 0)
    thresholds = plan.adaptive.thresholds
    rows = "".join(
        f"<tr><td>{thresholds[level]}</td><td>{concurrency[level]}</td><td>{steps[thresholds[level]]}</td>"
        f"<td class='label'>{html.escape(label)}</td>"
        f"<td class='label'>{html.escape(plan.adaptive.gives_up.get(level, ''))}</td></tr>"
        for level, label in by_size
    )
    parts.append(
        f"<p>Adaptive schedule (<code>--speculative-adaptive</code>, expected {plan.adaptive.mix_score:.3f} "
        "of the per-level best on the mix):</p><table class='adaptive-schedule'><tr><th>batch size &ge;</th>"
        f"<th>level's concurrency</th><th>draft steps</th><th class='label'>as measured by</th><th class='label'>gives up</th></tr>{rows}"
        "</table></section>"
    )
    return "".join(parts)


def _confirmation_table(confirmation: Confirmation) -> str:
    """The confirmation job per level against the winner and the best topk-1 chain, and on the mix."""
    rows = "".join(
        f"<tr><td class='label'>{html.escape(lc.load_level)}</td><td>{_fmt(lc.objective)}</td>"
        f"<td>{_ci(lc.objective_ci)}</td><td class='label'>{html.escape(lc.winner_label)}</td>"
        f"<td>{lc.of_winner:.3f}</td><td class='label'>{html.escape(lc.best_chain_label or '-')}</td>"
        f"<td>{_fmt(lc.of_best_chain)}</td><td class='label'>{html.escape(lc.gives_up or '')}</td></tr>"
        for lc in confirmation.levels
    )
    chain = confirmation.chain_static
    chain_text = (
        f"; best static topk-1 {html.escape(chain.config_label)} {chain.mix_score:.3f}" if chain else ""
    )
    return (
        f"<p>Measured adaptive server (confirmation job, {html.escape(confirmation.schedule)}): "
        f"{confirmation.mix_score:.3f} {_ci(confirmation.mix_ci)} of the per-level best on the mix; best static "
        f"{html.escape(confirmation.static.config_label)} {confirmation.static.mix_score:.3f}{chain_text}.</p>"
        "<table class='confirmation'><tr><th class='label'>level</th><th>adaptive</th><th>interval</th>"
        "<th class='label'>winner</th><th>of winner</th><th class='label'>best topk-1</th>"
        f"<th>of best topk-1</th><th class='label'>gives up</th></tr>{rows}</table>"
    )


def _fmt(value: float | None) -> str:
    """A number with two decimals everywhere, so a table's column lines up (4 significant digits gave 25.85
    beside 234 and 483.1)."""
    return "-" if value is None else f"{value:.2f}"


def _ci(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    return f"[{interval.low:.3f}, {interval.high:.3f}]"


# ---------------------------------------------------------------------------------------------------
# Plots: plotly.js figures (data and layout as JSON), drawn by the bundle inlined once in the page's head
# ---------------------------------------------------------------------------------------------------

# A qualitative palette of well-separated hues (D3's category10); past ten configs the colors repeat
# with another dash and marker, so no two configs look alike. Baselines are black and dashed.
PALETTE = (
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
    "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf",
)  # fmt: skip
DASHES = ("solid", "dot", "dashdot", "longdash")
SYMBOLS = ("circle", "square", "diamond", "triangle-up")
BASELINE_STYLE = ("#000000", "dash", "x")
_PLOT_CONFIG = {"displaylogo": False, "responsive": True, "modeBarButtonsToRemove": ["sendDataToCloud"]}
_FONT = {"family": "system-ui, sans-serif", "size": 12}


@dataclass(frozen=True)
class Style:
    """How one config is drawn everywhere in the report."""

    color: str
    dash: str
    symbol: str


def _plotly_js() -> str:
    """The plotly.js bundle the Python package ships (offline: nothing is fetched)."""
    from plotly.offline import get_plotlyjs

    return str(get_plotlyjs())


def _figure(element_id: str, body: str) -> str:
    caption = html.escape(PLOTS[element_id])
    return f"<figure id='{element_id}'><figcaption>{caption}</figcaption>{body}</figure>"


def _plot(element_id: str, traces: list[dict[str, Any]], layout: dict[str, Any]) -> str:
    """A div and the script that draws ``traces`` into it (JSON with ``</`` escaped for the page)."""
    div = f"{element_id}-div"
    full_layout = {
        "font": _FONT,
        "margin": {"l": 60, "r": 20, "t": 30, "b": 50},
        "hovermode": "closest",
        "legend": {"font": {"size": 11}},
        **layout,
    }
    payload = ", ".join(
        json.dumps(part, allow_nan=False).replace("</", "<\\/")
        for part in (traces, full_layout, _PLOT_CONFIG)
    )
    return (
        f"<div class='plot' id='{div}' style='height:{layout.get('height', 420)}px'></div>"
        f"<script>Plotly.newPlot('{div}', {payload});</script>"
    )


def _not_drawn(why: str) -> str:
    """One line in place of a plot with nothing to draw."""
    return f"<p class='note not-drawn'>{html.escape(why)}</p>"


def _config_styles(con: duckdb.DuckDBPyConnection) -> dict[str, Style]:
    """A stable, distinct style per config label (see ``PALETTE``); baselines are black and dashed."""
    rows = con.sql(
        "SELECT config_label, bool_and(effective_speculative_algorithm IS NULL) FROM results "
        "GROUP BY config_label ORDER BY config_label"
    ).fetchall()
    return config_styles([(label, bool(baseline)) for label, baseline in rows])


def config_styles(labels: list[tuple[str, bool]]) -> dict[str, Style]:
    """Styles for (label, is_baseline) in order: the n-th config gets ``PALETTE[n % 10]`` with the
    ``n // 10``-th dash and marker."""
    styles: dict[str, Style] = {}
    index = 0
    for label, baseline in labels:
        if baseline:
            styles[label] = Style(*BASELINE_STYLE)
            continue
        cycle = index // len(PALETTE)
        styles[label] = Style(
            PALETTE[index % len(PALETTE)], DASHES[cycle % len(DASHES)], SYMBOLS[cycle % len(SYMBOLS)]
        )
        index += 1
    return styles


def _style(styles: dict[str, Style], label: str) -> Style:
    return styles.get(label, Style("#888888", "solid", "circle"))


def _line(label: str, style: Style, xs: list[Any], ys: list[Any], **extra: Any) -> dict[str, Any]:
    """One config's line trace (its legend entry toggles it in every panel of the plot)."""
    return {
        "type": "scatter",
        "mode": "lines+markers",
        "name": label,
        "legendgroup": label,
        "x": xs,
        "y": ys,
        "line": {"color": style.color, "dash": style.dash, "width": 2},
        "marker": {"color": style.color, "symbol": style.symbol, "size": 6},
        **extra,
    }


def _series(con: duckdb.DuckDBPyConnection, column: str) -> dict[str, tuple[list[float], list[float]]]:
    """Per config: concurrency and the median over repeats of ``column`` (closed-loop levels)."""
    rows = con.sql(
        f"SELECT config_label, concurrency, median({column}) FROM results "
        "WHERE concurrency IS NOT NULL GROUP BY ALL ORDER BY config_label, concurrency"
    ).fetchall()
    series: dict[str, tuple[list[float], list[float]]] = {}
    for label, concurrency, value in rows:
        xs, ys = series.setdefault(label, ([], []))
        xs.append(concurrency)
        ys.append(value)
    return series


def _line_plot(
    con: duckdb.DuckDBPyConnection, styles: dict[str, Style], element_id: str, column: str, ylabel: str
) -> str:
    series = _series(con, column)
    if not series:
        return _not_drawn("no closed-loop level was measured (open-loop levels have no concurrency axis)")
    traces = [
        _line(
            label,
            _style(styles, label),
            xs,
            ys,
            hovertemplate=f"{label}<br>concurrency %{{x}}<br>{ylabel} %{{y:.4g}}<extra></extra>",
        )
        for label, (xs, ys) in series.items()
    ]
    ticks = sorted({x for xs, _ in series.values() for x in xs})
    layout = {
        "xaxis": {
            "title": {"text": "concurrency"},
            "type": "log",
            "tickvals": ticks,
            "ticktext": [str(t) for t in ticks],
        },
        "yaxis": {"title": {"text": ylabel}},
    }
    return _plot(element_id, traces, layout)


def _throughput_plot(con: duckdb.DuckDBPyConnection, styles: dict[str, Style]) -> str:
    return _line_plot(con, styles, "plot-throughput", "output_tok_s_per_gpu", "output tokens/s per GPU")


def _tpot_plot(con: duckdb.DuckDBPyConnection, styles: dict[str, Style]) -> str:
    return _line_plot(con, styles, "plot-tpot", "tpot_p50_ms", "TPOT p50 (ms)")


def _summed_lists(con: duckdb.DuckDBPyConnection, column: str) -> dict[str, list[int]]:
    """Per config: the element-wise sum of a histogram column over levels and repeats."""
    rows = con.sql(
        f"SELECT config_label, k, sum(v)::BIGINT FROM (SELECT config_label, unnest({column}) AS v, "
        f"generate_subscripts({column}, 1) - 1 AS k FROM results WHERE {column} IS NOT NULL) "
        "GROUP BY ALL ORDER BY config_label, k"
    ).fetchall()
    sums: dict[str, list[int]] = {}
    for label, _k, value in rows:
        sums.setdefault(label, []).append(value)
    return sums


def _accept_length_plot(con: duckdb.DuckDBPyConnection, styles: dict[str, Style]) -> str:
    from analysis.schema import ACCEPT_LENGTH_BIN_WIDTH

    hists = _summed_lists(con, "accept_length_hist")
    if not hists:
        return _not_drawn("no speculative config reported accept lengths")
    traces = []
    for label, counts in hists.items():
        total = sum(counts) or 1
        xs = [(i + 0.5) * ACCEPT_LENGTH_BIN_WIDTH for i in range(len(counts))]
        style = _style(styles, label)
        traces.append(
            {
                **_line(label, style, xs, [c / total for c in counts]),
                "mode": "lines",
                "line": {"color": style.color, "dash": style.dash, "shape": "hvh", "width": 2},
            }
        )
    layout = {
        "xaxis": {"title": {"text": "accept length (tokens per verify step, per request)"}},
        "yaxis": {"title": {"text": "fraction of requests"}},
    }
    return _plot("plot-accept-length", traces, layout)


def _acceptance_position_plot(con: duckdb.DuckDBPyConnection, styles: dict[str, Style]) -> str:
    hists = _summed_lists(con, "correct_drafts_histogram")
    if not hists:
        return _not_drawn("no speculative config reported its correct-drafts histogram")
    traces = []
    for label, steps in hists.items():
        total = sum(steps) or 1
        tail = [sum(steps[k:]) / total for k in range(1, len(steps))]
        traces.append(_line(label, _style(styles, label), list(range(1, len(steps))), tail))
    layout = {
        "xaxis": {"title": {"text": "draft position k"}, "dtick": 1},
        "yaxis": {"title": {"text": "P(verify step accepts >= k drafts)"}, "range": [0, 1.02]},
    }
    return _plot("plot-acceptance-position", traces, layout)


def _cdf_level(selection: Selection) -> str | None:
    """The level the CDFs show: the only one asked for, else the highest load measured."""
    return selection.levels[-1].load_level if selection.levels else None


def _latency_cdf_plot(con: duckdb.DuckDBPyConnection, styles: dict[str, Style], level: str | None) -> str:
    if level is None:
        return _not_drawn("no level was ranked")
    probs = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
    rows = con.sql(
        "SELECT j.config_label, quantile_cont(r.ttft_ms, ?), quantile_cont(r.tpot_ms, ?) "
        "FROM requests r JOIN current_jobs j USING (sweep_id, job_id) "
        "WHERE r.load_level = ? AND r.in_window AND r.error_type IS NULL "
        "GROUP BY j.config_label ORDER BY j.config_label",
        params=[probs, probs, level],
    ).fetchall()
    traces = []
    for label, ttft, tpot in rows:
        style = _style(styles, label)
        for axis, values in (("", ttft), ("2", tpot)):
            if values is not None:
                traces.append(
                    {
                        **_line(label, style, values, probs, xaxis=f"x{axis}", yaxis=f"y{axis}"),
                        "mode": "lines",
                        "showlegend": axis == "",
                    }
                )
    layout = {
        "xaxis": {"title": {"text": f"TTFT (ms) at {level}"}, "domain": [0, 0.46]},
        "yaxis": {"title": {"text": "fraction of requests"}},
        "xaxis2": {"title": {"text": f"TPOT (ms) at {level}"}, "domain": [0.54, 1]},
        "yaxis2": {"anchor": "x2", "matches": "y"},
    }
    return _plot("plot-latency-cdf", traces, layout)


def _short_level(level: str) -> str:
    """A level's name as a point label: concurrency=64 -> c=64, rate=2.5 -> r=2.5."""
    name, eq, value = level.partition("=")
    return f"{name[0]}={value}" if eq and name else level


def _pareto_plot(con: duckdb.DuckDBPyConnection, styles: dict[str, Style]) -> str:
    rows = con.sql(
        "SELECT config_label, load_level, median(output_tok_s_per_user), median(output_tok_s_per_gpu) "
        "FROM results GROUP BY ALL HAVING median(output_tok_s_per_user) IS NOT NULL "
        "AND median(output_tok_s_per_gpu) IS NOT NULL ORDER BY config_label, min(concurrency), load_level"
    ).fetchall()
    if not rows:
        return _not_drawn("no level has both per-user and per-GPU throughput")
    traces = []
    for label in sorted({r[0] for r in rows}):
        mine = [r for r in rows if r[0] == label]
        style = _style(styles, label)
        traces.append(
            {
                "type": "scatter",
                "mode": "markers+text",
                "name": label,
                "x": [r[2] for r in mine],
                "y": [r[3] for r in mine],
                "text": [_short_level(r[1]) for r in mine],
                "customdata": [r[1] for r in mine],
                "textposition": "top center",
                "textfont": {"size": 10, "color": style.color},
                "marker": {"color": style.color, "symbol": style.symbol, "size": 9},
                "hovertemplate": f"{label} at %{{customdata}}<br>per user %{{x:.4g}} tok/s<br>"
                "per GPU %{y:.4g} tok/s<extra></extra>",
            }
        )
    front = pareto_front([(r[2], r[3]) for r in rows])
    traces.append(
        {
            "type": "scatter",
            "mode": "lines",
            "name": "Pareto front",
            "x": [p[0] for p in front],
            "y": [p[1] for p in front],
            "line": {"color": "#444444", "width": 1.5},
            "hoverinfo": "skip",
        }
    )
    layout = {
        "xaxis": {"title": {"text": "per-user output tokens/s (median over requests)"}},
        "yaxis": {"title": {"text": "output tokens/s per GPU"}},
    }
    return _plot("plot-pareto", traces, layout)


def _featured_jobs(con: duckdb.DuckDBPyConnection, selection: Selection) -> dict[str, str]:
    """Config label -> its first repeat's job: the winner at the highest level ranked, and its baseline."""
    choice = next((c for c in reversed(selection.levels) if c.winner is not None), None)
    if choice is None or choice.winner is None:
        return {}
    labels = [choice.winner.config_label]
    if choice.baseline_label is not None and choice.baseline_label not in labels:
        labels.append(choice.baseline_label)
    rows = con.execute(
        "SELECT config_label, arg_min(job_id, repeat_index) FROM current_jobs "
        "WHERE config_label IN (SELECT unnest(?)) GROUP BY config_label",
        [labels],
    ).fetchall()
    jobs = dict(rows)
    return {label: jobs[label] for label in labels if label in jobs}


def _timeline_plot(
    con: duckdb.DuckDBPyConnection,
    styles: dict[str, Style],
    featured: dict[str, str],
    element_id: str,
    table: str,
    series: tuple[tuple[str, str], ...],
) -> str:
    """One row per metric, one column per level (in the order they ran): value over ``time_s``, the mean
    over label sets (GPUs, ranks) at each sample; or one line saying why there is nothing to draw."""
    jobs = list(featured.values())
    rows = con.execute(
        f"SELECT j.config_label, t.load_level, t.metric, t.time_s, avg(t.value), min(t.time_unix_ns) "
        f"FROM {table} t JOIN jobs j USING (sweep_id, job_id) "
        "WHERE t.job_id IN (SELECT unnest(?)) AND t.metric IN (SELECT unnest(?)) AND t.time_s >= 0 "
        "GROUP BY ALL ORDER BY t.time_s",
        [jobs, [metric for metric, _ in series]],
    ).fetchall()
    started: dict[str, int] = {}
    for _, level, _, _, _, unix_ns in rows:
        started[level] = min(unix_ns, started.get(level, unix_ns))
    levels = sorted(started, key=started.__getitem__)[-TIMELINE_LEVELS:]
    if not rows or not levels:
        off_column = f"{table}_off"
        reasons = con.execute(
            f"SELECT DISTINCT {off_column} FROM jobs WHERE job_id IN (SELECT unnest(?)) "
            f"AND {off_column} IS NOT NULL",
            [jobs],
        ).fetchall()
        why = "; ".join(r[0] for r in reasons) or "no samples for the featured jobs"
        return _not_drawn(f"not sampled: {why}")
    points: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
    for label, level, metric, time_s, value, _ in rows:
        xs, ys = points.setdefault((label, level, metric), ([], []))
        xs.append(time_s)
        ys.append(value)
    gap = 0.04
    width = (1 - gap * (len(levels) - 1)) / len(levels)
    height = (1 - 0.08 * (len(series) - 1)) / len(series)
    traces: list[dict[str, Any]] = []
    layout: dict[str, Any] = {"height": 170 * len(series) + 90, "annotations": []}
    shown: set[str] = set()
    for row, (metric, ylabel) in enumerate(series):
        for column, level in enumerate(levels):
            n = row * len(levels) + column + 1
            suffix = "" if n == 1 else str(n)
            top = 1 - row * (height + 0.08)
            layout[f"xaxis{suffix}"] = {
                "domain": [column * (width + gap), column * (width + gap) + width],
                "anchor": f"y{suffix}",
                "title": {"text": "s into the level"} if row == len(series) - 1 else {},
            }
            layout[f"yaxis{suffix}"] = {
                "domain": [top - height, top],
                "anchor": f"x{suffix}",
                "title": {"text": ylabel, "font": {"size": 10}} if column == 0 else {},
            }
            if row == 0:
                layout["annotations"].append(
                    {"text": level, "showarrow": False, "xref": f"x{suffix} domain", "yref": f"y{suffix} domain",
                     "x": 0.5, "y": 1.12, "font": {"size": 11}}
                )  # fmt: skip
            for label in featured:
                if (label, level, metric) in points:
                    xs, ys = points[(label, level, metric)]
                    traces.append(
                        {
                            **_line(
                                label, _style(styles, label), xs, ys, xaxis=f"x{suffix}", yaxis=f"y{suffix}"
                            ),
                            "mode": "lines",
                            "showlegend": label not in shown,
                        }
                    )
                    shown.add(label)
    return _plot(element_id, traces, layout)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in both coordinates (higher is better in both), by ascending x."""
    front: list[tuple[float, float]] = []
    best_y = float("-inf")
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best_y:
            front.append((x, y))
            best_y = y
    return sorted(front)
