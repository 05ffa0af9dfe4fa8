"""A one-slot sweep on the embedded Ray cluster, run as `specsweep run --no-validate` runs it: the shape
of the driver tests that watch one job's attempts (a hang, a port clash, a node without a GPU)."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import yaml

from harness.driver import SweepSummary, run_sweep
from harness.plan import unchecked_plan
from harness.progress import LogProgress
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
