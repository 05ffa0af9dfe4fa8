"""Scheduler efficiency: 40+ simulated-server jobs on 8 simulated 8-GPU nodes (one Ray cluster).

Measured in one run, from the queue's and the workers' own timestamps:
- makespan: first lease to last completion (cluster start and slot placement excluded);
- ideal: the sum of the jobs' durations as their workers measured them (run_job entry to return:
  launch, load, stop, files written), divided by the number of slots the driver placed (its
  ``slot_ready`` events, not only the slots that received an attempt: a slot left idle is the
  scheduler's loss), and never below the longest job - the makespan of a scheduler with zero cost and
  perfect packing. Each job runs one 6 s load level (duration, not a request count,
  so that jobs are about equally long whatever their config);
- driver overhead per job: the driver-side attempt time (lease to commit) minus the worker-side job
  time, i.e. dispatch RPC, result transfer, commit and queue writes.
Goals (issue #6): makespan <= 1.05 x ideal, overhead <= 50 ms per job.
Run: ``.venv/bin/python -m bench.scheduler`` (about 2-4 minutes on 2 cores).
"""

from __future__ import annotations

import io
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import pyarrow.dataset as ds
import yaml

from bench.common import REPO, emit

NODES = 8
DEPTHS = list(range(2, 12))  # 10 chain configs
REPEATS = 4  # x 4 = 40 jobs


def spec_data(root: Path) -> dict[str, Any]:
    """Chains on a Kimi-K2-shaped target with a built-in MTP layer (no drafter to convert)."""
    return {
        "engine": "sim",
        "model_path": str(REPO / "tests" / "fixtures" / "kimi-k2-mtp"),
        "base_args": ["--tp-size", "8"],
        "speculative": {"chain_depths": DEPTHS},
        "baseline": False,
        "repeats": REPEATS,
        "load": {
            "concurrency": [4],
            "duration_s": 6.0,
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": 16, "output_tokens": 64, "vocab_size": 256},
        },
        "timeouts": {"startup_s": 120, "level_s": 120, "stop_s": 5, "placement_s": 120},
        "env": {"SPECSWEEP_SIM_TIME_SCALE": "0.3"},
        "output_dir": str(root / "out"),
    }


def main() -> None:
    import ray
    from ray.cluster_utils import Cluster

    from harness.driver import run_sweep
    from harness.plan import plan_sweep
    from harness.progress import LogProgress
    from harness.queue import open_read_only, read_attempts
    from harness.spec import parse_spec

    with tempfile.TemporaryDirectory(prefix="bench-scheduler-") as tmp:
        root = Path(tmp)
        os.environ["SPECSWEEP_PID_DIR"] = str(root / "pids")
        os.environ["SPECSWEEP_DRAFTER_CACHE"] = str(root / "drafters")
        data = spec_data(root)
        spec = parse_spec(data)
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "num_gpus": 0})
        try:
            for _ in range(NODES):
                cluster.add_node(num_cpus=1, num_gpus=8)
            ray.init(address=cluster.address, namespace="specsweep", log_to_driver=False)
            plan = plan_sweep(spec, use_resolver=False)
            out = Path(spec.output_dir)
            wall = time.perf_counter()
            summary = run_sweep(
                spec,
                yaml.safe_dump(data),
                plan,
                out,
                ray_address="auto",
                resume=False,
                progress=LogProgress(io.StringIO()),
            )
            wall = time.perf_counter() - wall
            conn = open_read_only(out)
            attempts = read_attempts(conn)
            placed = {
                d.split()[1] for (d,) in conn.execute("SELECT detail FROM events WHERE kind = 'slot_ready'")
            }
            conn.close()
            jobs = ds.dataset(out / "jobs", partitioning="hive").count_rows()
        finally:
            ray.shutdown()
            cluster.shutdown()
    if summary.counts["done"] != len(plan.jobs):
        raise SystemExit(f"sweep incomplete: {summary.counts}")
    done = [a for a in attempts if a.outcome == "done"]
    worker_s = {a.job_id: a.worker_s or 0.0 for a in done}
    driver_s = {a.job_id: (a.finished_ns - a.started_ns) / 1e9 for a in done}
    slots = len(placed)
    makespan = (max(a.finished_ns for a in attempts) - min(a.started_ns for a in attempts)) / 1e9
    ideal = max(sum(worker_s.values()) / slots, max(worker_s.values()))
    overhead_ms = [1000 * (driver_s[j] - worker_s[j]) for j in worker_s]
    emit(
        "scheduler_makespan_vs_ideal",
        "ratio",
        makespan / ideal,
        goal_max=1.05,
        makespan_s=makespan,
        ideal_s=ideal,
        jobs=jobs,
        slots=slots,
        slots_with_attempts=len({a.slot for a in attempts}),
        nodes=NODES,
        wall_s=wall,
        mean_job_s=sum(worker_s.values()) / len(worker_s),
        job_s_min=min(worker_s.values()),
        job_s_max=max(worker_s.values()),
    )
    emit(
        "scheduler_driver_overhead_per_job",
        "ms",
        sum(overhead_ms) / len(overhead_ms),
        samples=overhead_ms,
        goal_max_ms=50.0,
        jobs=jobs,
    )


if __name__ == "__main__":
    main()
