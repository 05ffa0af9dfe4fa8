"""Goodput: requests meeting per-request SLOs, counted per level, ranked by, and read from the spec."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import duckdb
import pytest

from analysis.goodput import parse_request_slos
from analysis.select import select_best
from analysis.synthetic import write_sweep
from analysis.views import connect
from specsweep.errors import ResultsError

from .conftest import clear_sweep

# Tight enough that some requests of every level miss, loose enough that some meet.
REQUEST_SLO = "ttft_ms<=90,tpot_ms<=9"


def _direct_goodput(out: Path, clauses: str) -> dict[tuple[str, str], tuple[float, float]]:
    """Per (config, level): (goodput_rps, goodput_share) counted straight from the Parquet files."""
    con = duckdb.connect()
    limits = " AND ".join(f"coalesce({clause}, true)" for clause in clauses.split(","))
    rows = con.sql(
        f"""
        WITH req AS (
            SELECT job AS job_id, load_level,
                   error_type IS NULL AND {limits} AS good
            FROM read_parquet('{out}/requests/*/*/part-0.parquet', hive_partitioning = true)
            WHERE NOT warmup),
        counted AS (SELECT job_id, load_level, sum(good::INT) AS good, count(*) AS n FROM req GROUP BY ALL)
        SELECT j.config_label, c.load_level, c.good / l.duration_s, c.good / c.n
        FROM counted c
        JOIN read_parquet('{out}/levels/*/*/part-0.parquet') l USING (job_id, load_level)
        JOIN read_parquet('{out}/jobs/*/*/part-0.parquet') j USING (job_id)
        """
    ).fetchall()
    return {(label, level): (rps, share) for label, level, rps, share in rows}


def test_select_best_goodput_equals_direct_count_when_request_slos_given(clear_results) -> None:  # type: ignore[no-untyped-def]
    """goodput_rps and goodput_share of every ranked config equal a count over the raw request rows."""
    out, _ = clear_results
    selection = select_best(connect(out), out, request_slos=parse_request_slos(REQUEST_SLO))
    truth = _direct_goodput(out, REQUEST_SLO)
    shares = []
    for level in selection.levels:
        for r in level.ranked:
            rps, share = truth[(r.config_label, level.load_level)]
            assert r.goodput_rps == pytest.approx(rps, rel=1e-12)
            assert r.goodput_share == pytest.approx(share, rel=1e-12)
            shares.append(share)
    assert min(shares) < 0.5 < max(shares)  # the SLO bites somewhere and spares somewhere


def test_select_best_ranks_by_goodput_when_objective_is_goodput(clear_results) -> None:  # type: ignore[no-untyped-def]
    """--objective goodput ranks by goodput_rps, highest first; throughput and goodput are aliases."""
    out, _ = clear_results
    slos = parse_request_slos(REQUEST_SLO)
    by_goodput = select_best(connect(out), out, objective="goodput", request_slos=slos)
    by_tokens = select_best(connect(out), out, objective="throughput", request_slos=slos)
    assert by_goodput.objective == "goodput_rps" and by_tokens.objective == "output_tok_s_per_gpu"
    for level in by_goodput.levels:
        values = [r.objective for r in level.ranked]
        assert values == sorted(values, reverse=True)
        assert values == [r.goodput_rps for r in level.ranked]
    assert any(r.goodput_rps for lv in by_goodput.levels for r in lv.ranked)


def test_best_cli_names_goodputs_unit_and_direction_when_ranking_by_goodput(  # type: ignore[no-untyped-def]
    clear_results, capsys
) -> None:
    """`best --objective goodput` says what the ranked numbers are: good requests per second of the window,
    the more the better (the header a user reads before the table)."""
    from harness.cli import main

    out, _ = clear_results
    assert main(["best", str(out), "--objective", "goodput", "--request-slo", REQUEST_SLO]) == 0
    # the header line (a slow machine may print progress lines first)
    header = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("sweep "))
    assert "ranked by goodput_rps (requests/s, higher is better)" in header


def test_select_best_filters_by_goodput_share_when_level_slo_names_it(clear_results) -> None:  # type: ignore[no-untyped-def]
    """A level SLO on goodput_share keeps only configs whose share of good requests is high enough."""
    out, _ = clear_results
    slos = parse_request_slos(REQUEST_SLO)
    from analysis.select import SLO_METRICS
    from analysis.slo import parse_slos

    selection = select_best(
        connect(out), out, request_slos=slos, slos=parse_slos("goodput_share>=0.5", SLO_METRICS)
    )
    assert all(r.goodput_share >= 0.5 for lv in selection.levels for r in lv.ranked)  # type: ignore[operator]
    assert any(
        "goodput_share" in reason for lv in selection.levels for e in lv.excluded for reason in e.reasons
    )


def test_select_best_refuses_goodput_when_no_request_slo(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Ranking by goodput without per-request SLOs is a user error naming the flag to add."""
    out, _ = clear_results
    with pytest.raises(ResultsError, match="per-request SLOs") as info:
        select_best(connect(out), out, objective="goodput")
    assert "--request-slo" in str(info.value.fix)


def test_parse_request_slos_names_known_columns_when_metric_unknown() -> None:
    """A per-request SLO on a level aggregate (a p99) is refused with the per-request columns listed."""
    with pytest.raises(ResultsError, match="ttft_p99_ms") as info:
        parse_request_slos("ttft_p99_ms<=100")
    assert "ttft_ms" in str(info.value.fix) and info.value.where == "--request-slo"


def test_best_cli_uses_spec_request_slo_when_flag_absent(tmp_path: Path) -> None:
    """The spec's request_slo defines goodput for `best`; --request-slo overrides it."""
    spec = "request_slo:\n  ttft_ms: 90\n  tpot_ms: 9\n"
    write_sweep(tmp_path, clear_sweep(concurrencies=(1, 16), requests_per_level=200), spec_text=spec)

    def best(*extra: str) -> dict:  # type: ignore[type-arg]
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "harness.cli",
                "best",
                str(tmp_path),
                "--objective",
                "goodput",
                "--json",
                *extra,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)  # type: ignore[no-any-return]

    from_spec = best()
    assert from_spec["request_slos"] == ["ttft_ms<=90", "tpot_ms<=9"]
    truth = _direct_goodput(tmp_path, REQUEST_SLO)
    winner = from_spec["levels"][0]["ranked"][0]
    assert winner["objective"] == pytest.approx(truth[(winner["config_label"], "concurrency=1")][0])
    overridden = best("--request-slo", "e2e_ms<=100000")
    assert overridden["request_slos"] == ["e2e_ms<=100000"]
    assert all(r["goodput_share"] == 1.0 for lv in overridden["levels"] for r in lv["ranked"])
