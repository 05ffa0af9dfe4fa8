"""Prompt sets from Hugging Face datasets: each preset by its Hub id from a generated hub cache or local
mirror in the repo's own shape, revisions, configs and splits, offline mode, and one clear error when the
dataset cannot be reached. Nothing is downloaded: the Hub endpoint is a closed loopback port."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

import orjson
import pytest

from specsweep.errors import WorkloadError
from tests.workers.hub_cache import card, jsonl_bytes, parquet_bytes, write_hub_cache, write_mirror
from workers.load.hub_datasets import HubDataset
from workers.load.workloads import PromptSetWorkload, request_stream

MT_BENCH_ROWS = [
    {"prompt": ["Draft a note about tides.", "Shorten it."], "prompt_id": 1, "category": "writing", "reference": []},
    {"prompt": ["What is 7 times 6?", "And times 8?"], "prompt_id": 2, "category": "math", "reference": ["42", "336"]},
]  # fmt: skip
HUMANEVAL_ROWS = [
    {
        "task_id": f"HumanEval/{i}",
        "prompt": f'def f{i}(a: int) -> int:\n    """Return a plus {i}."""\n',
        "canonical_solution": f"    return a + {i}\n",
        "test": f"def check(candidate):\n    assert candidate(1) == {1 + i}\n",
        "entry_point": f"f{i}",
    }
    for i in range(3)
]
GSM8K_MAIN = [
    {"question": f"Ann has {i} apples and buys 2. How many?", "answer": f"#### {i + 2}"} for i in range(3)
]
GSM8K_SOCRATIC = [{"question": "How many socks? Ask yourself first.", "answer": "#### 2"}]
SHAREGPT_ROWS = [
    {
        "id": "c1",
        "conversations": [
            {"from": "human", "value": "Hi, who are you?"},
            {"from": "gpt", "value": "A recorded answer."},
            {"from": "human", "value": "Tell me more."},
        ],
    },
    {"id": "c2", "conversations": [{"from": "human", "value": "One question only."}]},
]
SPEC_BENCH_ROWS = [
    {"question_id": 81, "category": "writing", "turns": ["Plan a trip.", "Make it a poem."]},
    {"question_id": 161, "category": "translation", "turns": ["Translate 'good night' to German."]},
]

# preset -> (its Hub copy's id or None, the repo's files, the hf fields a user writes, categories, first turns)
HUB_SETS: dict[str, tuple[str, dict[str, bytes], dict[str, Any], set[str], set[str]]] = {
    "mt_bench": (
        "HuggingFaceH4/mt_bench_prompts",
        {
            "README.md": card({"default": {"train": "data/train-*"}}, "apache-2.0"),
            "data/train-00000-of-00001.parquet": parquet_bytes(MT_BENCH_ROWS),
            "raw/question.jsonl": jsonl_bytes([{"question_id": 9, "category": "x", "turns": ["raw"]}]),
        },
        {},
        {"writing", "math"},
        {r["prompt"][0] for r in MT_BENCH_ROWS},
    ),
    "humaneval": (
        "openai/openai_humaneval",
        {
            "README.md": card({"openai_humaneval": {"test": "openai_humaneval/test-*"}}),
            "openai_humaneval/test-00000-of-00001.parquet": parquet_bytes(HUMANEVAL_ROWS),
        },
        {},
        {"code"},
        {r["prompt"] for r in HUMANEVAL_ROWS},
    ),
    "gsm8k": (
        "openai/gsm8k",
        {
            "README.md": card(
                {
                    "main": {"train": "main/train-*", "test": "main/test-*"},
                    "socratic": {"train": "socratic/train-*", "test": "socratic/test-*"},
                }
            ),
            "main/test-00000-of-00001.parquet": parquet_bytes(GSM8K_MAIN),
            "main/train-00000-of-00001.parquet": parquet_bytes(GSM8K_SOCRATIC),
            "socratic/test-00000-of-00001.parquet": parquet_bytes(GSM8K_SOCRATIC),
            "socratic/train-00000-of-00001.parquet": parquet_bytes(GSM8K_SOCRATIC),
        },
        {},
        {"math"},
        {r["question"] for r in GSM8K_MAIN},
    ),
    "sharegpt": (
        "anon8231489123/ShareGPT_Vicuna_unfiltered",
        {
            "README.md": card(None, "apache-2.0"),
            "ShareGPT_V3_unfiltered_cleaned_split.json": json.dumps(SHAREGPT_ROWS).encode(),
            "ShareGPT_V3_unfiltered_cleaned_split_no_imsorry.json": json.dumps(
                [{"id": "z", "conversations": [{"from": "human", "value": "Not this file."}]}]
            ).encode(),
        },
        {},
        {"chat"},
        {"Hi, who are you?", "One question only."},
    ),
    "spec_bench": (
        None,  # Spec-Bench ships in its GitHub repo; a team mirrors question.jsonl as a dataset repo
        {"data/spec_bench/question.jsonl": jsonl_bytes(SPEC_BENCH_ROWS)},
        {"id": "team/spec-bench", "data_files": ("data/spec_bench/question.jsonl",)},
        {"writing", "translation"},
        {r["turns"][0] for r in SPEC_BENCH_ROWS},
    ),
}


@pytest.fixture(autouse=True)
def unreachable_hub(monkeypatch: pytest.MonkeyPatch) -> str:
    """The Hub endpoint is a loopback port nothing listens on: any download attempt fails at once."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    endpoint = f"http://127.0.0.1:{port}"
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    return endpoint


