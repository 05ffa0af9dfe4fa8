"""Bad input never stops a run: each failure becomes rows with its error class, and the run finishes.

Byte-level faults the simulated server cannot produce come from ``wire_server`` (exact bytes on a raw
TCP socket); server down is a closed port.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from tests.workers.wire_server import PACE_S, STREAMS, WireServer
from workers.job import LoadLevel
from workers.load.generator import run_load
from workers.load.stream import INVALID_RESPONSE
from workers.load.workloads import RandomIdsWorkload
from workers.node.launcher import start_sim

WORKLOAD = RandomIdsWorkload(input_tokens=8, output_tokens=10)
LEVEL = LoadLevel(concurrency=2, requests=4, request_timeout_s=1.0)


@pytest.fixture(scope="module")
def wire() -> Iterator[WireServer]:
    with WireServer() as server:
        yield server


@pytest.mark.parametrize(
    ("mode", "error_type", "status", "message"),
    [
        ("reset", "connection_reset", 200, "connection lost mid-stream after 1 tokens"),
        ("truncated", "truncated_stream", 200, "stream ended without [DONE] (mid-event) after 1 tokens"),
        ("not_sse", "malformed_sse", 200, "not a server-sent event line"),
        ("bad_json", "malformed_sse", 200, "chunk is not JSON"),
        ("stall", "timeout", 200, "no complete response within 1 s (1 tokens)"),
        ("http_503", "http_error", 503, 'HTTP 503: {"error":{"message":"overloaded"}}'),
    ],
)
def test_run_load_records_error_rows_when_server_misbehaves(
    wire: WireServer, mode: str, error_type: str, status: int, message: str
) -> None:
    """Every request of the level is a row with the failure's class, status and message; none dropped."""
    result = run_load(wire.url(mode), LEVEL, WORKLOAD, calibration_streams=4)
    assert len(result.records) == 4
    assert sorted(r.request_id for r in result.records) == ["r0000000", "r0000001", "r0000002", "r0000003"]
    for record in result.records:
        assert (record.error_type, record.http_status) == (error_type, status)
        assert message in (record.error_message or "")
        assert record.end_ns is not None and record.end_ns >= record.start_ns


def test_run_load_ends_a_request_as_invalid_response_when_a_line_never_ends(wire: WireServer) -> None:
    """A server streaming a 100 MB data line: each request becomes an invalid_response row naming the
    16 MiB bound once that much is held (dc0ce9c re-joined the held bytes on every read, quadratic: it
    buffered the whole line for about 90 s, then called it malformed_sse); the token before it is kept."""
    level = LoadLevel(concurrency=1, requests=2, request_timeout_s=60.0)
    result = run_load(wire.url("huge_line"), level, WORKLOAD, calibration_streams=1)
    assert len(result.records) == 2
    for record in result.records:
        assert (record.error_type, record.http_status) == (INVALID_RESPONSE, 200)
        assert "an event of more than 16 MiB without its end" in (record.error_message or "")
        assert record.completion_tokens == 1


def test_run_load_keeps_tokens_seen_when_stream_is_cut_mid_way(wire: WireServer) -> None:
    """A cut-off request keeps the chunk it did receive: partial data is data, marked as failed."""
    result = run_load(wire.url("reset"), LEVEL, WORKLOAD, calibration_streams=4)
    for record in result.records:
        assert record.chunk_tokens == [1]
        assert record.completion_tokens == 1
        assert record.ttft_ms is not None


