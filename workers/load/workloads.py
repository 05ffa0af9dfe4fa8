"""Seeded, reproducible request streams: what the load generator sends, body by body.

Two workloads: random token ids with fixed or ranged lengths on native ``/generate`` (``ignore_eos``, so
the output length is exact; a stress shape, not a basis for choosing a config), and prompt sets from a
JSONL, Parquet or CSV file or a Hugging Face dataset (prompt text, chat messages, MT-Bench turns or
ShareGPT conversations, through a column mapping) on ``/v1/chat/completions`` with
``return_spec_tokens_details``, each request carrying its category, optionally drawn from a weighted
category mix. A conversation of several user turns is replayed turn by turn: each later turn carries the
server's own reply to the one before (``NextTurn``), so only a first turn's body is fixed in advance.
Bodies are encoded to bytes here, before the clock starts, so the hot path only sends them. The same seed
and index always give the same body, whichever process of a multi-process run sends it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specsweep.documents import load_json
from specsweep.errors import WorkloadError
from workers.load.hub_datasets import HubDataset, HubDefaults, hub_data_files
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
    next_turn: NextTurn | None = None  # the conversation's next turn, which needs this request's reply


class _Strict(BaseModel):
    # Non-finite numbers are refused like unknown keys: a NaN mix weight passes every `w < 0` check and
    # reaches the job payload as null.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


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
        description="Column with a ShareGPT conversation ({from, value}), used when the row has no prompt: "
        "its human turns are replayed in order, each with the server's reply to the one before.",
    )
    turns: str | None = Field(
        default="turns",
        description="Column with a list of user turns (MT-Bench style), used when the row has no prompt: "
        "replayed in order, each with the server's reply to the one before. A prompt column holding a "
        "list of strings is read the same way.",
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
    """One row of a prompt set: the chat messages of its first turn, the user messages of its later turns,
    its category, its output length cap."""

    messages: tuple[tuple[str, str], ...]  # (role, content)
    category: str | None
    max_tokens: int | None
    later_turns: tuple[str, ...] = ()  # user messages of turns 1, 2, ... (each after the server's reply)


@dataclass(frozen=True, slots=True)
class NextTurn:
    """A later turn of a conversation, built once the reply of the request carrying it has arrived: the
    messages sent so far, the server's reply to them, then this turn's user message (as MT-Bench runs)."""

    workload: PromptSetWorkload
    prompt: Prompt
    sent: tuple[tuple[str, str], ...]  # the messages of the request whose reply it waits for
    turn: int  # the turn it sends (1 is the second)
    last: int  # the conversation's last turn to send

    def request(self, index: int, reply: str) -> PreparedRequest:
        """This turn's request, after ``reply`` (the text the server streamed for the turn before)."""
        messages = (*self.sent, ("assistant", reply), ("user", self.prompt.later_turns[self.turn - 1]))
        after = replace(self, sent=messages, turn=self.turn + 1) if self.turn < self.last else None
        return self.workload.turn_request(self.prompt, index, messages, self.turn, after)


