"""A model-search sweep on a simulated Ray cluster (two 8-GPU nodes), killed and resumed.

The models and spec helpers are test_driver's; the cluster is the driver tests' (tests/harness/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cli import main
from tests.harness.test_driver import (  # noqa: F401  (fixtures used by name)
    LEVELS,
    REPO,
    REQUESTS_PER_LEVEL,
    _driver_cmd,
    _wait_done,
    make_spec,
    models,
    queue_state,
    rows,
)

pytestmark = pytest.mark.ray


def test_search_sweep_resumes_without_relaunching_when_driver_is_killed(
    cluster: Any,
    models: dict[str, str],  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """strategy: model on two slots: the first two launches run at once on both slots; after a SIGKILL
    with two launches done, --resume finishes the search; no config is launched twice, no finished job
    runs again, and every launched job's rows are there exactly once. status shows the belief.

    Chains d=2..4 (four candidates with the baseline, at most four launches): the rule is the resume's,
    which needs the three seeds (baseline, deepest and shallowest chain) so that launches are still in
    flight when the driver is killed after two; d=5 and d=6 only added launches after the resume."""
    out = tmp_path / "out"
    data = make_spec(
        models,
        out,
        speculative={"chain_depths": [2, 3, 4]},
        search={"strategy": "model"},
        env={"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_LOAD_DELAY_S": "0.5"},
    )
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    first_log = tmp_path / "first-driver.log"
    with open(first_log, "wb") as log_file:
        first = subprocess.Popen(
            _driver_cmd(spec_file, cluster),
            cwd=REPO,
            env=dict(os.environ),
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_done(out, 2, timeout_s=120, log=first_log)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    _, jobs_before, _ = queue_state(out)
    done_before = {j.id for j in jobs_before if j.state == "done"}
    second = subprocess.run(
        _driver_cmd(spec_file, cluster, "--resume"), cwd=REPO, capture_output=True, text=True, timeout=300
    )
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    counts, jobs, attempts = queue_state(out)
    assert counts["pending"] == counts["leased"] == counts["failed"] == 0 and counts["done"] == len(jobs)
    assert len(jobs) >= 3  # the baseline and both chain seeds at least
    for job in jobs:
        done = [a for a in attempts if a.job_id == job.id and a.outcome == "done"]
        assert len(done) == 1, job
        if job.id in done_before:
            assert job.attempts == 1
    first_two = sorted(attempts, key=lambda a: a.started_ns)[:2]
    assert {a.slot for a in first_two} == {0, 1}
    assert first_two[1].started_ns < (first_two[0].finished_ns or 0)  # both slots busy at once
    job_rows = rows(out, "jobs")
    assert sorted(r["job_id"] for r in job_rows) == sorted(j.id for j in jobs)
    assert len({r["config_label"] for r in job_rows}) == len(job_rows)  # no config launched twice
    assert len(rows(out, "levels")) == len(jobs) * LEVELS
    assert len(rows(out, "requests")) == len(jobs) * LEVELS * REQUESTS_PER_LEVEL
    assert main(["status", str(out), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["node_hours"] > 0 and status["search"]["finished"]
    assert [lv["level"] for lv in status["search"]["levels"]] == ["concurrency=1", "concurrency=2"]
    assert all(lv["best_label"] for lv in status["search"]["levels"])
