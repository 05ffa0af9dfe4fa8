"""A raw TCP server on 127.0.0.1 that writes exact bytes: faults the simulated server cannot produce.

Not a mock of our code: it is a wire fixture. The first path segment picks the behaviour
(``http://127.0.0.1:PORT/<mode>`` as the base URL, so ``/<mode>/generate`` is requested), and each
behaviour writes a fixed byte sequence: a recorded SGLang stream (at once, or paced one event per
chunk), a stream reset mid-way, a stream
that ends without ``[DONE]``, a page that is not SSE, a stream that stalls, a cache flush refused while
busy and then accepted, a data line of ``HUGE_LINE_BYTES`` that a client must not buffer whole.
"""

from __future__ import annotations

import asyncio
import functools
import socket
import struct
import threading
from pathlib import Path

from workers.sglang.api import FLUSH_CACHE, MODEL_INFO

STREAMS = Path(__file__).parents[1] / "fixtures" / "sglang-0.5.23"
_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
_FIRST_CHUNK = (
    b'data: {"text":"a","output_ids":[1],"meta_info":{"id":"x","finish_reason":null,'
    b'"prompt_tokens":4,"completion_tokens":1,"cached_tokens":0}}\n\n'
)


# Paced modes: a recorded stream with one HTTP chunk per SSE event, PACE_S apart (as a server sends them).
PACED = {
    "paced_nominal": "generate_spec_stream.sse",
    "paced_coalesced": "generate_spec_stream_coalesced.sse",
}
PACE_S = 0.05
# "busy_flush": /flush_cache answers 400 this many times (as SGLang does while requests run), then 200.
BUSY_FLUSHES = 2
# "huge_line": after one chunk, a data line this long (sent 1 MiB per HTTP chunk), then its end and [DONE].
HUGE_LINE_BYTES = 100 << 20


def _chunked(body: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(body), body)


async def _read_request(reader: asyncio.StreamReader) -> str:
    """Read one request, return its path."""
    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1")
    length = 0
    for line in head.split("\r\n")[1:]:
        name, _, value = line.partition(":")
        if name.strip().lower() == "content-length":
            length = int(value)
    await reader.readexactly(length)
    return head.split(" ")[1]


async def _write_paced(writer: asyncio.StreamWriter, stream: bytes) -> None:
    """Each event of ``stream`` in its own chunk, flushed, then PACE_S before the next (none after [DONE])."""
    writer.write(_HEAD)
    events = [event + b"\n\n" for event in stream.split(b"\n\n") if event]
    for k, event in enumerate(events):
        if k:
            await asyncio.sleep(PACE_S)
        writer.write(_chunked(event))
        await writer.drain()
    writer.write(b"0\r\n\r\n")


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with RST (SO_LINGER 0), as a crashed server's kernel does."""
    sock = writer.get_extra_info("socket")
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


async def _handle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, seen: list[str], stalled: list[str]
) -> None:
    try:
        while True:
            path = await _read_request(reader)
            mode = path.strip("/").split("/")[0]
            if path.endswith(MODEL_INFO):  # what the load generator asks to open its connections
                body = b'{"model_path":"wire"}'
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()
                continue
            seen.append(path)
            if mode == "busy_flush" and path.endswith(FLUSH_CACHE):
                refused = seen.count(path) <= BUSY_FLUSHES
                status = b"400 Bad Request" if refused else b"200 OK"
                writer.write(b"HTTP/1.1 %s\r\nContent-Length: 0\r\n\r\n" % status)
            elif mode in ("recorded", "busy_flush"):
                writer.write(
                    _HEAD + _chunked((STREAMS / "generate_spec_stream.sse").read_bytes()) + b"0\r\n\r\n"
                )
            elif mode in PACED:
                await _write_paced(writer, (STREAMS / PACED[mode]).read_bytes())
            elif mode == "reset":
                writer.write(_HEAD + _chunked(_FIRST_CHUNK))
                await writer.drain()
                await asyncio.sleep(0.05)
                _reset(writer)
                return
            elif mode == "truncated":
                writer.write(_HEAD + _chunked(_FIRST_CHUNK + b'data: {"text":"ab"') + b"0\r\n\r\n")
            elif mode == "not_sse":
                page = b"<html><body>502 Bad Gateway</body></html>\n\n"
                writer.write(_HEAD + _chunked(page) + b"0\r\n\r\n")
            elif mode == "bad_json":
                writer.write(
                    _HEAD + _chunked(_FIRST_CHUNK + b"data: {not json}\n\ndata: [DONE]\n\n") + b"0\r\n\r\n"
                )
            elif mode == "huge_line":
                writer.write(_HEAD + _chunked(_FIRST_CHUNK + b'data: {"text":"'))
                piece = _chunked(b"x" * (1 << 20))
                for _ in range(HUGE_LINE_BYTES >> 20):
                    writer.write(piece)
                    await writer.drain()
                writer.write(_chunked(b'"}\n\ndata: [DONE]\n\n') + b"0\r\n\r\n")
            elif mode == "stall":
                writer.write(_HEAD + _chunked(_FIRST_CHUNK))
                await writer.drain()
                stalled.append(path)
                await asyncio.sleep(3600)
            elif mode == "http_503":
                body = b'{"error":{"message":"overloaded"}}'
                writer.write(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
                )
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


class WireServer:
    """The server on its own thread and event loop; ``url(mode)`` is a base URL for ``run_load``."""

    def __init__(self) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0
        self.requests_seen: list[str] = []  # paths of the requests answered by a mode, in arrival order
        self.stalled: list[str] = []  # "stall" requests whose first chunk was handed to the kernel

    def __enter__(self) -> WireServer:
        self._thread.start()
        handler = functools.partial(_handle, seen=self.requests_seen, stalled=self.stalled)
        future = asyncio.run_coroutine_threadsafe(asyncio.start_server(handler, "127.0.0.1", 0), self._loop)
        self._server = future.result(timeout=10)
        self.port = self._server.sockets[0].getsockname()[1]
        return self

    def url(self, mode: str) -> str:
        return f"http://127.0.0.1:{self.port}/{mode}"

    def unread_by_clients(self) -> int:
        """Bytes this server sent that its clients' sockets hold unread (their receive queues, from
        /proc/net/tcp): 0 once every client process has read everything it was sent."""
        unread = 0
        for line in Path("/proc/net/tcp").read_text().splitlines()[1:]:
            fields = line.split()
            remote_port = int(fields[2].split(":")[1], 16)
            if remote_port == self.port and fields[3] == "01":  # ESTABLISHED, a client's end
                unread += int(fields[4].split(":")[1], 16)
        return unread

    def __exit__(self, *exc: object) -> None:
        async def stop() -> None:
            assert self._server is not None
            self._server.close()
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(timeout=10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()
