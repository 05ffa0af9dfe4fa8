"""``--format table|json|csv``: the one way commands print machine-readable output.

``table`` is the command's own text for people. ``json`` is one JSON document (indent 2, non-finite
numbers as null, dates and other values as text) whose shape each command documents in docs/results.md.
``csv`` is a header row then one row per record, through the csv module (quoting as needed, null as an
empty cell, lists and objects as compact JSON text).
"""

from __future__ import annotations

import argparse
import csv
import datetime
import decimal
import json
import math
import sys
from collections.abc import Iterable, Sequence
from typing import IO, TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console

FORMATS = ("table", "json", "csv")


def add_format_argument(parser: argparse.ArgumentParser, *, json_alias: bool = False) -> None:
    """``--format`` (default table); with ``json_alias`` also ``--json``, the older spelling of
    ``--format json``."""
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="table",
        help="table for people (default), json (one document) or csv (a header, then one row per record)",
    )
    if json_alias:
        parser.add_argument(
            "--json", dest="format", action="store_const", const="json", help="the same as --format json"
        )


def plain(value: Any) -> Any:
    """``value`` as JSON can hold it: non-finite floats null, decimals float, dates ISO text, tuples lists."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, decimal.Decimal):
        return plain(float(value))
    if isinstance(value, datetime.timedelta):
        return value.total_seconds()
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        return [plain(v) for v in value]
    if value is None or isinstance(value, str | int | bool):
        return value
    return str(value)


def print_json(document: Any) -> None:
    """One JSON document on stdout (strict JSON: no NaN)."""
    print(json.dumps(plain(document), indent=2, allow_nan=False))


def print_csv(columns: Sequence[str], rows: Iterable[Sequence[Any]]) -> None:
    """A header and the rows on stdout, as the csv module writes them."""
    writer = csv.writer(sys.stdout, lineterminator="\n")
    writer.writerow(columns)
    for row in rows:
        writer.writerow([_cell(v) for v in row])


def _cell(value: Any) -> Any:
    """A CSV cell: null empty, floats in full (repr), lists and objects as compact JSON."""
    value = plain(value)
    if value is None:
        return ""
    if isinstance(value, list | dict):
        return json.dumps(value, separators=(",", ":"))
    return value


# A console's width when its output is not a terminal: wide enough that no cell of a table is ever folded
PIPE_WIDTH = 100_000


def table_console(file: IO[str] | None = None) -> Console:
    """The rich console for tables people read. On a terminal it wraps to the terminal's width; into a pipe
    or a file (``| less``, ``> out.txt``, CI logs) rich would fold every cell at 80 columns, cutting job
    ids and paths across lines, so there it does not wrap at all."""
    from rich.console import Console

    stream = file if file is not None else sys.stdout
    if stream.isatty():
        return Console(file=file)
    return Console(file=file, width=PIPE_WIDTH)
