"""The driver on a simulated Ray cluster: two 8-GPU nodes, the simulated SGLang server, real files.

One cluster for the session's driver modules (``cluster`` in tests/harness/conftest.py, a Ray job per
module); a test that takes a node away puts a fresh one back. Every sweep is tiny: two load levels of a few short requests at a fast simulator time
scale, so each job takes a few seconds.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil
import pyarrow.dataset as ds
import pytest
import yaml

from harness.cli import main
from harness.commands.plan import validated_plan
from harness.driver import SweepSummary, _acquire_driver_lock, run_sweep
from harness.plan import Plan, unchecked_plan
from harness.progress import LogProgress
from harness.queue import open_read_only, read_attempts, read_counts, read_jobs
from harness.spec import SweepSpec, parse_spec
from specsweep.errors import ClusterError
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config
from workers.node.launcher import group_members, pid_dir

pytestmark = pytest.mark.ray

REPO = Path(__file__).resolve().parents[2]
LEVELS = 2
REQUESTS_PER_LEVEL = 3


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A tiny DeepSeek-V3-shaped target config and a speculators-format EAGLE3 drafter."""
    root = tmp_path_factory.mktemp("models")
    target = write_target_config(root / "target", TINY)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")
    return {"target": str(target), "drafter": str(drafter)}


def make_spec(models: dict[str, str], out: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "engine": "sim",
        "model_path": models["target"],
        "drafter": {"path": models["drafter"], "format": "speculators"},
        "base_args": ["--tp-size", "8"],
        "speculative": {
            "chain_depths": [2, 3, 4, 5],
            "num_steps": [2],
            "topk": [2],
            "num_draft_tokens": [3, 5],
        },
        "baseline": True,
        "load": {
            "concurrency": [1, 2],
            "requests_per_level": REQUESTS_PER_LEVEL,
            "warmup_requests": 1,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 24, "vocab_size": 256},
        },
        "retries": 1,
        "timeouts": {"startup_s": 30, "level_s": 60, "stop_s": 5, "placement_s": 60},
        "env": {"SPECSWEEP_SIM_TIME_SCALE": "0.05"},
        "output_dir": str(out),
    }
    data.update(changes)
    return data


def plan_of(spec: SweepSpec) -> Plan:
    args = argparse.Namespace(sglang_python=None, builtin_only=True, target_config=None, draft_config=None)
    return validated_plan(spec, args)


def run(
    spec_data: dict[str, Any], plan: Plan | None = None, *, resume: bool = False
) -> tuple[SweepSummary, str]:
    spec = parse_spec(spec_data)
    stream = io.StringIO()
    summary = run_sweep(
        spec,
        yaml.safe_dump(spec_data),
        plan or plan_of(spec),
        Path(spec.output_dir),
        ray_address="auto",
        resume=resume,
        progress=LogProgress(stream),
    )
    return summary, stream.getvalue()


def rows(out: Path, table: str) -> list[dict[str, Any]]:
    folder = out / table
    if not folder.exists():
        return []
    return ds.dataset(folder, partitioning="hive").to_table().to_pylist()


def queue_state(out: Path) -> tuple[dict[str, int], list[Any], list[Any]]:
    conn = open_read_only(out)
    try:
        return read_counts(conn), read_jobs(conn), read_attempts(conn)
    finally:
        conn.close()


def committed_jobs_file(out: Path, sweep_id: str, job_id: str) -> Path:
    return out / "jobs" / f"sweep={sweep_id}" / f"job={job_id}" / "part-0.parquet"


