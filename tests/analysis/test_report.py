"""The HTML report: winner, command, tables and every plot; renders offline in headless Chromium."""

from __future__ import annotations

import itertools
import json
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.report import GLOSSARY, PALETTE, PLOTS, config_styles, pareto_front, render_report, write_report
from analysis.select import select_best
from analysis.views import connect
from harness.deploy_launch import deploy_launches

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="chromium missing: `make browser` installs it"
)


@pytest.fixture(scope="module")
def report(clear_results, tmp_path_factory):  # type: ignore[no-untyped-def]
    out, _ = clear_results
    con = connect(out)
    selection = select_best(con, out, replicates=200)
    page = render_report(con, selection, launches=deploy_launches(con))
    path = write_report(page, tmp_path_factory.mktemp("report") / "report.html")
    return path, page, selection


def _chromium(page: Path, profile: Path, *extra: str) -> subprocess.CompletedProcess[str]:
    argv = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile}",
        "--enable-logging=stderr",
        "--v=0",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


# Synthetic results sample no server or GPU metrics: those figures hold one line instead of a plot.
NOT_SAMPLED = ("plot-server-timeline", "plot-gpu-timeline")


def _figure_html(page: str, plot_id: str) -> str:
    match = re.search(f"<figure id='{plot_id}'>.*?</figure>", page, flags=re.DOTALL)
    assert match, plot_id
    return match.group()


def test_render_report_shows_winner_deploy_launch_and_every_plot_when_rendered(report) -> None:  # type: ignore[no-untyped-def]
    """Each level's winner and its deploy launch (no --host/--port) are on the page, and each plot with
    data is a plotly figure (a div and the call that draws it)."""
    _, page, selection = report
    for level in selection.levels:
        assert f"data-level='{level.load_level}'" in page
        assert f"<span class='winner-label'>{level.winner.config_label}</span>" in page
    for launch in re.findall(r"<pre class='launch'>(.*?)</pre>", page, flags=re.DOTALL):
        assert "--host" not in launch and "--port" not in launch and "-m sglang.launch_server" in launch
    for plot_id in set(PLOTS) - set(NOT_SAMPLED):
        figure = _figure_html(page, plot_id)
        assert f"<div class='plot' id='{plot_id}-div'" in figure, plot_id
        assert f"Plotly.newPlot('{plot_id}-div'" in figure, plot_id
    section = re.search("<section id='categories'>.*?</section>", page, flags=re.DOTALL)
    assert section and "random_ids" in section.group() and "x</td>" in section.group()


def test_render_report_shows_one_line_instead_of_a_plot_when_nothing_was_sampled(report) -> None:  # type: ignore[no-untyped-def]
    """A timeline with no samples is its caption and one line saying why, not an empty plot a screen tall."""
    _, page, _ = report
    for plot_id in NOT_SAMPLED:
        figure = _figure_html(page, plot_id)
        assert "class='plot'" not in figure and "<svg" not in figure, plot_id
        assert figure.count("<p class='note not-drawn'>not sampled: synthetic results") == 1, figure


def test_render_report_explains_its_terms_when_rendered(report) -> None:  # type: ignore[no-untyped-def]
    """The page ends with a glossary of the terms it and `best` print without explaining them."""
    _, page, _ = report
    section = re.search("<section id='glossary'>.*?</section>", page, flags=re.DOTALL)
    assert section
    for term in (
        "MAD",
        "mix score",
        "client-added delay",
        "MRR",
        "slot",
        "leased",
        "tie / not distinguishable",
    ):
        assert term in GLOSSARY and f"<dt>{term}</dt>" in section.group(), term


def test_render_report_labels_each_pareto_point_with_its_level_when_rendered(report) -> None:  # type: ignore[no-untyped-def]
    """Every point of the Pareto plot carries its level's short label (c=16), so a config's points can
    be told apart."""
    _, page, selection = report
    figure = _figure_html(page, "plot-pareto")
    data = json.loads(re.search(r"Plotly.newPlot\('plot-pareto-div', (\[.*?\]), \{", figure).group(1))
    labels = {trace["name"]: trace["text"] for trace in data if trace["name"] != "Pareto front"}
    levels = {f"c={level.load_level.split('=')[1]}" for level in selection.levels}
    assert labels and all(set(text) == levels for text in labels.values()), labels


def _lab(color: str) -> tuple[float, float, float]:
    """CIE L*a*b* (D65) of an sRGB hex color."""
    rgb = [int(color[i : i + 2], 16) / 255 for i in (1, 3, 5)]
    lin = [c / 12.92 if c <= 0.04045 else ((c + 0.055) / 1.055) ** 2.4 for c in rgb]
    xyz = (
        (0.4124 * lin[0] + 0.3576 * lin[1] + 0.1805 * lin[2]) / 0.95047,
        0.2126 * lin[0] + 0.7152 * lin[1] + 0.0722 * lin[2],
        (0.0193 * lin[0] + 0.1192 * lin[1] + 0.9505 * lin[2]) / 1.08883,
    )
    f = [t ** (1 / 3) if t > 0.008856 else 7.787 * t + 16 / 116 for t in xyz]
    return 116 * f[1] - 16, 500 * (f[0] - f[1]), 200 * (f[1] - f[2])


