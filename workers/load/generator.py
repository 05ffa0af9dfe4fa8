"""Concurrent load against an SGLang (or simulated) server, one exact record per request.

``run_load(url, level, workload)`` measures the client's own added delay on a loopback endpoint, sends
the warmup requests (not recorded; then ``/flush_cache`` when asked), and runs one load level:

- closed loop: ``concurrency`` requests always in flight, for a count or a duration; with ``ramp_up_s``
  the streams start evenly over it, and each record says whether it was sent inside the level's
  steady-state window and how many of its tokens arrived there (``measurement_window``);
- open loop: Poisson, gamma (bursty or regular) or constant arrivals at ``rate_rps``, optionally capped
  in flight; each record keeps the scheduled and the actual send time, so lateness is visible. Poisson
  and gamma schedules are true renewal processes (independent gaps from the start), for a count as for
  a duration: nothing pins the last arrival, so a level's offered rate is a draw, as in production.

Each process has ONE aiohttp session whose pool is sized to the streams it drives and filled (one
connection per stream) before the clock starts. Timestamps are ``perf_counter_ns`` taken as each socket
read comes in, before aiohttp or we parse it (``workers.load.socket_stamps``), so a busy loop does not date
chunks late; parsing is then kept to two integers a chunk (``workers.load.sse``, ``workers.load.stream``).
Failed, timed-out and cut-off requests are records with an ``error_type``; nothing is dropped. The turns
of a conversation go in order, each sent once the reply before it is in (closed loop: on one stream; open
loop: an arrival starts a conversation, its later turns follow their replies at once); a failed turn ends
its conversation. When one
process cannot keep up (``processes``, automatic by concurrency), shard
processes (``python -m workers.load.generator``) start together on one clock and their records are merged.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import json
import logging
import math
import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import AsyncIterator, Callable, Coroutine, Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

import aiohttp
import numpy as np
from pydantic import TypeAdapter

from analysis.schema import RequestRecord, requests_table, write_parquet_atomic
from workers.job import LoadLevel
from workers.load.calibration import ClientDelay, LoopbackServer, loopback_body
from workers.load.sequential import precise_enough
from workers.load.socket_stamps import StampedBody, StampingConnector
from workers.load.sse import SSEDecoder, SSEEventTooLargeError, SSEFormatError
from workers.load.stream import INVALID_RESPONSE, FinalStats, ReplyStream, ResponseStream, StreamError
from workers.load.workloads import PreparedRequest, Workload, request_stream
from workers.sglang import api

log = logging.getLogger(__name__)
T = TypeVar("T")

# Streams one process drives. Arrivals are stamped when the loop polls its sockets, and the loop polls
# again only after it has run every task the last poll woke: with one chunk per stream per step landing
# at once, the wait is about (streams in the process) x (20-40 us of CPU per chunk). Measured on a
# 16-core host (bench/loadgen.py), 128 streams a process gave p99 0.35-0.56 ms at 1024 streams but
# 2.0 ms at 256, where the server's writes are bunched; 21 streams a process gave 0.13-0.22 ms.
# Throughput alone would allow ~10x more streams a process.
STREAMS_PER_PROCESS = 64
_READ_BUFFER = 1 << 20
CUT_OFF = "cut_off"  # error_type of a request still running when the run was stopped
_ERROR_BODY_BYTES = 2048
_PRECONNECT_TIMEOUT = aiohttp.ClientTimeout(total=10)
_HEADERS = {"Content-Type": "application/json", "Accept": "text/event-stream"}
_WORKLOAD_ADAPTER: TypeAdapter[Workload] = TypeAdapter(Workload)
SPILL_INTERVAL_S = 1.0  # how often finished requests are written to the spill directory (run_load's spill)
MEASURING = "measuring"  # LoadTally's stage during the measured run


@dataclass(frozen=True, slots=True)
class LoadResult:
    """One level's outcome: measured records (warmup apart), the calibration, and achieved rates."""

    level: LoadLevel
    records: list[RequestRecord]
    warmup_records: list[RequestRecord]
    client_delay: ClientDelay
    duration_s: float  # run start to the last request's end
    window_start_s: float  # the measurement window on the records' clock (see ``measurement_window``)
    window_end_s: float
    stop_reason: str  # "precision" (sequential level precise enough) or "limit" (its count or duration)
    t0_ns: int  # absolute perf_counter_ns of the measured run's start: the records' time origin
    achieved_rate_rps: float | None  # requests sent per second (open loop: over the schedule's window)
    processes: int
    cache_flushed: bool | None  # None when not asked
    interrupted: bool  # stopped by Ctrl-C: the records are those made until then

    @property
    def num_errors(self) -> int:
        """Records with an error class."""
        return sum(1 for r in self.records if r.error_type is not None)


# --------------------------------------------------------------------------------------------------
# One request
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Context:
    """What every record of a run shares."""

    base_url: str
    level: LoadLevel
    t0_ns: int  # absolute perf_counter_ns of the run start; record times are relative to it
    warmup: bool
    tally: LoadTally | None = None  # the measured run's counts, for a progress line


