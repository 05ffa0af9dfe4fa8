"""Arrival stamps taken as each socket read comes in, before aiohttp parses it or a task resumes.

A stream's reader learns of new bytes only when its task is resumed, after the event loop has run every
other ready socket's I/O callback and every task woken before it. At 1,024 streams every 20 ms step
lands one chunk on every connection at once, so a stamp taken where ``readany()`` returns dates the
k-th stream's chunk late by the CPU time of the k-1 streams handled first: the instrument would add its
own queueing to every latency it reports.

So the connection's protocol stamps each read in ``data_received``, the first code that sees the bytes,
and notes how many body bytes the response held after parsing it. The reader then cuts what
``readany()`` returned at those marks and gives each piece the stamp of the read that brought it.

aiohttp has no public hook at that level: the connector's protocol factory is replaced, and the
protocol reads the response payload it is filling (``ResponseHandler._payload``). aiohttp is pinned;
``tests/workers/test_socket_stamps.py`` fails if a new version stops calling this path.
"""

from __future__ import annotations

import asyncio
import collections
import functools
import time
from typing import Any

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.streams import StreamReader


class StampingProtocol(ResponseHandler):
    """aiohttp's response protocol, noting ``(arrival_ns, payload, body bytes after)`` for every read."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(loop)
        self.marks: collections.deque[tuple[int, StreamReader, int]] = collections.deque()

    def data_received(self, data: bytes) -> None:
        arrival_ns = time.perf_counter_ns()
        super().data_received(data)
        payload = self._payload
        if payload is not None:
            self.marks.append((arrival_ns, payload, payload.total_bytes))


class StampingConnector(aiohttp.TCPConnector):
    """A ``TCPConnector`` whose connections stamp their reads (``StampingProtocol``)."""

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._factory = functools.partial(StampingProtocol, loop=asyncio.get_running_loop())  # type: ignore[assignment]


class StampedBody:
    """One response body's reads, each with the stamp of the socket read that brought it.

    ``pieces(data, now_ns)`` takes what ``readany()`` returned and cuts it at the protocol's marks. Bytes
    no mark covers (a connection that is not a ``StampingProtocol``) get ``now_ns``: the time of the
    ``readany()`` return, the best stamp left.
    """

    __slots__ = ("_marks", "_offset", "_payload")

    def __init__(self, response: aiohttp.ClientResponse) -> None:
        connection = response.connection
        protocol = connection.protocol if connection is not None else None
        self._marks = protocol.marks if isinstance(protocol, StampingProtocol) else collections.deque()
        self._payload = response.content
        self._offset = 0  # body bytes handed out so far

    def pieces(self, data: bytes, now_ns: int) -> list[tuple[bytes, int]]:
        """``data`` (the next bytes of the body) as ``(bytes, arrival_ns)`` pieces in order."""
        marks, offset, end = self._marks, self._offset, self._offset + len(data)
        if len(marks) == 1 and marks[0][2] == end and marks[0][1] is self._payload:
            # the common read: one socket read brought exactly these bytes
            self._offset = end
            return [(data, marks.popleft()[0])]
        out: list[tuple[bytes, int]] = []
        done = 0  # bytes of data already in out
        while marks and done < len(data):
            arrival_ns, payload, total = marks[0]
            if payload is not self._payload or total <= offset + done:
                marks.popleft()  # another response's read, or one that brought no new body bytes
                continue
            cut = min(total, end) - offset
            out.append((data[done:cut], arrival_ns))
            done = cut
            if total <= end:
                marks.popleft()
        if done < len(data):
            out.append((data[done:], now_ns))
        self._offset = end
        return out
