"""The HTML report: one self-contained file with the winner, its command, tables, and plots.

Rendering only: the numbers come from ``analysis.select`` (the ranking) and the DuckDB views. Plots
are matplotlib SVG inlined into the page; a Content-Security-Policy forbids every fetch, so the file
opens the same offline, from an e-mail, or years later.
"""

from __future__ import annotations

import html
import io
import os
import re
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.schema import GPU_POWER_W, GPU_SM_CLOCK_MHZ
from analysis.select import Interval, Selection, share_text
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

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
_METADATA = re.compile(r"<metadata>.*?</metadata>", re.DOTALL)  # RDF boilerplate, not needed
_CSP = "default-src 'none'; style-src 'unsafe-inline'; img-src data:"
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
"""


def render_report(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    server_series: tuple[tuple[str, str], ...] = (),
    confirmation: Confirmation | None = None,
) -> str:
    """The report page for ``selection`` over the results behind ``con``. ``server_series`` are the
    ``server_metrics`` samples to plot over time as (metric name, axis label): the server's names are
    the caller's knowledge (the harness passes SGLang's), not this layer's."""
    colors = _config_colors(con)
    featured = _featured_jobs(con, selection)
    gpu_series = ((GPU_POWER_W, "GPU power (W)"), (GPU_SM_CLOCK_MHZ, "SM clock (MHz)"))
    sections = [
        _header(con, selection),
        _winners(selection),
        _tables(selection),
        _categories(con),
        _deployment(con, selection, confirmation),
        _capacity(con, colors),
        _figure("plot-throughput", _throughput_plot(con, colors)),
        _figure("plot-tpot", _tpot_plot(con, colors)),
        _figure("plot-accept-length", _accept_length_plot(con, colors)),
        _figure("plot-acceptance-position", _acceptance_position_plot(con, colors)),
        _figure("plot-latency-cdf", _latency_cdf_plot(con, colors, _cdf_level(selection))),
        _figure("plot-pareto", _pareto_plot(con, colors)),
        _figure(
            "plot-server-timeline", _timeline_plot(con, colors, featured, "server_metrics", server_series)
        ),
        _figure("plot-gpu-timeline", _timeline_plot(con, colors, featured, "gpu_metrics", gpu_series)),
    ]
    title = f"specsweep report: {html.escape(selection.sweep_id)}"
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<meta http-equiv='Content-Security-Policy' content=\"{_CSP}\">"
        f"<title>{title}</title><style>{_STYLE}</style></head><body>\n"
        + "\n".join(sections)
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


def _winners(selection: Selection) -> str:
    parts = ["<section id='winner'><h2>Winner per load level</h2>"]
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
            f"{html.escape(tie_text)}<pre>{html.escape(w.launch_command or '(launch command unknown)')}</pre>"
            "</div>"
        )
    parts.append("</section>")
    return "".join(parts)


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
    for level in sorted({level for level, _ in cells}):
        parts.append(f"<h3>{html.escape(level)}</h3><table><tr><th class='label'>config</th>{head}</tr>")
        for (row_level, label), values in cells.items():
            if row_level == level:
                tds = "".join(f"<td>{values.get(c, '-')}</td>" for c in categories)
                parts.append(f"<tr><td class='label'>{html.escape(label)}</td>{tds}</tr>")
        parts.append("</table>")
    parts.append("</section>")
    return "".join(parts)


def _capacity(con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]]) -> str:
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
        f"{_capacity_plot(con, colors, choices)}</figure></section>"
    )
    return "".join(parts)


def _capacity_plot(
    con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]], choices: list[CapacityChoice]
) -> str:
    probes = con.sql(
        "SELECT j.config_label, c.probe_load, c.passed FROM capacity c "
        "JOIN current_jobs j USING (sweep_id, job_id) ORDER BY c.probe_index"
    ).fetchall()
    fig = _new_figure(height=3.6)
    ax = fig.add_subplot()
    for x, choice in enumerate(choices):
        color, _ = colors.get(choice.config_label, ("#888888", "-"))
        if choice.capacity is not None:
            ax.bar(x, choice.capacity, width=0.6, color=color, alpha=0.35)
        loads = [(load, passed) for label, load, passed in probes if label == choice.config_label]
        for load, passed in loads:
            ax.scatter(x, load, s=24, edgecolors=color, facecolors=color if passed else "none", zorder=3)
    ax.set_xticks(range(len(choices)), [c.config_label for c in choices])
    unit = "requests/s" if choices[0].kind == "rate" else "concurrency"
    ax.set_ylabel(f"load ({unit})")
    ax.grid(alpha=0.3, axis="y")
    return _svg(fig)


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
    return "-" if value is None else f"{value:.4g}"


