"""The load generator's record arithmetic on hand-built requests, with exact expected values.

A request as measured (absolute stamps, tokens per chunk, the server's final statistics) becomes one
Parquet row: TTFT, TPOT, per-step and per-token gaps, ids, window membership and the level's rates. Each
quantity is checked against the value worked out by hand, so a shifted, scaled or swapped formula fails
here in milliseconds (the tests against the simulated server check the same fields end to end, in
seconds). The last tests run the whole path against the wire server's exact bytes.
"""

from __future__ import annotations

import itertools
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from analysis.schema import RequestRecord
from tests.workers.wire_server import BUSY_FLUSHES, WireServer
from workers.job import LoadLevel
from workers.load.generator import (
    LoadResult,
    _achieved_rate,
    _Context,
    _Outcome,
    _record,
    _Shard,
    _stop_reason,
    arrival_offsets_ns,
    auto_processes,
    in_window,
    measurement_window,
    run_load,
)
from workers.load.stream import FinalStats
from workers.load.workloads import PreparedRequest, RandomIdsWorkload

T0 = 1_000_000_000  # the run's start on the absolute clock
START = T0 + 5_000_000  # the request is sent 5 ms after it
WORKLOAD = RandomIdsWorkload(input_tokens=8, output_tokens=10)
CLOSED = LoadLevel(concurrency=4, requests=8)
STATS = FinalStats(
    prompt_tokens=7,
    completion_tokens=6,
    finish_reason="length",
    spec_verify_ct=2,
    spec_accept_length=3.0,
    spec_accept_rate=0.5,
    spec_num_correct_drafts=3,
    spec_num_proposed_drafts=6,
    spec_correct_drafts_histogram=[0, 1, 1],
    cached_tokens=2,
)


def _outcome(
    *,
    stats: FinalStats | None = STATS,
    error: tuple[str, str] | None = None,
    arrivals_ms: tuple[float, ...] = (10.0, 16.0, 22.0),
    tokens: tuple[int, ...] = (1, 3, 2),
    tokens_seen: int = 6,
    warmup: bool = False,
    level: LoadLevel = CLOSED,
    prep: PreparedRequest | None = None,
    scheduled_abs_ns: int | None = None,
    status: int | None = 200,
) -> _Outcome:
    """A request sent at START whose chunks arrived ``arrivals_ms`` after the send, ending 30 ms after it;
    the server stamped each chunk 1 ms before it arrived."""
    arrivals = [START + round(ms * 1e6) for ms in arrivals_ms]
    return _Outcome(
        ctx=_Context("http://x", level, T0, warmup=warmup),
        prep=prep or PreparedRequest(12, "/generate", b"{}", 6, category="code", dataset="set"),
        status=status,
        error=error,
        stats=stats,
        scheduled_abs_ns=scheduled_abs_ns,
        start_ns=START,
        end_ns=START + 30_000_000,
        chunk_arrival_ns=arrivals,
        chunk_tokens=list(tokens),
        server_chunk_ns=[t - 1_000_000 for t in arrivals],
        tokens_seen=tokens_seen,
    )


def test_record_of_a_streamed_request_has_exact_latencies_and_the_servers_statistics() -> None:
    """TTFT is the first chunk; a step's gap is spread evenly over its tokens; TPOT is the time after the
    first chunk over the tokens after the first; the server's final statistics are copied as sent."""
    record = _record(_outcome())
    assert record.request_id == "r0000012"
    assert (record.load_level, record.concurrency, record.rate_rps) == ("concurrency=4", 4, None)
    assert (record.endpoint, record.warmup, record.category, record.dataset, record.turn) == (
        "/generate",
        False,
        "code",
        "set",
        None,
    )
    assert (record.scheduled_ns, record.start_ns, record.end_ns) == (5_000_000, 5_000_000, 35_000_000)
    assert record.ttft_ms == 10.0
    assert record.e2e_ms == 30.0
    assert record.tpot_ms == pytest.approx(12.0 / 5)
    assert record.chunk_arrival_ns == [10_000_000, 16_000_000, 22_000_000]
    assert record.chunk_tokens == [1, 3, 2]
    assert record.server_chunk_ns == [9_000_000, 15_000_000, 21_000_000]
    assert record.itl_per_step_ms == [6.0, 6.0]
    assert record.itl_per_token_ms == [2.0, 2.0, 2.0, 3.0, 3.0]
    assert (record.prompt_tokens, record.completion_tokens, record.cached_tokens) == (7, 6, 2)
    assert (record.finish_reason, record.spec_verify_ct, record.spec_accept_length) == ("length", 2, 3.0)
    assert (record.spec_accept_rate, record.spec_num_correct_drafts, record.spec_num_proposed_drafts) == (
        0.5,
        3,
        6,
    )
    assert record.spec_correct_drafts_histogram == [0, 1, 1]
    assert (record.http_status, record.error_type, record.error_message) == (200, None, None)


