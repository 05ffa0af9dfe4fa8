"""SSE framing, first-byte timestamps and the per-chunk integer scan, on SGLang 0.5.23's recorded streams."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from workers.load.sse import MAX_EVENT_BYTES, SSEDecoder, SSEEventTooLargeError, SSEFormatError, int_field
from workers.load.stream import ReplyStream, ResponseStream, StreamError
from workers.sglang import api

STREAMS = Path(__file__).parents[1] / "fixtures" / "sglang-0.5.23"


def _events(raw: bytes, cuts: list[int]) -> list:
    """Decode ``raw`` delivered in reads split at ``cuts``; read k arrives at time k."""
    decoder = SSEDecoder()
    bounds = [0, *cuts, len(raw)]
    events = []
    for k, (a, b) in enumerate(itertools.pairwise(bounds)):
        events.extend(decoder.feed(raw[a:b], k))
    return events


def test_decoder_yields_every_data_payload_when_fed_sglang_generate_stream() -> None:
    """Each ``data:`` line of SGLang's /generate stream is one event, [DONE] last, JSON bytes intact."""
    raw = (STREAMS / "generate_spec_stream.sse").read_bytes()
    events = _events(raw, [])
    assert [e.data for e in events][-1] == b"[DONE]"
    payloads = [json.loads(e.data) for e in events[:-1]]
    assert [p["meta_info"]["completion_tokens"] for p in payloads] == [1, 4, 6, 9, 10]


def test_decoder_stamps_event_with_its_first_bytes_read_when_event_spans_reads() -> None:
    """An event split over reads keeps the arrival time of the read that brought its first byte."""
    raw = b'data: {"a":1}\n\ndata: {"b":2}\n\ndata: [DONE]\n\n'
    second = raw.index(b'data: {"b"')
    events = _events(raw, [second + 3, second + 10, len(raw) - 4])
    assert [(e.first_byte_ns, e.data) for e in events] == [
        (0, b'{"a":1}'),
        (0, b'{"b":2}'),  # began in read 0, ended in read 2
        (2, b"[DONE]"),
    ]


def test_decoder_gives_same_events_when_split_at_every_byte() -> None:
    """Framing does not depend on where TCP splits the bytes (including between CR and LF)."""
    raw = (STREAMS / "chat_spec_stream.sse").read_bytes().replace(b"\n", b"\r\n")
    whole = [e.data for e in _events(raw, [])]
    bytewise = [e.data for e in _events(raw, list(range(1, len(raw))))]
    assert whole == bytewise
    assert len(whole) == 10


def test_decoder_handles_comments_event_names_and_multiline_data_when_present() -> None:
    """Comments are skipped, ``event:`` is kept, several ``data:`` lines join with a newline."""
    raw = b': keep-alive\n\nevent: sglext_ids\ndata: {"x":\ndata: 1}\nid: 7\n\n'
    (event,) = _events(raw, [])
    assert event.event == b"sglext_ids"
    assert event.data == b'{"x":\n1}'


def test_decoder_raises_when_bytes_are_not_sse() -> None:
    """An HTML error page (a proxy's) is reported as not SSE, not silently skipped."""
    with pytest.raises(SSEFormatError, match="not a server-sent event line"):
        _events(b"<html><body>502 Bad Gateway</body></html>\n\n", [])


def test_decoder_gives_same_events_when_long_multiline_events_with_crlf_come_in_many_reads() -> None:
    """Events longer than the held-in-place threshold (200 KiB, several data lines, CRLF line ends) give
    the same events and first-byte stamps cut into 997-byte reads as whole, whichever byte a cut splits."""
    line = b"data: " + b"y" * 100_000
    raw = b"event: big\r\n" + line + b"\r\n" + line + b"\r\n\r\n" + b"data: [DONE]\r\n\r\n"
    for offset in range(4):  # move the cuts over the CR/LF pairs
        cuts = list(range(997 - offset, len(raw), 997))
        events = _events(raw, cuts)
        assert [(e.event, e.data) for e in events] == [(e.event, e.data) for e in _events(raw, [])]
        assert events[0].data == line[6:] + b"\n" + line[6:] and events[0].first_byte_ns == 0


def test_decoder_refuses_an_event_when_it_grows_past_the_bound_without_an_end() -> None:
    """A line that never ends is refused once MAX_EVENT_BYTES are held: the decoder does not keep
    buffering (a server streaming 100 MB of one line costs a bounded amount of memory)."""
    decoder = SSEDecoder()
    decoder.feed(b"data: ", 0)
    piece, fed = b"z" * 65536, 6
    with pytest.raises(SSEEventTooLargeError, match="more than 16 MiB without its end"):
        while fed <= 2 * MAX_EVENT_BYTES:
            fed += len(piece)
            decoder.feed(piece, 1)
    assert MAX_EVENT_BYTES < fed <= MAX_EVENT_BYTES + len(piece)


