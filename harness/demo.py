"""``specsweep demo``: the whole pipeline on a laptop, no GPU.

It writes a Kimi-K2.5-shaped target config (the multimodal wrapper, its text model under text_config),
a small speculators-format EAGLE3 drafter (the converter turns it into SGLang's layout, as on a real
node) and a small generated prompt set of three categories, starts an embedded Ray cluster of simulated
8-GPU nodes, runs ``examples/demo.yaml`` on the simulated SGLang server, and prints the best config per load
level with its speedup and the exact SGLang command, then writes the HTML report.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from harness.reaper import Reaper
from harness.spec import SweepSpec, parse_spec
from specsweep.errors import SpecsweepError
from workers.convert.fixtures import FixtureDims

DEMO_SPEC = Path(__file__).resolve().parents[1] / "examples" / "demo.yaml"
DEMO_MARKER = ".specsweep-demo"  # written into OUT so a rerun may replace an old demo, and only a demo
TARGET_DIR = "inputs/kimi-k25-demo"
DRAFTER_DIR = "inputs/eagle3-speculators"
PROMPTS_FILE = "inputs/prompts.jsonl"
PROMPTS_PER_CATEGORY = 40
# Generated, never copied: each category's prompts are a template over a few subjects. The simulator
# reads its category from markers in the text (workers.sim.model.content_category): "python" and
# "function" for code, "solve" for math; the chat templates contain none of them.
_TEMPLATES: dict[str, tuple[str, ...]] = {
    "code": (
        "Write a python function that {verb} a list of {noun} and explain its complexity.",
        "Fix the bug in this python function that should {verb} the {noun}.",
    ),
    "math": (
        "Solve for x: {a}x + {b} = {c}, and show each step.",
        "Solve this word problem: a shop sells {a} {noun} a day for {b} days; what is the total?",
    ),
    "chat": (
        "Tell me a short story about {noun} on a rainy afternoon.",
        "What would you pack for a weekend trip to see the {noun}? Give a friendly list.",
    ),
}
_NOUNS = ("lighthouses", "orchards", "glaciers", "tram stops", "violins", "beehives", "comets", "ferries")
_VERBS = ("sorts", "deduplicates", "reverses", "groups", "merges")


@dataclass(frozen=True)
class DemoInputs:
    """Where the demo's target config, drafter checkpoint and prompt set were written."""

    target: Path
    drafter: Path
    prompts: Path


def write_demo_prompts(path: Path) -> Path:
    """A small generated prompt set: ``PROMPTS_PER_CATEGORY`` prompts each of code, math and chat, one
    ``{"prompt", "category"}`` object per line (the prompt_set workload's default columns)."""
    lines = []
    for category, templates in _TEMPLATES.items():
        for i in range(PROMPTS_PER_CATEGORY):
            text = templates[i % len(templates)].format(
                noun=_NOUNS[i % len(_NOUNS)], verb=_VERBS[i % len(_VERBS)], a=i + 2, b=3 * i + 1, c=7 * i + 40
            )
            lines.append(json.dumps({"prompt": text, "category": category}))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# The demo's drafter: small (hidden 128) so the demo converts it in well under a second; the simulated
# server models an H200 node serving the full-size model whatever the drafter's size.
DEMO_DIMS = FixtureDims(
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
# The shipped example's drafter (examples/inputs/): small enough to keep in git (about 200 KB, most of it the
# 163840-entry vocabulary mask), without an embedding (SGLang takes the target's when the hidden sizes match).
EXAMPLE_DIMS = replace(
    DEMO_DIMS,
    hidden_size=32,
    num_heads=2,
    num_kv_heads=1,
    head_dim=16,
    intermediate_size=64,
    draft_vocab_size=128,
    target_hidden_size=32,
)
EXAMPLE_INPUTS = Path(__file__).resolve().parents[1] / "examples" / "inputs"


def write_demo_inputs(root: Path) -> DemoInputs:
    """A Kimi-K2.5-shaped target (KimiK25ForConditionalGeneration around a DeepseekV3 text model, vocab
    163840; config only) and a small speculators drafter: the converter checks it against text_config."""
    return _write_inputs(root, DEMO_DIMS, TARGET_DIR, DRAFTER_DIR, PROMPTS_FILE, embedding=True)


def write_example_inputs(root: Path) -> DemoInputs:
    """What examples/inputs/ ships (the README's `convert` and examples/sweep.yaml read it), byte for byte:
    the demo's prompts, a Kimi-K2.5-shaped target config and a drafter of ``EXAMPLE_DIMS``."""
    return _write_inputs(
        root, EXAMPLE_DIMS, "kimi-k25-tiny", "eagle3-speculators", "prompts.jsonl", embedding=False
    )


def _write_inputs(
    root: Path, dims: FixtureDims, target_dir: str, drafter_dir: str, prompts_file: str, *, embedding: bool
) -> DemoInputs:
    from workers.convert.eagle3_format import SourceFormat
    from workers.convert.fixtures import build_checkpoint, write_checkpoint, write_target_config

    target = write_target_config(root / target_dir, dims, multimodal=True)
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS, dims, include_embedding=embedding)
    drafter = write_checkpoint(checkpoint, root / drafter_dir)
    return DemoInputs(target=target, drafter=drafter, prompts=write_demo_prompts(root / prompts_file))


def demo_spec(out: Path, inputs: DemoInputs, *, nodes_per_server: int = 1) -> tuple[SweepSpec, str]:
    """examples/demo.yaml with its model paths and prompt set pointed at the inputs written under ``out``;
    with ``nodes_per_server`` > 1 each server spans that many nodes (its --tp-size fills them all)."""
    if not DEMO_SPEC.is_file():
        raise SpecsweepError(
            f"the demo spec is missing: {DEMO_SPEC}",
            fix="run the demo from a checkout of the specsweep repository (`make demo`)",
        )
    data: dict[str, Any] = yaml.safe_load(DEMO_SPEC.read_text())
    data["model_path"] = str(inputs.target)
    data["drafter"] = {**data["drafter"], "path": str(inputs.drafter)}
    workload = data["load"]["workload"]
    if workload.get("kind") == "prompt_set":
        data["load"]["workload"] = {**workload, "path": str(inputs.prompts)}
    data["output_dir"] = str(out)
    if nodes_per_server > 1:
        args = list(data["base_args"])
        args[args.index("--tp-size") + 1] = str(data["gpus_per_server"] * nodes_per_server)
        data["base_args"], data["nodes_per_server"] = args, nodes_per_server
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
    """An embedded Ray cluster of ``nodes`` simulated GPU nodes (a GPU-less head); yields its address. Its
    processes are children of this one, so a reaper (harness.reaper) stops them once it is gone."""
    from ray.cluster_utils import Cluster

    cluster = Cluster(
        initialize_head=True,
        head_node_args={"num_cpus": 1, "num_gpus": 0, "include_dashboard": False},
    )
    head: Any = cluster.head_node  # a ray._private.node.Node (untyped in Ray)
    reaper = Reaper(head.session_name)
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=cpus_per_node, num_gpus=gpus_per_node)
        cluster.wait_for_nodes()
        yield cluster.address
    finally:
        cluster.shutdown()  # type: ignore[no-untyped-call]
        reaper.close()
