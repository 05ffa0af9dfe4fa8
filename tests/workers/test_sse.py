"""SSE framing, first-byte timestamps and the per-chunk integer scan, on SGLang 0.5.23's recorded streams."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from workers.load.sse import SSEDecoder, SSEFormatError, int_field
from workers.load.stream import ResponseStream, StreamError
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
    assert [p["meta_info"]["completion_tokens"] for p in payloads] == [3, 5, 9, 10]


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
    assert len(whole) == 9


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
    assert stream.chunk_tokens == [3, 2, 4, 1]
    stats = stream.final_stats()
    assert (stats.completion_tokens, stats.prompt_tokens, stats.finish_reason) == (10, 7, "length")
    assert (stats.spec_verify_ct, stats.spec_accept_length, stats.spec_accept_rate) == (4, 2.5, 0.5)
    assert (stats.spec_num_correct_drafts, stats.spec_num_proposed_drafts) == (6, 12)
    assert stats.spec_correct_drafts_histogram == [1, 1, 1, 1]


def test_response_stream_reads_usage_and_sglext_when_route_is_chat() -> None:
    """Chat: tokens from continuous usage, finish from the choice, spec stats from sglext."""
    stream = _stream("chat_spec_stream.sse", api.CHAT_COMPLETIONS)
    assert stream.chunk_tokens == [3, 2, 4, 1]
    stats = stream.final_stats()
    assert (stats.completion_tokens, stats.prompt_tokens, stats.finish_reason) == (10, 7, "length")
    assert (stats.spec_verify_ct, stats.spec_accept_length) == (4, 2.5)
    assert stats.spec_correct_drafts_histogram == [1, 1, 1, 1]


def test_response_stream_raises_server_error_when_stream_carries_error_event() -> None:
    """SGLang's in-stream error object becomes a ``server_error`` with its code and message."""
    stream = _stream("generate_error_event.sse", api.GENERATE)
    assert stream.chunk_tokens == [3]
    with pytest.raises(StreamError, match="400 The request was aborted") as caught:
        stream.final_stats()
    assert caught.value.error_type == "server_error"
