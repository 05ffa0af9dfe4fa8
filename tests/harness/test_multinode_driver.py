"""Servers over two nodes on a simulated Ray cluster of four 8-GPU nodes: placement, exactly-once
results, and a rank's death ending the whole server (retried as a unit, nothing left running)."""

from __future__ import annotations

import json
import os
import shlex
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest

from harness.cli import main
from harness.driver import SweepSummary
from harness.queue import open_read_only
from tests.harness.conftest import NODE_DIR_VARS
from tests.harness.test_driver import (  # noqa: F401  (models: a fixture shared with test_driver)
    LEVELS,
    REQUESTS_PER_LEVEL,
    make_spec,
    models,
    processes_of_job,
    queue_state,
    rows,
    run,
)
from workers.sglang import validate_many

pytestmark = pytest.mark.ray

TWO_NODE = {"base_args": ["--tp-size", "16"], "gpus_per_server": 8, "nodes_per_server": 2}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A head without GPUs plus four simulated 8-GPU nodes: room for two servers of two nodes (the session's
    two-node cluster is too small), with node-local dirs of its own in this process's environment while
    the module runs, as the nodes inherit them."""
    import ray
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("node-local-4")
    with pytest.MonkeyPatch.context() as env:
        for name, folder in NODE_DIR_VARS.items():
            env.setenv(name, str(root / folder))
        # no dashboard: no test here talks to it (the session's cluster in conftest.py does the same)
        head = {"num_cpus": 1, "num_gpus": 0, "include_dashboard": False}
        c = Cluster(initialize_head=True, head_node_args=head)
        for _ in range(4):
            c.add_node(num_cpus=2, num_gpus=8)
        c.wait_for_nodes()
        ray.init(address=c.address, namespace="specsweep", log_to_driver=False)
        yield c
        ray.shutdown()
        c.shutdown()


def ready_events(out: Path) -> list[str]:
    conn = open_read_only(out)
    try:
        return [detail for (detail,) in conn.execute("SELECT detail FROM events WHERE kind = 'slot_ready'")]
    finally:
        conn.close()


def rank_processes(job_id: str, rank: int) -> list[psutil.Process]:
    """Live server processes of ``job_id`` launched as node rank ``rank``."""
    found = []
    for proc in psutil.process_iter(["pid", "cmdline", "status"]):
        try:
            cmdline = proc.info["cmdline"] or []
            if proc.info["status"] == psutil.STATUS_ZOMBIE or "--node-rank" not in cmdline:
                continue
            if cmdline[cmdline.index("--node-rank") + 1] == str(rank) and (
                proc.environ().get("SPECSWEEP_JOB_ID") == job_id
            ):
                found.append(proc)
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return found


@pytest.fixture(scope="module")
def two_node_sweep(
    cluster: Any,
    models: dict[str, str],  # noqa: F811
    tmp_path_factory: pytest.TempPathFactory,
) -> tuple[Path, SweepSummary, str]:
    """A finished sweep of four jobs on servers of two nodes: its output, summary and progress log."""
    out = tmp_path_factory.mktemp("two-node") / "out"
    summary, log = run(make_spec(models, out, speculative={"chain_depths": [2, 3, 4]}, **TWO_NODE))
    return out, summary, log


def test_driver_runs_two_node_servers_exactly_once_when_four_nodes(
    two_node_sweep: tuple[Path, SweepSummary, str],
) -> None:
    """nodes_per_server 2 on four nodes: two slots, each holding two different nodes, both serving at
    once; every job done once with rank 0's log and rank 1's, and nothing left running."""
    out, summary, log = two_node_sweep
    assert summary.counts == {"pending": 0, "leased": 0, "done": 4, "failed": 0}, log
    _counts, jobs, attempts = queue_state(out)
    assert [j.attempts for j in jobs] == [1] * 4
    assert len({a.slot for a in attempts}) == 2
    first_done = min(a.finished_ns for a in attempts if a.finished_ns is not None)
    assert sum(a.started_ns < first_done for a in attempts) == 2  # two servers at a time
    events = ready_events(out)
    assert len(events) == 2
    for detail in events:  # "slot N on host (node id), host (node id)": two distinct Ray nodes
        node_ids = {part.split("(")[1].rstrip(")") for part in detail.split(" on ", 1)[1].split(", ")}
        assert len(node_ids) == 2, detail
    job_rows = rows(out, "jobs")
    assert sorted(r["job_id"] for r in job_rows) == sorted(j.id for j in jobs)
    assert {r["gpus"] for r in job_rows} == {16}
    for row in job_rows:
        argv = list(row["sglang_argv"])
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == "0"
    assert len(rows(out, "levels")) == 4 * LEVELS
    assert len(rows(out, "requests")) == 4 * LEVELS * REQUESTS_PER_LEVEL
    for job in jobs:
        logs = sorted(p.name for p in (out / "logs" / job.id / "attempt-1").glob("server*.log"))
        assert logs == ["server-rank1.log", "server.log"]
        assert processes_of_job(job.id) == []


def test_driver_retries_server_as_unit_and_leaves_no_process_when_a_rank_is_killed(
    cluster: Any,
    models: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """SIGKILL of rank 1's server mid-level ends the server (rank 0 dies with NCCL's remote error), the
    attempt fails as a crash with NCCL's words (transient, as every mid-run death), every rank is stopped, and the job's second attempt (all ranks launched
    afresh) is its one result; no process of the job is left.

    No warmup and two requests per level (was one warmup and three): the rule is about how a rank's
    death ends the attempt and what the retry leaves, not about what a level measures, and each attempt
    is all idle waiting at real speed (the retry took ~21 s, now ~9 s)."""
    out = tmp_path / "out"
    spec = make_spec(
        models,
        out,
        speculative=None,
        env={"SPECSWEEP_SIM_TIME_SCALE": "1"},  # requests of ~3 s: the kill lands in the first level
        load={
            "concurrency": [1, 2],
            "requests_per_level": 2,
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 200, "vocab_size": 256},
        },
        max_servers=1,
        **TWO_NODE,
    )
    job_id: list[str] = []
    killed: list[int] = []

    def kill_rank_one() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            try:
                conn = open_read_only(out)
                leased = conn.execute("SELECT id FROM jobs WHERE state = 'leased'").fetchall()
                conn.close()
            except (FileNotFoundError, sqlite3.Error, OSError):
                leased = []
            for (jid,) in leased:
                procs = rank_processes(jid, 1)
                server_log = out / "logs" / jid / "attempt-1" / "server.log"
                # the simulator logs each level's cache flush; with no warmup the first level follows it
                if procs and server_log.exists() and "Cache flushed successfully!" in server_log.read_text():
                    time.sleep(1.0)  # into the first level's first request (~3 s; the level ~6 s)
                    job_id.append(jid)
                    for proc in procs:
                        os.kill(proc.pid, signal.SIGKILL)
                        killed.append(proc.pid)
            time.sleep(0.2)

    killer = threading.Thread(target=kill_rank_one)
    killer.start()
    try:
        summary, log = run(spec)
    finally:
        killer.join()
    assert killed, log
    assert summary.counts == {"pending": 0, "leased": 0, "done": 1, "failed": 0}, log
    _counts, _jobs, attempts = queue_state(out)
    assert [a.outcome for a in attempts] == ["failed", "done"], attempts
    assert attempts[0].error_class == "crash" and "NCCL error" in (attempts[0].error_text or ""), attempts
    assert sorted(p.name for p in (out / "logs" / job_id[0]).iterdir()) == ["attempt-1", "attempt-2"]
    assert [r["status"] for r in rows(out, "jobs")] == ["done"]  # the failed attempt's row is not a result
    assert len(rows(out, "levels")) == LEVELS
    assert processes_of_job(job_id[0]) == []
    assert rank_processes(job_id[0], 0) == [] and rank_processes(job_id[0], 1) == []


def test_best_emit_writes_one_script_per_rank_that_sglang_accepts_when_two_node_sweep(
    two_node_sweep: tuple[Path, SweepSummary, str],
    models: dict[str, str],  # noqa: F811
    sglang_python: str,
    tmp_path: Path,
) -> None:
    """`best --emit` of a two-node sweep writes launch-rank0.sh and launch-rank1.sh (no one-node
    launch.sh): the same server flags, --nnodes 2, their own --node-rank, rank 0's address from
    $DIST_INIT_ADDR (a script run without it stops and says so), none of the sweep's addresses; SGLang's
    resolver accepts each rank's launch."""
    out, _summary, _log = two_node_sweep
    dest = tmp_path / "deploy"
    assert main(["best", str(out), "--emit", str(dest), "--bootstrap", "100"]) == 0
    assert sorted(p.name for p in dest.glob("launch*.sh")) == ["launch-rank0.sh", "launch-rank1.sh"]
    deploy = json.loads((dest / "deploy.json").read_text())
    assert [r["node_rank"] for r in deploy["ranks"]] == [0, 1]
    assert all(r["validation"]["status"] == "ok" for r in deploy["ranks"]), deploy["ranks"]
    launches = []
    for rank in (0, 1):
        script = dest / f"launch-rank{rank}.sh"
        line = script.read_text().splitlines()[-1]
        argv = shlex.split(line.replace(line[line.index('"${DIST_INIT_ADDR') :], "10.0.0.1:5000"))[1:]
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert "--host" not in argv and "--port" not in argv and argv.count("--dist-init-addr") == 1
        launches.append(argv[3:])
        unset = subprocess.run(
            ["sh", str(script)], env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=30
        )
        assert unset.returncode != 0 and "set DIST_INIT_ADDR to HOST:PORT of rank 0" in unset.stderr
    reports = validate_many(  # both ranks' scripts in one resolver process (its import is 10-30 s)
        launches,
        sglang_python=sglang_python,
        target_config_dir=models["target"],
        draft_config_dir=deploy["drafter"]["measured_copies"][0],  # the published one is not made here
    )
    assert len(reports) == 2
    for report in reports:
        assert report.status == "ok" and "sglang 0.5.23" in report.checked_by, report.errors