def test_record_of_a_failed_request_keeps_the_tokens_it_saw_and_its_error() -> None:
    """No final statistics: the completion count is the tokens streamed, server fields are null."""
    record = _record(
        _outcome(
            stats=None,
            error=("connection_reset", "lost"),
            arrivals_ms=(4.0, 9.0),
            tokens=(1, 2),
            tokens_seen=3,
        )
    )
    assert (record.completion_tokens, record.prompt_tokens, record.cached_tokens) == (3, None, None)
    assert (record.ttft_ms, record.tpot_ms) == (4.0, 2.5)  # 5 ms over the 2 tokens after the first
    assert record.itl_per_token_ms == [2.5, 2.5]
    assert (record.error_type, record.error_message, record.http_status) == ("connection_reset", "lost", 200)
    stats_fields = (
        record.finish_reason,
        record.spec_verify_ct,
        record.spec_accept_length,
        record.spec_accept_rate,
        record.spec_num_correct_drafts,
        record.spec_num_proposed_drafts,
        record.spec_correct_drafts_histogram,
    )
    assert stats_fields == (None,) * 7


def test_record_without_chunks_has_no_token_latencies() -> None:
    """A request that got nothing (connect error): no TTFT, TPOT, tokens or server stamps; only e2e."""
    record = _record(
        _outcome(stats=None, error=("connect_error", "down"), arrivals_ms=(), tokens=(), status=None)
    )
    assert (record.ttft_ms, record.tpot_ms, record.completion_tokens) == (None, None, None)
    assert (record.chunk_arrival_ns, record.chunk_tokens, record.server_chunk_ns) == ([], [], None)
    assert (record.itl_per_step_ms, record.itl_per_token_ms) == ([], [])
    assert (record.e2e_ms, record.http_status) == (30.0, None)


def test_record_tpot_is_null_when_one_token_or_one_chunk() -> None:
    """TPOT needs a second chunk and a second token; the server's count wins over the tokens streamed."""
    one_token = FinalStats(7, 1, "length", 0, None, None, None, None, None)
    assert _record(_outcome(stats=one_token, arrivals_ms=(3.0,), tokens=(1,), tokens_seen=1)).tpot_ms is None
    record = _record(_outcome(arrivals_ms=(3.0,), tokens=(6,)))
    assert (record.tpot_ms, record.completion_tokens) == (None, 6)
    more = FinalStats(
        7, 8, "stop", 2, 4.0, 1.0, 6, 6, [0, 0, 2]
    )  # the server counts tokens it did not stream
    record = _record(_outcome(stats=more))
    assert (record.completion_tokens, record.tpot_ms) == (8, 12.0 / 7)
    unsaid = FinalStats(7, None, "length", None, None, None, None, None, None)
    record = _record(_outcome(stats=unsaid, arrivals_ms=(2.0, 5.0), tokens=(1, 1), tokens_seen=2))
    assert (record.completion_tokens, record.tpot_ms) == (2, 3.0)


def test_record_ids_name_warmup_and_turns_and_keep_the_scheduled_send() -> None:
    """Warmup rows start with ``w``, a conversation's later turns end in ``.turn``; an open loop's row
    keeps when the request was due, before it was sent."""
    turn = PreparedRequest(3, "/v1/chat/completions", b"{}", None, turn=2)
    record = _record(_outcome(warmup=True, prep=turn, scheduled_abs_ns=T0 + 2_000_000))
    assert (record.request_id, record.warmup, record.turn) == ("w0000003.2", True, 2)
    assert (record.scheduled_ns, record.start_ns) == (2_000_000, 5_000_000)
    first = PreparedRequest(3, "/v1/chat/completions", b"{}", None, turn=0)
    record = _record(_outcome(prep=first, level=LoadLevel(rate_rps=2.5, requests=4)))
    assert (record.request_id, record.load_level, record.rate_rps, record.concurrency) == (
        "r0000003",
        "rate=2.5",
        2.5,
        None,
    )