def test_run_load_records_connect_errors_when_server_is_down() -> None:
    """No server on the port: every request is a ``connect_error`` row naming the address."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_load(f"http://127.0.0.1:{port}", LEVEL, WORKLOAD, calibration_streams=4)
    assert len(result.records) == 4
    assert {r.error_type for r in result.records} == {"connect_error"}
    assert all(f"127.0.0.1:{port}" in (r.error_message or "") for r in result.records)
    assert all(r.http_status is None for r in result.records)


def test_run_load_cuts_off_in_flight_requests_when_duration_and_drain_end(wire: WireServer) -> None:
    """With a duration, requests still running after the drain time are ``cut_off`` rows."""
    level = LoadLevel(concurrency=3, duration_s=0.3, drain_s=0.2, request_timeout_s=30)
    result = run_load(wire.url("stall"), level, WORKLOAD, calibration_streams=4)
    assert len(result.records) == 3
    assert {r.error_type for r in result.records} == {"cut_off"}
    assert all(r.completion_tokens == 1 for r in result.records)


def test_run_load_parses_recorded_sglang_stream_when_wire_is_exact(wire: WireServer) -> None:
    """Against SGLang's recorded bytes every row is complete: tokens per step, spec stats, no error."""
    result = run_load(wire.url("recorded"), LEVEL, WORKLOAD, calibration_streams=4)
    for record in result.records:
        assert record.error_type is None
        assert (record.chunk_tokens, record.completion_tokens) == ([1, 3, 2, 3, 1], 10)
        assert (record.spec_verify_ct, record.spec_accept_length) == (4, 2.5)
        assert len(record.itl_per_token_ms or []) == 9 and len(record.itl_per_step_ms or []) == 4


@pytest.mark.parametrize(
    ("mode", "chunk_tokens"),
    [("paced_nominal", [1, 3, 2, 3, 1]), ("paced_coalesced", [4, 2, 3, 1])],
)
def test_run_load_times_tokens_exactly_when_sglang_stream_has_either_shape(
    wire: WireServer, mode: str, chunk_tokens: list[int]
) -> None:
    """SGLang sends the prefill's token alone, then one chunk per verify step, unless its tokenizer manager
    coalesces queued outputs (docs/sim_server.md). In both shapes, chunks PACE_S apart: TTFT is the first
    chunk, each step's gap is spread over its tokens, and TPOT is SGLang's bench definition, the time after
    the first chunk over the tokens after the first, (chunks - 1) * PACE_S / (completion - 1)."""
    level = LoadLevel(concurrency=2, requests=2, warmup_requests=0)
    result = run_load(wire.url(mode), level, WORKLOAD, calibration_streams=2)
    pace_ms = PACE_S * 1e3
    for r in result.records:
        assert r.error_type is None, r.error_message
        assert (r.chunk_tokens, r.completion_tokens, r.spec_verify_ct) == (chunk_tokens, 10, 4)
        assert r.ttft_ms is not None and r.ttft_ms < pace_ms
        steps = r.itl_per_step_ms or []
        # The server sleeps PACE_S between chunks; the client reads each chunk when it is scheduled, so a
        # late read of one chunk shortens the next gap by that lateness (up to a few ms on a busy box).
        assert len(steps) == len(chunk_tokens) - 1 and min(steps) >= pace_ms * 0.9
        per_token = r.itl_per_token_ms or []
        assert len(per_token) == 10 - chunk_tokens[0]
        assert per_token[: chunk_tokens[1]] == [steps[0] / chunk_tokens[1]] * chunk_tokens[1]
        ideal_tpot_ms = (len(chunk_tokens) - 1) * pace_ms / 9
        assert r.tpot_ms is not None and ideal_tpot_ms * 0.97 <= r.tpot_ms < ideal_tpot_ms * 1.5
        assert r.tpot_ms * 9 == pytest.approx(sum(steps), rel=1e-9)


SIM_ARGS = ["--model-path", str(STREAMS.parent / "kimi-k2"), "--max-running-requests", "64"]


def test_run_load_records_http_500_rows_when_sim_server_fails_some_requests() -> None:
    """The simulated server's HTTP 500 fault: those requests are ``http_error`` 500 rows, the rest ok."""
    env = {
        "SPECSWEEP_SIM_FAULT": "http_500",
        "SPECSWEEP_SIM_FAULT_EVERY": "2",
        "SPECSWEEP_SIM_TIME_SCALE": "0.1",
    }
    with start_sim(SIM_ARGS, env=env) as sim:
        result = run_load(sim.url, LoadLevel(concurrency=2, requests=8), WORKLOAD, calibration_streams=4)
    assert len(result.records) == 8
    failed = [r for r in result.records if r.error_type is not None]
    assert len(failed) == 4
    assert {(r.error_type, r.http_status) for r in failed} == {("http_error", 500)}
    assert all("Internal server error" in (r.error_message or "") for r in failed)
    assert all(r.completion_tokens == 10 for r in result.records if r.error_type is None)