def _ci(interval: Interval | None) -> str:
    if interval is None:
        return "-"
    return f"[{interval.low:.3f}, {interval.high:.3f}]"


# ---------------------------------------------------------------------------------------------------
# Plots
# ---------------------------------------------------------------------------------------------------


def _figure(element_id: str, svg: str) -> str:
    caption = html.escape(PLOTS[element_id])
    return f"<figure id='{element_id}'><figcaption>{caption}</figcaption>{svg}</figure>"


def _new_figure(width: float = 9.0, height: float = 4.2) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _svg(fig: Figure) -> str:
    """The figure as inline SVG (text as paths: no fonts to fetch)."""
    import matplotlib

    buffer = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "path", "svg.hashsalt": "specsweep"}):
        fig.savefig(buffer, format="svg", metadata={"Date": None})
    text = buffer.getvalue()
    return _METADATA.sub("", text[text.index("<svg") :])


def _config_colors(con: duckdb.DuckDBPyConnection) -> dict[str, tuple[str, str]]:
    """A stable color and line style per config label; baselines are black and dashed."""
    from matplotlib import colormaps

    rows = con.sql(
        "SELECT config_label, bool_and(effective_speculative_algorithm IS NULL) FROM results "
        "GROUP BY config_label ORDER BY config_label"
    ).fetchall()
    palette = colormaps["tab20"].colors  # type: ignore[attr-defined]
    styles: dict[str, tuple[str, str]] = {}
    index = 0
    for label, baseline in rows:
        if baseline:
            styles[label] = ("#000000", "--")
        else:
            r, g, b = palette[index % len(palette)][:3]
            styles[label] = (f"#{int(r * 255):02x}{int(g * 255):02x}{int(b * 255):02x}", "-")
            index += 1
    return styles


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
    con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]], column: str, ylabel: str
) -> str:
    fig = _new_figure()
    ax = fig.add_subplot()
    series = _series(con, column)
    for label, (xs, ys) in series.items():
        color, style = colors.get(label, ("#888888", "-"))
        ax.plot(xs, ys, style, color=color, marker="o", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ticks = sorted({x for xs, _ in series.values() for x in xs})
    ax.set_xticks(ticks, [str(t) for t in ticks])
    ax.minorticks_off()
    ax.set_xlabel("concurrency")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _svg(fig)


def _legend(ax: Axes) -> None:
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))


def _throughput_plot(con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]]) -> str:
    return _line_plot(con, colors, "output_tok_s_per_gpu", "output tokens/s per GPU")


def _tpot_plot(con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]]) -> str:
    return _line_plot(con, colors, "tpot_p50_ms", "TPOT p50 (ms)")


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


def _accept_length_plot(con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]]) -> str:
    from analysis.schema import ACCEPT_LENGTH_BIN_WIDTH

    fig = _new_figure()
    ax = fig.add_subplot()
    for label, counts in _summed_lists(con, "accept_length_hist").items():
        total = sum(counts) or 1
        xs = [(i + 0.5) * ACCEPT_LENGTH_BIN_WIDTH for i in range(len(counts))]
        color, _ = colors.get(label, ("#888888", "-"))
        ax.plot(xs, [c / total for c in counts], color=color, drawstyle="steps-mid", label=label)
    ax.set_xlabel("accept length (tokens per verify step, per request)")
    ax.set_ylabel("fraction of requests")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _svg(fig)


def _acceptance_position_plot(con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]]) -> str:
    fig = _new_figure()
    ax = fig.add_subplot()
    for label, steps in _summed_lists(con, "correct_drafts_histogram").items():
        total = sum(steps) or 1
        tail = [sum(steps[k:]) / total for k in range(1, len(steps))]
        color, _ = colors.get(label, ("#888888", "-"))
        ax.plot(range(1, len(steps)), tail, color=color, marker="o", markersize=3, label=label)
    ax.set_xlabel("draft position k")
    ax.set_ylabel("P(verify step accepts >= k drafts)")
    ax.set_ylim(0, 1.02)
    ax.grid(alpha=0.3)
    _legend(ax)
    return _svg(fig)


def _cdf_level(selection: Selection) -> str | None:
    """The level the CDFs show: the only one asked for, else the highest load measured."""
    return selection.levels[-1].load_level if selection.levels else None


