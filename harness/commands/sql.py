"""``specsweep sql OUT ["QUERY"]``: DuckDB over a sweep's results; no query opens a small shell.

The connection is in-memory and only reads the committed Parquet files, so it is safe to run next
to a sweep that is still writing (it takes no lock and never opens ``queue.sqlite``). It is read-only
twice over: only queries run (``analysis.views.split_statements``, every statement checked, the one
inside an EXPLAIN too), and DuckDB itself can reach no file: pyarrow reads the committed files for it,
and its file system, external access and extensions are off and locked (``connect(read_only=True)``),
so a statement the check missed still cannot read, create, change or delete a file. ``--unsafe`` gives a
full DuckDB instead. A query of several statements runs each and prints each result under its own
label.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from harness.commands.base import Command
from harness.output import add_format_argument, print_csv, print_json
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb

PROMPT = "specsweep> "
TABLE_ROWS = 100  # rows a table shows unless --max-rows says otherwise


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "out", metavar="OUT", help="the sweep's output: a directory, or an s3:// or gs:// URI"
    )
    parser.add_argument(
        "query",
        nargs="?",
        help="SQL over the views sweep, jobs, levels, requests, results, request_metrics, "
        "acceptance_by_position (statements separated by ';' each print their result); without it, read "
        "queries from stdin (end each with ';')",
    )
    parser.add_argument(
        "--max-rows",
        type=_row_count,
        default=None,
        metavar="N",
        help=f"rows to print per statement (default {TABLE_ROWS} as a table, all as json or csv)",
    )
    add_format_argument(parser)
    parser.add_argument(
        "--unsafe",
        action="store_true",
        help="a full DuckDB: any statement, any file the user can read or write, extensions "
        "(default: read-only over the results)",
    )


def _row_count(text: str) -> int:
    """--max-rows: a count of rows, 0 or more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text!r} is not a row count (a whole number, 0 or more)")
    return value


def run(args: argparse.Namespace) -> int:
    from analysis.store import open_store
    from analysis.views import connect, readable_results

    store = open_store(args.out)
    max_rows = args.max_rows
    if max_rows is None and args.format == "table":
        max_rows = TABLE_ROWS
    with readable_results(store):
        con = connect(store, read_only=not args.unsafe)  # refuses a directory without results first
    try:
        if args.query is not None:
            _run_query(con, args.query, max_rows, args.format, unsafe=args.unsafe, where=store.location)
            return 0
        return _shell(con, max_rows, args.format, unsafe=args.unsafe, where=store.location)
    finally:
        con.close()


def _run_query(
    con: duckdb.DuckDBPyConnection,
    query: str,
    max_rows: int | None,
    fmt: str,
    *,
    unsafe: bool,
    where: str,
) -> None:
    """Print each statement's result as it completes (as a text table, labelled when there are several),
    or as CSV (one statement), or every result as one JSON document at the end; all are checked before
    the first runs. A bad query is a user error, not a traceback, and so is a damaged result object
    (``where``: OUT)."""
    from analysis.views import split_statements

    with _query_errors(where, "QUERY"):
        statements = split_statements(query, read_only=not unsafe)
    if not statements:
        raise ResultsError("the query holds no statement", where="QUERY", fix="write a SELECT query")
    several = len(statements) > 1
    if fmt == "csv" and several:
        raise ResultsError(
            f"--format csv prints one table, and the query holds {len(statements)} statements",
            where="QUERY",
            fix="run one statement per call, or use --format json (one result per statement)",
        )
    results: list[dict[str, Any]] = []
    for i, statement in enumerate(statements, 1):
        label = f"statement {i} of {len(statements)}"
        with _query_errors(where, f"QUERY, {label}" if several else "QUERY"):
            columns, rows = _run_statement(con, statement, max_rows)
        more = max_rows is not None and len(rows) > max_rows
        shown = rows[:max_rows] if max_rows is not None else rows
        if fmt == "json":
            results.append({"statement": statement, "columns": columns, "rows": shown, "more_rows": more})
        elif fmt == "csv":
            print_csv(columns, shown)
            if more:
                print(f"specsweep sql: {max_rows} rows shown, more not (--max-rows)", file=sys.stderr)
        else:
            if several:
                print(("\n" if i > 1 else "") + f"-- {label}: {_label(statement)}")
            print(_format(columns, rows, len(rows) if max_rows is None else max_rows) if columns else "OK")
    if fmt == "json":
        print_json({"statements": results})


