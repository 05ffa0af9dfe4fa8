"""Server-sent events: raw response bytes -> events stamped with the arrival time of their first byte.

The load generator stamps each read with ``time.perf_counter_ns`` the moment it returns, before any
parsing, and hands the bytes here; an event keeps the stamp of the read that brought its first byte, so
an event split across TCP reads is not dated late. Parsing is kept to what each chunk needs:
``int_field`` pulls one integer out of a JSON payload with ``bytes.rfind``, so only the final chunk of a
stream is ever decoded as JSON (by the caller). Stdlib only; knows nothing about SGLang.
"""

from __future__ import annotations

from dataclasses import dataclass

_EVENT_END = b"\n\n"
_DATA_PREFIX = b"data: "
_DIGITS = frozenset(b"-0123456789")
_SPACES = frozenset(b" \t\r\n")
_IGNORED_FIELDS = frozenset((b"id", b"retry"))


class SSEFormatError(ValueError):
    """Bytes that are not a server-sent event stream (a line that is no SSE field, e.g. an HTML page)."""


@dataclass(frozen=True, slots=True)
class SSEEvent:
    """One event: its ``data`` (lines joined by ``\\n``), its ``event`` name, when its first byte came."""

    first_byte_ns: int
    data: bytes
    event: bytes | None = None


class SSEDecoder:
    """Incremental decoder for one response body: ``feed`` each read as it arrives, get whole events.

    Follows the SSE framing rules (blank line ends an event; ``\\n``, ``\\r\\n`` and ``\\r`` line ends;
    ``:`` comments; ``data``/``event``/``id``/``retry`` fields; one space after the colon dropped).
    Unlike a browser it refuses lines that are no field, so a proxy's error page is reported, not
    silently skipped.
    """

    __slots__ = ("_buffer", "_buffer_first_ns")

    def __init__(self) -> None:
        self._buffer = b""
        self._buffer_first_ns = 0

    @property
    def has_partial_event(self) -> bool:
        """Whether bytes of an unfinished event are held (a stream cut off mid-event)."""
        return bool(self._buffer.strip(b"\r\n"))

    def feed(self, data: bytes, arrival_ns: int) -> list[SSEEvent]:
        """Events completed by ``data``, which arrived at ``arrival_ns``; raises ``SSEFormatError``."""
        if self._buffer:
            buffer = self._buffer + data
            first_ns = self._buffer_first_ns
        else:
            buffer = data
            first_ns = arrival_ns
        if b"\r" in buffer:
            buffer = _normalise_line_ends(buffer)
        events: list[SSEEvent] = []
        start = 0
        while (end := buffer.find(_EVENT_END, start)) >= 0:
            block = buffer[start:end]
            start = end + 2
            if block:
                event = _parse_block(block, first_ns)
                if event is not None:
                    events.append(event)
            first_ns = arrival_ns  # whatever follows began in this read
        self._buffer = buffer[start:]
        self._buffer_first_ns = first_ns
        return events


def _normalise_line_ends(buffer: bytes) -> bytes:
    """``\\r\\n`` and ``\\r`` to ``\\n``; a trailing ``\\r`` is kept, its ``\\n`` may be in the next read."""
    held = buffer.endswith(b"\r")
    body = buffer[:-1] if held else buffer
    body = body.replace(b"\r\n", b"\n").replace(b"\r", b"\n")
    return body + b"\r" if held else body


def _parse_block(block: bytes, first_ns: int) -> SSEEvent | None:
    """One event from its lines; None for a block of comments only."""
    if block.startswith(_DATA_PREFIX) and b"\n" not in block:  # the shape SGLang always sends
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
    integer (``null``).
    """
    at = payload.rfind(quoted_key)
    if at < 0:
        return None
    pos = at + len(quoted_key)
    size = len(payload)
    while pos < size and payload[pos] in _SPACES:
        pos += 1
    if pos >= size or payload[pos] != 58:  # ':'
        return None
    pos += 1
    while pos < size and payload[pos] in _SPACES:
        pos += 1
    end = pos
    while end < size and payload[end] in _DIGITS:
        end += 1
    if end == pos or (end < size and payload[end] in b".eE"):
        return None
    return int(payload[pos:end])