def test_rank_group_reports_a_dead_rank_and_stops_every_rank_when_rank_zero_never_notices(
    cluster: Any,
    models: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Rank 0's worker does not wait for NCCL to notice: a rank whose process exited is reported with its
    exit (here rank 0 never started, so nothing else would end the attempt), and stop() ends every rank's
    process, even one still waiting to join that would otherwise run until --dist-timeout."""
    import ray

    from harness.spec import parse_spec
    from tests.harness.test_driver import plan_of
    from workers.node.ports import reserved_port
    from workers.node.ranks import RankGroup, RankWorker

    spec = parse_spec(make_spec(models, tmp_path / "out", speculative=None, **TWO_NODE))
    job = plan_of(spec).jobs[0]
    workers = [
        ray.remote(RankWorker).options(num_gpus=8, num_cpus=1).remote(str(tmp_path), 0, 1) for _ in range(2)
    ]
    try:
        with reserved_port("127.0.0.1") as port:  # nobody listens: the ranks keep trying to join
            for worker in workers:
                group = RankGroup([worker])
                group.start(job.model_dump_json(), 1, f"127.0.0.1:{port}")
                waiting = rank_processes(job.job_id, 1)
                assert len(waiting) == 1 and group.first_exit() is None
                if worker is workers[0]:
                    os.kill(waiting[0].pid, signal.SIGKILL)
                    deadline = time.monotonic() + 10
                    while (ended := group.first_exit()) is None and time.monotonic() < deadline:
                        time.sleep(0.1)
                    assert ended is not None and "node rank 1 exited with code -9" in ended.message
                group.stop(5.0)
                assert rank_processes(job.job_id, 1) == []
    finally:
        for worker in workers:
            ray.kill(worker)
