"""The OpenAI-shaped bodies (chat and text completions) SGLang's serving layer emits, built for the simulator."""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import orjson
from aiohttp import web

from workers.sglang import api
from workers.sim.engine import EOS_TOKEN_ID, TOKEN_WORDS, Progress, SimRequest


@dataclass(frozen=True)
class OpenAIForm:
    """Builds the OpenAI-shaped objects (chat or text completion) SGLang's serving layer emits."""

    chat: bool
    model: str
    rid: str
    details: bool

    def _envelope(self, choices: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
        kind = "chat.completion.chunk" if self.chat else "text_completion"
        return {
            "id": self.rid,
            "object": kind,
            "created": int(time.time()),
            "model": self.model,
            "choices": choices,
            **extra,
        }

    def role_chunk(self) -> dict[str, Any]:
        delta = {"reasoning_content": None, "role": "assistant", "content": ""}
        return self._envelope([_stream_choice(delta=delta)])

    def delta_chunk(self, text: str, usage: dict[str, Any] | None) -> dict[str, Any]:
        extra = {"usage": usage} if usage else {}
        if self.chat:
            return self._envelope(
                [_stream_choice(delta={"reasoning_content": None, "content": text})], **extra
            )
        return self._envelope([_stream_choice(text=text)], **extra)

    def finish_chunk(self, finish_reason: dict[str, Any] | None) -> dict[str, Any]:
        kind, matched = _finish(finish_reason)
        if self.chat:
            return self._envelope(
                [_stream_choice(delta={"reasoning_content": None}, finish=kind, matched=matched)]
            )
        return self._envelope([_stream_choice(text="", finish=kind, matched=matched)])

    def sglext_chunk(self, details: dict[str, Any]) -> dict[str, Any]:
        return self._envelope([], usage=None, **{api.SGLEXT: _sglext(details)})

    def usage_chunk(self, usage: dict[str, Any]) -> dict[str, Any]:
        return self._envelope([], usage=usage)

    def full_response(self, progress: Progress, req: SimRequest, details: dict[str, Any]) -> dict[str, Any]:
        kind, matched = _finish(progress.finish_reason)
        if self.chat:
            choice = {
                "index": 0,
                "message": {"role": "assistant", "content": progress.text, "reasoning_content": None},
                "logprobs": None,
                "finish_reason": kind,
                "matched_stop": matched,
            }
        else:
            choice = {
                "index": 0,
                "text": progress.text,
                "logprobs": None,
                "finish_reason": kind,
                "matched_stop": matched,
            }
        body = self._envelope([choice], usage=usage(req, progress), metadata=None)
        body["object"] = "chat.completion" if self.chat else "text_completion"
        if self.details and details:
            body[api.SGLEXT] = _sglext(details)
        return body


def _stream_choice(
    *,
    delta: dict[str, Any] | None = None,
    text: str | None = None,
    finish: str | None = None,
    matched: Any = None,
) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0}
    if delta is not None:
        choice["delta"] = delta
    if text is not None:
        choice["text"] = text
    choice.update({"logprobs": None, "finish_reason": finish, "matched_stop": matched})
    return choice


def _finish(finish_reason: dict[str, Any] | None) -> tuple[str | None, Any]:
    if finish_reason is None:
        return None, None
    return finish_reason["type"], finish_reason.get("matched")


def usage(req: SimRequest, progress: Progress) -> dict[str, Any]:
    return {
        "prompt_tokens": req.prompt_tokens,
        "total_tokens": req.prompt_tokens + progress.completion_tokens,
        "completion_tokens": progress.completion_tokens,
        "prompt_tokens_details": None,
        "reasoning_tokens": 0,
        "completion_tokens_details": None,
    }


def _sglext(details: dict[str, Any]) -> dict[str, Any]:
    spec = {
        "spec_accept_rate": details[api.SPEC_ACCEPT_RATE],
        "spec_accept_length": details[api.SPEC_ACCEPT_LENGTH],
        "spec_cap_length": 0.0,
        "spec_block_accept_length": 0.0,
        "spec_num_correct_drafts": details[api.SPEC_NUM_CORRECT_DRAFTS],
        "spec_num_proposed_drafts": details[api.SPEC_NUM_PROPOSED_DRAFTS],
        "spec_verify_ct": details[api.SPEC_VERIFY_CT],
        "spec_correct_drafts_histogram": details[api.SPEC_CORRECT_DRAFTS_HISTOGRAM],
        "spec_cap_lens_histogram": [],
    }
    return {
        "routed_experts": None,
        "cached_tokens_details": None,
        api.SPEC_TOKENS_DETAILS: spec,
        "input_ids": None,
        "output_ids": None,
    }


def token_texts(ids: list[int]) -> Iterator[str]:
    for token in ids:
        if token != EOS_TOKEN_ID:
            yield " " + TOKEN_WORDS[token]


async def write_event(response: web.StreamResponse, chunk: dict[str, Any]) -> None:
    chunk[api.SIM_SEND_NS] = time.perf_counter_ns()
    await response.write(api.SSE_DATA_PREFIX + orjson.dumps(chunk) + b"\n\n")


def json_response(body: dict[str, Any], status: int = 200) -> web.Response:
    return web.Response(body=orjson.dumps(body), status=status, content_type="application/json")


def error_response(message: str, kind: str, status: int) -> web.Response:
    return json_response(
        {"object": "error", "message": message, "type": kind, "param": None, "code": status}, status
    )