@dataclass
class LoadTally:
    """Where a level stands, for a progress line read from another thread: the stage, and the measured
    requests sent, finished and failed so far. A shard process reports its counts to the parent on its
    stdout (``shard_counts``); the parent adds them up."""

    stage: str = "calibrating the client's own delay"
    total: int | None = None  # measured requests of a count level
    sent: int = 0
    finished: int = 0
    errors: int = 0
    shards: dict[int, tuple[int, int, int]] = field(default_factory=dict)

    def counts(self) -> tuple[int, int, int]:
        """Sent, finished and failed requests of this process and every shard."""
        totals = [self.sent, self.finished, self.errors]
        for counts in list(self.shards.values()):
            totals = [a + b for a, b in zip(totals, counts, strict=True)]
        return totals[0], totals[1], totals[2]

    def describe(self) -> str:
        """``measuring: done 40/100, in flight 8, errors 0`` (or the stage before the measured run)."""
        if self.stage != MEASURING:
            return self.stage
        sent, finished, errors = self.counts()
        of = "" if self.total is None else f"/{self.total}"
        return f"{MEASURING}: done {finished}{of}, in flight {sent - finished}, errors {errors}"


@dataclass(frozen=True, slots=True)
class _Outcome:
    """One request as measured: absolute stamps, tokens per chunk, final statistics, error.

    Turning it into a ``RequestRecord`` (relative times, per-token and per-step gaps) is left until the
    run is over: streams end in bursts, and that arithmetic would otherwise run while the chunks of
    other streams wait to be stamped.
    """

    ctx: _Context
    prep: PreparedRequest
    status: int | None
    error: tuple[str, str] | None
    stats: FinalStats | None
    scheduled_abs_ns: int | None
    start_ns: int
    end_ns: int
    chunk_arrival_ns: list[int]
    chunk_tokens: list[int]
    server_chunk_ns: list[int]
    tokens_seen: int
    reply: str | None = None  # the streamed text, kept only when a later turn sends it back

    @property
    def error_type(self) -> str | None:
        return self.error[0] if self.error else None


def _records(outcomes: Iterable[_Outcome]) -> list[RequestRecord]:
    """Each outcome's record; latencies only from what was measured."""
    return [_record(outcome) for outcome in outcomes]