def test_decoder_reports_partial_event_when_stream_is_cut_mid_event() -> None:
    """Bytes of an unfinished event are held and visible, so a cut-off stream can say so."""
    decoder = SSEDecoder()
    assert decoder.feed(b'data: {"a":1}\n\ndata: {"b"', 5)[0].data == b'{"a":1}'
    assert decoder.has_partial_event


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        (b'{"meta_info":{"completion_tokens":17}}', 17),
        (b'{"usage":{"completion_tokens": 3,"x":1}}', 3),
        (b'{"completion_tokens":1,"inner":{"completion_tokens":250}}', 250),
        (b'{"text":"say \\"completion_tokens\\": 9","completion_tokens":2}', 2),
        (b'{"completion_tokens":null}', None),
        (b'{"completion_tokens":1.5}', None),
        (b'{"prompt_tokens":5}', None),
    ],
)
def test_int_field_reads_last_integer_when_key_present(payload: bytes, expected: int | None) -> None:
    """The scan returns the last integer value of the key; strings, null and floats never match."""
    assert int_field(payload, b'"completion_tokens"') == expected


def _stream(name: str, endpoint: str) -> ResponseStream:
    stream = ResponseStream(endpoint)
    stream.add_events(_events((STREAMS / name).read_bytes(), []))
    return stream


def test_response_stream_counts_tokens_per_step_when_generate_chunks_are_cumulative() -> None:
    """Tokens per chunk are the deltas of completion_tokens; spec stats come from the final meta_info."""
    stream = _stream("generate_spec_stream.sse", api.GENERATE)
    assert stream.done
    assert stream.chunk_tokens == [1, 3, 2, 3, 1]  # the prefill's token, then one chunk per verify step
    _check_final_stats(stream)


def test_response_stream_counts_tokens_per_chunk_when_prefill_and_first_step_are_coalesced() -> None:
    """SGLang's tokenizer manager sends what queued since its last wake-up as one chunk: the prefill's
    token and the first verify step's arrive together; the deltas and final stats stay exact."""
    stream = _stream("generate_spec_stream_coalesced.sse", api.GENERATE)
    assert stream.done
    assert stream.chunk_tokens == [4, 2, 3, 1]
    _check_final_stats(stream)


def _check_final_stats(stream: ResponseStream) -> None:
    stats = stream.final_stats()
    assert (stats.completion_tokens, stats.prompt_tokens, stats.finish_reason) == (10, 7, "length")
    assert (stats.spec_verify_ct, stats.spec_accept_length, stats.spec_accept_rate) == (4, 2.5, 5 / 12)
    assert (stats.spec_num_correct_drafts, stats.spec_num_proposed_drafts) == (5, 12)
    assert stats.spec_correct_drafts_histogram == [1, 1, 2, 0]


def test_response_stream_reads_usage_and_sglext_when_route_is_chat() -> None:
    """Chat: tokens from continuous usage, finish from the choice, spec stats from sglext."""
    stream = _stream("chat_spec_stream.sse", api.CHAT_COMPLETIONS)
    assert stream.chunk_tokens == [1, 3, 2, 3, 1]
    _check_final_stats(stream)


def test_response_stream_raises_server_error_when_stream_carries_error_event() -> None:
    """SGLang's in-stream error object becomes a ``server_error`` with its code and message."""
    stream = _stream("generate_error_event.sse", api.GENERATE)
    assert stream.chunk_tokens == [3]
    with pytest.raises(StreamError, match="400 The request was aborted") as caught:
        stream.final_stats()
    assert caught.value.error_type == "server_error"


def _stream_of(endpoint: str, *payloads: bytes) -> ResponseStream:
    """A stream built from payloads, the k-th event arriving in read k, then [DONE]."""
    stream = ResponseStream(endpoint)
    raw = b"".join(b"data: " + p + b"\n\n" for p in (*payloads, api.SSE_DONE))
    stream.add_events(_events(raw, [i + 1 for i, b in enumerate(raw) if raw[i - 1 : i + 1] == b"\n\n"][:-1]))
    return stream


def test_response_stream_stamps_each_token_chunk_when_events_arrive_in_separate_reads() -> None:
    """A chunk's arrival is its first byte's read; [DONE]'s is ``done_ns``; chunks without new tokens
    are not token chunks; the simulator's send stamp is kept per token chunk, and absent it none is."""
    meta = '{"meta_info":{"completion_tokens":%d,"sim_send_ns":%d}}'
    stream = _stream_of(api.GENERATE, *(meta.encode() % (n, 100 + n) for n in (1, 4, 4, 6)))
    assert (stream.chunk_tokens, stream.chunk_arrival_ns, stream.done_ns) == ([1, 3, 2], [0, 1, 3], 4)
    assert stream.server_chunk_ns == [101, 104, 106]
    plain = _stream("generate_spec_stream.sse", api.GENERATE)
    assert plain.server_chunk_ns == [] and plain.completion_tokens == 10


