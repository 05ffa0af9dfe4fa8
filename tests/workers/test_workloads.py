"""Prompt-set workloads: files in three formats through a column mapping, categories, a weighted mix,
and what their requests measure on the simulated server."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import orjson
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from specsweep.errors import WorkloadError
from tests.launch_args import chain_launch_args
from workers.job import LoadLevel
from workers.load.generator import run_load
from workers.load.workloads import Columns, PromptSetWorkload, RandomIdsWorkload, request_stream
from workers.node.launcher import start_sim
from workers.sglang import SpecParams, api
from workers.sim.model import Load, ground_truth
from workers.sim.presets import DEFAULT_PRESET

ROWS = [
    {"question": f"Write a python function number {i}", "task": "code", "budget": 50} for i in range(4)
] + [{"question": f"Tell me a story about lighthouse {i}", "task": "chat", "budget": 300} for i in range(6)]
COLUMNS = Columns(prompt="question", category="task", output_tokens="budget")


def write_rows(path: Path, rows: list[dict]) -> Path:
    """``rows`` as a JSONL, Parquet or CSV file, by ``path``'s suffix."""
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    elif path.suffix == ".parquet":
        pq.write_table(pa.Table.from_pylist(rows), path)
    else:
        pacsv.write_csv(pa.Table.from_pylist(rows), path)
    return path


def bodies(workload: PromptSetWorkload, count: int) -> list[dict]:
    return [orjson.loads(r.body) for r in request_stream(workload, iter(range(count)))]


@pytest.mark.parametrize("suffix", [".jsonl", ".parquet", ".csv"])
def test_prompt_set_sends_same_requests_when_file_is_jsonl_parquet_or_csv(
    tmp_path: Path, suffix: str
) -> None:
    """The same rows give the same chat requests whatever the file format; the column mapping picks the
    prompt, category and output cap; each request carries category, dataset and turn 0."""
    path = write_rows(tmp_path / f"set{suffix}", ROWS)
    workload = PromptSetWorkload(path=str(path), columns=COLUMNS, max_tokens=128, dataset="mine", seed=4)
    requests = list(request_stream(workload, iter(range(10))))
    reference = PromptSetWorkload(
        path=str(write_rows(tmp_path / "ref.jsonl", ROWS)),
        columns=COLUMNS,
        max_tokens=128,
        dataset="mine",
        seed=4,
    )
    assert [r.body for r in requests] == [r.body for r in request_stream(reference, iter(range(10)))]
    seen = set()
    for request in requests:
        body = orjson.loads(request.body)
        prompt = body["messages"][0]["content"]
        seen.add(prompt)
        assert request.endpoint == api.CHAT_COMPLETIONS
        assert (request.dataset, request.turn) == ("mine", 0)
        assert request.category == ("code" if "python" in prompt else "chat")
        assert body["max_tokens"] == (50 if request.category == "code" else 128)
    assert len(seen) == 10  # a seeded permutation of all rows before any repeats


def test_prompt_set_draws_categories_by_weight_when_mix_is_given(tmp_path: Path) -> None:
    """A mix of 0.3 code / 0.7 chat gives about those shares over many requests, the same each time."""
    path = write_rows(tmp_path / "set.jsonl", ROWS)
    workload = PromptSetWorkload(
        path=str(path), columns=COLUMNS, mix={"code": 0.3, "chat": 0.7}, max_tokens=64
    )
    drawn = [r.category for r in request_stream(workload, iter(range(4000)))]
    shares = Counter(drawn)
    assert shares["code"] / 4000 == pytest.approx(0.3, abs=0.03)
    assert shares["chat"] / 4000 == pytest.approx(0.7, abs=0.03)
    assert drawn == [r.category for r in request_stream(workload, iter(range(4000)))]
    shard = [r.category for r in request_stream(workload, iter(range(1, 4000, 3)))]
    assert shard == drawn[1::3]  # a shard process draws what the single process would have


def test_prompt_set_sends_sampling_params_when_set(tmp_path: Path) -> None:
    """temperature, top_p, top_k and ignore_eos reach the chat body; unset ones are left to the server."""
    path = write_rows(tmp_path / "set.jsonl", [{"prompt": "hi"}])
    plain = bodies(PromptSetWorkload(path=str(path), max_tokens=8), 1)[0]
    assert "top_p" not in plain and "top_k" not in plain and "ignore_eos" not in plain
    tuned = PromptSetWorkload(
        path=str(path), max_tokens=8, temperature=0.7, top_p=0.9, top_k=20, ignore_eos=True
    )
    body = bodies(tuned, 1)[0]
    assert (body["temperature"], body["top_p"], body["top_k"], body["ignore_eos"]) == (0.7, 0.9, 20, True)
    assert next(request_stream(tuned, iter([0]))).expected_output_tokens == 8