def server_routes(job_id: str) -> dict[str, set[int]]:
    """A job's live server processes, found three independent ways.

    The environment the worker gives its server (SPECSWEEP_JOB_ID), the server log under the job's
    folder that the server's stdout is open on, and the process groups the node's pid files record for
    the job. A "no process left" check must not pass because one of them stopped marking the servers, so
    it asks all three, and a test shows each finds the servers while a job runs.
    """
    routes: dict[str, set[int]] = {"env": set(), "log": set(), "pid_file": set()}
    log_dir = f"{os.sep}logs{os.sep}{job_id}{os.sep}"
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.environ().get("SPECSWEEP_JOB_ID") == job_id:
                routes["env"].add(proc.pid)
            if log_dir in os.readlink(f"/proc/{proc.pid}/fd/1"):
                routes["log"].add(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, OSError):
            continue
    for path in pid_dir().glob("*.json"):
        try:
            entry = json.loads(path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            continue
        if entry["job_id"] == job_id:
            routes["pid_file"].update(group_members(int(entry["pgid"])))
    return routes


def processes_of_job(job_id: str) -> list[int]:
    """Live processes that any of the three routes says serve ``job_id``."""
    return sorted(set().union(*server_routes(job_id).values()))


def serving(job_id: str) -> bool:
    """The job's server is up: each of the three routes finds it."""
    return all(server_routes(job_id).values())


def test_driver_runs_every_job_exactly_once_when_two_nodes(
    cluster: Any, models: dict[str, str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Six speculative configs + the baseline on two nodes: each job done once, exact row counts."""
    out = tmp_path / "out"
    summary, log = run(make_spec(models, out))
    assert summary.counts == {"pending": 0, "leased": 0, "done": 7, "failed": 0}, log
    _counts, jobs, attempts = queue_state(out)
    assert [j.attempts for j in jobs] == [1] * 7
    assert len(attempts) == 7 and {a.outcome for a in attempts} == {"done"}
    assert {a.node for a in attempts} and len({a.slot for a in attempts}) == 2  # both slots worked
    job_rows = rows(out, "jobs")
    assert sorted(r["job_id"] for r in job_rows) == sorted(j.id for j in jobs)
    assert {r["status"] for r in job_rows} == {"done"}
    baseline = [r for r in job_rows if r["config_label"] == "baseline"]
    assert len(baseline) == 1 and baseline[0]["effective_speculative_algorithm"] is None
    assert len(rows(out, "levels")) == 7 * LEVELS
    requests = rows(out, "requests")
    assert len(requests) == 7 * LEVELS * REQUESTS_PER_LEVEL
    assert all(r["error_type"] is None for r in requests)
    assert len(rows(out, "sweep")) == 1
    for job in jobs:  # one attempt, one server log, nothing left running
        assert sorted(p.name for p in (out / "logs" / job.id).iterdir()) == ["attempt-1"]
        assert processes_of_job(job.id) == []
    assert main(["status", str(out), "--json"]) == 0
    status = json.loads(capsys.readouterr().out)
    assert status["counts"]["done"] == 7 and len(status["attempts"]) == 7


def test_driver_stores_server_metrics_per_level_when_server_serves_metrics(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A sim sweep with --enable-metrics stores a metrics series for every job x level, and a DuckDB
    query over it gives each level's mean running requests within 5% of the load generator's own
    in-flight count (busy request-seconds over the level's duration). The simulated nodes' GPUs are
    not real: the jobs row says why gpu_metrics is empty. Real speed, so each request lasts long next
    to the client's and the HTTP stack's per-request overhead (which the server does not count as
    running, and which grows on a loaded CI box)."""
    from analysis.views import connect

    out = tmp_path / "out"
    spec = make_spec(
        models,
        out,
        base_args=["--tp-size", "8", "--enable-metrics"],
        speculative={"chain_depths": [4]},
        load={
            "concurrency": [2, 4],
            "duration_s": 2.0,
            "warmup_requests": 2,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 512, "vocab_size": 256},
        },
        env={"SPECSWEEP_SIM_TIME_SCALE": "1.0"},
        telemetry={"server_metrics_interval_s": 0.05, "profile_steps": 3},
    )
    summary, log = run(spec)
    assert summary.counts["done"] == 2, log
    con = connect(out)
    compared = con.execute(
        """
        WITH flight AS (  -- requests' time in flight inside the level's window
            SELECT r.job_id, r.load_level,
                   sum(greatest(0, least(r.end_ns, l.window_end_s * 1e9)
                                   - greatest(r.start_ns, l.window_start_s * 1e9))) / 1e9 AS busy_s
            FROM requests r JOIN levels l USING (sweep_id, job_id, load_level) WHERE NOT r.warmup GROUP BY ALL
        )
        SELECT m.job_id, m.load_level, m.samples, m.mean, f.busy_s / l.duration_s AS in_flight
        FROM server_metrics_by_level m
        JOIN levels l USING (sweep_id, job_id, load_level)
        JOIN flight f USING (job_id, load_level)
        WHERE m.metric = 'sglang:num_running_reqs' ORDER BY ALL
        """
    ).fetchall()
    assert len(compared) == 2 * 2, compared
    for job_id, level, samples, running, in_flight in compared:
        assert samples >= 20, (job_id, level)
        assert running == pytest.approx(in_flight, rel=0.05), (job_id, level, running, in_flight)
    offs = con.execute("SELECT DISTINCT server_metrics_off IS NULL, gpu_metrics_off FROM jobs").fetchall()
    assert len(offs) == 1 and offs[0][0] is True and offs[0][1]
    assert con.execute("SELECT count(*) FROM gpu_metrics").fetchone() == (0,)
    counted = con.execute(
        "SELECT m.metric, m.kind, m.delta, m.rate_per_s FROM server_metrics_by_level m JOIN jobs j USING (job_id) "
        "WHERE m.metric IN ('sglang:spec_verify_calls_total', 'sglang:num_running_reqs') "
        "AND j.effective_speculative_algorithm IS NOT NULL"
    ).fetchall()
    assert sorted(kind for _, kind, *_ in counted) == ["counter"] * 2 + ["gauge"] * 2
    for metric, kind, delta, rate in counted:  # counters: what the level added, and per second
        if kind == "counter":
            assert delta > 0 and rate > 0, (metric, delta, rate)
        else:
            assert delta is None and rate is None, metric
    for job_id, level, *_ in compared:  # each level's bounded profiler capture, next to the server log
        assert (out / "logs" / job_id / "attempt-1" / "profile" / level).is_dir(), (job_id, level)
    report = tmp_path / "report.html"
    assert main(["report", str(out), "-o", str(report)]) == 0
    page = report.read_text()
    server_plot = page[page.index("id='plot-server-timeline'") : page.index("id='plot-gpu-timeline'")]
    drawn = re.search(r"Plotly.newPlot\('plot-server-timeline-div', (\[.*?\]), \{", server_plot)
    assert drawn is not None and "not sampled" not in server_plot
    assert any(trace["y"] for trace in json.loads(drawn.group(1)))  # the samples are plotted
    assert "not sampled: NVML did not start" in page[page.index("id='plot-gpu-timeline'") :]


def test_driver_refuses_second_driver_when_sweep_is_locked(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """The named-actor lock: a second driver on the same sweep (even with another --out) is refused, and
    the refusal leaves no queue in its OUT, so once the first driver is gone a plain run (no --resume)
    starts there."""
    data = make_spec(models, tmp_path / "out", speculative=None)
    spec = parse_spec(data)
    lock = _acquire_driver_lock(spec.sweep_id(), tmp_path / "elsewhere")
    try:
        with pytest.raises(ClusterError, match="another driver is running sweep"):
            run(data)
    finally:
        import ray

        ray.kill(lock)
    assert not (tmp_path / "out" / "queue.sqlite").exists()
    summary, _ = run(data)
    assert summary.counts["done"] == 1 and not summary.interrupted


def test_driver_refuses_then_fails_once_when_base_args_have_a_bad_flag(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A flag SGLang does not know: the plan drops every point naming it; forced into a run (no
    validation), the job fails at once as bad_args, not retried, and the error names the flag."""
    data = make_spec(
        models, tmp_path / "out", base_args=["--tp-size", "8", "--bogus-flag", "1"], speculative=None
    )
    plan = plan_of(parse_spec(data))
    assert plan.jobs == ()
    assert all("--bogus-flag" in " ".join(v.reasons) for v in plan.dropped)
    summary, log = run(data, unchecked_plan(parse_spec(data)))
    assert summary.counts["failed"] == 1, log
    _, jobs, attempts = queue_state(tmp_path / "out")
    assert jobs[0].attempts == 1 and jobs[0].error_class == "bad_args"
    assert "--bogus-flag" in (jobs[0].error_text or "")
    assert len(attempts) == 1 and "--bogus-flag" in (attempts[0].log_tail or "")
    (row,) = rows(tmp_path / "out", "jobs")
    assert row["status"] == "failed" and row["error_class"] == "bad_args" and row["attempts"] == 1
    assert rows(tmp_path / "out", "requests") == []


def test_driver_fails_after_retries_when_server_crashes_every_time(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """Servers that crash mid-run on every attempt: each job gets 1 + retries attempts, the retry on
    the other slot, each recorded with its class and log tail; then the job fails, with no results."""
    env = {
        "SPECSWEEP_SIM_TIME_SCALE": "0.05",
        "SPECSWEEP_SIM_FAULT": "crash_after",
        "SPECSWEEP_SIM_FAULT_AFTER": "2",
    }
    data = make_spec(models, tmp_path / "out", speculative={"chain_depths": [2]}, env=env, retries=1)
    summary, log = run(data)
    assert summary.counts["failed"] == 2, log
    _, jobs, attempts = queue_state(tmp_path / "out")
    for job in jobs:
        assert job.attempts == 2 and job.error_class == "crash"
        tries = [a for a in attempts if a.job_id == job.id]
        assert [a.error_class for a in tries] == ["crash", "crash"]
        assert all("illegal memory access" in (a.log_tail or "") for a in tries)
        assert all("illegal memory access" in (a.error_text or "") for a in tries)
        assert tries[0].slot != tries[1].slot  # retried on the other slot
    job_rows = rows(tmp_path / "out", "jobs")
    assert [(r["status"], r["attempts"]) for r in job_rows] == [("failed", 2), ("failed", 2)]
    assert rows(tmp_path / "out", "requests") == []


def test_driver_fails_before_launch_with_prompts_class_when_node_cannot_read_the_prompt_set(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A prompt file no node has: each attempt fails as prompts_unreadable before any server starts (no
    server log), naming the file; retried on the other slot like any node-local failure."""
    missing = tmp_path / "on-no-node" / "prompts.jsonl"
    load = {
        **make_spec(models, tmp_path)["load"],
        "workload": {"kind": "prompt_set", "path": str(missing), "max_tokens": 8},
    }
    data = make_spec(models, tmp_path / "out", speculative=None, load=load)
    summary, log = run(data)
    assert summary.counts["failed"] == 1, log
    _, jobs, attempts = queue_state(tmp_path / "out")
    assert jobs[0].error_class == "prompts_unreadable" and jobs[0].attempts == 2
    assert all(str(missing) in (a.error_text or "") and not a.log_tail for a in attempts)
    assert rows(tmp_path / "out", "requests") == []


def test_driver_fails_level_with_flush_class_when_cache_flush_is_refused(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A server that refuses /flush_cache: the job fails with cache_flush_failed after its retry (a busy
    server is transient), and with allow_failed_flush it is done and its levels say the cache was not
    flushed."""
    env = {"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_FAULT": "flush_refused"}
    load = make_spec(models, tmp_path)["load"]
    strict = {**load, "flush_timeout_s": 0.5}
    data = make_spec(models, tmp_path / "out", speculative={"chain_depths": [2]}, env=env, load=strict)
    summary, log = run(data)
    assert summary.counts["failed"] == 2, log
    _, jobs, attempts = queue_state(tmp_path / "out")
    assert {(job.error_class, job.attempts) for job in jobs} == {("cache_flush_failed", 2)}
    assert all("flush_cache" in (a.error_text or "") for a in attempts)
    allowed = {**strict, "allow_failed_flush": True}
    data = make_spec(models, tmp_path / "kept", speculative={"chain_depths": [2]}, env=env, load=allowed)
    summary, log = run(data)
    assert summary.counts["done"] == 2, log
    levels = rows(tmp_path / "kept", "levels")
    assert len(levels) == 2 * LEVELS and {r["cache_flushed"] for r in levels} == {False}
    assert sorted(r["run_index"] for r in levels) == [0, 0, 1, 1]


def test_driver_times_out_and_leaves_no_process_when_server_hangs_at_startup(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A server that never becomes healthy: startup_timeout, and no process of it is left."""
    env = {"SPECSWEEP_SIM_FAULT": "hang_before_ready"}
    timeouts = {"startup_s": 3, "level_s": 60, "stop_s": 2, "placement_s": 60}
    data = make_spec(models, tmp_path / "out", speculative=None, env=env, retries=0, timeouts=timeouts)
    summary, log = run(data)
    assert summary.counts["failed"] == 1, log
    _, jobs, _attempts = queue_state(tmp_path / "out")
    assert jobs[0].error_class == "startup_timeout" and jobs[0].attempts == 1
    assert processes_of_job(jobs[0].id) == []


def test_driver_errors_in_bounded_time_when_placement_is_impossible(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """16 GPUs per server on 8-GPU nodes: a ClusterError naming what was asked and what exists."""
    timeouts = {"startup_s": 30, "level_s": 60, "stop_s": 5, "placement_s": 3}
    data = make_spec(models, tmp_path / "out", speculative=None, gpus_per_server=16, timeouts=timeouts)
    started = time.monotonic()
    with pytest.raises(ClusterError) as caught:
        run(data)
    assert time.monotonic() - started < 30
    message = str(caught.value)
    assert "16 GPUs" in message and "at most 8 on one node" in message and "16 in total" in message


def _wait_done(out: Path, at_least: int, timeout_s: float, log: Path) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if (out / "queue.sqlite").exists():
            try:
                counts, _, _ = queue_state(out)
            except sqlite3.OperationalError:
                counts = {"done": 0}
            if counts["done"] >= at_least:
                return
        time.sleep(0.2)
    raise AssertionError(f"fewer than {at_least} jobs done within {timeout_s} s:\n{log.read_text()[-3000:]}")


def kill_driver_when_done(cmd: list[str], env: dict[str, str], state: Path, at_least: int, log: Path) -> None:
    """Run a driver, SIGKILL it once its queue (in ``state``) shows ``at_least`` jobs done."""
    with open(log, "wb") as log_file:
        driver = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT)
    try:
        _wait_done(state, at_least, timeout_s=180, log=log)
    finally:
        driver.send_signal(signal.SIGKILL)
        driver.wait()


def _driver_cmd(spec_file: Path, cluster: Any, *extra: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "harness.cli",
        "run",
        str(spec_file),
        "--ray-address",
        cluster.address,
        "--builtin-only",
        *extra,
    ]


def test_driver_resumes_without_rerunning_when_killed_mid_sweep(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """SIGKILL the driver after two jobs are done; --resume completes the sweep, the finished jobs
    are not run again (one attempt, files untouched) and row counts are exact.

    Four chains and the baseline (five jobs on two slots, not the seven of the full grid): the kill after
    two done still leaves jobs in flight and pending for the resume, which is all the rule needs; the
    trees only added a round of launches."""
    out = tmp_path / "out"
    spec_file = tmp_path / "sweep.yaml"
    data = make_spec(models, out, speculative={"chain_depths": [2, 3, 4, 5]})
    spec_file.write_text(yaml.safe_dump(data))
    env = dict(os.environ)
    first_log = tmp_path / "first-driver.log"
    with open(first_log, "wb") as log_file:
        first = subprocess.Popen(
            _driver_cmd(spec_file, cluster), cwd=REPO, env=env, stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        _wait_done(out, 2, timeout_s=120, log=first_log)
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait()
    _, jobs_before, _ = queue_state(out)
    done_before = {j.id for j in jobs_before if j.state == "done"}
    sweep_id = parse_spec(data).sweep_id()
    stamps = {j: committed_jobs_file(out, sweep_id, j).stat().st_mtime_ns for j in done_before}
    second = subprocess.run(
        _driver_cmd(spec_file, cluster, "--resume"),
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert second.returncode == 0, second.stderr[-3000:]
    counts, jobs, _ = queue_state(out)
    assert counts == {"pending": 0, "leased": 0, "done": 5, "failed": 0}
    assert 2 <= len(done_before) < 5  # the kill left work for the resume
    for job in jobs:
        if job.id in done_before:
            assert job.attempts == 1
            assert sorted(p.name for p in (out / "logs" / job.id).iterdir()) == ["attempt-1"]
    for job_id, stamp in stamps.items():
        assert committed_jobs_file(out, sweep_id, job_id).stat().st_mtime_ns == stamp
    assert len(rows(out, "jobs")) == 5
    assert len(rows(out, "levels")) == 5 * LEVELS
    assert len(rows(out, "requests")) == 5 * LEVELS * REQUESTS_PER_LEVEL


def test_driver_stops_servers_and_releases_leases_when_sigterm(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """SIGTERM mid-job: the driver stops the servers, releases the leases (no failure counted), exits
    130 and says how to resume; no server process of the sweep is left. Before the signal, each of the
    ways ``processes_of_job`` looks finds both running servers, so the final check cannot pass vacuously."""
    out = tmp_path / "out"
    spec_file = tmp_path / "sweep.yaml"
    data = make_spec(models, out, speculative={"chain_depths": [2]}, env={"SPECSWEEP_SIM_TIME_SCALE": "0.3"})
    spec_file.write_text(yaml.safe_dump(data))
    log = tmp_path / "driver.log"
    with open(log, "wb") as log_file:
        driver = subprocess.Popen(
            _driver_cmd(spec_file, cluster), cwd=REPO, stdout=log_file, stderr=subprocess.STDOUT
        )
    try:
        deadline = time.monotonic() + 120
        running: list[str] = []
        routes_seen: dict[str, dict[str, set[int]]] = {}
        while time.monotonic() < deadline:
            if (out / "queue.sqlite").exists():
                running = [j.id for j in queue_state(out)[1] if j.state == "leased"]
                routes_seen.update({job_id: server_routes(job_id) for job_id in running})
                if len(running) == 2 and all(all(routes_seen[j].values()) for j in running):
                    break
            time.sleep(0.2)
        assert len(running) == 2, f"servers found per route: {routes_seen}\n{log.read_text()[-3000:]}"
        for job_id in running:
            assert all(server_routes(job_id).values()), (job_id, server_routes(job_id))
        driver.send_signal(signal.SIGTERM)
        assert driver.wait(timeout=60) == 130, log.read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()
    counts, jobs, attempts = queue_state(out)
    assert counts["leased"] == 0 and counts["failed"] == 0
    assert all(j.failures == 0 for j in jobs)
    assert {a.outcome for a in attempts} <= {"released", "done"} and "released" in {
        a.outcome for a in attempts
    }
    assert "--resume" in log.read_text()
    for job in jobs:
        assert processes_of_job(job.id) == []


def test_driver_retries_on_another_node_when_one_node_crashes_servers(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A node whose servers crash mid-run (sim fault set in that node's environment): the job that
    lands there is retried on another slot and completes; every job done once in the results."""
    faulty = cluster.add_node(
        num_cpus=2,
        num_gpus=8,
        env_vars={"SPECSWEEP_SIM_FAULT": "crash_after", "SPECSWEEP_SIM_FAULT_AFTER": "2"},
    )
    try:
        data = make_spec(models, tmp_path / "out", speculative={"chain_depths": [2, 3]})
        summary, log = run(data)
        assert summary.counts == {"pending": 0, "leased": 0, "done": 3, "failed": 0}, log
        _, jobs, attempts = queue_state(tmp_path / "out")
        crashed = [a for a in attempts if a.error_class == "crash"]
        assert crashed, f"no job ran on the faulty node:\n{log}"
        for attempt in crashed:
            (job,) = [j for j in jobs if j.id == attempt.job_id]
            assert job.state == "done" and job.attempts == 2
        assert len(rows(tmp_path / "out", "jobs")) == 3
        assert len(rows(tmp_path / "out", "requests")) == 3 * LEVELS * REQUESTS_PER_LEVEL
    finally:
        cluster.remove_node(faulty)


def test_driver_completes_on_other_node_when_node_removed_mid_job(
    cluster: Any, models: dict[str, str], tmp_path: Path
) -> None:
    """A node dies while its job runs: the job is requeued and completes on the other node; no
    duplicate rows; the server on the dead node is gone. The node is replaced afterwards, so the tests
    after this one (in any order) have two nodes again."""
    out = tmp_path / "out"
    env = {"SPECSWEEP_SIM_TIME_SCALE": "0.3"}  # jobs of several seconds, so the kill lands mid-job
    data = make_spec(models, out, speculative={"chain_depths": [2, 3]}, env=env)
    removed: dict[str, str] = {}

    def kill_a_busy_node() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not removed:
            time.sleep(0.3)
            if not (out / "queue.sqlite").exists():
                continue
            try:
                conn = open_read_only(out)
                events = conn.execute("SELECT detail FROM events WHERE kind = 'slot_ready'").fetchall()
                leased = conn.execute(
                    "SELECT id, slot, leased_ns FROM jobs WHERE state = 'leased' ORDER BY leased_ns"
                ).fetchall()
                conn.close()
            except sqlite3.OperationalError:
                continue
            for job_id, slot, _leased_ns in leased:
                if not serving(job_id):  # mid-job: its server is up
                    continue
                node_prefix = next(
                    (d.split("(")[1].rstrip(")") for (d,) in events if d.startswith(f"slot {slot} ")), None
                )
                for node in cluster.workers:
                    if node_prefix and node.node_id.startswith(node_prefix):
                        removed["job"] = job_id
                        removed["node"] = node.node_id
                        cluster.remove_node(node, allow_graceful=False)
                        return

    killer = threading.Thread(target=kill_a_busy_node)
    killer.start()
    try:
        summary, log = run(data)
    finally:
        killer.join()
        if "node" in removed:
            _replace_node(cluster, removed["node"])
    assert removed, f"no node was removed:\n{log}"
    assert summary.counts == {"pending": 0, "leased": 0, "done": 3, "failed": 0}, log
    _, _jobs, attempts = queue_state(out)
    lost = [a for a in attempts if a.job_id == removed["job"]]
    assert [a.error_class for a in lost] == ["node_lost", None] and lost[1].outcome == "done"
    assert len(rows(out, "jobs")) == 3
    assert len(rows(out, "levels")) == 3 * LEVELS
    assert len(rows(out, "requests")) == 3 * LEVELS * REQUESTS_PER_LEVEL
    assert processes_of_job(removed["job"]) == []


def _replace_node(cluster: Any, node_id: str) -> None:
    """Put a fresh 8-GPU node in place of a removed one, once Ray has marked the removed one dead."""
    import ray

    deadline = time.monotonic() + 120
    while any(n["NodeID"] == node_id and n["Alive"] for n in ray.nodes()):
        assert time.monotonic() < deadline, f"Ray still lists node {node_id} alive 120 s after its removal"
        time.sleep(0.2)
    cluster.workers = [n for n in cluster.workers if n.node_id != node_id]
    cluster.workers.append(cluster.add_node(num_cpus=2, num_gpus=8))
