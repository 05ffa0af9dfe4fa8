"""Capacity results read back: the per-job answer and its bound, the ranking over repeats, best and report.

A synthetic sweep gets hand-made probes, so each config's capacity and bound are known exactly.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from analysis.capacity import rank_by_capacity
from analysis.layout import job_part_path
from analysis.schema import CapacityProbeRecord, LevelRecord, capacity_table, write_parquet_atomic
from analysis.synthetic import SyntheticConfig, SyntheticSweep, job_id_of, write_sweep
from analysis.views import connect
from harness.cli import main

SLO = "tpot_p99_ms<=50"
CONFIGS = (
    SyntheticConfig("baseline"),
    SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, repeats=2),
    SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4),
    SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.0),
)
# (config, repeat) -> probes as (rate, passed), in search order
PROBES: dict[tuple[str, int], list[tuple[float, bool]]] = {
    ("baseline", 0): [(16.0, True), (32.0, False), (24.0, True), (28.0, False)],
    ("chain d=4", 0): [(16.0, True), (32.0, True), (45.0, False), (40.0, True)],
    ("chain d=4", 1): [(16.0, True), (32.0, True), (45.0, False), (36.0, True), (38.0, False)],
    ("chain d=8", 0): [(16.0, True), (32.0, True), (45.0, True)],  # none failed: at least 45
    ("tree s=3 k=4 n=8", 0): [(16.0, False), (8.0, False)],  # none passed: below 8
}


def _probe(sweep_id: str, job_id: str, index: int, rate: float, passed: bool) -> CapacityProbeRecord:
    tpot = 40.0 if passed else 60.0
    values = {name: None for name in LevelRecord.__dataclass_fields__}
    values |= {
        "sweep_id": sweep_id,
        "job_id": job_id,
        "load_level": f"rate={rate:g}",
        "rate_rps": rate,
        "duration_s": 10.0,
        "gpus": 8,
        "num_requests": 100,
        "num_ok": 100,
        "num_errors": 0,
        "error_counts": (),
        "output_tokens": 1000,
        "tpot_p99_ms": tpot,
        "run_index": index,
    }
    return CapacityProbeRecord(
        LevelRecord(**values),  # type: ignore[arg-type]
        "rate",
        SLO,
        index,
        rate,
        passed,
        (50.0 - tpot) / 50.0,
    )


def _write_results(out: Path, probes_of: dict[tuple[str, int], list[tuple[float, bool]]]) -> Path:
    """The synthetic sweep at ``out`` with ``probes_of``'s capacity probes committed per job."""
    sweep = SyntheticSweep(configs=CONFIGS, concurrencies=(1,), requests_per_level=40)
    write_sweep(out, sweep)
    for (label, repeat), probes in probes_of.items():
        job_id = job_id_of(sweep, sweep.config(label), repeat)
        records = [_probe(sweep.sweep_id, job_id, i, rate, ok) for i, (rate, ok) in enumerate(probes)]
        write_parquet_atomic(capacity_table(records), job_part_path(out, "capacity", sweep.sweep_id, job_id))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write_results(tmp_path_factory.mktemp("capacity") / "out", PROBES)


def test_capacity_results_give_each_jobs_answer_and_bound_when_probes_stored(results: Path) -> None:
    con = connect(results)
    got = con.sql(
        "SELECT config_label, repeat_index, capacity, bound, lowest_fail, probes FROM capacity_results ORDER BY 1, 2"
    ).fetchall()
    con.close()
    assert got == [
        ("baseline", 0, 24.0, "bracketed", 28.0, 4),
        ("chain d=4", 0, 40.0, "bracketed", 45.0, 4),
        ("chain d=4", 1, 36.0, "bracketed", 38.0, 5),
        ("chain d=8", 0, 45.0, "at_least", None, 3),
        ("tree s=3 k=4 n=8", 0, None, "below", 8.0, 2),
    ]


def test_rank_credits_a_config_with_its_smallest_capacity_when_repeated(results: Path) -> None:
    con = connect(results)
    ranked = rank_by_capacity(con)
    con.close()
    assert [(c.config_label, c.capacity, c.bound, c.launches, c.probes) for c in ranked] == [
        ("chain d=8", 45.0, "at_least", 1, 3),
        ("chain d=4", 36.0, "bracketed", 2, 5),
        ("baseline", 24.0, "bracketed", 1, 4),
        ("tree s=3 k=4 n=8", None, "below", 1, 2),
    ]


def test_best_and_report_show_capacity_when_asked(results: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["best", str(results), "--objective", "capacity", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert [r["config_label"] for r in ranked] == ["chain d=8", "chain d=4", "baseline", "tree s=3 k=4 n=8"]
    assert main(["best", str(results), "--objective", "capacity"]) == 0
    text = capsys.readouterr().out
    assert "at least 45 req/s" in text and "36 req/s" in text and "below 8 req/s" in text
    report = results.parent / "report.html"
    assert main(["report", str(results), "-o", str(report)]) == 0
    page = report.read_text()
    assert "<section id='capacity'>" in page and "<figure id='plot-capacity'>" in page
    assert "36 req/s" in page and "below 8 req/s" in page


def test_best_points_at_capacity_when_the_sweep_has_no_fixed_levels(
    results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Capacity-only results: the default ranking and the report say so in one line and name
    --objective capacity; --objective capacity on results without a search names load.capacity."""
    only = tmp_path / "only"
    shutil.copytree(results, only)
    shutil.rmtree(only / "levels")
    shutil.rmtree(only / "requests")
    assert main(["best", str(only)]) == 2
    err = capsys.readouterr().err
    assert "capacity searches only" in err and "--objective capacity" in err and "Traceback" not in err
    assert main(["report", str(only), "-o", str(tmp_path / "report.html")]) == 2
    assert "capacity searches only" in capsys.readouterr().err and not (tmp_path / "report.html").exists()
    shutil.rmtree(only / "capacity")
    assert main(["best", str(only), "--objective", "capacity"]) == 2
    err = capsys.readouterr().err
    assert "no capacity search in these results" in err and "load.capacity" in err


def test_best_recommends_no_launch_and_exits_6_when_no_probe_met_the_slo(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every probe of every config failed: each config's bound is still shown, but there is no capacity,
    so no `launch:` line; one line says so and how to fix the search, exit 6 (no config meets the SLOs), as
    `best` and `--emit` when no config meets them (it used to print the first config's launch and exit 0)."""
    failing = {key: [(rate, False) for rate, _ in probes] for key, probes in PROBES.items()}
    out = _write_results(tmp_path / "out", failing)
    assert main(["best", str(out), "--objective", "capacity"]) == 6
    captured = capsys.readouterr()
    assert "below 16 req/s" in captured.out and "launch:" not in captured.out
    assert "Traceback" not in captured.err and len(captured.err.strip().splitlines()) == 2, captured.err
    assert "no config met its SLO" in captured.err and "load.capacity.lo" in captured.err
    assert main(["best", str(out), "--objective", "capacity", "--json"]) == 6
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert [r["capacity"] for r in ranked] == [None] * len(CONFIGS)
