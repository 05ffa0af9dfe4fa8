"""Sweeps the driver tests run: a one-slot sweep on the embedded Ray cluster, run as `specsweep run
--no-validate` runs it (the tests that watch one job's attempts: a hang, a port clash, a node without a
GPU), and a planned sweep on a simulated multi-node cluster (the tests of what a whole sweep's results
say: axes, algorithms, the lossless check)."""

from __future__ import annotations

import io
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.demo import simulated_cluster
from harness.driver import SweepSummary, run_sweep
from harness.plan import Plan, plan_with_local_configs, unchecked_plan
from harness.progress import LogProgress, progress_for
from harness.spec import parse_spec
from workers.convert.fixtures import TINY, write_target_config


def one_slot_sim_spec(
    tmp_path: Path, *, requests: int, output_tokens: int, level_s: float, env: dict[str, str]
) -> dict[str, Any]:
    """A simulated one-GPU server, one job at concurrency 1, one retry, random-id prompts."""
    return {
        "engine": "sim",
        "model_path": str(write_target_config(tmp_path / "target", TINY)),
        "base_args": ["--tp-size", "1"],
        "gpus_per_server": 1,
        "max_servers": 1,
        "load": {
            "concurrency": [1],
            "requests_per_level": requests,
            "warmup_requests": 0,
            "workload": {
                "kind": "random_ids",
                "input_tokens": 8,
                "output_tokens": output_tokens,
                "vocab_size": 256,
            },
        },
        "retries": 1,
        "timeouts": {"startup_s": 60, "level_s": level_s, "stop_s": 5, "placement_s": 60},
        "env": env,
        "output_dir": str(tmp_path / "out"),
    }


def run_unchecked(data: dict[str, Any]) -> tuple[SweepSummary, str]:
    """Run the sweep ``data`` describes into its output_dir on an embedded Ray; its summary and log."""
    spec = parse_spec(data)
    log = io.StringIO()
    summary = run_sweep(
        spec,
        yaml.safe_dump(data),
        unchecked_plan(spec),
        Path(spec.output_dir),
        ray_address="local",
        resume=False,
        progress=LogProgress(log),
    )
    return summary, log.getvalue()


def run_on_simulated_cluster(
    data: dict[str, Any], root: Path, *, nodes: int, gpus_per_node: int, cpus_per_node: int
) -> tuple[Plan, SweepSummary]:
    """Plan ``data`` with its local configs (no SGLang resolver) and run it into its output_dir on an
    embedded cluster of ``nodes`` simulated nodes, with the drafter cache and pid files under ``root``."""
    spec = parse_spec(data)
    with pytest.MonkeyPatch.context() as env:
        env.setenv("SPECSWEEP_DRAFTER_CACHE", str(root / "drafters"))
        env.setenv("SPECSWEEP_PID_DIR", str(root / "pids"))
        with simulated_cluster(
            nodes=nodes, gpus_per_node=gpus_per_node, cpus_per_node=cpus_per_node
        ) as address:
            plan = plan_with_local_configs(spec, use_resolver=False)
            summary = run_sweep(
                spec,
                yaml.safe_dump(data),
                plan,
                Path(spec.output_dir),
                ray_address=address,
                resume=False,
                progress=progress_for(sys.stdout),
            )
    return plan, summary


def run_refused_before_launch(
    tmp_path: Path, data: dict[str, Any], draft_config: Path, capsys: pytest.CaptureFixture[str]
) -> tuple[str, str]:
    """`specsweep run` of the spec ``data`` on a local Ray: it must exit 2 having written nothing to its
    --out (no point launched); its stdout and stderr."""
    from harness.cli import main

    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    argv = [
        "run",
        str(spec_file),
        "--out",
        str(out),
        "--ray-address",
        "local",
        "--draft-config",
        str(draft_config),
    ]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert not out.exists() or not any(out.iterdir())
    return captured.out, captured.err