@contextmanager
def _query_errors(where: str, statement: str) -> Iterator[None]:
    """DuckDB's error as one line naming the statement (``statement``), or the damaged result object."""
    import duckdb

    from analysis.views import damaged_results, is_damaged_object

    try:
        yield
    except duckdb.PermissionException as err:
        raise ResultsError(
            f"query refused: {err}",
            where=statement,
            fix="`specsweep sql` reads only the results' views; pass --unsafe for a full DuckDB",
        ) from None
    except duckdb.Error as err:
        if is_damaged_object(err):
            raise damaged_results(err, where) from None
        raise ResultsError(
            f"query failed: {err}",
            where=statement,
            fix="check the SQL; `SELECT * FROM information_schema.columns` lists every view's columns",
        ) from None


def _run_statement(
    con: duckdb.DuckDBPyConnection, statement: str, max_rows: int | None
) -> tuple[list[str], list[tuple[Any, ...]]]:
    """One statement's columns and rows (one more than ``max_rows``, to tell that more exist); no
    columns for a statement without a result (under --unsafe)."""
    relation = con.sql(statement)
    if relation is None:
        return [], []
    rows = relation.limit(max_rows + 1).fetchall() if max_rows is not None else relation.fetchall()
    return relation.columns, rows


def _label(statement: str) -> str:
    """A statement on one line, cut to fit a terminal."""
    text = " ".join(statement.split())
    return text if len(text) <= 80 else text[:77] + "..."


def _format(columns: list[str], rows: list[tuple[Any, ...]], max_rows: int) -> str:
    """Columns aligned, cut at max_rows with a note."""
    shown = rows[:max_rows]
    cells = [[_cell(v) for v in row] for row in shown]
    widths = [max([len(c)] + [len(r[i]) for r in cells]) for i, c in enumerate(columns)]
    lines = ["  ".join(c.ljust(w) for c, w in zip(columns, widths, strict=True))]
    lines.append("  ".join("-" * w for w in widths))
    lines += ["  ".join(v.ljust(w) for v, w in zip(r, widths, strict=True)) for r in cells]
    lines.append(
        f"({len(shown)} row{'s' if len(shown) != 1 else ''}{', more not shown' if len(rows) > max_rows else ''})"
    )
    return "\n".join(lines)


def _cell(value: object) -> str:
    if value is None:
        return "NULL"
    if isinstance(value, float):
        return f"{value:.6g}"
    text = str(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _shell(
    con: duckdb.DuckDBPyConnection, max_rows: int | None, fmt: str, *, unsafe: bool, where: str
) -> int:
    """Read ';'-terminated queries from stdin until EOF; a failed query prints its error and goes on."""
    interactive = sys.stdin.isatty()
    if interactive:
        print("views: sweep, jobs, levels, requests, results, request_metrics, acceptance_by_position")
        print("end each query with ';', Ctrl-D to quit")
    buffer: list[str] = []
    status = 0
    while True:
        if interactive:
            print(PROMPT if not buffer else "      ...> ", end="", flush=True)
        line = sys.stdin.readline()
        if not line:
            break
        buffer.append(line)
        if line.rstrip().endswith(";"):
            query = "".join(buffer).strip().rstrip(";")
            buffer.clear()
            try:
                _run_query(con, query, max_rows, fmt, unsafe=unsafe, where=where)
            except ResultsError as err:
                print(f"error: {err.problem}", file=sys.stderr)
                status = 2
    return status


COMMAND = Command(
    name="sql",
    help="query a sweep's results with DuckDB (views: sweep, jobs, levels, requests, results, ...)",
    add_arguments=add_arguments,
    run=run,
)
