"""``specsweep compare A B``: B / A per level and config with intervals over launches, ties, what changed."""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import statistics
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from analysis.compare import CSV_COLUMNS
from analysis.synthetic import SyntheticConfig, SyntheticSweep, job_id_of, write_sweep
from harness.cli import main

LEVELS = ("concurrency=1", "concurrency=16")
DIGESTS_A = {"prompts": "p" * 64, "drafter": "a" * 64, "target": "t" * 64, "engine": "sglang 0.5.23"}


def _sweep(sweep_id: str, configs: tuple[SyntheticConfig, ...], **overrides: object) -> SyntheticSweep:
    params: dict[str, object] = {
        "configs": configs,
        "concurrencies": (1, 16),
        "requests_per_level": 300,
        "sweep_id": sweep_id,
        "seed": 5,
    }
    params.update(overrides)
    return SyntheticSweep(**params)  # type: ignore[arg-type]


BASELINE = SyntheticConfig("baseline")
CHAIN = SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.15)


@pytest.fixture(scope="module")
def drafters(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A: drafter v1; B: drafter v2, whose chain's every TPOT is half of A's (same request draws, same
    seed), on SGLang 0.5.24 and with the chain on 4 GPUs instead of 8; the baseline is the same run."""
    root = tmp_path_factory.mktemp("compare")
    a = _sweep("sweep-a", (BASELINE, CHAIN))
    b = _sweep(
        "sweep-b",
        (BASELINE, dataclasses.replace(CHAIN, launch_tpot_factors=(0.5,), gpus=4)),
        draft_model_path="org/drafter-v2",
        server_versions={"sglang": "0.5.24", "ray": "2.60.0"},
    )
    write_sweep(root / "a", a, spec_text="model_path: /m\ndrafter: {path: /d/v1}\n", input_digests=DIGESTS_A)
    write_sweep(
        root / "b",
        b,
        spec_text="model_path: /m\ndrafter: {path: /d/v2}\n",
        input_digests={**DIGESTS_A, "drafter": "b" * 64},
    )
    return root / "a", root / "b"


def _level_values(out: Path, sweep: SyntheticSweep, label: str, metric: str, level: str) -> list[float]:
    """The stored levels value of each repeat of ``label`` at ``level``: the hand computation's input."""
    cfg = sweep.config(label)
    values = []
    for repeat in range(cfg.repeats):
        job = job_id_of(sweep, cfg, repeat)
        rows = pq.read_table(out / "levels" / f"sweep={sweep.sweep_id}" / f"job={job}" / "part-0.parquet")
        (value,) = [r[metric] for r in rows.to_pylist() if r["load_level"] == level]
        values.append(value)
    return values


def _compare_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict:  # type: ignore[type-arg]
    assert main(["compare", *args, "--format", "json", "--bootstrap", "400"]) == 0
    return json.loads(capsys.readouterr().out)  # type: ignore[no-any-return]


def _row(data: dict, level: str, label: str, metric: str) -> dict:  # type: ignore[type-arg]
    (row,) = [
        r
        for r in data["pairs"][0]["rows"]
        if (r["load_level"], r["config_label"], r["metric"]) == (level, label, metric)
    ]
    return row  # type: ignore[no-any-return]


def test_compare_ratio_is_b_over_a_of_the_stored_values_when_a_drafter_halves_tpot(
    drafters: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """The ratio is B's value over A's (median over repeats, as best ranks), per level and config: a
    drafter that halves every TPOT reads 0.5x on TPOT p50, better, with an interval around it; throughput
    per GPU is the stored B value over A's; the unchanged baseline is 1.000x and a tie."""
    a, b = drafters
    data = _compare_json(capsys, str(a), str(b))
    sweep_a = _sweep("sweep-a", (BASELINE, CHAIN))
    sweep_b = _sweep("sweep-b", (BASELINE, dataclasses.replace(CHAIN, gpus=4)))
    for level in LEVELS:
        tpot = _row(data, level, "chain d=4", "tpot_p50_ms")
        assert tpot["ratio"] == pytest.approx(0.5, rel=1e-9)
        assert tpot["ratio_low"] < 0.5 < tpot["ratio_high"] < 1
        assert tpot["verdict"] == "better" and tpot["better"] == "lower"
        throughput = _row(data, level, "chain d=4", "output_tok_s_per_gpu")
        (va,) = _level_values(a, sweep_a, "chain d=4", "output_tok_s_per_gpu", level)
        (vb,) = _level_values(b, sweep_b, "chain d=4", "output_tok_s_per_gpu", level)
        assert (throughput["a"], throughput["b"]) == (pytest.approx(va), pytest.approx(vb))
        assert throughput["ratio"] == pytest.approx(vb / va, rel=1e-12)
        assert throughput["verdict"] == "better" and throughput["ratio_low"] > 1
        baseline = _row(data, level, "baseline", "output_tok_s_per_gpu")
        assert baseline["ratio"] == pytest.approx(1.0)
        assert baseline["ratio_low"] < 1 < baseline["ratio_high"] and baseline["verdict"] == "tie"


def test_compare_states_a_tie_when_launch_to_launch_noise_exceeds_the_difference(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The interval resamples launches (repeats), not only requests: B 7% faster per launch than A is
    "better" with one launch each, but a tie when three launches of each spread by +-30%; the point ratio
    is the median over B's repeats over the median over A's."""
    spread_a, spread_b = (0.7, 1.0, 1.4), (0.65, 0.93, 1.3)
    one = {
        "a": _sweep("one-a", (dataclasses.replace(CHAIN, launch_tpot_factors=(1.0,)),)),
        "b": _sweep("one-b", (dataclasses.replace(CHAIN, launch_tpot_factors=(0.93,)),), seed=6),
    }
    three = {
        "a": _sweep("three-a", (dataclasses.replace(CHAIN, repeats=3, launch_tpot_factors=spread_a),)),
        "b": _sweep(
            "three-b", (dataclasses.replace(CHAIN, repeats=3, launch_tpot_factors=spread_b),), seed=6
        ),
    }
    verdicts = {}
    for name, pair in (("one", one), ("three", three)):
        for side, sweep in pair.items():
            write_sweep(tmp_path / name / side, sweep)
        data = _compare_json(
            capsys, str(tmp_path / name / "a"), str(tmp_path / name / "b"), "--metrics", "tpot_p50_ms"
        )
        row = _row(data, "concurrency=16", "chain d=4", "tpot_p50_ms")
        median_a = statistics.median(
            _level_values(tmp_path / name / "a", pair["a"], "chain d=4", "tpot_p50_ms", "concurrency=16")
        )
        median_b = statistics.median(
            _level_values(tmp_path / name / "b", pair["b"], "chain d=4", "tpot_p50_ms", "concurrency=16")
        )
        assert row["ratio"] == pytest.approx(median_b / median_a, rel=1e-12)
        assert (row["a_repeats"], row["b_repeats"]) == ((1, 1) if name == "one" else (3, 3))
        verdicts[name] = row["verdict"]
    assert verdicts == {"one": "better", "three": "tie"}


def test_compare_lists_what_changed_when_drafter_engine_and_flags_differ(
    drafters: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """What changed between A and B: the SGLang version, the drafter's input digest, the spec's drafter
    path, and a launch flag with the configs it concerns; never where a server listened or the node-local
    drafter copy (launch-only facts), nor inputs that did not change."""
    a, b = drafters
    changes = {c["what"]: c for c in _compare_json(capsys, str(a), str(b))["pairs"][0]["changes"]}
    assert changes["sglang version"] | {"configs": None} == {
        "what": "sglang version",
        "a": "0.5.23",
        "b": "0.5.24",
        "configs": None,
    }
    assert (changes["input drafter"]["a"], changes["input drafter"]["b"]) == ("a" * 64, "b" * 64)
    assert (changes["spec drafter.path"]["a"], changes["spec drafter.path"]["b"]) == ("/d/v1", "/d/v2")
    assert changes["flag --tp-size"] == {
        "what": "flag --tp-size",
        "a": "8",
        "b": "4",
        "configs": ["chain d=4"],
    }
    assert set(changes) == {"sglang version", "input drafter", "spec drafter.path", "flag --tp-size"}
    assert main(["compare", str(a), str(b), "--bootstrap", "200"]) == 0
    text = capsys.readouterr().out
    assert "input drafter: aaaaaaaaaaaa -> bbbbbbbbbbbb" in text
    assert "flag --tp-size: 8 -> 4  (chain d=4)" in text


def test_compare_prints_the_same_rows_when_asked_for_csv_json_table_and_html(
    drafters: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """JSON has a stable shape (version 1: sweeps, pairs with changes and rows); CSV is a header of
    CSV_COLUMNS and one row per JSON row with the same numbers; the table and the HTML page show each
    ratio with its interval and verdict."""
    a, b = drafters
    data = _compare_json(capsys, str(a), str(b))
    assert set(data) == {"version", "by", "metrics", "confidence", "replicates", "seed", "sweeps", "pairs"}
    assert data["version"] == 1 and data["by"] == "level"
    assert [s["sweep_id"] for s in data["sweeps"]] == ["sweep-a", "sweep-b"]
    (pair,) = data["pairs"]
    assert set(pair) == {"reference", "sweep", "changes", "rows", "only_in_reference", "only_in_sweep"}
    assert len(pair["rows"]) == 2 * 2 * 3  # levels x configs x default metrics
    assert all(set(row) == set(CSV_COLUMNS[2:]) for row in pair["rows"])
    assert main(["compare", str(a), str(b), "--format", "csv", "--bootstrap", "400"]) == 0
    rows = list(csv.reader(io.StringIO(capsys.readouterr().out)))
    assert tuple(rows[0]) == CSV_COLUMNS and len(rows) == 1 + len(pair["rows"])
    for line, row in zip(rows[1:], pair["rows"], strict=True):
        record = dict(zip(CSV_COLUMNS, line, strict=True))
        assert (record["reference"], record["sweep"]) == (str(a), str(b))
        assert float(record["ratio"]) == row["ratio"] and record["verdict"] == row["verdict"]
    page = tmp_path / "compare.html"
    assert main(["compare", str(a), str(b), "--bootstrap", "400", "--html", str(page)]) == 0
    text = capsys.readouterr().out
    row = _row(data, "concurrency=16", "chain d=4", "tpot_p50_ms")
    shown = f"{row['ratio']:.3f}x   [{row['ratio_low']:.3f}, {row['ratio_high']:.3f}]   B better"
    assert shown in text
    html = page.read_text()
    assert "<section id='comparison'>" in html and "<script" not in html
    assert f"<td>{row['ratio']:.3f}x</td><td>[{row['ratio_low']:.3f}, {row['ratio_high']:.3f}]</td>" in html
    assert "<tr class='tie'>" in html and "<tr class='better'>" in html


def test_compare_ranks_percentiles_per_category_and_refuses_rates_when_by_category(
    drafters: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """--by category compares percentiles over each category's requests (one category here: the same as
    the level's); a rate has no per-category value and is refused in one line (exit 2)."""
    a, b = drafters
    data = _compare_json(capsys, str(a), str(b), "--by", "category")
    assert data["metrics"] == ["tpot_p50_ms", "ttft_p99_ms"]
    rows = [
        r
        for r in data["pairs"][0]["rows"]
        if r["config_label"] == "chain d=4" and r["metric"] == "tpot_p50_ms"
    ]
    assert [(r["load_level"], r["category"]) for r in rows] == [(level, "random_ids") for level in LEVELS]
    assert all(r["ratio"] == pytest.approx(0.5, rel=1e-9) and r["verdict"] == "better" for r in rows)
    assert main(["compare", str(a), str(b), "--by", "category", "--metrics", "throughput"]) == 2
    err = capsys.readouterr().err
    assert "has no value per request category" in err and "Traceback" not in err


def test_compare_refuses_in_one_line_when_given_one_sweep_or_an_unknown_metric(
    drafters: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Two sweeps at least, and metrics best can rank by (goodput needs per-request SLOs): exit 2, one
    line with the fix, nothing printed on stdout."""
    a, b = drafters
    assert main(["compare", str(a)]) == 2
    assert main(["compare", str(a), str(b), "--metrics", "goodput"]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "Traceback" not in captured.err
    assert "two or more sweeps" in captured.err and "not a metric compare can resample" in captured.err


def test_report_holds_the_comparison_section_when_compared_with_a_reference_sweep(
    drafters: tuple[Path, Path], capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """`report B --compare-with A` embeds the comparison `compare A B` prints: the halved TPOT's ratio
    and interval, the tie of the unchanged baseline, and what changed (the drafter); without the option
    the report has no comparison section."""
    a, b = drafters
    data = _compare_json(capsys, str(a), str(b))
    row = _row(data, "concurrency=16", "chain d=4", "tpot_p50_ms")
    page = tmp_path / "report.html"
    args = ["report", str(b), "-o", str(page), "--bootstrap", "400"]
    assert main([*args, "--compare-with", str(a)]) == 0
    html = page.read_text()
    section = html.split("<section id='comparison'>", 1)[1].split("</section>", 1)[0]
    assert (
        f"<td>{row['ratio']:.3f}x</td><td>[{row['ratio_low']:.3f}, {row['ratio_high']:.3f}]</td>" in section
    )
    assert "<tr class='tie'>" in section and "drafter" in section
    assert main(args) == 0
    assert "<section id='comparison'>" not in page.read_text()
