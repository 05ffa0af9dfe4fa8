"""docs/workloads.md's examples run: each `load:` block is a valid load plan whose requests can be built
from the files the page shows."""

from __future__ import annotations

import re
from itertools import islice
from pathlib import Path

import pyarrow as pa
import pyarrow.csv as pacsv
import pytest
import yaml

from workers.job import LoadPlan
from workers.load.workloads import PromptSetWorkload, request_stream

DOC = Path(__file__).resolve().parents[2] / "docs" / "workloads.md"
TEXT = DOC.read_text()
LOAD_BLOCKS = [b for b in re.findall(r"```yaml\n(.*?)```", TEXT, flags=re.S) if b.startswith("load:")]
JSONL = re.findall(r"```jsonl\n(.*?)```", TEXT, flags=re.S)[0]


def test_workloads_doc_shows_every_workload_kind_when_read() -> None:
    """The page has a load example for prompt sets (mixed, column-mapped, a preset), random ids and gamma
    rates."""
    assert len(LOAD_BLOCKS) == 5


@pytest.mark.parametrize("block", LOAD_BLOCKS)
def test_workloads_doc_example_builds_requests_when_files_exist(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example parses as a load plan and yields requests (from the page's JSONL, or a CSV in the
    mapped shape), every one with a category."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text(JSONL)
    (tmp_path / "question.jsonl").write_text(
        '{"question_id": 1, "category": "coding", "turns": ["Hi?", "More?"]}\n'
    )
    rows = [
        {"question": f"Q{i}?", "team": "billing" if i % 2 else "shipping", "answer_len": 64} for i in range(6)
    ]
    pacsv.write_csv(pa.Table.from_pylist(rows), tmp_path / "questions.csv")
    plan = LoadPlan.model_validate(yaml.safe_load(block)["load"])
    assert plan.levels(seed=1, request_timeout_s=60)
    requests = list(islice(request_stream(plan.workload, iter(range(50))), 50))
    assert len(requests) == 50 and all(r.category for r in requests)
    if isinstance(plan.workload, PromptSetWorkload) and plan.workload.columns.output_tokens:
        assert all(b'"max_tokens":64' in r.body for r in requests)
