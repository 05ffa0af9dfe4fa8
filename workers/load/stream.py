"""One SGLang streaming response, event by event: token arrivals per chunk, then the final statistics.

Per chunk only two integers are read (``completion_tokens`` and, from the simulated server, its send
stamp) with ``workers.load.sse.int_field``; the tokens a chunk carried are the delta of ``completion_tokens``
(never re-tokenised text). Full JSON is decoded only for the few chunks that carry no new tokens (role,
finish, ``sglext``, usage, error) and, on ``/generate``, the final chunk. Both routes are covered: native
``/generate`` (cumulative chunks, ``meta_info``) and ``/v1/chat/completions`` (``usage`` on every chunk
with ``stream_options.continuous_usage_stats``; speculative stats in the ``sglext`` chunk). A reply that a
later turn of a conversation needs is read by ``ReplyStream``, which also keeps each chunk's text; every
other request pays nothing for that.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import orjson

from workers.load.sse import SSEEvent, int_field
from workers.sglang import api

_COMPLETION_TOKENS_KEY = f'"{api.META_COMPLETION_TOKENS}"'.encode()
INVALID_RESPONSE = "invalid_response"  # error_type of a response with a field we cannot store as sent
# Bounds of what a server may report for one request; past them the value is a server bug (or hostile),
# and storing it would corrupt the tables (or, for token counts, grow per-token lists without limit).
MAX_TOKENS = 1 << 22  # prompt or completion tokens of one request (4M: above any context length)
MAX_HISTOGRAM_BINS = 4096  # one bin per accepted-draft count: far above any draft-token setting
MAX_ACCEPT_LENGTH = 4096.0
MAX_FINISH_REASON_CHARS = 64
_SERVER_SEND_NS_KEY = f'"{api.SIM_SEND_NS}"'.encode()


class StreamError(Exception):
    """A stream that ended in an error event or cannot be read; ``error_type`` names the class."""

    def __init__(self, error_type: str, message: str) -> None:
        super().__init__(message)
        self.error_type = error_type


@dataclass(frozen=True, slots=True)
class FinalStats:
    """What the last chunks of a finished stream say about the whole request (null when not said)."""

    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    spec_verify_ct: int | None
    spec_accept_length: float | None
    spec_accept_rate: float | None
    spec_num_correct_drafts: int | None
    spec_num_proposed_drafts: int | None
    spec_correct_drafts_histogram: list[int] | None
    cached_tokens: int | None = None


class ResponseStream:
    """Collects one streaming response: arrival and tokens of every chunk that carried tokens.

    ``chunk_arrival_ns`` and ``server_chunk_ns`` are absolute ``perf_counter_ns`` stamps (the caller
    makes them relative). ``done`` turns true on ``data: [DONE]``.
    """

    __slots__ = (
        "_chat",
        "_completion_tokens",
        "_tail",
        "chunk_arrival_ns",
        "chunk_tokens",
        "done",
        "done_ns",
        "server_chunk_ns",
    )

    def __init__(self, endpoint: str) -> None:
        self._chat = endpoint != api.GENERATE
        self._completion_tokens = 0
        self._tail: list[bytes] = []  # payloads without new tokens, and the last one with tokens
        self.chunk_arrival_ns: list[int] = []
        self.chunk_tokens: list[int] = []
        self.server_chunk_ns: list[int] = []
        self.done = False
        self.done_ns: int | None = None

    @property
    def completion_tokens(self) -> int:
        """Tokens seen so far (the last ``completion_tokens`` value)."""
        return self._completion_tokens

    @property
    def reply(self) -> str | None:
        """The reply's text, when this stream keeps it (``ReplyStream``)."""
        return None

    def add_events(self, events: list[SSEEvent]) -> None:
        """Take the events of one read; reads two integers per event, decodes nothing."""
        for first_byte_ns, payload, _ in events:
            if payload == api.SSE_DONE:
                self.done = True
                self.done_ns = first_byte_ns
                continue
            total = int_field(payload, _COMPLETION_TOKENS_KEY)
            if total is None or total <= self._completion_tokens:
                self._tail.append(payload)
                continue
            if total > MAX_TOKENS:
                raise StreamError(
                    INVALID_RESPONSE,
                    f"{api.META_COMPLETION_TOKENS} jumped to {total} (after {self._completion_tokens}); at most "
                    f"{MAX_TOKENS} are believable",
                )
            self.chunk_arrival_ns.append(first_byte_ns)
            self.chunk_tokens.append(total - self._completion_tokens)
            self._completion_tokens = total
            sent = int_field(payload, _SERVER_SEND_NS_KEY)
            if sent is not None:
                self.server_chunk_ns.append(sent)
            if not self._chat:  # /generate: the newest token chunk is the final one unless others follow
                self._tail.clear()
                self._tail.append(payload)

    def final_stats(self) -> FinalStats:
        """Decode the tail chunks; raises ``StreamError`` for an error event, undecodable JSON or a field
        that cannot be true (``invalid_response``: wrong type, out of range, fewer tokens than streamed)."""
        objects = [_decode(payload) for payload in self._tail]
        for obj in objects:
            if "error" in obj:
                raise StreamError("server_error", _error_message(obj["error"]))
        stats = _chat_stats(objects) if self._chat else _generate_stats(objects)
        if stats.completion_tokens is not None and stats.completion_tokens < self._completion_tokens:
            raise StreamError(
                INVALID_RESPONSE,
                f"final {api.META_COMPLETION_TOKENS} {stats.completion_tokens} is below the "
                f"{self._completion_tokens} tokens streamed",
            )
        return stats


