"""The result tables' schemas: one place that says what every column is and in which unit.

The load generator writes ``RequestRecord`` rows, the node worker writes them per attempt, and the
analysis views read them; all three use the Arrow schemas below, so a column cannot mean two things.
Times are integer nanoseconds (``*_ns``) from ``time.perf_counter_ns`` on the load-generating host,
measured from the run's start; derived latencies are float milliseconds (``*_ms``). Unknown values are
null, never 0. ``docs/results.md`` documents every column.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import pyarrow as pa

SCHEMA_VERSION = 1

# ---------------------------------------------------------------------------------------------------
# requests: one row per request, as the load generator measured it.
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One request as the client saw it. Failed, timed-out and cut-off requests are rows too.

    ``scheduled_ns`` is when the load plan wanted the request sent (open loop; equal to ``start_ns``
    in closed loop), ``start_ns`` when it was actually sent. ``chunk_arrival_ns`` are the arrival
    times of streamed chunks that carried tokens (relative to ``start_ns``); ``chunk_tokens`` the
    tokens each carried (delta of ``completion_tokens``). ``server_chunk_ns`` are the simulated
    server's send stamps (same clock on one host; null against a real SGLang server).
    """

    request_id: str
    load_level: str  # e.g. "concurrency=64" or "rate=12.5"
    concurrency: int | None
    rate_rps: float | None
    endpoint: str  # "/generate", "/v1/chat/completions", ...
    warmup: bool
    scheduled_ns: int
    start_ns: int
    end_ns: int | None
    ttft_ms: float | None
    e2e_ms: float | None
    tpot_ms: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    chunk_arrival_ns: list[int] | None
    chunk_tokens: list[int] | None
    server_chunk_ns: list[int] | None
    itl_per_token_ms: list[float] | None
    itl_per_step_ms: list[float] | None
    finish_reason: str | None
    spec_verify_ct: int | None
    spec_accept_length: float | None
    spec_accept_rate: float | None
    spec_num_correct_drafts: int | None
    spec_num_proposed_drafts: int | None
    spec_correct_drafts_histogram: list[int] | None
    http_status: int | None
    error_type: str | None  # null for a successful request
    error_message: str | None


REQUESTS_SCHEMA = pa.schema(
    [
        pa.field("request_id", pa.string(), nullable=False),
        pa.field("load_level", pa.string(), nullable=False),
        pa.field("concurrency", pa.int32()),
        pa.field("rate_rps", pa.float64()),
        pa.field("endpoint", pa.string(), nullable=False),
        pa.field("warmup", pa.bool_(), nullable=False),
        pa.field("scheduled_ns", pa.int64(), nullable=False),
        pa.field("start_ns", pa.int64(), nullable=False),
        pa.field("end_ns", pa.int64()),
        pa.field("ttft_ms", pa.float64()),
        pa.field("e2e_ms", pa.float64()),
        pa.field("tpot_ms", pa.float64()),
        pa.field("prompt_tokens", pa.int32()),
        pa.field("completion_tokens", pa.int32()),
        pa.field("chunk_arrival_ns", pa.list_(pa.int64())),
        pa.field("chunk_tokens", pa.list_(pa.int32())),
        pa.field("server_chunk_ns", pa.list_(pa.int64())),
        pa.field("itl_per_token_ms", pa.list_(pa.float64())),
        pa.field("itl_per_step_ms", pa.list_(pa.float64())),
        pa.field("finish_reason", pa.string()),
        pa.field("spec_verify_ct", pa.int32()),
        pa.field("spec_accept_length", pa.float64()),
        pa.field("spec_accept_rate", pa.float64()),
        pa.field("spec_num_correct_drafts", pa.int64()),
        pa.field("spec_num_proposed_drafts", pa.int64()),
        pa.field("spec_correct_drafts_histogram", pa.list_(pa.int64())),
        pa.field("http_status", pa.int32()),
        pa.field("error_type", pa.string()),
        pa.field("error_message", pa.string()),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "requests"},
)

_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(RequestRecord))
if _REQUEST_FIELDS != tuple(REQUESTS_SCHEMA.names):  # pragma: no cover - guards edits to this file
    raise RuntimeError("RequestRecord and REQUESTS_SCHEMA disagree on columns or their order")


def requests_table(records: list[RequestRecord]) -> pa.Table:
    """Arrow table of request records, column by column (no per-row dicts)."""
    columns = {name: [getattr(r, name) for r in records] for name in _REQUEST_FIELDS}
    return pa.Table.from_pydict(columns, schema=REQUESTS_SCHEMA)