@dataclass(slots=True)
class _Spill:
    """Writes the records of finished requests to ``directory`` as they come in, so a process killed
    mid-level (kill -9, the OOM killer) leaves the requests it measured on disk: every
    ``SPILL_INTERVAL_S`` one Parquet part (``<prefix>-<n>.parquet``, temp name + rename) of the outcomes
    finished since the last part. Converting them costs the loop about as much as building the records
    at the end does, spread over the level; the node worker, whose killed attempt is run again anyway,
    does not spill."""

    directory: Path
    prefix: str
    written: int = 0  # outcomes already in a part
    parts: int = 0

    async def run(self, outcomes: list[_Outcome], stop: asyncio.Event) -> None:
        """Spill every ``SPILL_INTERVAL_S`` until ``stop`` is set (a write in progress completes)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), SPILL_INTERVAL_S)
            end = len(outcomes)
            if end > self.written and not stop.is_set():
                table = requests_table(_records(outcomes[self.written : end]))
                self.written, self.parts = end, self.parts + 1
                path = self.directory / f"{self.prefix}-{self.parts:06d}.parquet"
                await asyncio.to_thread(write_parquet_atomic, table, path)


async def _send(
    session: aiohttp.ClientSession, ctx: _Context, prep: PreparedRequest, scheduled_abs_ns: int | None
) -> _Outcome:
    """Send one request and read its stream; always returns an outcome (errors included)."""
    stream = ResponseStream(prep.endpoint) if prep.next_turn is None else ReplyStream(prep.endpoint)
    decoder = SSEDecoder()
    status: int | None = None
    error: tuple[str, str] | None = None
    if ctx.tally is not None:
        ctx.tally.sent += 1
    start_ns = time.perf_counter_ns()
    try:
        async with session.post(ctx.base_url + prep.endpoint, data=prep.body, headers=_HEADERS) as resp:
            status = resp.status
            if status != 200:
                text = await resp.content.read(_ERROR_BODY_BYTES)
                error = ("http_error", f"HTTP {status}: {text.decode('utf-8', 'replace').strip()}")
            else:
                content = resp.content
                body = StampedBody(resp)
                feed = decoder.feed
                add_events = stream.add_events
                while data := await content.readany():
                    for piece, arrival_ns in body.pieces(data, time.perf_counter_ns()):
                        add_events(feed(piece, arrival_ns))
    except asyncio.CancelledError:
        error = (CUT_OFF, f"run ended with the request in flight after {stream.completion_tokens} tokens")
    except TimeoutError:
        timeout = ctx.level.request_timeout_s
        error = ("timeout", f"no complete response within {timeout:g} s ({stream.completion_tokens} tokens)")
    except aiohttp.ClientConnectorError as err:
        error = ("connect_error", f"cannot connect to {ctx.base_url}: {err.os_error or err}")
    except (
        aiohttp.ServerDisconnectedError,
        aiohttp.ClientPayloadError,
        aiohttp.ClientOSError,
        ConnectionError,
    ) as err:
        error = (
            "connection_reset",
            f"connection lost mid-stream after {stream.completion_tokens} tokens: {type(err).__name__}: {err}",
        )
    except SSEEventTooLargeError as err:  # a line without end: no reply can be that, refuse it now
        error = (INVALID_RESPONSE, str(err))
    except SSEFormatError as err:
        error = ("malformed_sse", str(err))
    except StreamError as err:  # a chunk that cannot be true (invalid_response)
        error = (err.error_type, str(err))
    except (aiohttp.ClientError, OSError, ValueError) as err:
        error = ("client_error", f"{type(err).__name__}: {err}")
    end_ns = time.perf_counter_ns()
    outcome = _outcome(ctx, prep, stream, decoder, status, error, scheduled_abs_ns, start_ns, end_ns)
    if ctx.tally is not None:
        ctx.tally.finished += 1
        ctx.tally.errors += outcome.error is not None
    return outcome


def _outcome(
    ctx: _Context,
    prep: PreparedRequest,
    stream: ResponseStream,
    decoder: SSEDecoder,
    status: int | None,
    error: tuple[str, str] | None,
    scheduled_abs_ns: int | None,
    start_ns: int,
    end_ns: int,
) -> _Outcome:
    """What a finished (or failed) stream says: its error class, if any, and its final statistics."""
    stats = None
    if error is None:
        if not stream.done:
            partial = " (mid-event)" if decoder.has_partial_event else ""
            error = (
                "truncated_stream",
                f"stream ended without [DONE]{partial} after {stream.completion_tokens} tokens",
            )
        else:
            try:
                stats = stream.final_stats()
            except StreamError as err:
                error = (err.error_type, str(err))
    return _Outcome(
        ctx=ctx,
        prep=prep,
        status=status,
        error=error,
        stats=stats,
        scheduled_abs_ns=scheduled_abs_ns,
        start_ns=start_ns,
        end_ns=end_ns if stream.done_ns is None else stream.done_ns,
        chunk_arrival_ns=stream.chunk_arrival_ns,
        chunk_tokens=stream.chunk_tokens,
        server_chunk_ns=stream.server_chunk_ns,
        tokens_seen=stream.completion_tokens,
        reply=stream.reply if error is None else None,
    )


def _next_turn(prep: PreparedRequest, outcome: _Outcome) -> PreparedRequest | None:
    """The conversation's next request, carrying this one's reply; None after its last turn or a failure."""
    if prep.next_turn is None or outcome.reply is None:
        return None
    return prep.next_turn.request(prep.index, outcome.reply)


class _Turns:
    """One closed-loop stream's requests: the next turn of its conversation once the reply is in, else
    the first turn of the next conversation."""

    __slots__ = ("_next", "_requests")

    def __init__(self, requests: Iterator[PreparedRequest]) -> None:
        self._requests = requests
        self._next: PreparedRequest | None = None

    def __iter__(self) -> _Turns:
        return self

    def __next__(self) -> PreparedRequest:
        prep, self._next = self._next, None
        return prep if prep is not None else next(self._requests)

    def answered(self, prep: PreparedRequest, outcome: _Outcome) -> None:
        self._next = _next_turn(prep, outcome)


def _record(outcome: _Outcome) -> RequestRecord:
    """The record of one outcome: times relative to the run start and to the request's send."""
    ctx, stats, error = outcome.ctx, outcome.stats, outcome.error
    start_ns, end_ns = outcome.start_ns, outcome.end_ns
    scheduled_abs_ns = outcome.scheduled_abs_ns
    arrivals = [t - start_ns for t in outcome.chunk_arrival_ns]
    tokens = outcome.chunk_tokens
    completion = stats.completion_tokens if stats and stats.completion_tokens is not None else None
    if completion is None and tokens:
        completion = outcome.tokens_seen
    ttft_ms = arrivals[0] / 1e6 if arrivals else None
    step_ms = [(b - a) / 1e6 for a, b in itertools.pairwise(arrivals)]
    token_ms = [gap / n for gap, n in zip(step_ms, tokens[1:], strict=True) for _ in range(n)]
    tpot_ms = None
    if len(arrivals) > 1 and completion and completion > 1:
        tpot_ms = (arrivals[-1] - arrivals[0]) / 1e6 / (completion - 1)
    level = ctx.level
    return RequestRecord(
        request_id=f"{'w' if ctx.warmup else 'r'}{outcome.prep.index:07d}"
        + (f".{outcome.prep.turn}" if outcome.prep.turn else ""),
        load_level=level.label,
        concurrency=level.concurrency,
        rate_rps=level.rate_rps,
        endpoint=outcome.prep.endpoint,
        warmup=ctx.warmup,
        scheduled_ns=(start_ns if scheduled_abs_ns is None else scheduled_abs_ns) - ctx.t0_ns,
        start_ns=start_ns - ctx.t0_ns,
        end_ns=end_ns - ctx.t0_ns,
        ttft_ms=ttft_ms,
        e2e_ms=(end_ns - start_ns) / 1e6,
        tpot_ms=tpot_ms,
        prompt_tokens=stats.prompt_tokens if stats else None,
        completion_tokens=completion,
        chunk_arrival_ns=arrivals,
        chunk_tokens=list(tokens),
        server_chunk_ns=[t - start_ns for t in outcome.server_chunk_ns] or None,
        itl_per_token_ms=token_ms,
        itl_per_step_ms=step_ms,
        finish_reason=stats.finish_reason if stats else None,
        spec_verify_ct=stats.spec_verify_ct if stats else None,
        spec_accept_length=stats.spec_accept_length if stats else None,
        spec_accept_rate=stats.spec_accept_rate if stats else None,
        spec_num_correct_drafts=stats.spec_num_correct_drafts if stats else None,
        spec_num_proposed_drafts=stats.spec_num_proposed_drafts if stats else None,
        spec_correct_drafts_histogram=stats.spec_correct_drafts_histogram if stats else None,
        http_status=outcome.status,
        error_type=error[0] if error else None,
        error_message=error[1] if error else None,
        cached_tokens=stats.cached_tokens if stats else None,
        category=outcome.prep.category,
        dataset=outcome.prep.dataset,
        turn=outcome.prep.turn,
    )