def first_turns(workload: PromptSetWorkload, count: int) -> list[Any]:
    return list(request_stream(workload, iter(range(count))))


@pytest.mark.parametrize("layout", ["cache", "mirror"])
@pytest.mark.parametrize("preset", sorted(HUB_SETS))
def test_preset_loads_by_hub_id_when_cache_or_mirror_holds_its_repo(
    preset: str, layout: str, tmp_path: Path
) -> None:
    """Each preset reads its set's Hub repo in the repo's own shape (its config, split and file) from a
    hub cache (offline) or a local mirror: the categories, the first turns and the dataset name are the
    set's, and an MT-Bench row carries its second turn."""
    repo_id, files, fields, categories, texts = HUB_SETS[preset]
    if layout == "cache":
        write_hub_cache(tmp_path / "hub", repo_id or fields["id"], files)
        hf = HubDataset(**fields, cache_dir=str(tmp_path / "hub"), offline=True)
    else:
        hf = HubDataset(**{**fields, "id": None}, mirror=str(write_mirror(tmp_path / "mirror", files)))
        if repo_id is None:  # no Hub copy to take defaults from: the mirror names its own files
            hf = hf.model_copy(update={"data_files": fields["data_files"]})
    workload = PromptSetWorkload(format=preset, hf=hf, max_tokens=32)  # type: ignore[arg-type]
    requests = first_turns(workload, len(texts))
    assert {r.category for r in requests} == categories
    assert {r.dataset for r in requests} == {preset} and {r.turn for r in requests} == {0}
    assert {orjson.loads(r.body)["messages"][0]["content"] for r in requests} == texts
    if preset == "mt_bench":
        assert all(r.next_turn is not None for r in requests)
        second = requests[0].next_turn.request(requests[0].index, "A reply.")  # type: ignore[union-attr]
        assert [m["content"] for m in orjson.loads(second.body)["messages"]][1:] == [
            "A reply.",
            "Shorten it.",
        ]


def gsm8k_cache(tmp_path: Path) -> Path:
    write_hub_cache(tmp_path / "hub", "openai/gsm8k", HUB_SETS["gsm8k"][1])
    return tmp_path / "hub"


