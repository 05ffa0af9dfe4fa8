"""Arrival stamps come from the socket read that brought the bytes, not from when the reader got to them."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import aiohttp
from aiohttp import web

from workers.load.socket_stamps import StampedBody, StampingConnector

GAP_S = 0.05
PARTS = [b"data: 1\n\n", b"data: 2\n\n", b"data: 3\n\n"]
SENT_NS = web.AppKey("sent_ns", list[int])


async def _three_parts(request: web.Request) -> web.StreamResponse:
    """Three body parts, GAP_S apart; the send time of each (perf_counter_ns) kept in the app."""
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await response.prepare(request)
    for part in PARTS:
        request.app[SENT_NS].append(time.perf_counter_ns())
        await response.write(part)
        await asyncio.sleep(GAP_S)
    await response.write_eof()
    return response


async def _server() -> tuple[web.AppRunner, str, list[int]]:
    app = web.Application()
    app[SENT_NS] = []
    app.router.add_get("/stream", _three_parts)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    return runner, f"http://127.0.0.1:{port}/stream", app[SENT_NS]


async def _read_late(
    connector_factory: Callable[..., aiohttp.BaseConnector], requests: int = 1
) -> tuple[list[list[tuple[bytes, int]]], list[int]]:
    """Each request's body read in one go, 4 gaps after the request: every part is already buffered.

    One connection (``limit=1``), so the later requests reuse the first one's kept-alive connection.
    """
    runner, url, sent_ns = await _server()
    bodies: list[list[tuple[bytes, int]]] = []
    try:
        async with aiohttp.ClientSession(connector=connector_factory(limit=1)) as session:
            for _ in range(requests):
                async with session.get(url) as response:
                    body = StampedBody(response)
                    await asyncio.sleep(4 * GAP_S)  # the reader is busy elsewhere; the loop still reads
                    pieces: list[tuple[bytes, int]] = []
                    while data := await response.content.readany():
                        pieces.extend(body.pieces(data, time.perf_counter_ns()))
                bodies.append(pieces)
    finally:
        await runner.cleanup()
    return bodies, sent_ns


def test_each_part_keeps_the_stamp_of_its_own_read_when_the_reader_comes_late() -> None:
    """Parts sent 50 ms apart and read together 200 ms later are stamped 50 ms apart, at arrival.

    The second request reuses the connection: its parts get their own reads' stamps, none of the first's.
    """
    bodies, sent_ns = asyncio.run(_read_late(StampingConnector, requests=2))
    for pieces, sent in zip(bodies, (sent_ns[:3], sent_ns[3:]), strict=True):
        assert [p for p, _ in pieces] == PARTS  # cut where the reads were, though read in one go
        for (_, arrival_ns), sent_part_ns in zip(pieces, sent, strict=True):
            assert 0 <= arrival_ns - sent_part_ns < 10e6  # within 10 ms of the send, not 200 ms later


def test_a_plain_connector_falls_back_to_the_time_of_the_read() -> None:
    """Without stamping connections the best stamp left is when ``readany`` returned: late, not wrong."""
    bodies, sent_ns = asyncio.run(_read_late(aiohttp.TCPConnector))
    assert b"".join(p for p, _ in bodies[0]) == b"".join(PARTS)
    assert bodies[0][0][1] - sent_ns[0] > 3 * GAP_S * 1e9
