"""Server-sent events: raw response bytes -> events stamped with the arrival time of their first byte.

The load generator stamps each read with ``time.perf_counter_ns`` the moment it returns, before any
parsing, and hands the bytes here; an event keeps the stamp of the read that brought its first byte, so
an event split across TCP reads is not dated late. Parsing is kept to what each chunk needs:
``int_field`` pulls one integer out of a JSON payload with ``bytes.rfind``, so only the final chunk of a
stream is ever decoded as JSON (by the caller). Stdlib only; knows nothing about SGLang.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_DATA_PREFIX = b"data: "
_TAIL_BYTES = 512
_INT_VALUE = re.compile(rb"\s*:\s*(-?\d+)(?![\d.eE])")  # what follows a key whose value is an integer
_IGNORED_FIELDS = frozenset((b"id", b"retry"))
# Most bytes one unfinished event may hold: a server that streams a line without end (100 MB of one
# chunk) is refused here instead of being buffered until the request times out. SGLang's largest events,
# a final chunk with logprobs of a long output, are a few MiB.
MAX_EVENT_BYTES = 16 << 20
# An unfinished event this long is appended to in place and searched only where each read added bytes;
# below it, re-joining it with the next read (as events split across two reads are) is cheaper.
_LONG_EVENT_BYTES = 64 << 10


class SSEFormatError(ValueError):
    """Bytes that are not a server-sent event stream (a line that is no SSE field, e.g. an HTML page)."""


class SSEEventTooLargeError(ValueError):
    """An event still unfinished past ``MAX_EVENT_BYTES``: the server sends something no reply can be."""


class SSEEvent(NamedTuple):
    """One event: its ``data`` (lines joined by ``\\n``), its ``event`` name, when its first byte came.

    A named tuple, not a frozen dataclass: one is made per streamed chunk, and this is the cheapest.
    """

    first_byte_ns: int
    data: bytes
    event: bytes | None = None


class SSEDecoder:
    """Incremental decoder for one response body: ``feed`` each read as it arrives, get whole events.

    Follows the SSE framing rules (blank line ends an event; ``\\n``, ``\\r\\n`` and ``\\r`` line ends;
    ``:`` comments; ``data``/``event``/``id``/``retry`` fields; one space after the colon dropped).
    Unlike a browser it refuses lines that are no field, so a proxy's error page is reported, not
    silently skipped. Linear in the bytes fed: an unfinished event is appended to, and searched for its
    end only in what each read added; one past ``MAX_EVENT_BYTES`` raises ``SSEEventTooLargeError``.
    """

    __slots__ = ("_buffer", "_buffer_first_ns")

    def __init__(self) -> None:
        # An unfinished event: no blank line in it, line ends normalised except a held trailing "\r";
        # a bytearray once it is long (``_extend``).
        self._buffer: bytes | bytearray = b""
        self._buffer_first_ns = 0

    @property
    def has_partial_event(self) -> bool:
        """Whether bytes of an unfinished event are held (a stream cut off mid-event)."""
        return bool(self._buffer.strip(b"\r\n"))

    def feed(self, data: bytes, arrival_ns: int) -> list[SSEEvent]:
        """Events completed by ``data``, which arrived at ``arrival_ns``; raises ``SSEFormatError``."""
        if (  # the common read: exactly one whole one-line data event
            not self._buffer
            and data.find(b"\n") == len(data) - 2
            and data.endswith(b"\n\n")
            and data.startswith(_DATA_PREFIX)
            and b"\r" not in data
        ):
            return [SSEEvent(arrival_ns, data[6:-2])]
        buffer: bytes
        if self._buffer:
            if len(self._buffer) < _LONG_EVENT_BYTES:
                buffer = self._buffer + data  # type: ignore[assignment]  # short: bytes, not a bytearray
                if b"\r" in buffer:
                    buffer = _normalise_line_ends(buffer)
            else:
                ended = self._extend(data)
                if ended is None:
                    return []
                buffer = ended
            first_ns = self._buffer_first_ns
        else:
            buffer = _normalise_line_ends(data) if b"\r" in data else data
            first_ns = arrival_ns
        events: list[SSEEvent] = []
        start = 0
        last = len(buffer) - 1
        # Single-byte finds (memchr) first: SGLang's events are one line, ended by "\n\n".
        while 0 <= (newline := buffer.find(b"\n", start)) < last:
            if buffer[newline + 1] == 10:
                end, one_line = newline, True
            else:
                end, one_line = buffer.find(b"\n\n", newline), False
                if end < 0:
                    break
            if end > start:
                event = _parse_block(buffer[start:end], first_ns, one_line)
                if event is not None:
                    events.append(event)
            start = end + 2
            first_ns = arrival_ns  # whatever follows began in this read
        rest = buffer[start:]
        if len(rest) > MAX_EVENT_BYTES:
            raise _too_large(rest)
        self._buffer = rest
        self._buffer_first_ns = first_ns
        return events

    def _extend(self, data: bytes) -> bytes | None:
        """Append ``data`` to a long unfinished event: its bytes when it ended in this read, else None."""
        held = self._buffer
        if not isinstance(held, bytearray):
            held = self._buffer = bytearray(held)
        if held[-1] == 13:  # a held "\r": its "\n" may begin this read
            del held[-1]
            data = b"\r" + data
        if b"\r" in data:
            data = _normalise_line_ends(data)
        scan_from = len(held) - 1  # what was held has no blank line; one may straddle the join
        held += data
        if held.find(b"\n\n", scan_from) >= 0:
            return bytes(held)
        if len(held) > MAX_EVENT_BYTES:
            raise _too_large(held)
        return None


def _too_large(unfinished: bytes | bytearray) -> SSEEventTooLargeError:
    return SSEEventTooLargeError(
        f"an event of more than {MAX_EVENT_BYTES >> 20} MiB without its end ({len(unfinished)} bytes "
        f"held, starting {bytes(unfinished[:60])!r})"
    )


def _normalise_line_ends(buffer: bytes) -> bytes:
    """``\\r\\n`` and ``\\r`` to ``\\n``; a trailing ``\\r`` is kept, its ``\\n`` may be in the next read."""
    held = buffer.endswith(b"\r")
    body = buffer[:-1] if held else buffer
    body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return body + b"\r" if held else body


def _parse_block(block: bytes, first_ns: int, one_line: bool) -> SSEEvent | None:
    """One event from its lines; None for a block of comments only."""
    if one_line and block.startswith(_DATA_PREFIX):  # the shape SGLang always sends
        return SSEEvent(first_ns, block[6:])
    data_lines: list[bytes] = []
    name: bytes | None = None
    for line in block.split(b"\n"):
        if not line or line.startswith(b":"):
            continue
        field, colon, value = line.partition(b":")
        if not colon and field not in (b"data", b"event"):
            raise SSEFormatError(f"not a server-sent event line: {line[:120]!r}")
        if value.startswith(b" "):
            value = value[1:]
        if field == b"data":
            data_lines.append(value)
        elif field == b"event":
            name = value
        elif field not in _IGNORED_FIELDS:
            raise SSEFormatError(f"not a server-sent event line: {line[:120]!r}")
    if not data_lines:
        return None
    return SSEEvent(first_ns, b"\n".join(data_lines), name)


def int_field(payload: bytes, quoted_key: bytes) -> int | None:
    """The integer value of the LAST ``"key": <int>`` in a JSON payload, without decoding the JSON.

    ``quoted_key`` includes the quotes (``b'"completion_tokens"'``). A key inside a JSON string cannot
    match: there its quotes are escaped (``\\"``). None when the key is absent or its value is not an
    integer (``null``, a float).
    """
    at = payload.rfind(quoted_key, max(0, len(payload) - _TAIL_BYTES))  # chunks end with the counters
    if at < 0 and len(payload) > _TAIL_BYTES:
        at = payload.rfind(quoted_key)
    if at < 0:
        return None
    found = _INT_VALUE.match(payload, at + len(quoted_key))
    return int(found[1]) if found else None