# --------------------------------------------------------------------------------------------------
# Schedules and loops
# --------------------------------------------------------------------------------------------------


def arrival_offsets_ns(level: LoadLevel) -> Iterator[int]:
    """Send times (ns after the run start) of an open loop, all of them (count) or unending (duration).

    Constant: ``k / rate`` for k = 1, 2, ... Poisson: cumulative independent exponential gaps of mean
    ``1 / rate``. Gamma: cumulative gamma gaps of shape ``burstiness`` and mean ``1 / rate`` (coefficient
    of variation ``1 / sqrt(burstiness)``; shape 1 is Poisson).
    """
    rate = float(level.rate_rps or 0)
    if level.arrival == "constant":
        gaps: Iterator[float] = itertools.repeat(1.0 / rate)
    else:
        rng = np.random.default_rng(level.seed)
        shape = level.burstiness if level.arrival == "gamma" else 1.0
        gaps = _gaps(rng, shape, 1.0 / (rate * shape))
    offsets = (round(t * 1e9) for t in itertools.accumulate(gaps))
    return offsets if level.requests is None else itertools.islice(offsets, level.requests)


def _gaps(rng: np.random.Generator, shape: float, scale: float) -> Iterator[float]:
    """Independent gamma(shape, scale) gaps, drawn in blocks (shape 1: exponential)."""
    while True:
        yield from rng.gamma(shape, scale, 4096).tolist()


async def _closed_loop(
    session: aiohttp.ClientSession,
    ctx: _Context,
    requests: Iterator[PreparedRequest],
    workers: int,
    deadline_abs_ns: int | None,
    outcomes: list[_Outcome],
    start_offsets_ns: Iterable[int] = (),
) -> None:
    """``workers`` coroutines, each sending its next request as soon as the last one ends; worker i
    first waits ``start_offsets_ns[i]`` after the run start (the ramp-up; none given: all at once)."""

    precision = None if ctx.warmup else ctx.level.precision
    done: tuple[list[float], list[float]] = ([], [])  # tokens and latency of each successful request
    stop = asyncio.Event()  # the throughput is precise enough: send no more, let in-flight ones finish

    async def worker(offset_ns: int) -> None:
        if offset_ns:
            await _sleep_until(ctx.t0_ns + offset_ns)
        for prep in (turns := _Turns(requests)):
            if stop.is_set() or (deadline_abs_ns is not None and time.perf_counter_ns() >= deadline_abs_ns):
                return
            outcome = await _send(session, ctx, prep, None)
            outcomes.append(outcome)
            turns.answered(prep, outcome)
            if outcome.error_type == CUT_OFF:  # the run is being stopped (duration over, or Ctrl-C)
                return
            if precision is not None and outcome.error is None:
                done[0].append(float(outcome.tokens_seen))
                done[1].append((outcome.end_ns - outcome.start_ns) / 1e9)
                if len(done[0]) % workers == 0 and precise_enough(*done, workers, precision):
                    stop.set()

    offsets = itertools.islice(itertools.chain(start_offsets_ns, itertools.repeat(0)), workers)
    tasks = [asyncio.create_task(worker(offset)) for offset in offsets]
    async with _cut_off_when_stopped(tasks):
        await _finish(tasks, ctx.level, deadline_abs_ns)


async def _open_loop(
    session: aiohttp.ClientSession,
    ctx: _Context,
    requests: Iterator[PreparedRequest],
    offsets_ns: Iterator[int],
    cap: int | None,
    deadline_abs_ns: int | None,
    outcomes: list[_Outcome],
) -> None:
    """Send each request at its scheduled time (or as soon after as the cap allows)."""
    slots = asyncio.Semaphore(cap) if cap else None
    tasks: set[asyncio.Task[None]] = set()

    async def one(prep: PreparedRequest, scheduled: int) -> None:
        try:
            outcome = await _send(session, ctx, prep, scheduled)
            outcomes.append(outcome)
            while (turn := _next_turn(prep, outcome)) is not None and (
                deadline_abs_ns is None or time.perf_counter_ns() < deadline_abs_ns
            ):  # a later turn follows its reply at once, in the same slot
                prep, outcome = turn, await _send(session, ctx, turn, None)
                outcomes.append(outcome)
        finally:
            if slots is not None:
                slots.release()

    async with _cut_off_when_stopped(tasks):
        for prep, offset in zip(requests, offsets_ns, strict=False):
            scheduled = ctx.t0_ns + offset
            if deadline_abs_ns is not None and scheduled >= deadline_abs_ns:
                break
            await _sleep_until(scheduled)
            if slots is not None:
                await slots.acquire()
            task = asyncio.create_task(one(prep, scheduled))
            tasks.add(task)
            task.add_done_callback(tasks.discard)
        await _finish(list(tasks), ctx.level, deadline_abs_ns)


