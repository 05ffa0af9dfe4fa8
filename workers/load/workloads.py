"""Seeded, reproducible request streams: what the load generator sends, body by body.

Two workloads: random token ids with fixed or ranged lengths on native ``/generate`` (``ignore_eos``, so
the output length is exact), and prompts from a JSONL file (``{"prompt": ...}`` or ShareGPT-style
``{"conversations": [...]}``) on ``/v1/chat/completions`` with ``return_spec_tokens_details``. Bodies
are encoded to bytes here, before the clock starts, so the hot path only sends them. The same seed and
index always give the same body, whichever process of a multi-process run sends it.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Literal

import numpy as np
import orjson
from pydantic import BaseModel, ConfigDict, Field, model_validator

from specsweep.errors import WorkloadError
from workers.sglang import api


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """One request ready to send: its index in the workload, route, encoded JSON body."""

    index: int
    endpoint: str
    body: bytes
    expected_output_tokens: int | None  # exact with ignore_eos, else None


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
            index, api.GENERATE, orjson.dumps(body, option=orjson.OPT_SERIALIZE_NUMPY), output_len
        )


class JsonlPromptsWorkload(_Strict):
    """Prompts from a JSONL file sent to ``/v1/chat/completions``, in a seeded order, cycled if short."""

    kind: Literal["jsonl_prompts"] = Field(default="jsonl_prompts", description="Workload type tag.")
    path: str = Field(description='JSONL file: one {"prompt": str} or {"conversations": [...]} per line.')
    max_tokens: int = Field(ge=1, description="max_tokens of each request.")
    temperature: float = Field(default=0.0, ge=0, description="Sampling temperature of each request.")
    model: str = Field(default="default", description="The model name sent in each request.")
    seed: int = Field(default=0, description="Seed of the prompt order.")

    def prompts(self) -> list[str]:
        """The file's prompts in seeded order; ``WorkloadError`` naming the line if one is unusable."""
        prompts = _read_prompts(Path(self.path))
        random.Random(self.seed).shuffle(prompts)
        return prompts

    def request_from(self, prompts: list[str], index: int) -> PreparedRequest:
        """Request number ``index`` over already loaded ``prompts``."""
        body = {
            "model": self.model,
            "messages": [{"role": "user", "content": prompts[index % len(prompts)]}],
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
            "stream": True,
            api.STREAM_OPTIONS: {"include_usage": True, api.CONTINUOUS_USAGE_STATS: True},
            api.RETURN_SPEC_TOKENS_DETAILS: True,
        }
        return PreparedRequest(index, api.CHAT_COMPLETIONS, orjson.dumps(body), None)


Workload = Annotated[RandomIdsWorkload | JsonlPromptsWorkload, Field(discriminator="kind")]


def request_stream(workload: Workload, indices: Iterator[int]) -> Iterator[PreparedRequest]:
    """The workload's requests for ``indices`` (a shard of a multi-process run takes every n-th)."""
    if isinstance(workload, JsonlPromptsWorkload):
        prompts = workload.prompts()
        return (workload.request_from(prompts, i) for i in indices)
    return (workload.request(i) for i in indices)


def _read_prompts(path: Path) -> list[str]:
    """Prompts of a JSONL file: ``prompt`` or the first human turn of ``conversations``."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as err:
        raise WorkloadError(
            f"cannot read prompts file: {err.strerror}",
            where=str(path),
            fix="pass an existing JSONL file with one prompt object per line",
        ) from None
    prompts = []
    for number, line in enumerate(lines, start=1):
        if line.strip():
            prompts.append(_prompt_of(line, f"{path}:{number}"))
    if not prompts:
        raise WorkloadError("prompts file has no prompts", where=str(path), fix="add JSONL lines")
    return prompts


def _prompt_of(line: str, where: str) -> str:
    """One line's prompt text."""
    fix = 'each line must be {"prompt": "..."} or {"conversations": [{"from": "human", "value": "..."}]}'
    try:
        obj = json.loads(line)
    except json.JSONDecodeError as err:
        raise WorkloadError(f"not JSON: {err.msg}", where=where, fix=fix) from None
    if isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
        return str(obj["prompt"])
    turns = obj.get("conversations") if isinstance(obj, dict) else None
    if isinstance(turns, list):
        for turn in turns:
            if isinstance(turn, dict) and turn.get("from") in ("human", "user"):
                value = turn.get("value")
                if isinstance(value, str):
                    return value
    raise WorkloadError("line has no prompt and no human turn", where=where, fix=fix)
