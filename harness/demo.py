"""``specsweep demo``: the whole pipeline on a laptop, no GPU.

It writes a Kimi-K2-shaped target config and a small speculators-format EAGLE3 drafter (the converter
turns it into SGLang's layout, as on a real node), starts an embedded Ray cluster of simulated 8-GPU
nodes, runs ``examples/demo.yaml`` on the simulated SGLang server, and prints the best config per load
level with its speedup and the exact SGLang command, then writes the HTML report.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from harness.spec import SweepSpec, parse_spec
from specsweep.errors import SpecsweepError

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
DEMO_MARKER = ".specsweep-demo"  # written into OUT so a rerun may replace an old demo, and only a demo
TARGET_DIR = "inputs/kimi-k2-demo"
DRAFTER_DIR = "inputs/eagle3-speculators"


@dataclass(frozen=True)
class DemoInputs:
    """Where the demo's target config and drafter checkpoint were written."""

    target: Path
    drafter: Path


def write_demo_inputs(root: Path) -> DemoInputs:
    """A Kimi-K2-shaped target (DeepseekV3, vocab 163840; config only) and a small speculators drafter.

    The drafter is small (hidden 128) so the demo converts it in well under a second; the simulated
    server models an H200 node serving the full-size model whatever the drafter's size.
    """
    from workers.convert.eagle3_format import SourceFormat
    from workers.convert.fixtures import FixtureDims, build_checkpoint, write_checkpoint, write_target_config

    dims = FixtureDims(
        hidden_size=128,
        num_heads=4,
        num_kv_heads=2,
        head_dim=32,
        intermediate_size=256,
        draft_vocab_size=8192,
        vocab_size=163840,
        target_hidden_size=128,
        target_layers=61,
        aux_layer_ids=(1, 29, 57),
    )
    target = write_target_config(root / TARGET_DIR, dims)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, dims), root / DRAFTER_DIR)
    return DemoInputs(target=target, drafter=drafter)


def demo_spec(out: Path, inputs: DemoInputs) -> tuple[SweepSpec, str]:
    """examples/demo.yaml with its model paths pointed at the inputs written under ``out``."""
    if not DEMO_SPEC.is_file():
        raise SpecsweepError(
            f"the demo spec is missing: {DEMO_SPEC}",
            fix="run the demo from a checkout of the specsweep repository (`make demo`)",
        )
    data: dict[str, Any] = yaml.safe_load(DEMO_SPEC.read_text())
    data["model_path"] = str(inputs.target)
    data["drafter"] = {**data["drafter"], "path": str(inputs.drafter)}
    data["output_dir"] = str(out)
    text = yaml.safe_dump(data, sort_keys=False)
    return parse_spec(data, source=str(DEMO_SPEC)), text


def prepare_output(out: Path) -> None:
    """Start from an empty OUT: an earlier demo there is replaced; anything else is refused."""
    if out.exists() and any(out.iterdir()):
        if not (out / DEMO_MARKER).exists():
            raise SpecsweepError(
                "the output directory is not empty and holds no earlier demo",
                where=str(out),
                fix="choose another directory with --out",
            )
        shutil.rmtree(out)
    out.mkdir(parents=True, exist_ok=True)
    (out / DEMO_MARKER).write_text("written by `specsweep demo`; the next demo run replaces this directory\n")


@contextlib.contextmanager
def simulated_cluster(nodes: int, gpus_per_node: int, cpus_per_node: int) -> Iterator[str]:
    """An embedded Ray cluster of ``nodes`` simulated GPU nodes (a GPU-less head); yields its address."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
    )
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
