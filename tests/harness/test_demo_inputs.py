"""The demo's generated inputs: its prompt set is what its spec's workload reads, by category."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

from harness.demo import PROMPTS_PER_CATEGORY, demo_spec, write_demo_inputs
from workers.load.workloads import PromptSetWorkload
from workers.sim.model import DEFAULT_MIX, DEFAULT_PROFILE, content_category


def test_demo_prompts_fall_in_their_simulated_category_when_generated(tmp_path: Path) -> None:
    """Every generated prompt's label is the category the simulator's marker rule gives its text, the
    three categories are equally many, and the demo spec's workload reads that file with the default mix."""
    inputs = write_demo_inputs(tmp_path)
    rows = [json.loads(line) for line in inputs.prompts.read_text().splitlines()]
    assert Counter(r["category"] for r in rows) == {c: PROMPTS_PER_CATEGORY for c in ("code", "math", "chat")}
    for row in rows:
        assert content_category(DEFAULT_PROFILE, row["prompt"]) == row["category"], row
    spec, _ = demo_spec(tmp_path, inputs)
    workload = spec.load.workload
    assert isinstance(workload, PromptSetWorkload) and workload.path == str(inputs.prompts)
    assert workload.mix == dict(DEFAULT_MIX)
    assert len(workload.prompts()) == len(rows)