@contextlib.asynccontextmanager
async def _cut_off_when_stopped(tasks: Iterable[asyncio.Task[None]]) -> AsyncIterator[None]:
    """On Ctrl-C (the run's task is cancelled) cancel the requests in flight and wait for them while the
    session is still open, so each becomes a ``cut_off`` record, not a ``connection_reset`` one."""
    try:
        yield
    except asyncio.CancelledError:
        in_flight = list(tasks)
        for task in in_flight:
            task.cancel()
        await asyncio.gather(*in_flight, return_exceptions=True)
        raise


async def _sleep_until(abs_ns: int) -> None:
    """Sleep until ``abs_ns`` and never wake early (uvloop's timers round to milliseconds)."""
    while (remaining := abs_ns - time.perf_counter_ns()) > 0:
        await asyncio.sleep(remaining / 1e9)


async def _finish(tasks: list[asyncio.Task[None]], level: LoadLevel, deadline_abs_ns: int | None) -> None:
    """Wait for in-flight requests; after a duration they get ``drain_s`` more, then are cut off (never
    earlier: uvloop's timers round to milliseconds and may wake before the time asked, so it waits again
    until the drain has really ended)."""
    end_abs_ns = None
    if deadline_abs_ns is not None:
        end_abs_ns = max(deadline_abs_ns, time.perf_counter_ns()) + round(level.drain_s * 1e9)
    pending = set(tasks)
    while pending:
        remaining_s = None if end_abs_ns is None else (end_abs_ns - time.perf_counter_ns()) / 1e9
        if remaining_s is not None and remaining_s <= 0:
            break
        _, pending = await asyncio.wait(pending, timeout=remaining_s)
    for task in pending:
        task.cancel()  # _send turns the cancellation into a "cut_off" record
    if pending:
        await asyncio.wait(pending)