def test_prompt_set_reads_messages_and_sharegpt_when_columns_say_so(tmp_path: Path) -> None:
    """A messages column is sent as is; a ShareGPT row sends its first human turn."""
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Why is the sky blue?"},
    ]
    path = write_rows(tmp_path / "chat.jsonl", [{"msgs": messages}])
    body = bodies(PromptSetWorkload(path=str(path), columns=Columns(messages="msgs"), max_tokens=8), 1)[0]
    assert body["messages"] == messages
    share = write_rows(
        tmp_path / "sharegpt.jsonl",
        [{"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello"}]}],
    )
    body = bodies(PromptSetWorkload(path=str(share), max_tokens=8), 1)[0]
    assert body["messages"] == [{"role": "user", "content": "Hi there"}]


def test_prompt_set_names_the_problem_when_file_or_mix_is_unusable(tmp_path: Path) -> None:
    """Unknown suffix, unreadable file, a row without the prompt column and a mix category the file
    lacks are each one WorkloadError naming where and how to fix it."""
    with pytest.raises(WorkloadError, match="unknown prompt file type"):
        PromptSetWorkload(path=str(tmp_path / "set.txt"), max_tokens=8).prompts()
    with pytest.raises(WorkloadError, match="cannot read prompt file"):
        PromptSetWorkload(path=str(tmp_path / "absent.jsonl"), max_tokens=8).prompts()
    path = write_rows(tmp_path / "set.csv", ROWS)
    with pytest.raises(WorkloadError) as err:
        PromptSetWorkload(path=str(path), max_tokens=8).prompts()
    assert "row 1" in str(err.value) and "question" in str(err.value)
    with pytest.raises(WorkloadError, match="math"):
        PromptSetWorkload(path=str(path), columns=COLUMNS, mix={"math": 1.0}, max_tokens=8).prompts()
    with pytest.raises(ValueError, match="mix"):
        PromptSetWorkload(path=str(path), mix={"code": 0.0}, max_tokens=8)


GOOD_LINE = '{"question": "hi", "category": "chat"}\n'
DEEP = "[" * 100_000 + "]" * 100_000


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        ("set.jsonl", GOOD_LINE + '{"question": "hi", "id": ' + "9" * 5000 + "}\n", "set.jsonl:2"),
        ("set.jsonl", GOOD_LINE + DEEP + "\n", "set.jsonl:2"),
        ("set.json", "\n" + DEEP, "set.json:2"),
    ],
    ids=["jsonl_5000_digits", "jsonl_deep", "json_deep"],
)
def test_prompt_set_names_file_and_line_when_json_holds_a_huge_integer_or_deep_nesting(
    name: str, text: str, where: str, tmp_path: Path
) -> None:
    """A 5000-digit integer or nesting past the parser's depth in a prompt file is a WorkloadError naming
    the file and line (a node reports prompts_unreadable), not a ValueError or RecursionError."""
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(WorkloadError, match="not JSON") as err:
        PromptSetWorkload(path=str(path), columns=COLUMNS, max_tokens=8).prompts()
    assert str(err.value).startswith(str(tmp_path / where) + ": ")


def test_random_ids_requests_are_categorised_as_random_ids_when_built() -> None:
    """Random token ids carry the random_ids category (a stress shape), no dataset and no turn."""
    request = RandomIdsWorkload(input_tokens=4, output_tokens=4).request(0)
    assert (request.category, request.dataset, request.turn) == ("random_ids", None, None)


FIXTURES = Path(__file__).parents[1] / "fixtures"
CATEGORY_TEXT = {
    "code": "Write a python function that {}.",
    "math": "Solve for x: {} plus x equals 40.",
    "chat": "Tell me something kind about {}.",
}


def test_run_load_measures_each_categorys_accept_length_when_prompt_set_is_mixed(tmp_path: Path) -> None:
    """A mixed prompt set on the chat route: every row carries its category, dataset, turn and
    cached_tokens (the server's cache report), and each category's token-weighted accept length is
    within 3% of the simulator's truth for that category (its acceptance follows the content)."""
    rows = [
        {"prompt": text.format(f"item {i}"), "category": category}
        for category, text in CATEGORY_TEXT.items()
        for i in range(20)
    ]
    path = write_rows(tmp_path / "mixed.jsonl", rows)
    workload = PromptSetWorkload(
        path=str(path), mix={"code": 0.3, "chat": 0.5, "math": 0.2}, max_tokens=96, ignore_eos=True, seed=1
    )
    steps = 5
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", steps, "--enable-cache-report")
    env = {"SPECSWEEP_SIM_TIME_SCALE": "0.02", "SPECSWEEP_SIM_SEED": "4"}
    with start_sim(args, env=env) as server:
        result = run_load(
            server.url, LoadLevel(concurrency=16, requests=600), workload, calibration_streams=4
        )
    assert result.num_errors == 0
    assert {(r.dataset, r.turn, r.cached_tokens) for r in result.records} == {("mixed", 0, 0)}
    spec = SpecParams("EAGLE3", steps, 1, steps + 1, 48)
    for category in CATEGORY_TEXT:
        mine = [r for r in result.records if r.category == category]
        assert len(mine) > 80, category
        measured = sum(r.completion_tokens or 0 for r in mine) / sum(r.spec_verify_ct or 0 for r in mine)
        load = Load(16, 16, 96, 64, mix=((category, 1.0),))
        truth = ground_truth(DEFAULT_PRESET, spec, load).reported_accept_length  # acceptance: no factor
        assert measured == pytest.approx(truth, rel=0.03), category