def _row(
    start_ms: float, end_ms: float | None, arrivals_ms: tuple[float, ...] = (), tokens: tuple[int, ...] = ()
) -> RequestRecord:
    record = _record(_outcome(stats=None, arrivals_ms=arrivals_ms, tokens=tokens, tokens_seen=sum(tokens)))
    ms = 1_000_000
    return RequestRecord(
        **{
            **{f: getattr(record, f) for f in RequestRecord.__dataclass_fields__},
            "start_ns": round(start_ms * ms),
            "end_ns": None if end_ms is None else round(end_ms * ms),
        }
    )


def test_window_counts_the_sends_and_tokens_inside_it_bounds_included() -> None:
    """A row is in the window when sent inside it (both ends count); its window tokens are those of the
    chunks that arrived inside it."""
    row = _row(100.0, 200.0, arrivals_ms=(10.0, 50.0, 90.0), tokens=(1, 2, 3))
    assert (
        in_window(row, 100_000_000, 150_000_000).in_window,
        in_window(row, 100_000_000, 150_000_000).window_tokens,
    ) == (True, 3)
    assert in_window(row, 110_000_000, 190_000_000).window_tokens == 6  # both bounds are inside
    assert in_window(row, 60_000_000, 100_000_000).in_window is True
    late = in_window(row, 0, 99_999_999)
    assert (late.in_window, late.window_tokens) == (False, 0)
    early = in_window(row, 100_000_001, 300_000_000)
    assert (early.in_window, early.window_tokens) == (False, 6)
    assert in_window(_row(5.0, None), 0, 10**9).window_tokens == 0  # no chunks at all


def test_window_runs_from_the_ramp_to_the_drain_when_closed_loop_and_to_the_last_send_when_open() -> None:
    """Closed loop: the window ends at the first request to end after the last send (a row still open
    does not count); open loop: at the last send; never before the ramp's end."""
    rows = [_row(0.0, 40.0), _row(10.0, 25.0), _row(30.0, 60.0), _row(20.0, 35.0), _row(5.0, None)]
    closed = LoadLevel(concurrency=4, requests=5, ramp_up_s=0.002)
    assert measurement_window(closed, rows) == (2_000_000, 35_000_000)
    assert measurement_window(LoadLevel(rate_rps=10.0, requests=5), rows) == (0, 30_000_000)
    assert measurement_window(LoadLevel(concurrency=4, requests=5, ramp_up_s=1.5), rows) == (
        1_500_000_000,
        1_500_000_000,
    )
    assert measurement_window(closed, []) == (2_000_000, 2_000_000)
    # Only the request sent last is left to end: the window ends with it; none ended: the last send.
    assert measurement_window(closed, [_row(0.0, 10.0), _row(30.0, 45.0)]) == (2_000_000, 45_000_000)
    assert measurement_window(closed, [_row(0.0, 10.0), _row(30.0, None)]) == (2_000_000, 30_000_000)
    # A request ending at the very instant of the last send ends the window.
    assert measurement_window(closed, [_row(0.0, 30.0), _row(30.0, 50.0)]) == (2_000_000, 30_000_000)


def test_stop_reason_says_precision_only_when_a_sequential_level_stopped_before_its_limit() -> None:
    """``precision`` when fewer requests than the count, or a last end before the duration; else ``limit``
    (no precision asked, interrupted, no rows, the limit reached)."""
    rows = [_row(0.0, 400.0), _row(10.0, 900.0), _row(20.0, None)]
    count = LoadLevel(concurrency=2, requests=4, precision=0.1)
    assert _stop_reason(count, rows, interrupted=False) == "precision"
    assert _stop_reason(count.model_copy(update={"requests": 3}), rows, interrupted=False) == "limit"
    assert _stop_reason(count, rows, interrupted=True) == "limit"
    assert _stop_reason(count, [], interrupted=False) == "limit"
    assert _stop_reason(LoadLevel(concurrency=2, requests=4), rows, interrupted=False) == "limit"
    timed = LoadLevel(concurrency=2, duration_s=1.0, precision=0.1)
    assert _stop_reason(timed, rows, interrupted=False) == "precision"
    assert _stop_reason(timed.model_copy(update={"duration_s": 0.9}), rows, interrupted=False) == "limit"
    assert (
        _stop_reason(timed.model_copy(update={"duration_s": 0.5}), [_row(950.0, None)], interrupted=False)
        == "limit"
    )