# --------------------------------------------------------------------------------------------------
# One process
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Shard:
    """This process's part of a level: shard ``index`` of ``count``, its share of streams and requests."""

    index: int
    count: int

    def share(self, total: int) -> int:
        """This shard's part of ``total`` streams (the first shards take the remainder)."""
        return total // self.count + (1 if self.index < total % self.count else 0)

    def ramp_offsets_ns(self, level: LoadLevel) -> list[int]:
        """Start offsets of this shard's closed-loop streams: global stream g of c starts at
        ``g * ramp_up_s / c``, so the streams of all shards together start evenly over the ramp."""
        total = level.concurrency or 0
        first = sum(_Shard(i, self.count).share(total) for i in range(self.index))
        return [round((first + j) * level.ramp_up_s * 1e9 / total) for j in range(self.share(total))]

    def indices(self, level: LoadLevel) -> Iterable[int]:
        """Global indices of this shard's measured requests (after the warmup indices).

        Closed loop with a count: a contiguous block in proportion to this shard's streams, so every
        stream of every shard sends the same number of requests and no shard runs a lone extra cycle
        after the others finish (1024 streams over 12 shards: 86 or 85 each, so an equal split of the
        count would leave some streams one request more). Otherwise every ``count``-th index, matching
        the open loop's round-robin of arrivals.
        """
        start = level.warmup_requests
        if level.concurrency is not None and level.requests is not None:
            before = sum(_Shard(i, self.count).share(level.concurrency) for i in range(self.index))
            mine = self.share(level.concurrency)
            first = start + level.requests * before // level.concurrency
            return range(first, start + level.requests * (before + mine) // level.concurrency)
        if level.requests is not None:
            return range(start + self.index, start + level.requests, self.count)
        return _stepped(start + self.index, self.count)


def _stepped(first: int, step: int) -> Iterator[int]:
    k = first
    while True:
        yield k
        k += step


def _session(streams: int | None, level: LoadLevel) -> aiohttp.ClientSession:
    """The process's one session: pool sized to its streams, large read buffer, no per-request extras."""
    connector = StampingConnector(limit=streams or 0, limit_per_host=0, ttl_dns_cache=None)
    return aiohttp.ClientSession(
        connector=connector,
        timeout=aiohttp.ClientTimeout(total=level.request_timeout_s),
        read_bufsize=_READ_BUFFER,
        auto_decompress=False,
        skip_auto_headers=("User-Agent",),
    )


def _prepared_requests(level: LoadLevel, workload: Workload, shard: _Shard) -> Iterator[PreparedRequest]:
    """This shard's measured requests; for a count, all bodies encoded now, before the clock starts."""
    indices = shard.indices(level)
    limit = len(indices) if isinstance(indices, range) else None  # a count: conversations' turns in all
    requests = request_stream(workload, iter(indices), limit)
    return iter(list(requests)) if level.requests is not None else requests


async def _run_measured(
    session: aiohttp.ClientSession,
    base_url: str,
    level: LoadLevel,
    requests: Iterator[PreparedRequest],
    shard: _Shard,
    t0_ns: int,
    outcomes: list[_Outcome],
    spill: Path | None,
    tally: LoadTally | None,
) -> None:
    """This process's share of the measured requests, starting at ``t0_ns``, appended to ``outcomes``
    (and, with ``spill``, written there as they finish; with ``tally``, counted there)."""
    ctx = _Context(base_url, level, t0_ns, warmup=False, tally=tally)
    deadline = t0_ns + round(level.duration_s * 1e9) if level.duration_s is not None else None
    stop = asyncio.Event()
    spilling = None
    if spill is not None:
        spilling = asyncio.create_task(_Spill(spill, f"shard{shard.index}").run(outcomes, stop))
    try:
        await _sleep_until(t0_ns)
        if level.concurrency is not None:
            streams = shard.share(level.concurrency)
            ramp = shard.ramp_offsets_ns(level)
            await _closed_loop(session, ctx, requests, streams, deadline, outcomes, ramp)
        else:
            offsets = (o for k, o in enumerate(arrival_offsets_ns(level)) if k % shard.count == shard.index)
            cap = shard.share(level.max_concurrency) if level.max_concurrency else None
            await _open_loop(session, ctx, requests, offsets, cap, deadline, outcomes)
    finally:
        stop.set()
        if spilling is not None:
            await asyncio.shield(spilling)  # a part being written is finished, even on Ctrl-C


async def _open_connections(session: aiohttp.ClientSession, base_url: str, count: int | None) -> None:
    """Fill the pool with ``count`` kept-alive connections (one cheap GET each) before the clock starts.

    Otherwise every stream opens its TCP connection in the first instant of the run, and that burst of
    connects and first requests lands on the same CPU as the first chunks. A server that refuses or is
    down is not reported here: the measured requests report it, as error rows.
    """
    if not count:
        return

    async def one() -> None:
        with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
            async with session.get(base_url + api.MODEL_INFO, timeout=_PRECONNECT_TIMEOUT) as resp:
                await resp.read()

    await asyncio.gather(*(one() for _ in range(count)))


async def _warmup(
    session: aiohttp.ClientSession, base_url: str, level: LoadLevel, workload: Workload
) -> tuple[list[RequestRecord], bool | None]:
    """Send the warmup requests (closed loop at the level's streams), then flush the cache if asked."""
    outcomes: list[_Outcome] = []
    if level.warmup_requests:
        ctx = _Context(base_url, level, time.perf_counter_ns(), warmup=True)
        requests = request_stream(workload, iter(range(level.warmup_requests)), level.warmup_requests)
        workers = min(level.warmup_requests, level.streams or level.warmup_requests)
        await _closed_loop(session, ctx, requests, workers, None, outcomes)
    flushed = await _flush_cache(session, base_url, level.flush_timeout_s) if level.flush_cache else None
    records = _records(outcomes)  # in the order they finished, which a loaded machine reorders
    records.sort(key=lambda r: (r.start_ns, r.request_id))  # as the measured rows
    return records, flushed


async def _flush_cache(session: aiohttp.ClientSession, base_url: str, timeout_s: float) -> bool:
    """POST /flush_cache until it succeeds (SGLang answers 400 while requests still run)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            async with session.post(base_url + api.FLUSH_CACHE) as resp:
                if resp.status == 200:
                    return True
                log.info("flush_cache answered %d; retrying", resp.status)
        except aiohttp.ClientError as err:
            log.warning("flush_cache failed: %s", err)
        if time.monotonic() > deadline:
            log.warning("flush_cache did not succeed; server-side averages include warmup")
            return False
        await asyncio.sleep(0.2)


async def _calibrate(streams: int, chunks: int = 40, interval_us: int = 5000) -> ClientDelay:
    """Client-added delay per chunk on the loopback endpoint, through the normal request path."""
    level = LoadLevel(concurrency=streams, requests=streams, request_timeout_s=60)
    with LoopbackServer() as server:
        async with _session(streams, level) as session:
            ctx = _Context(server.url, level, time.perf_counter_ns(), warmup=False)
            prep = PreparedRequest(0, api.GENERATE, loopback_body(chunks, interval_us), chunks)
            records = _records(
                await asyncio.gather(*(_send(session, ctx, prep, None) for _ in range(streams)))
            )
    delays = [
        (arrival - sent) / 1e3
        for r in records
        if r.error_type is None and r.server_chunk_ns is not None and r.chunk_arrival_ns is not None
        for arrival, sent in zip(r.chunk_arrival_ns, r.server_chunk_ns, strict=True)
    ]
    if not delays:
        errors = {r.error_message for r in records}
        raise RuntimeError(f"loopback calibration got no chunks: {errors}")
    values = np.asarray(delays)
    return ClientDelay(
        streams=streams,
        chunks=len(delays),
        p50_us=float(np.percentile(values, 50)),
        p99_us=float(np.percentile(values, 99)),
        max_us=float(values.max()),
    )


@contextlib.contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """No cyclic GC during measurement: a full collection stalls every stream for milliseconds."""
    gc.collect()
    gc.freeze()
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
        gc.unfreeze()


def _new_event_loop() -> asyncio.AbstractEventLoop:
    """uvloop's loop when installed (lower per-read cost), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def _run_async(coro_factory: Callable[[], Coroutine[Any, Any, T]]) -> T:
    """Run a coroutine on a fresh (uv)loop."""
    with asyncio.Runner(loop_factory=_new_event_loop) as runner:
        return runner.run(coro_factory())


# --------------------------------------------------------------------------------------------------
# Public API
# --------------------------------------------------------------------------------------------------


def auto_processes(level: LoadLevel) -> int:
    """Client processes for a level: one per ``STREAMS_PER_PROCESS`` streams, on at most half the cores.

    The other half is left to the server being measured (on a GPU node it shares the host; on a laptop
    or CI box the simulated server runs beside us).
    """
    if level.processes is not None:
        return level.processes
    streams = level.streams or 1
    return max(1, min((os.cpu_count() or 2) // 2, math.ceil(streams / STREAMS_PER_PROCESS)))


def run_load(
    url: str,
    level: LoadLevel,
    workload: Workload,
    *,
    calibration_streams: int = 32,
    spill: Path | None = None,
    tally: LoadTally | None = None,
) -> LoadResult:
    """Run one load level against ``url`` (``http://host:port``) and return every request's record. With
    ``spill`` (an existing directory), the measured records are also written there as requests finish
    (``_Spill``), so a killed process leaves them on disk; the caller removes it once the result is kept.
    With ``tally``, the stage and the measured requests' counts are kept there as the level runs."""
    base_url = url.rstrip("/")
    processes = auto_processes(level)
    tally = tally or LoadTally()
    client_delay = _run_async(lambda: _calibrate(calibration_streams))
    log.info("client-added delay p50 %.0f us, p99 %.0f us", client_delay.p50_us, client_delay.p99_us)

    async def warmup() -> tuple[list[RequestRecord], bool | None]:
        async with _session(level.streams, level) as session:
            return await _warmup(session, base_url, level, workload)

    tally.stage = f"warmup: {level.warmup_requests} request(s)" if level.warmup_requests else tally.stage
    warmup_records, flushed = _run_async(warmup)
    tally.stage, tally.total = MEASURING, level.requests
    records: list[RequestRecord] = []
    outcomes: list[_Outcome] = []
    interrupted = False
    t0 = [time.perf_counter_ns()]  # set again where the measured run starts
    with _no_gc_pauses():
        try:
            if processes == 1:
                _run_async(lambda: _run_one_process(base_url, level, workload, outcomes, t0, spill, tally))
            else:
                _run_shard_processes(base_url, level, workload, processes, records, t0, spill, tally)
        except KeyboardInterrupt:  # in-flight requests became cut_off records; keep them all
            interrupted = True
        records.extend(_records(outcomes))
    records.sort(key=lambda r: (r.start_ns, r.request_id))
    window = measurement_window(level, records)
    records = [in_window(r, *window) for r in records]
    return LoadResult(
        level=level,
        records=records,
        warmup_records=warmup_records,
        client_delay=client_delay,
        duration_s=max((r.end_ns or r.start_ns for r in records), default=0) / 1e9,
        window_start_s=window[0] / 1e9,
        window_end_s=window[1] / 1e9,
        stop_reason=_stop_reason(level, records, interrupted),
        t0_ns=t0[0],
        achieved_rate_rps=_achieved_rate(level, records),
        processes=processes,
        cache_flushed=flushed,
        interrupted=interrupted,
    )


async def _run_one_process(
    base_url: str,
    level: LoadLevel,
    workload: Workload,
    outcomes: list[_Outcome],
    t0: list[int],
    spill: Path | None,
    tally: LoadTally,
) -> None:
    shard = _Shard(0, 1)
    requests = _prepared_requests(level, workload, shard)
    async with _session(level.streams, level) as session:
        await _open_connections(session, base_url, level.streams)
        t0[0] = time.perf_counter_ns()
        await _run_measured(session, base_url, level, requests, shard, t0[0], outcomes, spill, tally)


def measurement_window(level: LoadLevel, records: list[RequestRecord]) -> tuple[int, int]:
    """The level's steady-state window (ns on the records' clock): from ``ramp_up_s`` after the start
    (every closed-loop stream has started) to the end of sending. Closed loop: the first request to end
    after the last send, when the first stream stops and the drain begins (a duration level sends until
    its deadline, a count level until its requests run out); open loop: the last send. It holds no send
    when every request was sent during the ramp (then its end is no earlier than its start)."""
    start = round(level.ramp_up_s * 1e9)
    if not records:
        return start, start
    last_send = max(r.start_ns for r in records)
    end = last_send
    if level.concurrency is not None:
        end = min((r.end_ns for r in records if r.end_ns is not None and r.end_ns >= last_send), default=end)
    return start, max(start, end)


def in_window(record: RequestRecord, start_ns: int, end_ns: int) -> RequestRecord:
    """The record with its window fields: sent inside the window, and its tokens that arrived inside it."""
    arrivals = record.chunk_arrival_ns or []
    tokens = sum(
        n
        for at, n in zip(arrivals, record.chunk_tokens or [], strict=True)
        if start_ns <= record.start_ns + at <= end_ns
    )
    return replace(record, in_window=start_ns <= record.start_ns <= end_ns, window_tokens=tokens)


def _stop_reason(level: LoadLevel, records: list[RequestRecord], interrupted: bool) -> str:
    """``precision`` when a sequential level stopped before its limit, else ``limit``: a count level
    that sent fewer requests, or a duration level whose last request ended before the duration (at
    the limit, requests in flight at the deadline end after it)."""
    if level.precision is None or interrupted or not records:
        return "limit"
    if level.requests is not None:
        return "precision" if len(records) < level.requests else "limit"
    end = max(r.end_ns or r.start_ns for r in records)
    return "precision" if level.duration_s is not None and end < level.duration_s * 1e9 else "limit"


def _achieved_rate(level: LoadLevel, records: list[RequestRecord]) -> float | None:
    """Sends per second: open loop over the span to the last send; closed loop over the run."""
    if not records:
        return None
    if level.rate_rps is not None:
        last = max(r.start_ns for r in records)
        return len(records) / (last / 1e9) if last > 0 else None
    end = max(r.end_ns or r.start_ns for r in records)
    return len(records) / (end / 1e9) if end > 0 else None


# --------------------------------------------------------------------------------------------------
# Several processes
# --------------------------------------------------------------------------------------------------

_START_MARGIN_NS = 200_000_000  # shards are told the start time this far ahead


def _run_shard_processes(
    base_url: str,
    level: LoadLevel,
    workload: Workload,
    processes: int,
    records: list[RequestRecord],
    t0: list[int],
    spill: Path | None,
    tally: LoadTally,
) -> None:
    """Start ``processes`` shard processes, let them all begin at one instant, merge their records.

    On Ctrl-C the shards (same process group) stop on their own and still write their records, so the
    parent waits for them before reading the parts. While they run, a thread a shard reads the counts
    each one prints (``shard_counts``) into ``tally``.
    """
    with tempfile.TemporaryDirectory(prefix="specsweep-load-") as tmp:
        children = []
        for index in range(processes):
            job = {
                "url": base_url,
                "level": level.model_dump(mode="json"),
                "workload": _WORKLOAD_ADAPTER.dump_python(workload, mode="json"),
                "shard": index,
                "shards": processes,
                "out": str(Path(tmp) / f"part-{index}.parquet"),
                "spill": None if spill is None else str(spill),
            }
            child = subprocess.Popen(
                [sys.executable, "-m", "workers.load.generator"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                text=True,
            )
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(json.dumps(job) + "\n")
            child.stdin.flush()
            children.append(child)
        try:
            for child in children:
                if child.stdout.readline().strip() != "ready":  # type: ignore[union-attr]
                    raise RuntimeError("a load generator shard process failed to start")
            t0_ns = t0[0] = time.perf_counter_ns() + _START_MARGIN_NS
            for child in children:
                child.stdin.write(f"{t0_ns}\n")  # type: ignore[union-attr]
                child.stdin.flush()  # type: ignore[union-attr]
            readers = [
                threading.Thread(target=_read_counts, args=(child, index, tally), daemon=True)
                for index, child in enumerate(children)
            ]
            for reader in readers:
                reader.start()
            for child in children:
                child.wait()
            for reader in readers:
                reader.join()
        finally:
            for child in children:
                try:
                    child.wait(timeout=level.drain_s + 10)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            for index in range(processes):
                part = Path(tmp) / f"part-{index}.parquet"
                if part.exists():
                    records.extend(_read_records(part))
                else:
                    log.error("load generator shard %d wrote no records", index)


def _read_counts(child: subprocess.Popen[str], index: int, tally: LoadTally) -> None:
    """Keep shard ``index``'s latest counts (lines of ``shard_counts``) in ``tally`` until it exits."""
    assert child.stdout is not None
    for line in child.stdout:
        sent, finished, errors = json.loads(line)
        tally.shards[index] = (sent, finished, errors)


async def shard_counts(tally: LoadTally) -> None:
    """A shard's side of the progress line: its counts as one JSON line on stdout every second."""
    while True:
        print(json.dumps([tally.sent, tally.finished, tally.errors]), flush=True)
        await asyncio.sleep(SPILL_INTERVAL_S)


def _read_records(path: Path) -> list[RequestRecord]:
    """Records back from a shard's Parquet part."""
    import pyarrow.parquet as pq

    table = pq.read_table(path)
    return [RequestRecord(**row) for row in table.to_pylist()]


def _shard_main() -> int:
    """A shard process: read its job, say ready, wait for the start time, run, write records."""
    job = json.loads(sys.stdin.readline())
    level = LoadLevel.model_validate(job["level"])
    workload = _WORKLOAD_ADAPTER.validate_python(job["workload"])
    shard = _Shard(job["shard"], job["shards"])

    outcomes: list[_Outcome] = []
    tally = LoadTally(stage=MEASURING)

    async def main() -> None:
        requests = _prepared_requests(level, workload, shard)
        streams = shard.share(level.streams) if level.streams else None
        async with _session(streams, level) as session:
            await _open_connections(session, job["url"], streams)
            print("ready", flush=True)
            t0_ns = int(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
            spill = None if job["spill"] is None else Path(job["spill"])
            reporting = asyncio.create_task(shard_counts(tally))
            try:
                await _run_measured(
                    session, job["url"], level, requests, shard, t0_ns, outcomes, spill, tally
                )
            finally:
                reporting.cancel()
                print(json.dumps([tally.sent, tally.finished, tally.errors]), flush=True)

    # On Ctrl-C in-flight requests become cut_off records; all records are written either way.
    with _no_gc_pauses():
        with contextlib.suppress(KeyboardInterrupt):
            _run_async(main)
        records = _records(outcomes)
    write_parquet_atomic(requests_table(records), job["out"])
    return 0


if __name__ == "__main__":
    sys.exit(_shard_main())