@pytest.mark.parametrize(
    "payloads",
    [
        (),  # [DONE] alone
        (b'{"text":"a","meta_info":{"completion_tokens":1}}', b"{not json}"),
        (b'{"text":"a","meta_info":{"completion_tokens":1}}', b"[1, 2]"),
        (b'{"text":"a","completion_tokens":1}',),  # no meta_info
    ],
)
def test_response_stream_raises_malformed_sse_when_generate_stream_cannot_be_read(
    payloads: tuple[bytes, ...],
) -> None:
    """A /generate stream with no chunk, a chunk that is not a JSON object, or no final meta_info is a
    ``malformed_sse`` error naming what is wrong, never a crash."""
    with pytest.raises(StreamError) as caught:
        _stream_of(api.GENERATE, *payloads).final_stats()
    assert caught.value.error_type == "malformed_sse"
    assert any(s in str(caught.value) for s in ("no chunk", "not JSON", "not a JSON object", "no meta_info"))


def test_response_stream_reads_plain_finish_and_error_without_code_when_server_sends_them() -> None:
    """A finish reason given as a string is kept; an error object without a code reads as its message."""
    stats = _stream_of(
        api.GENERATE, b'{"meta_info":{"completion_tokens":2,"prompt_tokens":3,"finish_reason":"stop"}}'
    ).final_stats()
    assert (stats.finish_reason, stats.completion_tokens, stats.prompt_tokens) == ("stop", 2, 3)
    with pytest.raises(StreamError, match=r"^overloaded$"):
        _stream_of(api.GENERATE, b'{"error":{"message":"overloaded"}}').final_stats()


def test_response_stream_has_no_spec_stats_when_chat_server_does_not_speculate() -> None:
    """SGLang's sglext reports verify count 0 without speculation: every spec_* field is then null, while
    the counts come from usage and the finish reason from the choice."""
    usage = b'{"choices":[{"delta":{"content":"a"},"finish_reason":null}],"usage":{"completion_tokens":1}}'
    finish = b'{"choices":[{"delta":{},"finish_reason":"length"}]}'
    sglext = b'{"choices":[],"sglext":{"spec_tokens_details":{"spec_verify_ct":0,"spec_accept_length":1.0,'
    sglext += b'"spec_accept_rate":0.0,"spec_num_correct_drafts":0,"spec_num_proposed_drafts":0,'
    sglext += b'"spec_correct_drafts_histogram":[]}}}'
    last = b'{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":1}}'
    stats = _stream_of(api.CHAT_COMPLETIONS, usage, finish, sglext, last).final_stats()
    assert (stats.completion_tokens, stats.prompt_tokens, stats.finish_reason) == (1, 4, "length")
    assert stats.spec_verify_ct is None and stats.spec_accept_length is None
    assert stats.spec_accept_rate is None and stats.spec_num_correct_drafts is None
    assert stats.spec_num_proposed_drafts is None and stats.spec_correct_drafts_histogram is None


def test_response_stream_reads_bare_chat_and_string_errors_when_extras_are_absent() -> None:
    """A chat stream without usage or sglext chunks (no stream_options asked) has null counts and spec
    stats and no finish reason yet, rather than failing; an error given as a bare string reads as itself."""
    stats = _stream_of(
        api.CHAT_COMPLETIONS, b'{"choices":[{"delta":{"content":"a"},"finish_reason":null}]}'
    ).final_stats()
    assert (stats.completion_tokens, stats.prompt_tokens, stats.finish_reason, stats.spec_verify_ct) == (
        None,
        None,
        None,
        None,
    )
    with pytest.raises(StreamError, match=r"^boom$"):
        _stream_of(api.GENERATE, b'{"error":"boom"}').final_stats()


def test_reply_stream_keeps_the_reply_text_and_the_same_stats_when_a_later_turn_needs_it() -> None:
    """SGLang's recorded chat stream read by ReplyStream (a request a later turn replies to): the same
    token chunks and final statistics as ResponseStream, plus the reply text joined from every chunk's
    ``delta.content``; a ResponseStream keeps no text."""
    raw = (STREAMS / "chat_spec_stream.sse").read_bytes()
    events = _events(raw, [len(raw) // 3, len(raw) // 2])  # reads split mid-event
    plain, kept = ResponseStream(api.CHAT_COMPLETIONS), ReplyStream(api.CHAT_COMPLETIONS)
    plain.add_events(events)
    kept.add_events(events)
    assert kept.reply == "The quick brown fox jumps over the lazy dog." and plain.reply is None
    assert (kept.chunk_tokens, kept.chunk_arrival_ns) == (plain.chunk_tokens, plain.chunk_arrival_ns)
    assert kept.final_stats() == plain.final_stats()


def test_reply_stream_raises_malformed_sse_when_a_chunk_is_not_json() -> None:
    """A reply chunk that is not JSON cannot give text to send back: ``malformed_sse`` at once."""
    stream = ReplyStream(api.CHAT_COMPLETIONS)
    with pytest.raises(StreamError, match="not JSON") as caught:
        stream.add_events(_events(b'data: {"usage":{"completion_tokens":1},\n\n', []))
    assert caught.value.error_type == "malformed_sse"