class ReplyStream(ResponseStream):
    """A chat stream whose reply text the next turn of its conversation sends back: each chunk's
    ``delta.content`` is decoded as it comes (a few microseconds per chunk, spread over the stream rather
    than one burst at its end, so other streams' chunks are not held up)."""

    __slots__ = ("_parts",)

    def __init__(self, endpoint: str) -> None:
        super().__init__(endpoint)
        self._parts: list[str] = []

    @property
    def reply(self) -> str:
        """The text streamed so far, concatenated."""
        return "".join(self._parts)

    def add_events(self, events: list[SSEEvent]) -> None:
        super().add_events(events)
        for _, payload, _ in events:
            if payload != api.SSE_DONE:
                self._parts.append(_delta_content(_decode(payload)))


def _delta_content(obj: dict[str, Any]) -> str:
    """The text a chat chunk adds (empty for role, finish, usage and ``sglext`` chunks)."""
    for choice in obj.get("choices") or ():
        delta = choice.get("delta") if isinstance(choice, dict) else None
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            return str(delta["content"])
    return ""


def _decode(payload: bytes) -> dict[str, Any]:
    """One chunk's JSON object, or ``StreamError('malformed_sse')``."""
    try:
        obj = orjson.loads(payload)
    except orjson.JSONDecodeError as err:
        raise StreamError("malformed_sse", f"chunk is not JSON ({err}): {payload[:200]!r}") from None
    if not isinstance(obj, dict):
        raise StreamError("malformed_sse", f"chunk is not a JSON object: {payload[:200]!r}")
    return obj


def _error_message(error: object) -> str:
    """The message of an SGLang error object (``{"message": ..., "code": ...}``) or its text."""
    if isinstance(error, dict):
        return f"{error.get('code', '')} {error.get('message', error)}".strip()
    return str(error)


def _generate_stats(objects: list[dict[str, Any]]) -> FinalStats:
    """``/generate``: everything is in the last chunk's ``meta_info``."""
    if not objects:
        raise StreamError("malformed_sse", "stream ended with [DONE] but carried no chunk")
    meta = objects[-1].get("meta_info")
    if not isinstance(meta, dict):
        raise StreamError("malformed_sse", "final /generate chunk has no meta_info")
    cached = meta.get(api.META_CACHED_TOKENS)
    return _stats_from(meta, meta, _finish_type(meta.get(api.META_FINISH_REASON)), cached)