def test_achieved_rate_is_sends_over_the_span_to_the_last_send_open_loop_and_the_run_closed() -> None:
    """Open loop: 4 sends by 0.2 s is 20 per second; closed loop: over the last end (0.8 s), 5 per second;
    no rows or a zero span: none."""
    rows = [_row(0.0, 300.0), _row(50.0, 800.0), _row(100.0, None), _row(200.0, 400.0)]
    assert _achieved_rate(LoadLevel(rate_rps=30.0, requests=4), rows) == 4 / 0.2
    assert _achieved_rate(LoadLevel(concurrency=2, requests=4), rows) == 4 / 0.8
    assert _achieved_rate(LoadLevel(concurrency=2, requests=4), [_row(900.0, None)]) == 1 / 0.9
    one_ns = [_row(0.0, 0.0), _row(0.000001, 0.000001)]  # spans of 1 ns are spans
    assert _achieved_rate(LoadLevel(rate_rps=30.0, requests=2), one_ns) == 2 / 1e-9
    assert _achieved_rate(LoadLevel(concurrency=1, requests=2), one_ns) == 2 / 1e-9
    assert _achieved_rate(LoadLevel(rate_rps=30.0, requests=4), []) is None
    assert _achieved_rate(LoadLevel(rate_rps=30.0, requests=1), [_row(0.0, 5.0)]) is None
    assert _achieved_rate(LoadLevel(concurrency=1, requests=1), [_row(0.0, 0.0)]) is None


def test_shards_split_streams_ramp_and_requests_without_gaps_or_overlap() -> None:
    """10 streams over 3 shards: 4, 3, 3, starting evenly over the ramp across shards; a closed-loop
    count splits in proportion to streams, after the warmup's indices; otherwise round-robin."""
    shards = [_Shard(i, 3) for i in range(3)]
    assert [s.share(10) for s in shards] == [4, 3, 3]
    ramp = LoadLevel(concurrency=10, requests=25, ramp_up_s=2.0, warmup_requests=2)
    assert [s.ramp_offsets_ns(ramp) for s in shards] == [
        [0, 200_000_000, 400_000_000, 600_000_000],
        [800_000_000, 1_000_000_000, 1_200_000_000],
        [1_400_000_000, 1_600_000_000, 1_800_000_000],
    ]
    assert [list(s.indices(ramp)) for s in shards] == [
        list(range(2, 12)),
        list(range(12, 19)),
        list(range(19, 27)),
    ]
    open_count = LoadLevel(rate_rps=5.0, requests=7, warmup_requests=1)
    assert [list(s.indices(open_count)) for s in shards] == [[1, 4, 7], [2, 5], [3, 6]]
    timed = LoadLevel(rate_rps=5.0, duration_s=1.0, warmup_requests=1)
    stepped = shards[1].indices(timed)
    assert [x for _, x in zip(range(4), stepped, strict=False)] == [2, 5, 8, 11]


def test_constant_schedule_sends_every_one_over_rate_and_a_count_ends_it() -> None:
    """Constant arrivals at 4 per second: 0.25 s apart from the first gap; a count ends the schedule."""
    assert list(arrival_offsets_ns(LoadLevel(rate_rps=4.0, arrival="constant", requests=3))) == [
        250_000_000,
        500_000_000,
        750_000_000,
    ]


def test_auto_processes_takes_the_level_s_own_count_or_one_per_64_streams_on_half_the_cores() -> None:
    """An explicit ``processes`` wins; a level of few streams, or an open loop without a cap, is one process."""
    assert auto_processes(LoadLevel(concurrency=500, requests=500, processes=3)) == 3
    assert auto_processes(LoadLevel(concurrency=64, requests=64)) == 1
    assert auto_processes(LoadLevel(rate_rps=5.0, requests=5)) == 1


@pytest.fixture
def wire() -> Iterator[WireServer]:
    """Per test, so mutmut credits each test with the code it runs."""
    with WireServer() as server:
        yield server