def test_config_styles_tell_every_config_apart_when_there_are_many() -> None:
    """Up to ten configs get ten different colors, none pale on white (L* <= 75) and each pair at least
    20 apart in CIE L*a*b* (tab20's pale twins, e.g. two light blues, fail this); past ten the colors
    come back with another dash and marker, so no two configs share a style; the baseline stays black."""
    labels = [("baseline", True)] + [(f"config {i}", False) for i in range(14)]
    styles = config_styles(labels)
    assert styles["baseline"].color == "#000000" and styles["baseline"].dash == "dash"
    assert len({(s.color, s.dash, s.symbol) for s in styles.values()}) == len(labels)
    first = [styles[f"config {i}"].color for i in range(10)]
    assert first == list(PALETTE)
    lab = [_lab(color) for color in first]
    assert all(lightness <= 75 for lightness, _, _ in lab), lab
    for one, other in itertools.combinations(lab, 2):
        assert math.dist(one, other) >= 20, (one, other)


def test_render_report_references_nothing_external_when_opened_offline(report) -> None:  # type: ignore[no-untyped-def]
    """No script or stylesheet is loaded from anywhere (plotly.js is inlined), no src/href outside the
    inlined bundle points off the page, and a CSP forbids every fetch."""
    _, page, _ = report
    assert not re.search(r"<script[^>]*\bsrc\s*=", page) and "<link" not in page
    body = page.split("</head>", 1)[1]
    assert not re.search(r"""\b(src|href)\s*=\s*["']?(https?:|//)""", body)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert "connect-src" not in page and "script-src 'unsafe-inline'" in page


@needs_chromium
def test_report_renders_in_chromium_without_console_errors_when_opened(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Headless Chromium loads the file with no console message (a CSP violation or a plotly.js error
    would log one), its rendered DOM holds the winner and a plotly SVG in every drawn plot, and its
    screenshot shows every config's color (drawn only by the plots: the page's text is black and grey)."""
    path, _, selection = report
    shot = tmp_path / "report.png"
    result = _chromium(path, tmp_path / "profile-a", "--window-size=1200,9000", f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert _console_lines(result.stderr) == []
    dom = _chromium(path, tmp_path / "profile-b", "--dump-dom").stdout
    assert selection.levels[0].winner.config_label in dom
    for plot_id in set(PLOTS) - set(NOT_SAMPLED):
        drawn = re.search(
            f'<div class="plot js-plotly-plot" id="{plot_id}-div".*?<svg class="main-svg"',
            dom,
            flags=re.DOTALL,
        )
        assert drawn, plot_id
    from PIL import Image

    with Image.open(shot) as image:
        pixels = image.convert("RGB").getcolors(maxcolors=1 << 22)
    assert pixels is not None
    counts = {rgb: n for n, rgb in pixels}
    for color in PALETTE[:3]:  # the synthetic sweep's three speculative configs
        rgb = tuple(int(color[i : i + 2], 16) for i in (1, 3, 5))
        assert counts.get(rgb, 0) > 500, color  # lines and markers, not a stray pixel


@needs_chromium
def test_chromium_check_catches_console_error_when_page_logs_one(tmp_path: Path) -> None:
    """The console capture the report test relies on does see an error (the check can fail)."""
    page = tmp_path / "bad.html"
    page.write_text("<!DOCTYPE html><html><body><script>console.error('boom-marker')</script></body></html>")
    result = _chromium(page, tmp_path / "profile", "--dump-dom")
    assert any("boom-marker" in line for line in _console_lines(result.stderr))


def test_pareto_front_keeps_undominated_points_when_mixed() -> None:
    """A point is on the front unless another is at least as good in both coordinates and better in one."""
    points = [(1.0, 10.0), (2.0, 8.0), (1.5, 7.0), (3.0, 3.0), (0.5, 9.0), (3.0, 2.0)]
    assert pareto_front(points) == [(1.0, 10.0), (2.0, 8.0), (3.0, 3.0)]


def test_render_report_shows_adaptive_schedule_when_chains_win_levels(report) -> None:  # type: ignore[no-untyped-def]
    """The report's deploy section names the static config best over the load mix and the adaptive
    schedule: one row per measured concurrency (from the batch size its depth serves) with the winning
    chain depth, 0 where the baseline wins."""
    _, page, selection = report
    assert "<section id='deploy'>" in page and "Best static config" in page
    schedule = page.split("class='adaptive-schedule'")[1].split("</table>")[0]
    levels = sorted(int(level.load_level.split("=")[1]) for level in selection.levels)
    thresholds = dict(
        zip(levels, [1] + [math.ceil(math.sqrt(a * b)) for a, b in itertools.pairwise(levels)], strict=True)
    )
    for level in selection.levels:
        winner = level.winner.config_label
        concurrency = int(level.load_level.split("=")[1])
        steps = "0" if winner == "baseline" else None
        row = f"<tr><td>{thresholds[concurrency]}</td><td>{concurrency}</td><td>"
        assert row in schedule
        if steps is not None:
            assert f"{row}{steps}</td>" in schedule


def test_render_report_orders_levels_by_load_and_prints_two_decimals_when_tabled(report) -> None:  # type: ignore[no-untyped-def]
    """The per-category tables come in load order (concurrency 1, 16, 128: they came as text, 1, 128, 16),
    and every number of the per-level tables has two decimals (25.85 stood beside 234 and 483.1)."""
    _, page, _ = report
    categories = page.split("<section id='categories'>", 1)[1].split("</section>", 1)[0]
    assert re.findall(r"<h3>(concurrency=\d+)</h3>", categories) == [
        "concurrency=1",
        "concurrency=16",
        "concurrency=128",
    ]
    tables = page.split("<section id='configs'>", 1)[1].split("</section>", 1)[0]
    objective_cells = re.findall(r"<td class='label'>[^<]+</td><td>([^<]+)</td>", tables)
    assert len(objective_cells) == 12
    assert all(re.fullmatch(r"\d+\.\d\d", cell) for cell in objective_cells), objective_cells
