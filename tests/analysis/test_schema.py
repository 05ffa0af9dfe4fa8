"""The result schemas: records mirror them, docs cover them, files are written whole or not at all."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import schema
from analysis.schema import CAPACITY_SCHEMA, RECORD_SCHEMAS, write_parquet_atomic

DOCS = Path(__file__).resolve().parents[2] / "docs" / "results.md"


def test_records_mirror_schemas_when_imported() -> None:
    """Every record dataclass has exactly its schema's columns, in order."""
    for record_type, table_schema in RECORD_SCHEMAS.items():
        assert tuple(f.name for f in dataclasses.fields(record_type)) == tuple(table_schema.names)


def test_docs_document_every_column_when_schemas_change() -> None:
    """docs/results.md has a table row for every column of every schema, so they cannot drift."""
    text = DOCS.read_text()
    documented = set(re.findall(r"^\| `([a-z0-9_]+)` \|", text, flags=re.MULTILINE))
    missing = {
        f"{s.metadata[b'specsweep.table'].decode()}.{name}"
        for s in (*RECORD_SCHEMAS.values(), CAPACITY_SCHEMA)
        for name in s.names
        if name not in documented
    }
    assert not missing, f"undocumented columns in docs/results.md: {sorted(missing)}"


def test_column_names_carry_units_when_numeric_measurements() -> None:
    """Latency and rate columns end in their unit."""
    for table_schema in RECORD_SCHEMAS.values():
        for name in table_schema.names:
            if any(word in name for word in ("ttft", "tpot", "itl", "e2e")):
                assert name.endswith("_ms"), name


def test_write_parquet_atomic_creates_parents_and_leaves_no_temp_when_written(tmp_path: Path) -> None:
    """The file lands at its path with the table's rows; no temporary file is left beside it."""
    table = pa.table({"a": [1, 2, 3]})
    target = tmp_path / "x" / "y" / "part-0.parquet"
    write_parquet_atomic(table, target)
    assert pq.read_table(target).equals(table)
    assert [p.name for p in target.parent.iterdir()] == ["part-0.parquet"]


def test_write_parquet_atomic_keeps_old_file_when_write_fails(tmp_path: Path) -> None:
    """A failed write leaves the previous file intact and no temporary file behind."""
    target = tmp_path / "part-0.parquet"
    write_parquet_atomic(pa.table({"a": [1]}), target)
    with pytest.raises((TypeError, AttributeError, pa.ArrowException)):
        write_parquet_atomic("not a table", target)  # type: ignore[arg-type]
    assert pq.read_table(target).column("a").to_pylist() == [1]
    assert [p.name for p in tmp_path.iterdir()] == ["part-0.parquet"]


def test_records_table_builds_struct_lists_when_error_counts_given() -> None:
    """error_counts pairs become list<struct<error_type, count>> rows."""
    names = schema.LEVELS_SCHEMA.names
    values = dict.fromkeys(names)
    values.update(
        sweep_id="s",
        job_id="j",
        load_level="concurrency=1",
        duration_s=1.0,
        gpus=1,
        num_requests=3,
        num_ok=1,
        num_errors=2,
        error_counts=(("timeout", 2),),
        output_tokens=5,
    )
    table = schema.levels_table([schema.LevelRecord(**values)])
    assert table.column("error_counts").to_pylist() == [[{"error_type": "timeout", "count": 2}]]
