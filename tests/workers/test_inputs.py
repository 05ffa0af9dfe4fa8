"""Input digests (workers/node/inputs.py): each input a result depends on, edited in place at the same
path, changes its own digest and no other; what does not shape a result changes none."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.plan import unchecked_plan
from harness.spec import parse_spec
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config
from workers.job import JobSpec
from workers.node.inputs import engine_identity, input_digests


@pytest.fixture
def jobs(tmp_path: Path) -> dict[str, Any]:
    """The baseline and a chain job of a sim sweep on a local target, drafter and prompt file."""
    target = write_target_config(tmp_path / "target", TINY)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), tmp_path / "drafter")
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hello"}\n')
    spec = parse_spec(
        {
            "engine": "sim",
            "model_path": str(target),
            "drafter": {"path": str(drafter), "format": "speculators"},
            "speculative": {"chain_depths": [2]},
            "load": {
                "concurrency": [1],
                "requests_per_level": 1,
                "workload": {"kind": "prompt_set", "path": str(prompts), "max_tokens": 4},
            },
        }
    )
    baseline, chain = unchecked_plan(spec).jobs
    return {"baseline": baseline, "chain": chain, "target": target, "drafter": drafter, "prompts": prompts}


def _edit_json(path: Path, key: str, value: Any) -> None:
    data = json.loads(path.read_text())
    data[key] = value
    path.write_text(json.dumps(data))


def _changed(job: JobSpec, before: dict[str, str]) -> set[str]:
    after = input_digests(job, on_node=True)
    assert after.keys() == before.keys()
    return {kind for kind in before if before[kind] != after[kind]}


def test_input_digests_change_only_the_edited_input_when_files_change_in_place(jobs: dict[str, Any]) -> None:
    """Prompt file, drafter config, drafter weights, target config.json and target tokenizer files, each
    edited at the same path, change exactly their own digest; a target README changes nothing; a job
    without a drafter has no drafter digest."""
    chain, baseline = jobs["chain"], jobs["baseline"]
    assert set(input_digests(baseline, on_node=True)) == {"prompts", "target", "engine"}
    steps: list[tuple[str, Any]] = [
        ("prompts", lambda: jobs["prompts"].write_text('{"prompt": "hello there"}\n')),
        ("drafter", lambda: _edit_json(jobs["drafter"] / "config.json", "draft_vocab_size", 95)),
        ("drafter", lambda: _flip_last_byte(jobs["drafter"] / "model.safetensors")),
        ("target", lambda: _edit_json(jobs["target"] / "config.json", "max_position_embeddings", 8192)),
        ("target", lambda: (jobs["target"] / "tokenizer_config.json").write_text('{"eos_token": "</s>"}')),
        (None, lambda: (jobs["target"] / "README.md").write_text("notes")),
    ]
    for kind, edit in steps:
        before = input_digests(chain, on_node=True)
        edit()
        assert _changed(chain, before) == ({kind} if kind else set()), kind


def _flip_last_byte(path: Path) -> None:
    """Change one weight byte (the file's last byte lies in the tensor data), same size, same path."""
    data = bytearray(path.read_bytes())
    data[-1] ^= 0x01
    path.write_bytes(bytes(data))


def test_engine_identity_names_sglang_version_when_interpreter_has_sglang(sglang_python: str) -> None:
    """SGLang's identity is the version its interpreter has installed; a spec interpreter this machine
    lacks is left to the nodes (None), the simulator's is its source digest."""
    assert engine_identity("sglang", sglang_python, on_node=False) == "sglang 0.5.23"
    assert engine_identity("sglang", "/nodes/only/python", on_node=False) is None
    assert (engine_identity("sim", None, on_node=False) or "").startswith("sim ")
