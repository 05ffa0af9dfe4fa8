"""The commit path's own module (``harness.results``) on its own, without Ray: which outputs it refuses
and with what one-line error, what it publishes where, and what it reads back.

The refusals are compared as the user reads them (``str`` of the error: where, problem, fix), and a
refused claim must leave the output as it was.
"""

from __future__ import annotations

import dataclasses
import socket
import sqlite3
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis import layout
from analysis.layout import ROOT
from analysis.schema import JobRecord, write_parquet_atomic
from analysis.store import write_local_atomic
from analysis.synthetic import SyntheticSweep, standard_sweep, write_sweep
from harness.queue import QUEUE_FILE, JobQueue
from harness.results import (
    CommittedRow,
    Output,
    check_output,
    check_output_dir,
    claim_output_dir,
    commit_attempt,
    commit_jobs_row,
    committed_row,
    drop_uncommitted_parts,
    mark_leased,
    median_client_delay_us,
    output_for,
    publish_queue,
    write_sweep_row,
)
from specsweep import __version__
from specsweep.errors import ResultsError
from tests.object_store import S3Server
from workers.job import AttemptResult

SPEC = "engine: sim\n"


def _files(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


def _committed_sweep(out: Path) -> tuple[SyntheticSweep, JobRecord]:
    """A finished synthetic sweep in ``out`` and the jobs row of its first job."""
    sweep = standard_sweep(concurrencies=(1,), requests_per_level=5)
    write_sweep(out, sweep)
    (path,) = sorted(out.glob("jobs/sweep=*/job=*/*.parquet"))[:1]
    return sweep, JobRecord(**pq.read_table(path).to_pylist()[0])


def _refusal(out: Output | Path, sweep_id: str, *, resume: bool) -> str:
    with pytest.raises(ResultsError) as err:
        claim_output_dir(out, sweep_id, SPEC, resume=resume)
    return str(err.value)


def test_claim_copies_the_spec_on_a_new_output_and_on_a_resume_of_the_same_sweep(tmp_path: Path) -> None:
    """A fresh directory gets OUT/sweep.yaml; a resume of the sweep it holds rewrites it."""
    claim_output_dir(tmp_path, "s1", "first: 1\n", resume=False)
    assert (tmp_path / "sweep.yaml").read_text() == "first: 1\n"
    JobQueue(tmp_path).close()
    write_sweep_row(output_for(tmp_path).store, "s1", "first: 1\n", sglang_version=None, created_ns=1)
    claim_output_dir(tmp_path, "s1", "second: 2\n", resume=True)
    assert (tmp_path / "sweep.yaml").read_text() == "second: 2\n"


def test_claim_refuses_each_unusable_local_output_with_its_fix_and_writes_nothing(tmp_path: Path) -> None:
    """Committed results without a queue, a sweep without --resume, --resume of nothing, another sweep."""
    empty = tmp_path / "empty"
    empty.mkdir()
    assert _refusal(empty, "s1", resume=True) == (
        f"{empty}: nothing to resume: the output directory holds no sweep\n  fix: run without --resume"
    )

    orphaned = tmp_path / "orphaned"
    _committed_sweep(orphaned)
    for resume in (False, True):
        assert _refusal(orphaned, "synthetic", resume=resume) == (
            f"{orphaned}: the output holds committed results but no sweep queue (queue.sqlite is missing); "
            "running here would overwrite them\n"
            "  fix: restore OUT/queue.sqlite to resume, or choose another directory with --out"
        )

    held = tmp_path / "held"
    held.mkdir()
    JobQueue(held).close()
    assert _refusal(held, "s1", resume=False) == (
        f"{held}: the output directory already holds a sweep\n"
        "  fix: pass --resume to continue it, or choose another directory with --out"
    )
    store = output_for(held).store
    for sweep_id in ("s2", "s1"):
        write_sweep_row(store, sweep_id, SPEC, sglang_version=None, created_ns=1)
    assert _refusal(held, "s3", resume=True) == (
        f"{held}: the output directory holds sweep s1, s2, but this spec is sweep s3 (the spec changed since "
        "that sweep started)\n"
        "  fix: resume with the spec stored in OUT/sweep.yaml, or start the new spec in another --out"
    )
    for out in (empty, orphaned, held):
        assert not (out / layout.SPEC_COPY).exists()


def test_claim_refuses_an_object_store_output_naming_its_state_directory(
    s3: S3Server, tmp_path: Path
) -> None:
    """In an object store the queue lives in a local state directory: the errors name it and --state-dir."""
    uri = f"s3://{s3.new_bucket()}/sweep"
    out = output_for(uri, str(tmp_path / "state"))
    assert _refusal(out, "synthetic", resume=True) == (
        f"{uri}: nothing to resume: the output directory holds no sweep (no queue in the state directory "
        f"{out.state})\n  fix: run without --resume, or pass the sweep's --state-dir"
    )
    _, record = _committed_sweep(tmp_path / "local")
    commit_jobs_row(out, record)
    assert _refusal(out, "synthetic", resume=False) == (
        f"{uri}: the output holds committed results but no sweep queue (no queue in the local state directory "
        f"{out.state}); running here would overwrite them\n"
        "  fix: resume on the host that ran the sweep, or pass its queue's directory with --state-dir; "
        "or choose another --out"
    )
    assert out.store.read_bytes(layout.SPEC_COPY) is None


def test_check_output_dir_refuses_a_file_and_an_unmakeable_directory_and_leaves_no_probe(
    tmp_path: Path,
) -> None:
    """A file -> "is a file"; a directory that cannot be made -> its OS reason; a good one: made, empty."""
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    with pytest.raises(ResultsError) as err:
        check_output_dir(a_file)
    assert (
        str(err.value)
        == f"{a_file}: the output path is a file, not a directory\n  fix: pass a directory with --out"
    )
    with pytest.raises(ResultsError) as err:
        check_output_dir(a_file / "out")
    assert str(err.value) == (
        f"{a_file / 'out'}: cannot write to the output directory: Not a directory\n"
        "  fix: choose a writable directory with --out (or free space on its disk)"
    )
    good = tmp_path / "new" / "out"
    for _ in range(2):  # made, then found
        check_output_dir(good)
        assert good.is_dir() and _files(good) == []


def test_check_output_makes_the_state_directory_of_an_object_store_output(
    s3: S3Server, tmp_path: Path
) -> None:
    """An object store is checked for writes and its local state directory is made; a local OUT is made."""
    out = output_for(f"s3://{s3.new_bucket()}/sweep", str(tmp_path / "state"))
    check_output(out)
    assert out.state == tmp_path / "state" and out.state.is_dir() and _files(out.state) == []
    local = output_for(tmp_path / "local")
    check_output(local)
    assert local.state == tmp_path / "local" and local.state.is_dir()


def test_committed_row_reads_back_the_jobs_row_and_none_when_absent_or_damaged(tmp_path: Path) -> None:
    """The jobs row a commit wrote is the verdict; no row or an unreadable one means not committed."""
    _, record = _committed_sweep(tmp_path)
    out = output_for(tmp_path)
    failed = dataclasses.replace(record, status="failed", attempts=3, error_class="E", error_message="boom")
    commit_jobs_row(out, failed)
    assert committed_row(out, record.sweep_id, record.job_id) == CommittedRow(3, "failed", "E", "boom")
    assert committed_row(out, record.sweep_id, "0" * 16) is None
    (tmp_path / layout.job_part_path(ROOT, "jobs", record.sweep_id, record.job_id)).write_bytes(
        b"not parquet"
    )
    assert committed_row(out, record.sweep_id, record.job_id) is None


def test_commit_attempt_renames_the_workers_staged_files_into_place_on_a_local_out(tmp_path: Path) -> None:
    """A local OUT takes the worker's own files (a rename, no second copy left in ``_attempts``); the
    published table is the attempt's, under the job's committed path."""
    out = output_for(tmp_path)
    tables = ("requests", "levels", "jobs")
    data = {table: f"{table} bytes".encode() for table in tables}
    for table in tables:
        write_local_atomic(layout.attempt_path(tmp_path, "job1", 2, table), data[table])
    result = AttemptResult("job1", 2, "token", None, None, None, "host", 1.0, files=dict(data))
    commit_attempt(out, "s1", result, ("jobs", "requests"))
    assert (tmp_path / layout.job_part_path(ROOT, "requests", "s1", "job1")).read_bytes() == b"requests bytes"
    assert (tmp_path / layout.job_part_path(ROOT, "jobs", "s1", "job1")).read_bytes() == b"jobs bytes"
    assert not (tmp_path / layout.job_part_path(ROOT, "levels", "s1", "job1")).exists()
    staged = layout.attempt_path(tmp_path, "job1", 2, "jobs").parent
    assert sorted(p.name for p in staged.iterdir()) == ["levels.parquet"]  # the table not committed


def test_drop_uncommitted_parts_removes_every_table_but_the_jobs_row(tmp_path: Path) -> None:
    """What a driver that died between the renames left is removed; the commit marker stays."""
    _, record = _committed_sweep(tmp_path)
    part = {
        t: tmp_path / layout.job_part_path(ROOT, t, record.sweep_id, record.job_id)
        for t in layout.COMMIT_ORDER
    }
    for table in ("capacity", "server_metrics", "gpu_metrics"):  # tables a synthetic sweep does not write
        write_parquet_atomic(pa.table({"a": [1]}), part[table])
    drop_uncommitted_parts(output_for(tmp_path), record.sweep_id, record.job_id)
    assert [t for t, path in part.items() if path.exists()] == ["jobs"]


def test_write_sweep_row_records_the_spec_versions_host_and_calibration(tmp_path: Path) -> None:
    import ray

    store = output_for(tmp_path).store
    write_sweep_row(
        store,
        "s1",
        SPEC,
        sglang_version="0.5.23",
        created_ns=42,
        client_delay_us=(45.0, 180.0),
        input_digests='{"prompts": "p1"}',
    )
    (row,) = pq.read_table(tmp_path / layout.sweep_part_path(ROOT, "s1")).to_pylist()
    assert row == {
        "sweep_id": "s1",
        "spec_text": SPEC,
        "specsweep_version": __version__,
        "sglang_version": "0.5.23",
        "ray_version": ray.__version__,
        "host": socket.gethostname(),
        "client_delay_p50_us": 45.0,
        "client_delay_p99_us": 180.0,
        "created_unix_ns": 42,
        "input_digests": '{"prompts": "p1"}',
    }


def test_median_client_delay_is_the_median_over_this_sweeps_levels_skipping_nulls(tmp_path: Path) -> None:
    """p50 and p99 each: the middle of the sorted non-null values over the committed levels of this sweep."""
    sweep, _ = _committed_sweep(tmp_path)
    store = output_for(tmp_path).store
    assert median_client_delay_us(store, "no-such-sweep") == (None, None)
    paths = sorted(tmp_path.glob(f"levels/sweep={sweep.sweep_id}/job=*/*.parquet"))
    assert len(paths) == 4

    def set_delays(p50s: list[float | None], p99s: list[float | None]) -> None:
        for path, p50, p99 in zip(paths, p50s, p99s, strict=True):
            table = pq.read_table(path)
            for name, value in (("client_delay_p50_us", p50), ("client_delay_p99_us", p99)):
                column = pa.array([value] * table.num_rows, pa.float64())
                table = table.set_column(table.schema.get_field_index(name), name, column)
            write_parquet_atomic(table, path)

    set_delays([None] * 4, [None] * 4)  # levels without a calibration
    assert median_client_delay_us(store, sweep.sweep_id) == (None, None)
    set_delays([30.0, None, 10.0, 20.0], [300.0, 100.0, 400.0, 200.0])  # three values, and four
    assert median_client_delay_us(store, sweep.sweep_id) == (20.0, 300.0)


def test_object_store_gets_leased_marks_and_a_queue_snapshot_and_a_local_out_neither(
    s3: S3Server, tmp_path: Path
) -> None:
    """``best`` and ``status`` on another host read these; a local OUT has its own queue and attempt dirs."""
    remote = output_for(f"s3://{s3.new_bucket()}/sweep", str(tmp_path / "state"))
    local = output_for(tmp_path / "local")
    for out in (remote, local):
        out.state.mkdir(parents=True, exist_ok=True)
        queue = JobQueue(out.state)
        try:
            queue.add_jobs([("j1", "label", "{}")])
            mark_leased(out, "j1", 2)
            publish_queue(out, queue)
        finally:
            queue.close()
    assert remote.store.read_bytes(layout.leased_mark("j1", 2)) == b""
    snapshot = tmp_path / "snapshot.sqlite"
    snapshot.write_bytes(remote.store.read_bytes(layout.QUEUE_SNAPSHOT) or b"")
    with sqlite3.connect(snapshot) as con:
        assert con.execute("SELECT id FROM jobs").fetchall() == [("j1",)]
    assert _files(remote.state) == [Path(QUEUE_FILE)]  # the snapshot's temporary file is gone
    assert _files(local.state) == [Path(QUEUE_FILE)]
    assert not (local.state / layout.leased_mark("j1", 2)).exists()
