"""Seeded, reproducible request streams: what the load generator sends, body by body.

Two workloads: random token ids with fixed or ranged lengths on native ``/generate`` (``ignore_eos``, so
the output length is exact; a stress shape, not a basis for choosing a config), and prompt sets from a
JSONL, Parquet or CSV file (prompt text, chat messages or ShareGPT conversations, through a column
mapping) on ``/v1/chat/completions`` with ``return_spec_tokens_details``, each request carrying its
category, optionally drawn from a weighted category mix. Bodies
are encoded to bytes here, before the clock starts, so the hot path only sends them. The same seed and
index always give the same body, whichever process of a multi-process run sends it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specsweep.errors import WorkloadError
from workers.sglang import api

RANDOM_IDS_CATEGORY = "random_ids"  # the category of every random-ids request (a stress shape)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request ready to send: its index in the workload, route, encoded JSON body."""

    index: int
    endpoint: str
    body: bytes
    expected_output_tokens: int | None  # exact with ignore_eos, else None
    category: str | None = None  # content category, recorded in the request's row
    dataset: str | None = None  # the prompt set it came from
    turn: int | None = None  # 0-based turn of a conversation


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class RandomIdsWorkload(_Strict):
    """Random token ids on ``/generate`` with ``ignore_eos``: lengths known exactly, no tokenizer."""

    kind: Literal["random_ids"] = Field(default="random_ids", description="Workload type tag.")
    input_tokens: int = Field(ge=1, description="Prompt length in tokens (the minimum if a max is set).")
    input_tokens_max: int | None = Field(
        default=None, ge=1, description="Upper bound of a uniform prompt length range; null = fixed."
    )
    output_tokens: int = Field(ge=1, description="Output length (max_new_tokens; minimum if ranged).")
    output_tokens_max: int | None = Field(
        default=None, ge=1, description="Upper bound of a uniform output length range; null = fixed."
    )
    vocab_size: int = Field(default=32000, ge=2, description="Token ids are drawn from [1, vocab_size).")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature sent with each request.")
    seed: int = Field(default=0, description="Seed of the lengths and token ids.")

    @model_validator(mode="after")
    def _check_ranges(self) -> RandomIdsWorkload:
        for low, high, name in (
            (self.input_tokens, self.input_tokens_max, "input_tokens"),
            (self.output_tokens, self.output_tokens_max, "output_tokens"),
        ):
            if high is not None and high < low:
                raise ValueError(f"{name}_max ({high}) is below {name} ({low})")
        return self

    def request(self, index: int) -> PreparedRequest:
        """Request number ``index``: the same bytes for the same seed and index."""
        rng = np.random.default_rng((self.seed, index))
        prompt_len = int(rng.integers(self.input_tokens, (self.input_tokens_max or self.input_tokens) + 1))
        output_len = int(rng.integers(self.output_tokens, (self.output_tokens_max or self.output_tokens) + 1))
        ids = rng.integers(1, self.vocab_size, size=prompt_len, dtype=np.int64)
        body = {
            "input_ids": ids,
            "sampling_params": {
                "max_new_tokens": output_len,
                "temperature": self.temperature,
                "ignore_eos": True,
            },
            "stream": True,
        }
        return PreparedRequest(
            index,
            api.GENERATE,
            orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY),
            output_len,
            category=RANDOM_IDS_CATEGORY,
        )


class Columns(_Strict):
    """Which columns of a prompt file hold what (a column mapping for files not in the default shape)."""

    prompt: str = Field(default="prompt", description="Column with the user prompt text.")
    messages: str | None = Field(
        default=None,
        description="Column with a chat message list ({role, content}); used instead of prompt when set.",
    )
    conversations: str | None = Field(
        default="conversations",
        description="Column with a ShareGPT conversation ({from, value}); its first human turn is sent "
        "when the row has no prompt.",
    )
    turns: str | None = Field(
        default="turns",
        description="Column with a list of user turns (MT-Bench style); its first turn is sent when the row "
        "has no prompt.",
    )
    category: str | None = Field(
        default="category", description="Column with the row's category; null or absent: uncategorised."
    )
    output_tokens: str | None = Field(
        default=None,
        description="Column with a reference output length; caps that row's max_tokens when set.",
    )


