"""The HTML report: winner, command, tables and every plot; renders offline in headless Chromium."""

from __future__ import annotations

import itertools
import math
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from analysis.report import PLOTS, pareto_front, render_report, write_report
from analysis.select import select_best
from analysis.views import connect

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
needs_chromium = pytest.mark.skipif(
    not Path(CHROMIUM).exists(), reason="chromium missing: `make browser` installs it"
)


@pytest.fixture(scope="module")
def report(clear_results, tmp_path_factory):  # type: ignore[no-untyped-def]
    out, _ = clear_results
    con = connect(out)
    selection = select_best(con, out, replicates=200)
    page = render_report(con, selection)
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
        "--window-size=1200,4000",
        *extra,
        page.as_uri(),
    ]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def _console_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if ":CONSOLE" in line]


def test_render_report_shows_winner_command_and_every_plot_when_rendered(report) -> None:  # type: ignore[no-untyped-def]
    """Each level's winner and launch command are on the page, and each plot is an inline SVG."""
    _, page, selection = report
    for level in selection.levels:
        assert f"data-level='{level.load_level}'" in page
        assert f"<span class='winner-label'>{level.winner.config_label}</span>" in page
        assert level.winner.launch_command in page
    for plot_id in PLOTS:
        match = re.search(f"<figure id='{plot_id}'>.*?</figure>", page, flags=re.DOTALL)
        assert match and "<svg" in match.group() and "<path" in match.group(), plot_id
    section = re.search("<section id='categories'>.*?</section>", page, flags=re.DOTALL)
    assert section and "random_ids" in section.group() and "x</td>" in section.group()


def test_render_report_references_nothing_external_when_opened_offline(report) -> None:  # type: ignore[no-untyped-def]
    """No script, no src/href to anything, and a CSP that forbids every fetch."""
    _, page, _ = report
    assert "<script" not in page
    assert not re.search(r"""\b(src|href)\s*=\s*["']?(https?:|//)""", page)
    assert "Content-Security-Policy" in page and "default-src 'none'" in page


@needs_chromium
def test_report_renders_in_chromium_without_console_errors_when_opened(report, tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    """Headless Chromium loads the file with no console message, screenshots a non-blank page, and
    its rendered DOM holds the winner and every plot."""
    path, _, selection = report
    shot = tmp_path / "report.png"
    result = _chromium(path, tmp_path / "profile-a", f"--screenshot={shot}")
    assert result.returncode == 0, result.stderr[-2000:]
    assert _console_lines(result.stderr) == []
    from PIL import Image

    with Image.open(shot) as image:
        colors = image.convert("RGB").getcolors(maxcolors=1 << 20)
    assert colors is None or len(colors) > 50  # more than a blank page's handful of colors
    dom = _chromium(path, tmp_path / "profile-b", "--dump-dom").stdout
    assert selection.levels[0].winner.config_label in dom
    for plot_id in PLOTS:
        assert re.search(f'<figure id="{plot_id}">.*?<svg', dom, flags=re.DOTALL), plot_id


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
