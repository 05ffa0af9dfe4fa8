"""`specsweep sql` only reads the results: other files, writes, databases and extensions are refused,
twice over (the statement check, and a connection on which DuckDB can reach no file), every statement
of a query runs and prints, and `--unsafe` gives the full DuckDB back."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest

from analysis.store import open_store
from analysis.synthetic import SyntheticSweep
from analysis.views import connect, split_statements
from harness.cli import main
from specsweep.errors import ResultsError

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
    "write through EXPLAIN ANALYZE": "EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{out}/jobs/written.csv'",
    "write through EXPLAIN (ANALYZE)": "EXPLAIN (ANALYZE) COPY (SELECT 1 AS a) TO '{tmp}/written.csv'",
    "export the database": "EXPORT DATABASE '{tmp}/exported'",
    "run a pragma": "PRAGMA enable_profiling",
    "call a procedure": "CALL enable_logging(storage = 'file', storage_path = '{tmp}/logs')",
    "log to a file from a SELECT": "SELECT * FROM enable_logging(storage = 'file', storage_path = '{tmp}/logs')",
    "run SQL given as text": "SELECT * FROM query('SELECT 1')",
    "update extensions": "UPDATE EXTENSIONS",
    "read a result file directly": "SELECT * FROM read_parquet('{out}/jobs/*/*/part-0.parquet')",
    "hide a write after a query": "SELECT 1; EXPLAIN ANALYZE COPY (SELECT 1 AS a) TO '{tmp}/written.csv'",
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
    """The views answer queries, DESCRIBE, SUMMARIZE and EXPLAIN ANALYZE of a query."""
    out, _ = clear_results
    for query in (
        "SELECT count(*) AS n FROM jobs",
        "WITH r AS (SELECT * FROM results) SELECT count(DISTINCT config_label) AS n FROM r",
        "DESCRIBE levels",
        "SUMMARIZE jobs",
        "EXPLAIN ANALYZE SELECT count(*) FROM requests",
        "EXPLAIN (FORMAT json) SELECT 1",
    ):
        assert main(["sql", str(out), query]) == 0, (query, capsys.readouterr().err)
        assert "row" in capsys.readouterr().out


@pytest.fixture
def own_results(clear_results: tuple[Path, SyntheticSweep], tmp_path: Path) -> Path:
    """A copy of the clear sweep this test alone may damage."""
    out = tmp_path / "out"
    shutil.copytree(clear_results[0], out)
    return out


def _best(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    assert main(["best", str(out), "--json", "--bootstrap", "100"]) == 0
    return capsys.readouterr().out


# The forgeries of issue 26: EXPLAIN ANALYZE runs the COPY it explains, over a committed file.
FORGERIES = {
    "levels x100": (
        "levels",
        "{explain} COPY (SELECT * REPLACE (output_tok_s_per_gpu * 100 AS output_tok_s_per_gpu) "
        "FROM levels WHERE job_id = '{job}') TO '{path}' (FORMAT parquet)",
    ),
    "jobs emptied": ("jobs", "{explain} COPY (SELECT * FROM jobs WHERE false) TO '{path}' (FORMAT parquet)"),
}


@pytest.mark.parametrize("explain", ["EXPLAIN ANALYZE", "EXPLAIN (ANALYZE)"])
@pytest.mark.parametrize("forgery", list(FORGERIES.values()), ids=list(FORGERIES))
def test_sql_leaves_committed_files_and_best_unchanged_when_explain_analyze_copies_over_them(
    forgery: tuple[str, str], explain: str, own_results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`EXPLAIN ANALYZE COPY ... TO 'OUT/levels/...'` (or over a jobs file) is refused with one line and
    exit 2: the file's bytes and `best`'s answer stay as they were (it used to forge a 171x speedup, or
    make a job vanish, with exit 0)."""
    table, template = forgery
    target = sorted(own_results.glob(f"{table}/sweep=*/job=*/part-0.parquet"))[0]
    job = target.parent.name.removeprefix("job=")
    before, ranked = target.read_bytes(), _best(own_results, capsys)
    query = template.format(explain=explain, job=job, path=target)
    assert main(["sql", str(own_results), query]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2 and "--unsafe" in err, err
    assert target.read_bytes() == before
    assert _best(own_results, capsys) == ranked


@pytest.mark.parametrize(
    "statement",
    [
        "COPY (SELECT * FROM jobs WHERE false) TO '{path}' (FORMAT parquet)",
        "EXPORT DATABASE '{dir}'",
        "ATTACH '{dir}/other.duckdb' AS other",
        "SELECT * FROM read_csv('/etc/passwd')",
        "INSTALL httpfs",
        "SET disabled_filesystems = ''",
    ],
)
def test_connect_read_only_reaches_no_file_when_the_statement_check_is_bypassed(
    statement: str, own_results: Path
) -> None:
    """The second layer holds on its own: on a read-only connection DuckDB can reach no file, so a
    statement the check let through still cannot write, read beyond the views, or undo the lock (with
    the old `allowed_directories` the COPY overwrote the jobs file)."""
    target = sorted(own_results.glob("jobs/sweep=*/job=*/part-0.parquet"))[0]
    before = target.read_bytes()
    con = connect(open_store(own_results), read_only=True)
    try:
        with pytest.raises((duckdb.PermissionException, duckdb.InvalidInputException)):
            con.sql(statement.format(path=target, dir=own_results / "jobs")).fetchall()
        assert con.sql("SELECT count(*) FROM jobs").fetchall() == [(4,)]
    finally:
        con.close()
    assert target.read_bytes() == before
    assert sorted(p.name for p in (own_results / "jobs").iterdir()) == ["sweep=synthetic"]


def test_sql_prints_every_result_when_the_query_holds_several_statements(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """`sql OUT "SELECT 1; SELECT 2"` prints both results, each under a label naming its statement (the
    first one used to be dropped silently)."""
    out, _ = clear_results
    assert main(["sql", str(out), "SELECT 41 + 1 AS first_answer; SELECT count(*) AS jobs_n FROM jobs;"]) == 0
    printed = capsys.readouterr().out
    assert "-- statement 1 of 2: SELECT 41 + 1 AS first_answer\nfirst_answer" in printed
    assert "-- statement 2 of 2: SELECT count(*) AS jobs_n FROM jobs\njobs_n" in printed
    assert "\n42 " in printed or "\n42\n" in printed


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


WRITES = {
    "COPY": "COPY levels TO 'x.parquet'",
    "EXPLAIN ANALYZE COPY": "EXPLAIN ANALYZE COPY levels TO 'x.parquet'",
    "EXPLAIN (options) COPY": "EXPLAIN (FORMAT json, ANALYZE) COPY levels TO 'x.parquet'",
    "EXPLAIN with comments": "EXPLAIN /* a */ ANALYZE /* b */ COPY levels TO 'x.parquet'",
    "EXPORT": "EXPORT DATABASE 'x'",
    "PRAGMA": "PRAGMA enable_profiling",
    "CALL": "CALL enable_logging()",
    "enable_logging in a SELECT": 'SELECT * FROM "main"."enable_logging"(storage = \'file\')',
    "query() in a SELECT": "SELECT * FROM query('SELECT 1')",
    "UPDATE EXTENSIONS": "UPDATE EXTENSIONS",
    "second of two": "SELECT 1; ATTACH 'x.duckdb'",
}


@pytest.mark.parametrize("query", list(WRITES.values()), ids=list(WRITES))
def test_split_statements_refuses_the_input_when_a_statement_could_write(query: str) -> None:
    """The first layer holds on its own: every statement is checked by DuckDB's parser, the one inside an
    EXPLAIN too, and a state-changing table function in a SELECT is refused."""
    with pytest.raises(ResultsError, match=r"not allowed|changes DuckDB's state"):
        split_statements(query, read_only=True)


def test_split_statements_returns_each_query_when_all_only_read() -> None:
    """Queries and EXPLAINs of queries pass, split into the statements that run, in order."""
    query = "SELECT 1;\nWITH a AS (SELECT 2) SELECT * FROM a; EXPLAIN (FORMAT json) FROM jobs; DESCRIBE jobs;"
    assert split_statements(query, read_only=True) == [
        "SELECT 1",
        "WITH a AS (SELECT 2) SELECT * FROM a",
        "EXPLAIN (FORMAT json) FROM jobs",
        "DESCRIBE jobs",
    ]


def test_sql_prints_the_results_before_the_failure_when_a_later_statement_fails(
    clear_results: tuple[Path, SyntheticSweep], capsys: pytest.CaptureFixture[str]
) -> None:
    """A failing second statement does not swallow the first one's result: it is printed, then one line
    names the statement that failed (exit 2)."""
    out, _ = clear_results
    assert main(["sql", str(out), "SELECT 41 + 1 AS first_answer; SELECT no_such_column FROM jobs"]) == 2
    captured = capsys.readouterr()
    assert "first_answer" in captured.out and "42" in captured.out
    assert "QUERY, statement 2 of 2: query failed" in captured.err and "Traceback" not in captured.err


def test_sql_counts_no_requests_when_no_committed_job_has_request_rows(
    own_results: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A sweep whose committed jobs wrote no request rows (each failed before its first request) still
    answers over the read-only connection: the requests view is there, with its job_id column, and
    holds no job's rows; the jobs are all there (4 configs of the clear sweep)."""
    shutil.rmtree(own_results / "requests")
    assert (
        main(
            [
                "sql",
                str(own_results),
                "SELECT count(DISTINCT job_id) AS n FROM requests; SELECT count(*) AS jobs FROM jobs",
            ]
        )
        == 0
    )
    lines = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert lines[1:4] == ["n", "-", "0"]
    assert lines[7:10] == ["jobs", "----", "4"]


def test_connect_read_only_reads_the_sweep_and_job_ids_when_the_results_path_holds_a_partition_name(
    clear_results: tuple[Path, SyntheticSweep], tmp_path: Path
) -> None:
    """Results kept under a folder named like a partition (``sweep=old/job=x/out``) are read with the
    ids of their own files, the same 4 jobs of one sweep as where they were written: only the path below
    each table's folder is a partition."""
    out, _ = clear_results
    moved = tmp_path / "sweep=old" / "job=x" / "out"
    shutil.copytree(out, moved)
    query = "SELECT DISTINCT sweep_id, job_id FROM requests ORDER BY ALL"
    expected = connect(out).sql(query).fetchall()
    assert len(expected) == 4 and len({sweep for sweep, _ in expected}) == 1
    assert connect(moved, read_only=True).sql(query).fetchall() == expected
