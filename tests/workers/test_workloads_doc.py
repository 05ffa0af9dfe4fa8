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

from specsweep.errors import WorkloadError
from tests.workers.hub_cache import card, jsonl_bytes, parquet_bytes, write_hub_cache, write_mirror
from workers.job import LoadPlan
from workers.load.hub_datasets import HubDataset
from workers.load.workloads import PromptSetWorkload, request_stream

DOC = Path(__file__).resolve().parents[2] / "docs" / "workloads.md"
TEXT = DOC.read_text()
LOAD_BLOCKS = [b for b in re.findall(r"```yaml\n(.*?)```", TEXT, flags=re.S) if b.startswith("load:")]
JSONL = re.findall(r"```jsonl\n(.*?)```", TEXT, flags=re.S)[0]
ERROR_BLOCK = re.findall(r"```console\n(.*?)```", TEXT, flags=re.S)[0]


def test_workloads_doc_shows_every_workload_kind_when_read() -> None:
    """The page has a load example for prompt sets (mixed, column-mapped, a preset, a preset's Hub copy,
    another Hub dataset, multi-turn), random ids, gamma rates and a ramped-up closed loop."""
    assert len(LOAD_BLOCKS) == 9


@pytest.mark.parametrize("block", LOAD_BLOCKS)
def test_workloads_doc_example_builds_requests_when_files_exist(
    block: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each example parses as a load plan and yields requests (from the page's JSONL, a CSV in the mapped
    shape, or Hugging Face datasets in a generated hub cache and mirror), every one with a category."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "prompts.jsonl").write_text(JSONL)
    (tmp_path / "question.jsonl").write_text(
        '{"question_id": 1, "category": "coding", "turns": ["Hi?", "More?"]}\n'
    )
    rows = [
        {"question": f"Q{i}?", "team": "billing" if i % 2 else "shipping", "answer_len": 64} for i in range(6)
    ]
    pacsv.write_csv(pa.Table.from_pylist(rows), tmp_path / "questions.csv")
    gsm8k_rows = [{"question": r["question"], "answer": "#### 1"} for r in rows]
    gsm8k = {
        "README.md": card({"main": {"test": "main/test-*"}}),
        "main/test-0.parquet": parquet_bytes(gsm8k_rows),
    }
    write_hub_cache(tmp_path / "hf-cache", "openai/gsm8k", gsm8k)
    write_mirror(tmp_path / "support-prompts", {"test.jsonl": jsonl_bytes(rows), "README.md": card(None)})
    plan = LoadPlan.model_validate(yaml.safe_load(block)["load"])
    assert plan.levels(seed=1, request_timeout_s=60)
    requests = list(islice(request_stream(plan.workload, iter(range(50))), 50))
    assert len(requests) == 50 and all(r.category for r in requests)
    if isinstance(plan.workload, PromptSetWorkload) and plan.workload.columns.output_tokens:
        assert all(b'"max_tokens":64' in r.body for r in requests)


def test_workloads_doc_shows_the_error_an_unreachable_dataset_gives_when_offline(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The page's example error is the one a gsm8k Hub copy absent from an offline cache raises, word for
    word, and reading it creates nothing."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    workload = PromptSetWorkload(format="gsm8k", hf=HubDataset(cache_dir="/shared/hf-hub"), max_tokens=8)
    with pytest.raises(WorkloadError) as err:
        workload.prompts()
    assert ERROR_BLOCK.strip() == f"specsweep plan: error: {err.value}"
    assert not Path("/shared/hf-hub").exists()
