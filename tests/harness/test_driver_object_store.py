"""A sweep whose output is an S3 bucket (moto's S3-compatible server on 127.0.0.1), end to end.

The two-node simulated cluster of the driver tests (tests/harness/conftest.py): the driver writes the
results into the bucket and its queue into a local state directory, is SIGKILLed mid-sweep and resumed;
every job's rows are in the bucket exactly once, the jobs finished before the kill are not run again,
``status`` reads the queue from the state directory and, from a host without it, the copy in the bucket,
and ``best`` names the same winners from the bucket as from a local run of the same sweep.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from analysis import layout
from analysis.store import ResultStore, open_store
from harness.cli import main
from harness.spec import parse_spec
from tests.harness.test_driver import (  # the module's cluster, models and driver helpers
    REPO,
    _driver_cmd,
    kill_driver_when_done,
    make_spec,
    models,
    queue_state,
)
from tests.object_store import S3Server

pytestmark = pytest.mark.ray

__all__ = ["models"]  # a fixture used by name

LEVELS = 2
REQUESTS = 6
JOBS = 4  # a chain and the baseline, two launches each


def sweep_spec(models: dict[str, str], out: str) -> dict[str, Any]:
    """Two configs far apart in the simulator's model (a depth-4 chain and no speculation; neighbouring
    chains are within a tiny level's timing noise), so the winner is the model's, not the noise's."""
    return make_spec(
        models,
        Path("unused"),
        speculative={"chain_depths": [4]},
        repeats=2,
        load={
            "concurrency": [1, 4],
            "requests_per_level": REQUESTS,
            "warmup_requests": 1,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 32, "vocab_size": 256},
        },
        output_dir=out,
    )


def table_rows(store: ResultStore, table: str) -> list[dict[str, Any]]:
    """Every committed file of a table in the store, concatenated (no view, no filtering)."""
    keys = [k for k in store.list_files(table) if k.endswith(layout.PART)]
    parts = [store.read_table(key) for key in keys]
    found = [p for p in parts if p is not None]
    return pa.concat_tables(found).to_pylist() if found else []


def ranking(capsys: pytest.CaptureFixture[str], out: str) -> dict[str, list[tuple[str, float]]]:
    """``best --json``: per level the ranked configs with their objective (the winner first)."""
    assert main(["best", out, "--json"]) == 0
    selection = json.loads(capsys.readouterr().out)
    return {
        level["load_level"]: [(r["config_label"], r["objective"]) for r in level["ranked"]]
        for level in selection["levels"]
    }


def test_driver_writes_a_bucket_exactly_once_when_killed_and_resumed(
    cluster: Any,
    models: dict[str, str],
    s3: S3Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """SIGKILL the driver after two jobs commit to the bucket; --resume finishes the sweep: one commit
    per job, exact row counts, the early jobs' objects untouched; status and best read the bucket."""
    uri = f"s3://{s3.new_bucket()}/team/sweep-1"
    state = tmp_path / "state"
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(sweep_spec(models, uri)))
    env = {**os.environ, **s3.env()}
    first = _driver_cmd(spec_file, cluster, "--state-dir", str(state))
    kill_driver_when_done(first, env, state, 2, tmp_path / "first-driver.log")
    store = open_store(uri)
    sweep_id = parse_spec(sweep_spec(models, uri)).sweep_id()
    _, jobs_before, _ = queue_state(state)
    done_before = {j.id for j in jobs_before if j.state == "done"}
    assert len(done_before) >= 2
    commits = {
        j: store.read_bytes(layout.job_part_path(layout.ROOT, "jobs", sweep_id, j)) for j in done_before
    }
    assert all(commits.values())
    assert not list(state.rglob("part-0.parquet"))  # no committed table lands on the local disk

    second = subprocess.run(
        _driver_cmd(spec_file, cluster, "--state-dir", str(state), "--resume"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stdout[-2000:] + second.stderr[-3000:]

    counts, jobs, _ = queue_state(state)
    assert counts == {"pending": 0, "leased": 0, "done": JOBS, "failed": 0}
    assert all(j.attempts == 1 for j in jobs if j.id in done_before)
    for job_id, data in commits.items():  # not run again: the commit object is byte for byte the same
        assert store.read_bytes(layout.job_part_path(layout.ROOT, "jobs", sweep_id, job_id)) == data
    job_rows = table_rows(store, "jobs")
    assert sorted(r["job_id"] for r in job_rows) == sorted(j.id for j in jobs)
    assert {r["status"] for r in job_rows} == {"done"}
    assert len(table_rows(store, "levels")) == JOBS * LEVELS
    requests = [r for r in table_rows(store, "requests") if not r["warmup"]]
    assert len(requests) == JOBS * LEVELS * REQUESTS
    assert len(table_rows(store, "sweep")) == 1
    assert store.read_bytes(layout.SPEC_COPY) == spec_file.read_bytes()
    assert layout.attempted_job_ids(store) == {j.id for j in jobs}  # the driver's leased marks

    monkeypatch.setenv("SPECSWEEP_STATE_DIR", str(tmp_path / "elsewhere"))  # a host without the state
    assert main(["status", uri, "--json"]) == 0
    published = json.loads(capsys.readouterr().out)
    assert published["counts"]["done"] == JOBS and published["queue_copy"]
    assert main(["status", uri, "--state-dir", str(state), "--json"]) == 0
    live = json.loads(capsys.readouterr().out)
    assert live["queue_copy"] is None and live["counts"] == published["counts"]
    assert main(["sql", uri, "SELECT count(DISTINCT job_id) AS jobs FROM results"]) == 0
    assert f"{JOBS}" in capsys.readouterr().out.splitlines()[2]

    # `best` reads the bucket as it reads the same files on a disk: every level's ranking, numbers
    # included (an independent local sweep's winner, compared before, differed from the bucket's on a
    # busy box by the launches' own noise, which says nothing of how the bucket is read)
    local = tmp_path / "local"
    for key in store.list_files(""):
        data = store.read_bytes(key)
        assert data is not None, key
        (local / key).parent.mkdir(parents=True, exist_ok=True)
        (local / key).write_bytes(data)
    from_bucket, from_disk = ranking(capsys, uri), ranking(capsys, str(local))
    assert len(from_bucket) == LEVELS and all(
        len(ranked) == 2 for ranked in from_bucket.values()
    )  # the configs
    assert from_bucket == from_disk