class PromptSetWorkload(_Strict):
    """Prompts from a local JSONL, Parquet or CSV file or a Hugging Face dataset, sent to
    ``/v1/chat/completions``; each request carries its row's category (and the set's name and the turn)
    into the results. Natural output lengths (EOS ends a request) capped by ``max_tokens``."""

    kind: Literal["prompt_set"] = Field(default="prompt_set", description="Workload type tag.")
    path: str | None = Field(
        default=None, description="Prompt file: .jsonl, .json, .parquet or .csv (by suffix); or give hf."
    )
    hf: HubDataset | None = Field(
        default=None,
        description="A Hugging Face dataset (id, revision, config, split; a hub cache or a local mirror for "
        "clusters without internet) instead of path.",
    )
    columns: Columns = Field(default_factory=Columns, description="Which columns hold what.")
    format: Literal["table", "mt_bench", "spec_bench", "humaneval", "gsm8k", "sharegpt"] = Field(
        default="table",
        description="table: the columns mapping; or a named preset reading that set's upstream file or its "
        "Hugging Face dataset as published (see docs/workloads.md), which fixes the columns and the category.",
    )
    dataset: str | None = Field(
        default=None,
        description="Name of the set recorded in each row; null = the format's name, else the Hub id's name "
        "or the file's stem.",
    )
    mix: dict[str, float] | None = Field(
        default=None,
        description="Category weights (e.g. {code: 0.3, chat: 0.5, math: 0.2}): each request draws its "
        "category, then a prompt of it; null = the file's rows in seeded order, cycled.",
    )
    max_turns: int | None = Field(
        default=None,
        ge=1,
        description="Turns of each conversation to replay (1: first turns only); null = all of them.",
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
        if (self.path is None) == (self.hf is None):
            raise ValueError(
                "a prompt_set reads exactly one of path (a local file) and hf (a Hugging Face dataset)"
            )
        if self.mix is not None and (not self.mix or any(w < 0 for w in self.mix.values())):
            raise ValueError("mix needs at least one category and no negative weight")
        if self.mix is not None and sum(self.mix.values()) <= 0:
            raise ValueError("mix weights must not all be 0")
        return self

    @property
    def dataset_name(self) -> str:
        """The ``dataset`` column value of this set's rows: the spec's, the format's, the Hub id's name or
        the file's stem."""
        if self.dataset or self.format != "table":
            return self.dataset or self.format
        if self.hf is not None:
            return (self.hf.id or Path(str(self.hf.mirror)).name).rsplit("/", 1)[-1]
        return Path(str(self.path)).stem

    @property
    def _where(self) -> str:
        """How errors name the set: its file, or its Hub dataset."""
        return f"Hugging Face dataset {self.hf.label}" if self.hf is not None else str(self.path)

    def data_files(self) -> list[Path]:
        """The local files of the set (for a Hub dataset: found in the cache or mirror, or downloaded);
        ``WorkloadError`` when the dataset cannot be reached."""
        if self.hf is None:
            return [Path(str(self.path))]
        preset = PRESETS.get(self.format)
        return hub_data_files(self.hf, preset.hub if preset else None)

    def check_readable(self) -> None:
        """``WorkloadError`` unless every file of the set is here (a Hub dataset: in the cache or mirror,
        or downloaded now); cheap, it parses nothing."""
        for path in self.data_files():
            if not path.is_file():
                raise WorkloadError("cannot read prompt file: no such file", where=str(path), fix=_FIX_FILE)

    def node_only(self) -> bool:
        """Whether the set is a local path (file or mirror) this machine lacks: the nodes read it."""
        local = self.path if self.hf is None else self.hf.mirror
        return local is not None and not Path(local).exists()

    def prompts(self) -> list[Prompt]:
        """The set's prompts in seeded order; ``WorkloadError`` naming the row if one is unusable, naming a
        mix category the set lacks, or saying why a Hub dataset cannot be reached."""
        preset = PRESETS.get(self.format)
        columns, category = (preset.columns, preset.category) if preset else (self.columns, None)
        prompts = [
            _prompt_of(row, columns, where, category)
            for path in self.data_files()
            for row, where in _read_rows(path)
        ]
        if not prompts:
            raise WorkloadError("prompt set has no rows", where=self._where, fix="add prompts to it")
        random.Random(self.seed).shuffle(prompts)
        if self.mix is not None:
            have = {p.category for p in prompts}
            missing = sorted(c for c, w in self.mix.items() if w > 0 and c not in have)
            if missing:
                raise WorkloadError(
                    f"mix names categories the set has no rows of: {', '.join(missing)}",
                    where=self._where,
                    fix=f"use categories of the file ({', '.join(sorted(str(c) for c in have))}) "
                    f"or check columns.category ({self.columns.category})",
                )
        return prompts

    def requests(self, indices: Iterator[int], limit: int | None = None) -> Iterator[PreparedRequest]:
        """The first turns of the conversations for ``indices`` (the set read once, the mix's pools built
        once). With ``limit``, conversations are taken until their turns add up to ``limit`` requests, the
        last one cut short if need be."""
        prompts = self.prompts()
        drawn = self._mix_draw(prompts) if self.mix is not None else lambda i: prompts[i % len(prompts)]

        def first_turns(left: int | None) -> Iterator[PreparedRequest]:
            for index in indices:
                if left is not None and left <= 0:
                    return
                prep = self._first_turn(drawn(index), index, left)
                if left is not None:
                    left -= 1 + (prep.next_turn.last if prep.next_turn else 0)
                yield prep

        return first_turns(limit)

    def _mix_draw(self, prompts: list[Prompt]) -> Callable[[int], Prompt]:
        """Index -> prompt by the mix: its category drawn by weight, then a row of it (seeded by index)."""
        assert self.mix is not None
        pools: dict[str, list[Prompt]] = {}
        for prompt in prompts:
            if prompt.category is not None:
                pools.setdefault(prompt.category, []).append(prompt)
        names = sorted(c for c, w in self.mix.items() if w > 0)
        weights = [self.mix[c] for c in names]

        def drawn(index: int) -> Prompt:
            rng = random.Random(f"{self.seed}:{index}")
            pool = pools[rng.choices(names, weights=weights)[0]]
            return pool[rng.randrange(len(pool))]

        return drawn

    def _first_turn(self, prompt: Prompt, index: int, limit: int | None) -> PreparedRequest:
        """A conversation's first request; it carries the next turn when more are replayed (at most
        ``max_turns``, and at most ``limit`` requests in all)."""
        turns = 1 + len(prompt.later_turns)
        last = min(turns, self.max_turns or turns, limit or turns) - 1
        after = NextTurn(self, prompt, prompt.messages, 1, last) if last > 0 else None
        return self.turn_request(prompt, index, prompt.messages, 0, after)

    def turn_request(
        self,
        prompt: Prompt,
        index: int,
        messages: tuple[tuple[str, str], ...],
        turn: int,
        next_turn: NextTurn | None,
    ) -> PreparedRequest:
        """The request of one turn of ``prompt``'s conversation, sending ``messages``."""
        max_tokens = min(self.max_tokens, prompt.max_tokens or self.max_tokens)
        body: dict[str, object] = {
            "model": self.model,
            "messages": [{"role": role, "content": content} for role, content in messages],
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
            turn,
            next_turn,
        )


Workload = Annotated[RandomIdsWorkload | PromptSetWorkload, Field(discriminator="kind")]


def request_stream(
    workload: Workload, indices: Iterator[int], limit: int | None = None
) -> Iterator[PreparedRequest]:
    """The workload's requests for ``indices`` (a shard of a multi-process run takes every n-th): one per
    index, each the first turn of a conversation whose later turns follow its replies, all of them
    together at most ``limit`` requests."""
    if isinstance(workload, PromptSetWorkload):
        return workload.requests(indices, limit)
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
    """(row, where) of a JSON file holding an array of objects (as ShareGPT is published), or JSON Lines
    under a .json name (as many Hub dataset repos store them)."""
    text = path.read_text(encoding="utf-8")
    try:
        data = load_json(text)
    except json.JSONDecodeError as err:
        if err.msg == "Extra data":  # more than one document: JSON Lines
            return _json_lines(text, path)
        raise WorkloadError(f"not JSON: {err.msg}", where=f"{path}:{err.lineno}", fix=_FIX_FILE) from None
    if not isinstance(data, list) or not all(isinstance(row, dict) for row in data):
        raise WorkloadError(
            "a .json prompt file must hold an array of objects", where=str(path), fix=_FIX_FILE
        )
    return ((row, f"{path} item {n}") for n, row in enumerate(data, 1))


def _json_lines(text: str, path: Path) -> Iterator[tuple[dict[str, Any], str]]:
    """(row, where) of JSON Lines text, blank lines skipped."""
    return (
        (_json_row(line, f"{path}:{n}"), f"{path}:{n}")
        for n, line in enumerate(text.splitlines(), 1)
        if line.strip()
    )


def _json_row(line: str, where: str) -> dict[str, Any]:
    try:
        obj = load_json(line)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"not JSON: {err.msg}", where=where, fix="one JSON object per line") from None
    if not isinstance(obj, dict):
        raise WorkloadError("line is not a JSON object", where=where, fix="one JSON object per line")
    return obj