@dataclass(frozen=True, slots=True)
class Prompt:
    """One row of a prompt set: the chat messages to send, its category, its output length cap."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    category: str | None
    max_tokens: int | None


class PromptSetWorkload(_Strict):
    """Prompts from a local JSONL, Parquet or CSV file sent to ``/v1/chat/completions``; each request
    carries its row's category (and the set's name) into the results. Natural output lengths (EOS ends a
    request) capped by ``max_tokens``."""

    kind: Literal["prompt_set"] = Field(default="prompt_set", description="Workload type tag.")
    path: str = Field(description="Prompt file: .jsonl, .parquet or .csv (by suffix).")
    columns: Columns = Field(default_factory=Columns, description="Which columns hold what.")
    format: Literal["table", "mt_bench", "spec_bench", "humaneval", "gsm8k", "sharegpt"] = Field(
        default="table",
        description="table: the columns mapping; or a named preset reading that set's upstream file as "
        "published (see docs/workloads.md), which fixes the columns and the category.",
    )
    dataset: str | None = Field(
        default=None,
        description="Name of the set recorded in each row; null = the format's name, else the file's stem.",
    )
    mix: dict[str, float] | None = Field(
        default=None,
        description="Category weights (e.g. {code: 0.3, chat: 0.5, math: 0.2}): each request draws its "
        "category, then a prompt of it; null = the file's rows in seeded order, cycled.",
    )
    max_tokens: int = Field(ge=1, description="max_tokens of each request (the output length cap).")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature of each request.")
    top_p: float | None = Field(default=None, gt=0, le=1, description="Nucleus sampling; null = server's.")
    top_k: int | None = Field(default=None, ge=1, description="Top-k sampling; null = server's.")
    ignore_eos: bool = Field(
        default=False, description="Generate exactly max_tokens (a fixed-length benchmark, not natural)."
    )
    model: str = Field(default="default", description="The model name sent in each request.")
    seed: int = Field(default=0, description="Seed of the prompt order and the category draws.")

    @model_validator(mode="after")
    def _check_mix(self) -> PromptSetWorkload:
        if self.mix is not None and (not self.mix or any(w < 0 for w in self.mix.values())):
            raise ValueError("mix needs at least one category and no negative weight")
        if self.mix is not None and sum(self.mix.values()) <= 0:
            raise ValueError("mix weights must not all be 0")
        return self

    @property
    def dataset_name(self) -> str:
        """The ``dataset`` column value of this set's rows."""
        return self.dataset or (self.format if self.format != "table" else Path(self.path).stem)

    def prompts(self) -> list[Prompt]:
        """The file's prompts in seeded order; ``WorkloadError`` naming the row if one is unusable, or
        naming a mix category the file lacks."""
        columns, category = PRESETS.get(self.format, (self.columns, None))
        prompts = [_prompt_of(row, columns, where, category) for row, where in _read_rows(Path(self.path))]
        if not prompts:
            raise WorkloadError("prompt file has no rows", where=self.path, fix="add prompts to it")
        random.Random(self.seed).shuffle(prompts)
        if self.mix is not None:
            have = {p.category for p in prompts}
            missing = sorted(c for c, w in self.mix.items() if w > 0 and c not in have)
            if missing:
                raise WorkloadError(
                    f"mix names categories the file has no rows of: {', '.join(missing)}",
                    where=self.path,
                    fix=f"use categories of the file ({', '.join(sorted(str(c) for c in have))}) "
                    f"or check columns.category ({self.columns.category})",
                )
        return prompts

    def request_from(self, prompts: list[Prompt], index: int) -> PreparedRequest:
        """Request number ``index`` over already loaded ``prompts``: the same for the same seed."""
        return self._request(prompts[index % len(prompts)], index)

    def requests(self, indices: Iterator[int]) -> Iterator[PreparedRequest]:
        """The requests for ``indices``: the file read once, the mix's pools built once."""
        prompts = self.prompts()
        if self.mix is None:
            return (self.request_from(prompts, i) for i in indices)
        pools: dict[str, list[Prompt]] = {}
        for prompt in prompts:
            if prompt.category is not None:
                pools.setdefault(prompt.category, []).append(prompt)
        names = sorted(c for c, w in self.mix.items() if w > 0)
        weights = [self.mix[c] for c in names]

        def drawn(index: int) -> PreparedRequest:
            rng = random.Random(f"{self.seed}:{index}")
            pool = pools[rng.choices(names, weights=weights)[0]]
            return self._request(pool[rng.randrange(len(pool))], index)

        return (drawn(i) for i in indices)

    def _request(self, prompt: Prompt, index: int) -> PreparedRequest:
        max_tokens = min(self.max_tokens, prompt.max_tokens or self.max_tokens)
        body: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": role, "content": content} for role, content in prompt.messages],
            "max_tokens": max_tokens,
            "temperature": self.temperature,
            "stream": True,
            api.STREAM_OPTIONS: {"include_usage": True, api.CONTINUOUS_USAGE_STATS: True},
            api.RETURN_SPEC_TOKENS_DETAILS: True,
        }
        if self.top_p is not None:
            body["top_p"] = self.top_p
        if self.top_k is not None:
            body["top_k"] = self.top_k
        if self.ignore_eos:
            body["ignore_eos"] = True
        return PreparedRequest(
            index,
            api.CHAT_COMPLETIONS,
            orjson.dumps(body),
            max_tokens if self.ignore_eos else None,
            prompt.category,
            self.dataset_name,
            0,
        )


Workload = Annotated[RandomIdsWorkload | PromptSetWorkload, Field(discriminator="kind")]