def _chat_stats(objects: list[dict[str, Any]]) -> FinalStats:
    """``/v1/chat/completions``: finish reason in a choice, spec stats in ``sglext``, counts in usage."""
    usage: dict[str, Any] = {}
    spec: dict[str, Any] = {}
    finish: str | None = None
    for obj in objects:
        if isinstance(obj.get("usage"), dict):
            usage = obj["usage"]
        sglext = obj.get(api.SGLEXT)
        if isinstance(sglext, dict) and isinstance(sglext.get(api.SPEC_TOKENS_DETAILS), dict):
            spec = sglext[api.SPEC_TOKENS_DETAILS]
        for choice in obj.get("choices") or ():
            if choice.get("finish_reason"):
                finish = choice["finish_reason"]
    details = usage.get(api.USAGE_PROMPT_TOKENS_DETAILS)
    cached = details.get(api.META_CACHED_TOKENS) if isinstance(details, dict) else None
    return _stats_from(usage, spec, finish, cached)


def _finish_type(reason: object) -> str | None:
    """SGLang's finish reason object (``{"type": "length", ...}``) to its type."""
    if isinstance(reason, dict):
        return reason.get("type")
    return reason if isinstance(reason, str) else None


def _stats_from(
    counts: dict[str, Any], spec: dict[str, Any], finish: str | None, cached: object
) -> FinalStats:
    """FinalStats from the object with token counts, the one with ``spec_*`` fields, and the prompt
    tokens served from the prefix cache (``cached``); each value checked (``StreamError(invalid_response)``
    naming the field otherwise)."""
    verify_ct = _count(spec, api.SPEC_VERIFY_CT) or None  # SGLang's sglext reports 0 when not speculating
    if finish is not None and (not isinstance(finish, str) or len(finish) > MAX_FINISH_REASON_CHARS):
        raise StreamError(INVALID_RESPONSE, f"finish reason {str(finish)[:80]!r} is not a short string")
    return FinalStats(
        prompt_tokens=_count(counts, api.META_PROMPT_TOKENS),
        completion_tokens=_count(counts, api.META_COMPLETION_TOKENS),
        finish_reason=finish,
        spec_verify_ct=verify_ct,
        spec_accept_length=_number(spec, api.SPEC_ACCEPT_LENGTH, MAX_ACCEPT_LENGTH) if verify_ct else None,
        spec_accept_rate=_number(spec, api.SPEC_ACCEPT_RATE, 1.0) if verify_ct else None,
        spec_num_correct_drafts=_count(spec, api.SPEC_NUM_CORRECT_DRAFTS) if verify_ct else None,
        spec_num_proposed_drafts=_count(spec, api.SPEC_NUM_PROPOSED_DRAFTS) if verify_ct else None,
        spec_correct_drafts_histogram=_histogram(spec) if verify_ct else None,
        cached_tokens=_count({api.META_CACHED_TOKENS: cached}, api.META_CACHED_TOKENS),
    )


def _count(source: dict[str, Any], key: str) -> int | None:
    """A token or step count: an integer from 0 to MAX_TOKENS, or absent."""
    value = source.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_TOKENS:
        raise StreamError(INVALID_RESPONSE, f"{key} = {value!r:.80} is not a count from 0 to {MAX_TOKENS}")
    return value


def _number(source: dict[str, Any], key: str, high: float) -> float | None:
    """A finite number from 0 to ``high``, or absent."""
    value = source.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0.0 <= value <= high:
        raise StreamError(INVALID_RESPONSE, f"{key} = {value!r:.80} is not a number from 0 to {high:g}")
    return float(value)


def _histogram(source: dict[str, Any]) -> list[int] | None:
    """Counts per number of accepted drafts: a bounded list of counts, or absent."""
    value = source.get(api.SPEC_CORRECT_DRAFTS_HISTOGRAM)
    if value is None:
        return None
    key = api.SPEC_CORRECT_DRAFTS_HISTOGRAM
    if not isinstance(value, list) or len(value) > MAX_HISTOGRAM_BINS:
        raise StreamError(
            INVALID_RESPONSE, f"{key} is not a list of at most {MAX_HISTOGRAM_BINS} counts: {str(value)[:80]}"
        )
    return [_count({key: bin_count}, key) or 0 for bin_count in value]