@dataclass(frozen=True, slots=True)
class Preset:
    """A named prompt set in its upstream shape: its columns, the category of every row (None: the
    category column's), and its copy on the Hugging Face Hub (None: it has none)."""

    columns: Columns
    category: str | None
    hub: HubDefaults | None


# Named prompt sets, read as published. MT-Bench and Spec-Bench: FastChat's question.jsonl ({question_id,
# category, turns}); MT-Bench on the Hub: {prompt: [turns], prompt_id, category, reference}; HumanEval:
# {task_id, prompt, canonical_solution, test, entry_point}; GSM8K: {question, answer}; ShareGPT: a JSON
# array of {id, conversations: [{from, value}]}. docs/workloads.md lists their sources and licenses.
PRESETS: dict[str, Preset] = {
    "mt_bench": Preset(Columns(), None, HubDefaults("HuggingFaceH4/mt_bench_prompts", "train")),
    "spec_bench": Preset(Columns(), None, None),
    "humaneval": Preset(Columns(category=None), "code", HubDefaults("openai/openai_humaneval", "test")),
    "gsm8k": Preset(
        Columns(prompt="question", category=None), "math", HubDefaults("openai/gsm8k", "test", "main")
    ),
    "sharegpt": Preset(
        Columns(category=None),
        "chat",
        HubDefaults(
            "anon8231489123/ShareGPT_Vicuna_unfiltered",
            "train",
            data_files=("ShareGPT_V3_unfiltered_cleaned_split.json",),
        ),
    ),
}


