"""`specsweep sql` only reads the results: other files, writes, databases and extensions are refused,
and `--unsafe` gives the full DuckDB back."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.synthetic import SyntheticSweep
from harness.cli import main

HOSTILE = {
    "read another file": "SELECT * FROM read_csv('/etc/passwd')",
    "list another folder": "SELECT * FROM glob('/root/*')",
    "write a file": "COPY (SELECT 1 AS a) TO '{tmp}/written.csv'",
    "write into OUT": "COPY (SELECT 1 AS a) TO '{out}/jobs/written.csv'",
    "attach a database": "ATTACH '{tmp}/other.duckdb' AS other",
    "install an extension": "INSTALL httpfs",
    "load an extension": "LOAD httpfs",
    "undo the lock": "SET enable_external_access = true",
    "create a table": "CREATE TABLE t AS SELECT 1",
}


@pytest.mark.parametrize("query", list(HOSTILE.values()), ids=list(HOSTILE))
def test_sql_refuses_the_statement_when_it_reaches_outside_the_results(
    query: str,
    clear_results: tuple[Path, SyntheticSweep],
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Each query that would read, write or install something beyond the results exits 2 with one line
    that names --unsafe, and leaves nothing behind."""
    out, _ = clear_results
    code = main(["sql", str(out), query.format(tmp=tmp_path, out=out)])
    err = capsys.readouterr().err
    assert code == 2 and "--unsafe" in err and "Traceback" not in err
    assert list(tmp_path.iterdir()) == [] and not (out / "jobs" / "written.csv").exists()


def test_sql_still_answers_queries_when_read_only(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """The views, and read_parquet over the result files themselves, still work."""
    out, _ = clear_results
    assert main(["sql", str(out), "SELECT count(*) AS n FROM jobs"]) == 0
    assert "(1 row)" in capsys.readouterr().out
    files = f"{out}/levels/*/*/part-0.parquet"
    assert main(["sql", str(out), f"SELECT count(*) AS n FROM read_parquet('{files}')"]) == 0
    assert "(1 row)" in capsys.readouterr().out


def test_sql_runs_any_statement_when_unsafe(
    clear_results: tuple[Path, SyntheticSweep], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--unsafe restores full DuckDB: the same COPY writes its file."""
    out, _ = clear_results
    target = tmp_path / "written.csv"
    assert main(["sql", str(out), f"COPY (SELECT 1 AS a) TO '{target}'", "--unsafe"]) == 0
    assert target.read_text().splitlines() == ["a", "1"]


@pytest.mark.parametrize("value", ["-1", "many"])
def test_sql_refuses_max_rows_when_not_a_row_count(
    value: str, clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """--max-rows -1 used to print "0 rows, more not shown"; now it is a usage error (exit 2)."""
    out, _ = clear_results
    with pytest.raises(SystemExit) as exited:
        main(["sql", str(out), "--max-rows", value, "SELECT 1"])
    assert exited.value.code == 2 and "row count" in capsys.readouterr().err