@pytest.mark.parametrize("variable", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_hub_dataset_is_one_clear_error_when_offline_and_not_cached(
    variable: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline by either Hugging Face variable with an empty cache: one WorkloadError naming the dataset
    and its revision, saying offline mode is on, with the download command as the fix."""
    monkeypatch.setenv(variable, "1")
    workload = PromptSetWorkload(
        hf=HubDataset(id="team/absent", revision="v1", cache_dir=str(tmp_path / "hub")), max_tokens=8
    )
    with pytest.raises(WorkloadError) as err:
        workload.prompts()
    assert "team/absent@v1 is not in" in err.value.problem and "offline mode is on" in err.value.problem
    assert "hf download team/absent --repo-type dataset --revision v1" in str(err.value.fix)
    assert not (tmp_path / "hub").exists()  # nothing written


def test_hub_dataset_reads_the_cache_when_hub_is_unreachable(tmp_path: Path) -> None:
    """Online but the Hub does not answer: a cached revision is read from the cache; an uncached one is
    one error saying the Hub cannot be reached."""
    workload = PromptSetWorkload(
        format="gsm8k", hf=HubDataset(cache_dir=str(gsm8k_cache(tmp_path))), max_tokens=8
    )
    assert len(workload.prompts()) == len(GSM8K_MAIN)
    absent = workload.model_copy(update={"hf": HubDataset(id="team/other", cache_dir=str(tmp_path / "hub"))})
    with pytest.raises(WorkloadError, match="the Hub cannot be reached"):
        absent.prompts()


def test_hub_dataset_reads_the_named_revision_config_and_split_when_cache_holds_several(
    tmp_path: Path,
) -> None:
    """A pinned commit reads that commit's files, not main's; config and split pick the data files."""
    cache = gsm8k_cache(tmp_path)
    older = [{"question": "An older question?", "answer": "#### 1"}]
    files = {**HUB_SETS["gsm8k"][1], "main/test-00000-of-00001.parquet": parquet_bytes(older)}
    commit = write_hub_cache(cache, "openai/gsm8k", files, revision="v0")
    hf = HubDataset(cache_dir=str(cache), offline=True)

    def questions(**fields: Any) -> set[str]:
        workload = PromptSetWorkload(format="gsm8k", hf=hf.model_copy(update=fields), max_tokens=8)
        return {p.messages[0][1] for p in workload.prompts()}

    assert questions() == {r["question"] for r in GSM8K_MAIN}
    assert questions(revision=commit) == questions(revision="v0") == {"An older question?"}
    assert questions(config="socratic") == questions(split="train") == {GSM8K_SOCRATIC[0]["question"]}


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"split": "validation"}, "names split 'validation', and Hugging Face dataset openai/gsm8k@main has: test, train"),
        ({"config": "nope"}, "BuilderConfig 'nope' not found"),
        ({"revision": "v9"}, "openai/gsm8k@v9 is not in"),
    ],
    ids=["split", "config", "revision"],
)  # fmt: skip
def test_hub_dataset_names_the_bad_field_when_split_config_or_revision_is_wrong(
    fields: dict[str, str], needle: str, tmp_path: Path
) -> None:
    """A split, config or revision the cached dataset does not have is one WorkloadError naming it."""
    hf = HubDataset(cache_dir=str(gsm8k_cache(tmp_path)), offline=True, **fields)
    with pytest.raises(WorkloadError) as err:
        PromptSetWorkload(format="gsm8k", hf=hf, max_tokens=8).prompts()
    assert needle in err.value.problem and "\n" not in err.value.problem


def test_hub_dataset_is_one_error_when_mirror_is_missing_or_id_absent(tmp_path: Path) -> None:
    """A mirror directory that does not exist, and a table format with no id, are one error each."""
    with pytest.raises(WorkloadError, match="mirror directory does not exist"):
        PromptSetWorkload(hf=HubDataset(mirror=str(tmp_path / "none")), max_tokens=8).prompts()
    with pytest.raises(WorkloadError, match="hf has no id"):
        PromptSetWorkload(hf=HubDataset(), max_tokens=8).prompts()
    with pytest.raises(ValueError, match="exactly one of path"):
        PromptSetWorkload(path="a.jsonl", hf=HubDataset(id="a/b"), max_tokens=8)


def test_prompt_set_reads_json_lines_when_a_json_file_holds_them(tmp_path: Path) -> None:
    """A .json data file holding JSON Lines (as many Hub repos name them) reads like a .jsonl file."""
    path = tmp_path / "set.json"
    path.write_bytes(
        jsonl_bytes([{"prompt": "One.", "category": "chat"}, {"prompt": "Two.", "category": "code"}])
    )
    prompts = PromptSetWorkload(path=str(path), max_tokens=8).prompts()
    assert sorted(p.messages[0][1] for p in prompts) == ["One.", "Two."]