def _latency_cdf_plot(
    con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]], level: str | None
) -> str:
    probs = [i / (CDF_POINTS - 1) for i in range(CDF_POINTS)]
    fig = _new_figure(height=4.0)
    axes = fig.subplots(1, 2)
    if level is not None:
        rows = con.sql(
            "SELECT j.config_label, quantile_cont(r.ttft_ms, ?), quantile_cont(r.tpot_ms, ?) "
            "FROM requests r JOIN current_jobs j USING (sweep_id, job_id) "
            "WHERE r.load_level = ? AND r.in_window AND r.error_type IS NULL "
            "GROUP BY j.config_label ORDER BY j.config_label",
            params=[probs, probs, level],
        ).fetchall()
        for label, ttft, tpot in rows:
            color, style = colors.get(label, ("#888888", "-"))
            for ax, values in zip(axes, (ttft, tpot), strict=True):
                if values is not None:
                    ax.plot(values, probs, style, color=color, label=label)
    for ax, name in zip(axes, ("TTFT (ms)", "TPOT (ms)"), strict=True):
        ax.set_xlabel(name)
        ax.set_ylabel("fraction of requests")
        ax.set_title(f"at {level}" if level else "no data", fontsize=9)
        ax.grid(alpha=0.3)
    _legend(axes[1])
    return _svg(fig)


def _pareto_plot(con: duckdb.DuckDBPyConnection, colors: dict[str, tuple[str, str]]) -> str:
    rows = con.sql(
        "SELECT config_label, load_level, median(output_tok_s_per_user), median(output_tok_s_per_gpu) "
        "FROM results GROUP BY ALL HAVING median(output_tok_s_per_user) IS NOT NULL "
        "AND median(output_tok_s_per_gpu) IS NOT NULL"
    ).fetchall()
    fig = _new_figure()
    ax = fig.add_subplot()
    for label in sorted({r[0] for r in rows}):
        xs = [r[2] for r in rows if r[0] == label]
        ys = [r[3] for r in rows if r[0] == label]
        color, _ = colors.get(label, ("#888888", "-"))
        ax.scatter(xs, ys, s=14, color=color, label=label)
    front = pareto_front([(r[2], r[3]) for r in rows])
    if front:
        ax.plot(
            [p[0] for p in front], [p[1] for p in front], "-", color="#d62728", lw=1.5, label="Pareto front"
        )
    ax.set_xlabel("per-user output tokens/s (median over requests)")
    ax.set_ylabel("output tokens/s per GPU")
    ax.grid(alpha=0.3)
    _legend(ax)
    return _svg(fig)


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
    colors: dict[str, tuple[str, str]],
    featured: dict[str, str],
    table: str,
    series: tuple[tuple[str, str], ...],
) -> str:
    """One row per metric, one column per level (in the order they ran): value over ``time_s``, the mean
    over label sets (GPUs, ranks) at each sample; or why there is nothing to draw."""
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
        fig = _new_figure(height=1.2)
        ax = fig.add_subplot()
        ax.text(0.5, 0.5, "not sampled", ha="center", va="center", color="#a60")
        ax.set_axis_off()
        return f"<p class='note'>not sampled: {html.escape(why)}</p>{_svg(fig)}"
    fig = _new_figure(height=1.9 * len(series) + 0.6)
    axes = fig.subplots(len(series), len(levels), squeeze=False, sharex="col")
    points: dict[tuple[str, str, str], tuple[list[float], list[float]]] = {}
    for label, level, metric, time_s, value, _ in rows:
        xs, ys = points.setdefault((label, level, metric), ([], []))
        xs.append(time_s)
        ys.append(value)
    for row, (metric, ylabel) in enumerate(series):
        for column, level in enumerate(levels):
            ax = axes[row][column]
            for label in featured:
                if (label, level, metric) in points:
                    color, style = colors.get(label, ("#888888", "-"))
                    xs, ys = points[(label, level, metric)]
                    ax.plot(xs, ys, style, color=color, linewidth=1, label=label)
            ax.grid(alpha=0.3)
            ax.tick_params(labelsize=7)
            if row == 0:
                ax.set_title(level, fontsize=8)
            if row == len(series) - 1:
                ax.set_xlabel("s into the level", fontsize=8)
            if column == 0:
                ax.set_ylabel(ylabel, fontsize=8)
    _legend(axes[0][-1])
    return _svg(fig)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Points not dominated in both coordinates (higher is better in both), by ascending x."""
    front: list[tuple[float, float]] = []
    best_y = float("-inf")
    for x, y in sorted(points, key=lambda p: (-p[0], -p[1])):
        if y > best_y:
            front.append((x, y))
            best_y = y
    return sorted(front)