def test_run_load_rows_of_a_recorded_sglang_stream_carry_its_final_statistics(wire: WireServer) -> None:
    """Against SGLang's recorded bytes: every row has the stream's final meta_info, tokens per chunk,
    times on the run's clock, window fields, the level's achieved rate and stop reason, and the
    calibration's 40 chunks per stream."""
    level = LoadLevel(concurrency=2, requests=4, warmup_requests=3)
    result = run_load(wire.url("recorded"), level, WORKLOAD, calibration_streams=2)
    assert [r.request_id for r in result.records] == ["r0000003", "r0000004", "r0000005", "r0000006"]
    assert [r.start_ns for r in result.records] == sorted(r.start_ns for r in result.records)
    assert [r.request_id for r in result.warmup_records] == ["w0000000", "w0000001", "w0000002"]
    assert (result.cache_flushed, result.stop_reason, result.processes, result.interrupted) == (
        None,
        "limit",
        1,
        False,
    )
    delay = result.client_delay
    assert (delay.streams, delay.chunks) == (2, 80)
    assert 0 < delay.p50_us <= delay.p99_us <= delay.max_us
    for r in [*result.records, *result.warmup_records]:
        _check_recorded_row(r)
    ends = [r.end_ns or 0 for r in result.records]
    assert result.duration_s == max(ends) / 1e9
    assert result.achieved_rate_rps == pytest.approx(4 / result.duration_s)
    window = measurement_window(level, result.records)
    assert (result.window_start_s, result.window_end_s) == (window[0] / 1e9, window[1] / 1e9)
    assert [r.in_window for r in result.records] == [in_window(r, *window).in_window for r in result.records]
    assert [r.window_tokens for r in result.records] == [
        in_window(r, *window).window_tokens for r in result.records
    ]


def _check_recorded_row(r: RequestRecord) -> None:
    """A row of the wire server's recorded SGLang stream: its final meta_info, tokens and times."""
    assert (r.error_type, r.http_status, r.endpoint) == (None, 200, "/generate")
    assert (r.prompt_tokens, r.completion_tokens, r.cached_tokens, r.finish_reason) == (7, 10, 0, "length")
    assert (r.chunk_tokens, r.spec_verify_ct, r.spec_accept_length) == ([1, 3, 2, 3, 1], 4, 2.5)
    assert (r.spec_num_correct_drafts, r.spec_num_proposed_drafts) == (5, 12)
    assert r.spec_correct_drafts_histogram == [1, 1, 2, 0]
    assert r.scheduled_ns == r.start_ns and r.end_ns is not None and r.end_ns >= r.start_ns
    assert r.e2e_ms == (r.end_ns - r.start_ns) / 1e6


