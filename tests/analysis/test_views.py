"""DuckDB views over committed results: visibility, read-only access, other readers agree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pytest

from analysis.layout import attempt_path
from analysis.schema import write_parquet_atomic
from analysis.synthetic import SyntheticSweep
from analysis.views import VIEW_NAMES, connect
from specsweep.errors import ResultsError


def _snapshot(out: Path) -> dict[str, tuple[int, int]]:
    return {str(p): (p.stat().st_mtime_ns, p.stat().st_size) for p in out.rglob("*")}


def test_connect_registers_every_view_when_sweep_finished(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Each view answers, and requests/levels have one row set per committed job."""
    out, sweep = clear_results
    con = connect(out)
    for view in VIEW_NAMES:
        con.sql(f"SELECT count(*) FROM {view}").fetchall()
    jobs = con.sql("SELECT count(*) FROM jobs").fetchall()[0][0]
    levels = con.sql("SELECT count(*) FROM levels").fetchall()[0][0]
    assert jobs == len(sweep.configs)
    assert levels == len(sweep.configs) * len(sweep.concurrencies)
    ids = con.sql("SELECT count(DISTINCT job_id) FROM requests").fetchall()[0][0]
    assert ids == len(sweep.configs)


def test_connect_writes_nothing_when_reading(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Querying leaves every file of OUT untouched and creates none (no lock, no database file)."""
    out, _ = clear_results
    before = _snapshot(out)
    con = connect(out)
    con.sql("SELECT sum(completion_tokens) FROM requests").fetchall()
    con.close()
    assert _snapshot(out) == before


def test_views_hide_job_when_jobs_file_not_yet_committed(tmp_path: Path, clear_results) -> None:  # type: ignore[no-untyped-def]
    """Requests and levels renamed in before the jobs file (a crash mid-commit) stay invisible."""
    out, sweep = clear_results
    partial = tmp_path / "out"
    for table in ("requests", "levels", "jobs", "sweep"):
        for src in (out / table).rglob("part-0.parquet"):
            dst = partial / src.relative_to(out)
            dst.parent.mkdir(parents=True, exist_ok=True)
            dst.write_bytes(src.read_bytes())
    victim = next((partial / "jobs").rglob("part-0.parquet"))
    job_id = victim.parent.name.removeprefix("job=")
    victim.unlink()
    con = connect(partial)
    assert con.sql("SELECT count(*) FROM requests WHERE job_id = ?", params=[job_id]).fetchall()[0][0] == 0
    assert con.sql("SELECT count(*) FROM levels WHERE job_id = ?", params=[job_id]).fetchall()[0][0] == 0
    assert con.sql("SELECT count(DISTINCT job_id) FROM requests").fetchall()[0][0] == len(sweep.configs) - 1


@pytest.mark.parametrize("make", ["missing", "empty", "file", "attempts_only"])
def test_connect_refuses_directory_when_no_committed_results(tmp_path: Path, make: str) -> None:
    """No committed jobs file -> ResultsError naming the directory and what is expected."""
    out = tmp_path / "out"
    if make == "empty":
        out.mkdir()
    elif make == "file":
        out.write_text("x")
    elif make == "attempts_only":
        write_parquet_atomic(pa.table({"a": [1]}), attempt_path(out, "job1", 1, "requests"))
    with pytest.raises(ResultsError) as err:
        connect(out)
    assert str(out) in str(err.value)
    if make == "attempts_only":
        assert "in progress" in str(err.value)
    if make in ("missing", "file"):
        assert err.value.fix == "pass the output directory of `specsweep run`"


def test_connect_reads_every_row_when_the_results_path_holds_a_quote(
    tmp_path: Path, clear_results: tuple[Path, SyntheticSweep]
) -> None:
    """A results directory named ``bob's sweep`` reads the same rows as the original: 4 configs x 3
    levels = 12 levels, and 12 x (600 measured + 12 warmup) = 7344 requests."""
    out, _ = clear_results
    quoted = tmp_path / "bob's sweep"
    shutil.copytree(out, quoted)
    con = connect(quoted)
    assert con.sql("SELECT count(*) FROM jobs").fetchall() == [(4,)]
    assert con.sql("SELECT count(*) FROM levels").fetchall() == [(12,)]
    assert con.sql("SELECT count(*) FROM requests").fetchall() == [(7344,)]


def test_acceptance_by_position_is_tail_fraction_when_histogram_known(tmp_path: Path) -> None:
    """Position k acceptance = steps accepting >= k drafts / all steps, from a 3-entry histogram."""
    from analysis.synthetic import SyntheticConfig, write_sweep

    sweep = SyntheticSweep(
        configs=(SyntheticConfig("chain d=3", "EAGLE3", 2, 1, 3, accept_length=2.0),),
        concurrencies=(1,),
        requests_per_level=50,
    )
    write_sweep(tmp_path, sweep)
    con = connect(tmp_path)
    (hist,) = con.sql("SELECT correct_drafts_histogram FROM levels").fetchall()[0]
    rows = con.sql("SELECT position, acceptance FROM acceptance_by_position ORDER BY position").fetchall()
    total = sum(hist)
    assert [r[0] for r in rows] == [1, 2]
    assert rows[0][1] == pytest.approx((hist[1] + hist[2]) / total)
    assert rows[1][1] == pytest.approx(hist[2] / total)


def test_same_answer_when_read_with_duckdb_polars_pandas(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Output tokens per job agree across DuckDB views, Polars and pandas on the same files."""
    import pandas as pd
    import polars as pl

    out, _ = clear_results
    con = connect(out)
    duck = dict(
        con.sql(
            "SELECT job_id, sum(completion_tokens) FROM requests "
            "WHERE NOT warmup AND error_type IS NULL GROUP BY job_id"
        ).fetchall()
    )
    frame = (
        pl.scan_parquet(str(out / "requests" / "*" / "*" / "part-0.parquet"), hive_partitioning=True)
        .filter(~pl.col("warmup") & pl.col("error_type").is_null())
        .group_by("job")
        .agg(pl.col("completion_tokens").sum())
        .collect()
    )
    polars_sums = dict(zip(frame["job"].to_list(), frame["completion_tokens"].to_list(), strict=True))
    pdf = pd.read_parquet(out / "requests", columns=["job", "warmup", "error_type", "completion_tokens"])
    pdf = pdf[~pdf["warmup"] & pdf["error_type"].isna()]
    pandas_sums = {
        str(k): int(v) for k, v in pdf.groupby("job", observed=True)["completion_tokens"].sum().items()
    }
    levels_duck = dict(con.sql("SELECT job_id, sum(output_tokens) FROM levels GROUP BY job_id").fetchall())
    assert duck == polars_sums == pandas_sums == levels_duck
    assert len(duck) == 4


def test_category_results_split_accept_length_and_speedup_when_requests_have_categories(
    tmp_path: Path,
) -> None:
    """Per config x level x category: token-weighted accept length of that category's requests, and the
    baseline's mean TPOT over the config's for the same category (where the drafter is weak shows)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    from analysis.synthetic import SyntheticConfig, write_sweep

    sweep = SyntheticSweep(
        configs=(
            SyntheticConfig("baseline"),
            SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=3.0),
        ),
        concurrencies=(4,),
        requests_per_level=40,
    )
    write_sweep(tmp_path, sweep)
    for path in (tmp_path / "requests").rglob("*.parquet"):
        table = pq.read_table(path)
        n = table.num_rows
        code = pa.array([i % 2 == 0 for i in range(n)])
        tokens = pa.array([100] * n, pa.int32())
        spec = pc.is_valid(table["spec_verify_ct"]).to_pylist()[0]
        table = table.set_column(
            table.schema.get_field_index("completion_tokens"), "completion_tokens", tokens
        )
        table = table.set_column(
            table.schema.get_field_index("category"), "category", pc.if_else(code, "code", "chat")
        )
        tpot = pc.if_else(code, 5.0 if spec else 20.0, 10.0 if spec else 12.0)
        table = table.set_column(table.schema.get_field_index("tpot_ms"), "tpot_ms", tpot)
        if spec:
            verify = pc.if_else(code, pa.scalar(25, pa.int32()), pa.scalar(50, pa.int32()))
            table = table.set_column(table.schema.get_field_index("spec_verify_ct"), "spec_verify_ct", verify)
        table = table.set_column(
            table.schema.get_field_index("error_type"), "error_type", pa.nulls(n, pa.string())
        )
        pq.write_table(table, path)
    con = connect(tmp_path)
    rows = con.sql(
        "SELECT config_label, category, accept_length_mean, speedup FROM category_results ORDER BY ALL"
    ).fetchall()
    assert rows == [
        ("baseline", "chat", None, pytest.approx(1.0)),
        ("baseline", "code", None, pytest.approx(1.0)),
        ("chain d=4", "chat", pytest.approx(2.0), pytest.approx(1.2)),
        ("chain d=4", "code", pytest.approx(4.0), pytest.approx(4.0)),
    ]
