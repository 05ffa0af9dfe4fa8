"""The client's own added delay, measured against a loopback endpoint before each run.

A tiny raw-asyncio HTTP server runs in a child process (so it does not share the client's event loop or
GIL) and answers ``/generate`` with chunks shaped like SGLang's, each stamped with ``perf_counter_ns`` just before it is
written. The load generator reads them through its normal request path; arrival stamp minus send stamp is
what the client (event loop, aiohttp, kernel loopback) adds to every chunk it times. On Linux
``perf_counter_ns`` is CLOCK_MONOTONIC, one clock for every process on the host.

Run ``python -m workers.load.calibration`` to start the endpoint alone; it prints its port on stdout.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from dataclasses import dataclass

from workers.sglang import api


@dataclass(frozen=True, slots=True)
class ClientDelay:
    """Delay the client adds per chunk, in microseconds, over ``chunks`` chunks of ``streams`` streams."""

    streams: int
    chunks: int
    p50_us: float
    p99_us: float
    max_us: float

    def to_json_dict(self) -> dict[str, float | int]:
        """Plain values for Parquet metadata and the CLI summary."""
        return {
            "streams": self.streams,
            "chunks": self.chunks,
            "p50_us": self.p50_us,
            "p99_us": self.p99_us,
            "max_us": self.max_us,
        }


def loopback_body(chunks: int, interval_us: int) -> bytes:
    """Request body asking the loopback ``/generate`` for ``chunks`` chunks ``interval_us`` apart."""
    return json.dumps({"chunks": chunks, "interval_us": interval_us}).encode()


class LoopbackServer:
    """The loopback endpoint as a child process; ``url`` is its base URL. Use as a context manager."""

    def __init__(self) -> None:
        self._process: subprocess.Popen[str] | None = None
        self.url = ""

    def __enter__(self) -> LoopbackServer:
        self._process = subprocess.Popen(
            [sys.executable, "-m", "workers.load.calibration"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        assert self._process.stdout is not None
        port = self._process.stdout.readline().strip()
        if not port.isdigit():
            self.__exit__(None, None, None)
            raise RuntimeError("the loopback calibration endpoint did not start")
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc: object) -> None:
        if self._process is not None:
            self._process.terminate()
            self._process.wait(timeout=10)
            if self._process.stdout is not None:
                self._process.stdout.close()
            self._process = None


def _chunk(count: int, final: bool) -> bytes:
    """A ``/generate``-shaped chunk carrying one more token and the send stamp."""
    finish = b'{"type":"length"}' if final else b"null"
    return b'data: {"meta_info":{"finish_reason":%s,"%s":%d,"%s":%d}}\n\n' % (
        finish,
        api.META_COMPLETION_TOKENS.encode(),
        count,
        api.SIM_SEND_NS.encode(),
        time.perf_counter_ns(),
    )


async def _serve_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    """Answer requests on one keep-alive connection until the client closes it."""
    try:
        while True:
            head = await reader.readuntil(b"\r\n\r\n")
            _, _, header_text = head.decode("latin-1").partition("\r\n")
            length = 0
            for line in header_text.split("\r\n"):
                name, _, value = line.partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            ask = json.loads(await reader.readexactly(length))
            chunks = int(ask["chunks"])
            interval = int(ask["interval_us"]) / 1e6
            writer.write(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            )
            for count in range(1, chunks + 1):
                await asyncio.sleep(interval)
                body = _chunk(count, count == chunks)
                writer.write(b"%x\r\n%s\r\n" % (len(body), body))
            done = b"data: [DONE]\n\n"
            writer.write(b"%x\r\n%s\r\n0\r\n\r\n" % (len(done), done))
            await writer.drain()
    except (asyncio.IncompleteReadError, ConnectionError):
        pass
    finally:
        writer.close()


async def _serve() -> None:
    server = await asyncio.start_server(_serve_connection, "127.0.0.1", 0)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(_serve())