def test_run_load_records_timeouts_when_sim_server_hangs_mid_stream() -> None:
    """The simulated scheduler stalls mid-stream: requests caught in it time out; earlier ones are kept."""
    env = {
        "SPECSWEEP_SIM_FAULT": "hang_mid_stream",
        "SPECSWEEP_SIM_FAULT_AFTER": "2",
        "SPECSWEEP_SIM_TIME_SCALE": "0.1",
    }
    level = LoadLevel(concurrency=1, requests=4, request_timeout_s=1.0)
    with start_sim(SIM_ARGS, env=env) as sim:
        result = run_load(sim.url, level, WORKLOAD, calibration_streams=4)
    assert [r.error_type for r in result.records] == [None, None, "timeout", "timeout"]
    assert result.records[2].completion_tokens is not None and result.records[2].completion_tokens >= 5


def test_load_command_writes_records_made_when_interrupted(wire: WireServer, tmp_path: Path) -> None:
    """Ctrl-C mid-run: ``specsweep load`` writes the cut-off requests as rows and exits 130."""
    out = tmp_path / "load.parquet"
    argv = [sys.executable, "-m", "harness.cli", "load", "--url", wire.url("stall"), "--concurrency", "2"]
    argv += ["--requests", "6", "--input-tokens", "8", "--output-tokens", "10", "--out", str(out)]
    before = len(wire.stalled)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        # Both streams stalled after their first chunk, and the client has read both chunks.
        deadline = time.monotonic() + 60
        while (len(wire.stalled) < before + 2 or wire.unread_by_clients()) and time.monotonic() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 130, stderr
    rows = pq.read_table(out).to_pylist()
    assert [r["error_type"] for r in rows] == ["cut_off", "cut_off"]
    assert all(r["completion_tokens"] == 1 for r in rows)


def _load_command(url: str, out: Path) -> subprocess.CompletedProcess[str]:
    argv = [sys.executable, "-m", "harness.cli", "load", "--url", url, "--concurrency", "2"]
    argv += ["--requests", "4", "--input-tokens", "8", "--output-tokens", "10", "--out", str(out)]
    argv += ["--timeout", "5"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False)


def test_load_command_exits_4_with_error_classes_when_no_request_succeeds(tmp_path: Path) -> None:
    """A closed port: every request fails, so ``specsweep load`` writes the rows, names the error
    classes on stderr and exits 4 (EXIT_NO_SUCCESS), so a script can tell a dead server from a run."""
    from harness.commands.load import EXIT_NO_SUCCESS

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    out = tmp_path / "load.parquet"
    proc = _load_command(f"http://127.0.0.1:{port}", out)
    assert proc.returncode == EXIT_NO_SUCCESS == 4, proc.stderr
    assert "no request succeeded (connect_error x4)" in proc.stderr
    assert "ok 0, errors 4" in proc.stdout
    assert [r["error_type"] for r in pq.read_table(out).to_pylist()] == ["connect_error"] * 4


def test_load_command_exits_0_with_counts_when_some_requests_fail(tmp_path: Path) -> None:
    """Partial failure is still a run: exit 0, and the summary counts the failures by class."""
    env = {
        "SPECSWEEP_SIM_FAULT": "http_500",
        "SPECSWEEP_SIM_FAULT_EVERY": "2",
        "SPECSWEEP_SIM_TIME_SCALE": "0.1",
    }
    out = tmp_path / "load.parquet"
    with start_sim(SIM_ARGS, env=env) as sim:
        proc = _load_command(sim.url, out)
    assert proc.returncode == 0, proc.stderr
    assert "ok 2, errors 2" in proc.stdout
    assert "http_error: 2" in proc.stdout