def request_stream(workload: Workload, indices: Iterator[int]) -> Iterator[PreparedRequest]:
    """The workload's requests for ``indices`` (a shard of a multi-process run takes every n-th)."""
    if isinstance(workload, PromptSetWorkload):
        return workload.requests(indices)
    return (workload.request(i) for i in indices)


_FIX_FILE = "pass an existing .jsonl, .json (an array), .parquet or .csv file with one prompt per row"


def _read_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, where) of a JSONL, Parquet or CSV file, by suffix; ``WorkloadError`` if unreadable."""
    suffix = path.suffix.lower()
    if suffix not in (".jsonl", ".json", ".parquet", ".csv"):
        raise WorkloadError(f"unknown prompt file type {suffix!r}", where=str(path), fix=_FIX_FILE)
    try:
        if suffix == ".json":
            return _json_array_rows(path)
        if suffix == ".jsonl":
            lines = path.read_text(encoding="utf-8").splitlines()
            return (
                (_json_row(line, f"{path}:{n}"), f"{path}:{n}")
                for n, line in enumerate(lines, 1)
                if line.strip()
            )
        import pyarrow.csv as pacsv
        import pyarrow.parquet as pq

        table = pq.read_table(path) if suffix == ".parquet" else pacsv.read_csv(path)
    except OSError as err:
        raise WorkloadError(f"cannot read prompt file: {err}", where=str(path), fix=_FIX_FILE) from None
    except ValueError as err:  # pyarrow.ArrowInvalid: not Parquet / not CSV
        raise WorkloadError(
            f"prompt file is not {suffix[1:]}: {err}", where=str(path), fix=_FIX_FILE
        ) from None
    return ((row, f"{path} row {n}") for n, row in enumerate(table.to_pylist(), 1))


def _json_array_rows(path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, where) of a JSON file holding an array of objects (as ShareGPT is published)."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as err:
        raise WorkloadError(f"not JSON: {err.msg}", where=str(path), fix=_FIX_FILE) from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise WorkloadError(
            "a .json prompt file must hold an array of objects", where=str(path), fix=_FIX_FILE
        )
    return ((row, f"{path} item {n}") for n, row in enumerate(data, 1))


def _json_row(line: str, where: str) -> dict[str, Any]:
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"not JSON: {err.msg}", where=where, fix="one JSON object per line") from None
    if not isinstance(obj, dict):
        raise WorkloadError("line is not a JSON object", where=where, fix="one JSON object per line")
    return obj


# Named prompt sets in their upstream file format: (columns, the category every row has, or None to read
# it from the category column). MT-Bench and Spec-Bench: FastChat's question.jsonl ({question_id, category,
# turns}); HumanEval: {task_id, prompt, canonical_solution, test, entry_point}; GSM8K: {question, answer};
# ShareGPT: a JSON array of {id, conversations: [{from, value}]}.
PRESETS: dict[str, tuple[Columns, str | None]] = {
    "mt_bench": (Columns(), None),
    "spec_bench": (Columns(), None),
    "humaneval": (Columns(category=None), "code"),
    "gsm8k": (Columns(prompt="question", category=None), "math"),
    "sharegpt": (Columns(category=None), "chat"),
}


def _prompt_of(
    row: dict[str, Any], columns: Columns, where: str, fixed_category: str | None = None
) -> Prompt:
    """One row's prompt through the column mapping (``fixed_category``: every row's, from a preset)."""
    category = fixed_category or (row.get(columns.category) if columns.category else None)
    limit = row.get(columns.output_tokens) if columns.output_tokens else None
    return Prompt(
        messages=_messages_of(row, columns, where),
        category=None if category is None else str(category),
        max_tokens=int(limit) if isinstance(limit, int | float) and limit >= 1 else None,
    )


def _messages_of(row: dict[str, Any], columns: Columns, where: str) -> tuple[tuple[str, str], ...]:
    """The chat messages of a row: its messages column, its prompt, its first turn, or a ShareGPT first
    human turn."""
    if columns.messages is not None:
        messages = row.get(columns.messages)
        if (
            isinstance(messages, list)
            and messages
            and all(
                isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
                for m in messages
            )
        ):
            return tuple((m["role"], m["content"]) for m in messages)
        raise WorkloadError(
            f"column {columns.messages!r} is not a list of {{role, content}} messages",
            where=where,
            fix="point columns.messages at a chat message list, or use columns.prompt",
        )
    if isinstance(row.get(columns.prompt), str):
        return (("user", row[columns.prompt]),)
    turns = row.get(columns.turns) if columns.turns else None
    if isinstance(turns, list) and turns and isinstance(turns[0], str):
        return (("user", turns[0]),)
    conversation = row.get(columns.conversations) if columns.conversations else None
    if isinstance(conversation, list):
        for turn in conversation:
            if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
                value = turn.get("value")
                if isinstance(value, str):
                    return (("user", value),)
    raise WorkloadError(
        f"row has no text in column {columns.prompt!r} and no human turn",
        where=where,
        fix=f"set columns.prompt to the file's prompt column (the row has: {', '.join(sorted(row))})",
    )