def test_run_load_reports_unflushed_cache_when_server_refuses_flush() -> None:
    """A server that refuses /flush_cache: the level's result says the cache was not flushed (the node
    worker then fails the attempt with cache_flush_failed unless the plan allows it)."""
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 2)
    env = {"SPECSWEEP_SIM_TIME_SCALE": "0.02", "SPECSWEEP_SIM_FAULT": "flush_refused"}
    level = LoadLevel(concurrency=2, requests=4, warmup_requests=2, flush_cache=True, flush_timeout_s=0.5)
    with start_sim(args, env=env) as server:
        result = run_load(
            server.url, level, RandomIdsWorkload(input_tokens=4, output_tokens=4), calibration_streams=2
        )
    assert result.cache_flushed is False
    assert len(result.records) == 4 and result.num_errors == 0


# Each preset's upstream file shape, generated here (nothing is downloaded; no upstream text is copied).
PRESET_FILES: dict[str, tuple[str, object, set[str]]] = {
    "mt_bench": (
        "question.jsonl",
        [
            {"question_id": 81, "category": "writing", "turns": ["Draft a note about tides.", "Shorten it."]},
            {"question_id": 111, "category": "math", "turns": ["What is 7 times 6?", "And times 8?"]},
        ],
        {"writing", "math"},
    ),
    "spec_bench": (
        "question.jsonl",
        [
            {"question_id": 1, "category": "translation", "turns": ["Translate 'good morning' to French."]},
            {"question_id": 2, "category": "summarization", "turns": ["Summarize: the cat sat."]},
            {"question_id": 3, "category": "math_reasoning", "turns": ["A box holds 3 pens; 4 boxes?"]},
        ],
        {"translation", "summarization", "math_reasoning"},
    ),
    "humaneval": (
        "HumanEval.jsonl",
        [
            {
                "task_id": "HumanEval/0",
                "prompt": 'def add(a: int, b: int) -> int:\n    """Sum of a and b."""\n',
                "canonical_solution": "    return a + b\n",
                "test": "def check(candidate):\n    assert candidate(1, 2) == 3\n",
                "entry_point": "add",
            }
        ],
        {"code"},
    ),
    "gsm8k": (
        "test.jsonl",
        [{"question": "Ann has 3 apples and buys 2 more. How many?", "answer": "3 + 2 = 5\n#### 5"}],
        {"math"},
    ),
    "sharegpt": (
        "sharegpt.json",
        [
            {
                "id": "a1",
                "conversations": [{"from": "human", "value": "Hi!"}, {"from": "gpt", "value": "Hello."}],
            }
        ],
        {"chat"},
    ),
}


@pytest.mark.parametrize("preset", sorted(PRESET_FILES))
def test_preset_reads_its_upstream_format_when_file_is_generated(tmp_path: Path, preset: str) -> None:
    """Each named preset reads a file in its set's published shape: the first user turn is sent, the
    category comes from the file (MT-Bench, Spec-Bench) or is the set's own, and the dataset is named."""
    name, rows, categories = PRESET_FILES[preset]
    path = tmp_path / name
    if name.endswith(".json"):
        path.write_text(json.dumps(rows))
    else:
        write_rows(path, rows)  # type: ignore[arg-type]
    workload = PromptSetWorkload(path=str(path), format=preset, max_tokens=32)  # type: ignore[arg-type]
    requests = list(request_stream(workload, iter(range(len(rows)))))  # type: ignore[arg-type]
    assert {r.category for r in requests} == categories
    assert {r.dataset for r in requests} == {preset}
    for request in requests:
        messages = orjson.loads(request.body)["messages"]
        assert len(messages) == 1 and messages[0]["role"] == "user" and messages[0]["content"]
    first_turns = {
        row.get("question")
        or row.get("prompt")
        or (row.get("turns") or [None])[0]  # type: ignore[union-attr]
        or row["conversations"][0]["value"]  # type: ignore[index]
        for row in rows  # type: ignore[union-attr]
    }
    assert {orjson.loads(r.body)["messages"][0]["content"] for r in requests} == first_turns