def _prompt_of(
    row: dict[str, Any], columns: Columns, where: str, fixed_category: str | None = None
) -> Prompt:
    """One row's prompt through the column mapping (``fixed_category``: every row's, from a preset)."""
    category = fixed_category or (row.get(columns.category) if columns.category else None)
    limit = row.get(columns.output_tokens) if columns.output_tokens else None
    messages, later_turns = _turns_of(row, columns, where)
    return Prompt(
        messages=messages,
        category=None if category is None else str(category),
        max_tokens=int(limit) if isinstance(limit, int | float) and limit >= 1 else None,
        later_turns=later_turns,
    )


def _turns_of(
    row: dict[str, Any], columns: Columns, where: str
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]]:
    """A row's first-turn chat messages and its later user turns: its messages column (one turn), its
    prompt, its list of turns (MT-Bench), or a ShareGPT conversation's human turns."""
    if columns.messages is not None:
        return _messages_column(row, columns.messages, where), ()
    prompt = row.get(columns.prompt)
    if isinstance(prompt, str):
        return (("user", prompt),), ()
    for turns in (prompt, row.get(columns.turns) if columns.turns else None):
        if isinstance(turns, list) and turns and all(isinstance(t, str) for t in turns):
            return (("user", turns[0]),), tuple(turns[1:])
    conversation = row.get(columns.conversations) if columns.conversations else None
    if isinstance(conversation, list) and (found := _sharegpt_turns(conversation)) is not None:
        return found
    raise WorkloadError(
        f"row has no text in column {columns.prompt!r} and no human turn",
        where=where,
        fix=f"set columns.prompt to the file's prompt column (the row has: {', '.join(sorted(row))})",
    )


def _messages_column(row: dict[str, Any], column: str, where: str) -> tuple[tuple[str, str], ...]:
    """A chat message list column, sent as is."""
    messages = row.get(column)
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
        f"column {column!r} is not a list of {{role, content}} messages",
        where=where,
        fix="point columns.messages at a chat message list, or use columns.prompt",
    )


def _sharegpt_turns(
    conversation: list[Any],
) -> tuple[tuple[tuple[str, str], ...], tuple[str, ...]] | None:
    """A ShareGPT conversation's human turns, in order (the recorded answers are not replayed: the server
    gives its own), after its system message if it opens with one; None without a human turn."""
    system: tuple[tuple[str, str], ...] = ()
    human: list[str] = []
    for n, turn in enumerate(conversation):
        if not isinstance(turn, dict) or not isinstance(turn.get("value"), str):
            continue
        if n == 0 and turn.get("from") == "system":
            system = (("system", turn["value"]),)
        elif turn.get("from") in ("human", "user"):
            human.append(turn["value"])
    if not human:
        return None
    return (*system, ("user", human[0])), tuple(human[1:])