def test_run_load_merges_the_rows_of_shard_processes_and_writes_nothing_without_spill(
    wire: WireServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two processes on one clock, each longer than the spill interval: every request of the level is one
    complete row, none lost or doubled, and without spill nothing is written to the working directory."""
    monkeypatch.chdir(tmp_path)
    level = LoadLevel(concurrency=2, requests=10, processes=2)
    result = run_load(wire.url("paced_nominal"), level, WORKLOAD, calibration_streams=1)
    assert result.processes == 2
    assert sorted(r.request_id for r in result.records) == [f"r{i:07d}" for i in range(10)]
    for r in result.records:
        _check_recorded_row(r)
        assert r.start_ns >= 0
    assert result.achieved_rate_rps == pytest.approx(10 / result.duration_s)
    assert list(tmp_path.iterdir()) == []


def test_run_load_shard_processes_spill_their_rows_as_they_go(wire: WireServer, tmp_path: Path) -> None:
    """Two processes, each longer than the spill interval: each shard leaves its own numbered parts in
    the spill directory, holding rows the result has, with the same values."""
    level = LoadLevel(concurrency=2, requests=10, processes=2)
    result = run_load(wire.url("paced_nominal"), level, WORKLOAD, calibration_streams=1, spill=tmp_path)
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert {name.split("-")[0] for name in parts} == {"shard0", "shard1"}
    assert all(name.endswith(("-000001.parquet", "-000002.parquet")) for name in parts)
    by_id = {r.request_id: r for r in result.records}
    spilled = [row for part in parts for row in pq.read_table(tmp_path / part).to_pylist()]
    assert 0 < len(spilled) < 10
    for row in spilled:
        record = by_id[row["request_id"]]
        assert (row["start_ns"], row["end_ns"], row["chunk_tokens"]) == (
            record.start_ns,
            record.end_ns,
            record.chunk_tokens,
        )


def test_run_load_starts_closed_loop_streams_evenly_over_the_ramp_on_the_runs_clock(wire: WireServer) -> None:
    """Two streams over a 0.2 s ramp, each request about 0.2 s long (paced chunks): the first stream sends
    at once, the second not before 0.1 s; the window opens at the ramp's end; ``t0_ns`` is the run's start
    on this process's clock."""
    level = LoadLevel(concurrency=2, requests=2, ramp_up_s=0.2)
    before = time.perf_counter_ns()
    result = run_load(wire.url("paced_nominal"), level, WORKLOAD, calibration_streams=1)
    first, second = result.records
    assert first.start_ns < 100_000_000 <= second.start_ns
    assert result.window_start_s == 0.2
    assert before < result.t0_ns < time.perf_counter_ns()


def test_run_load_stops_a_sequential_level_once_precise_enough(wire: WireServer) -> None:
    """Identical replies give a narrow throughput interval: the level stops long before its count, after
    at least 3 rounds of its 4 streams, and says so; the warmup does not stop early."""
    level = LoadLevel(concurrency=4, requests=400, precision=0.5, warmup_requests=13)
    result = run_load(wire.url("recorded"), level, WORKLOAD, calibration_streams=1)
    assert result.stop_reason == "precision"
    assert 12 <= len(result.records) < 100
    assert len(result.warmup_records) == 13


def test_run_load_spills_finished_rows_as_it_goes(wire: WireServer, tmp_path: Path) -> None:
    """A level longer than the spill interval leaves numbered Parquet parts holding the rows finished so
    far, in order, each once, with the values the result has."""
    level = LoadLevel(concurrency=1, requests=6)
    result = run_load(wire.url("paced_nominal"), level, WORKLOAD, calibration_streams=1, spill=tmp_path)
    parts = sorted(p.name for p in tmp_path.iterdir())
    assert parts and parts == [f"shard0-{n:06d}.parquet" for n in range(1, len(parts) + 1)]
    spilled = [row for part in parts for row in pq.read_table(tmp_path / part).to_pylist()]
    assert 0 < len(spilled) < 6
    for row, record in zip(spilled, result.records, strict=False):
        assert (row["request_id"], row["start_ns"], row["end_ns"], row["chunk_tokens"]) == (
            record.request_id,
            record.start_ns,
            record.end_ns,
            record.chunk_tokens,
        )


@pytest.mark.parametrize(
    ("mode", "row"),
    [
        (
            "truncated",
            ("truncated_stream", "stream ended without [DONE] (mid-event) after 1 tokens", 200, [1]),
        ),
        (
            "not_sse",
            (
                "malformed_sse",
                "not a server-sent event line: b'<html><body>502 Bad Gateway</body></html>'",
                200,
                [],
            ),
        ),
        ("http_503", ("http_error", 'HTTP 503: {"error":{"message":"overloaded"}}', 503, [])),
        ("stall", ("timeout", "no complete response within 0.3 s (1 tokens)", 200, [1])),
    ],
)
def test_run_load_row_of_a_failed_request_names_its_error_exactly(
    wire: WireServer, mode: str, row: tuple[str, str, int, list[int]]
) -> None:
    """Each failure is a row with its class, the whole message a user reads, its status and the tokens seen."""
    level = LoadLevel(concurrency=1, requests=1, request_timeout_s=0.3)
    (record,) = run_load(wire.url(mode), level, WORKLOAD, calibration_streams=1).records
    assert (record.error_type, record.error_message, record.http_status, record.chunk_tokens) == row
    assert (record.prompt_tokens, record.finish_reason) == (None, None)


def test_run_load_row_of_a_reset_stream_names_the_exception_and_the_tokens_seen(wire: WireServer) -> None:
    """A connection lost mid-stream: ``connection_reset`` with the tokens that did arrive."""
    (record,) = run_load(
        wire.url("reset"), LoadLevel(concurrency=1, requests=1), WORKLOAD, calibration_streams=1
    ).records
    assert record.error_type == "connection_reset"
    assert (record.error_message or "").startswith(
        "connection lost mid-stream after 1 tokens: ClientPayloadError: "
    )
    assert (record.chunk_tokens, record.completion_tokens) == ([1], 1)


def test_run_load_rows_are_cut_off_when_the_duration_and_drain_end(wire: WireServer) -> None:
    """Requests still running after the duration and the drain are ``cut_off`` rows with their tokens,
    in a closed loop as in an open one."""
    level = LoadLevel(concurrency=2, duration_s=0.1, drain_s=0.1, request_timeout_s=30)
    result = run_load(wire.url("stall"), level, WORKLOAD, calibration_streams=1)
    assert [(r.error_type, r.error_message) for r in result.records] == [
        ("cut_off", "run ended with the request in flight after 1 tokens")
    ] * 2
    assert all(r.end_ns is not None and r.end_ns >= 200_000_000 for r in result.records)
    open_loop = LoadLevel(rate_rps=50, arrival="constant", duration_s=0.1, drain_s=0.1, request_timeout_s=30)
    result = run_load(wire.url("stall"), open_loop, WORKLOAD, calibration_streams=1)
    assert [r.error_type for r in result.records] == ["cut_off"] * 4


def test_run_load_rows_of_an_open_loop_keep_their_schedule(wire: WireServer) -> None:
    """Constant arrivals at 50 per second: rows due at 20, 40 and 60 ms, sent no earlier; the cache flush
    is reported; the achieved rate is the sends over the span to the last one."""
    level = LoadLevel(rate_rps=50, arrival="constant", requests=3, flush_cache=True, warmup_requests=1)
    result = run_load(wire.url("recorded"), level, WORKLOAD, calibration_streams=1)
    assert result.cache_flushed is True
    rows = result.records
    assert [(r.request_id, r.scheduled_ns, r.load_level, r.rate_rps) for r in rows] == [
        ("r0000001", 20_000_000, "rate=50", 50.0),
        ("r0000002", 40_000_000, "rate=50", 50.0),
        ("r0000003", 60_000_000, "rate=50", 50.0),
    ]
    assert all(r.start_ns >= r.scheduled_ns for r in rows)
    assert result.achieved_rate_rps == 3 / (rows[-1].start_ns / 1e9)
    assert result.window_end_s == rows[-1].start_ns / 1e9


def test_run_load_rows_name_the_address_when_the_server_is_down() -> None:
    """No server on the port: a ``connect_error`` row whose message names the address and the refusal."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    (record,) = run_load(
        f"http://127.0.0.1:{port}", LoadLevel(concurrency=1, requests=1), WORKLOAD, calibration_streams=1
    ).records
    assert record.error_type == "connect_error" and record.http_status is None
    assert (
        record.error_message
        == f"cannot connect to http://127.0.0.1:{port}: [Errno 111] Connect call failed ('127.0.0.1', {port})"
    )


def test_run_load_open_loop_stops_sending_at_the_duration_and_waits_for_a_slot_when_capped(
    wire: WireServer,
) -> None:
    """Constant arrivals at 50 per second for 0.1 s: due at 20, 40, 60 and 80 ms, none at the deadline
    itself. Capped at one in flight against a stream of 4 paced steps, each send waits for the reply
    before it, so it is late."""
    timed = LoadLevel(rate_rps=50, arrival="constant", duration_s=0.1)
    rows = run_load(wire.url("recorded"), timed, WORKLOAD, calibration_streams=1).records
    assert [r.scheduled_ns for r in rows] == [20_000_000, 40_000_000, 60_000_000, 80_000_000]
    capped = LoadLevel(rate_rps=100, arrival="constant", requests=3, max_concurrency=1)
    rows = run_load(wire.url("paced_nominal"), capped, WORKLOAD, calibration_streams=1).records
    assert [r.error_type for r in rows] == [None] * 3
    assert all(later.start_ns >= earlier.end_ns for earlier, later in itertools.pairwise(rows))  # type: ignore[operator]


def test_run_load_reports_an_unflushed_cache_when_flush_cache_keeps_failing(wire: WireServer) -> None:
    """A server that answers /flush_cache with 503 until the flush timeout: ``cache_flushed`` is false."""
    level = LoadLevel(concurrency=1, requests=1, flush_cache=True, flush_timeout_s=0.1)
    assert run_load(wire.url("http_503"), level, WORKLOAD, calibration_streams=1).cache_flushed is False


def test_run_load_retries_a_refused_cache_flush_until_the_server_accepts_it(wire: WireServer) -> None:
    """SGLang answers /flush_cache with 400 while requests still run: the flush is asked again every
    0.2 s, accepted at the third try well within a 1.1 s timeout, and the cache is reported flushed."""
    level = LoadLevel(concurrency=1, requests=1, flush_cache=True, flush_timeout_s=1.1)
    result = run_load(wire.url("busy_flush"), level, WORKLOAD, calibration_streams=1)
    assert result.cache_flushed is True
    flushes = [p for p in wire.requests_seen if p.endswith("/flush_cache")]
    assert flushes == ["/busy_flush/flush_cache"] * (BUSY_FLUSHES + 1)
    assert [r.error_type for r in result.records] == [None]


def test_run_load_spills_no_part_while_no_request_has_finished(wire: WireServer, tmp_path: Path) -> None:
    """A level whose requests all stall past a spill interval leaves no (empty) part: rows are spilled
    only once some request has finished."""
    level = LoadLevel(concurrency=1, duration_s=1.2, drain_s=0.1, request_timeout_s=30)
    result = run_load(wire.url("stall"), level, WORKLOAD, calibration_streams=1, spill=tmp_path)
    assert [r.error_type for r in result.records] == ["cut_off"]
    assert list(tmp_path.iterdir()) == []


def test_run_load_open_loop_cuts_off_its_requests_in_flight_on_ctrl_c(wire: WireServer) -> None:
    """Ctrl-C while an open loop's two requests stall: ``run_load`` returns, marked interrupted, each
    request in flight a ``cut_off`` row (not an exception, not a lost row)."""
    level = LoadLevel(rate_rps=50, arrival="constant", requests=2, request_timeout_s=30)
    result = _run_load_until_ctrl_c(wire, level)
    assert (result.interrupted, result.stop_reason) == (True, "limit")
    assert [r.error_type for r in result.records] == ["cut_off"] * 2
    assert all(
        (r.error_message or "").startswith("run ended with the request in flight after")
        for r in result.records
    )


def test_run_load_shard_processes_keep_their_cut_off_rows_on_ctrl_c(wire: WireServer) -> None:
    """Ctrl-C reaches every process of the terminal's group: each of two shard processes cuts off its
    stalled request and writes it, and ``run_load`` waits for them (the drain plus 10 s, so even after a
    0.1 s drain): one ``cut_off`` row from each shard."""
    level = LoadLevel(concurrency=2, requests=2, processes=2, request_timeout_s=30, drain_s=0.1)
    result = _run_load_until_ctrl_c(wire, level)
    assert (result.interrupted, result.processes) == (True, 2)
    assert sorted((r.request_id, r.error_type, r.error_message) for r in result.records) == [
        (f"r{i:07d}", "cut_off", "run ended with the request in flight after 1 tokens") for i in range(2)
    ]


def _run_load_until_ctrl_c(wire: WireServer, level: LoadLevel) -> LoadResult:
    """``run_load`` on the wire server's stalling stream, interrupted by Ctrl-C once two requests stall,
    under Python's own Ctrl-C handler, as in a terminal (mutmut's workers ignore SIGINT)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    interrupter = threading.Thread(target=_interrupt_when, args=(lambda: len(wire.stalled) == 2,))
    interrupter.start()
    try:
        return run_load(wire.url("stall"), level, WORKLOAD, calibration_streams=1)
    finally:
        interrupter.join()
        signal.signal(signal.SIGINT, previous)


def _interrupt_when(ready: Callable[[], bool]) -> None:
    """SIGINT (Ctrl-C) to this process's shard processes, then to this process, as a terminal sends it
    to the whole group, once ``ready()`` holds; none if it never does within 30 s."""
    deadline = time.monotonic() + 30
    while not ready():
        if time.monotonic() > deadline:
            return
        time.sleep(0.005)
    for child in psutil.Process().children():
        if "workers.load.generator" in child.cmdline():
            child.send_signal(signal.SIGINT)
    os.kill(os.getpid(), signal.SIGINT)
