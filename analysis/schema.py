"""The result tables' schemas: one place that says what every column is and in which unit.

The load generator writes ``RequestRecord`` rows, the node worker writes them per attempt, and the
analysis views read them; all three use the Arrow schemas below, so a column cannot mean two things.
Times are integer nanoseconds (``*_ns``) from ``time.perf_counter_ns`` on the load-generating host,
measured from the run's start; derived latencies are float milliseconds (``*_ms``). Unknown values are
null, never 0. ``docs/results.md`` documents every column.
"""

from __future__ import annotations

import dataclasses
import os
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
    cached_tokens: int | None = None  # prompt tokens the server's prefix cache served
    category: str | None = None  # the workload's content category of the request
    dataset: str | None = None  # the prompt set it came from
    turn: int | None = None  # 0-based turn of a replayed conversation
    in_window: bool = False  # sent inside its level's measurement window (warmup rows: false)
    window_tokens: int | None = None  # its output tokens that arrived inside that window


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
        pa.field("cached_tokens", pa.int32()),
        pa.field("category", pa.string()),
        pa.field("dataset", pa.string()),
        pa.field("turn", pa.int32()),
        pa.field("in_window", pa.bool_(), nullable=False),
        pa.field("window_tokens", pa.int32()),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "requests"},
)


# ---------------------------------------------------------------------------------------------------
# levels: one row per job x load level, summarised by the node worker (analysis.levels).
# ---------------------------------------------------------------------------------------------------

# Percentiles kept for every latency in the levels table: columns ``<latency>_p<N>_ms``.
LEVEL_PERCENTILES: tuple[int, ...] = (50, 90, 99)
# Width of the bins of ``accept_length_hist``: bin i counts requests with i*w <= accept length < (i+1)*w.
ACCEPT_LENGTH_BIN_WIDTH = 0.25


@dataclass(frozen=True, slots=True)
class LevelRecord:
    """One load level of one job: counts, rates, latency percentiles and acceptance.

    Warmup requests are excluded. Counts, latencies and acceptance are over the requests sent inside
    the level's measurement window (``window_start_s`` to ``window_end_s``, ramp-up and drain left
    out); output tokens are those that arrived inside it, and rates divide by its length
    ``duration_s``. Latency percentiles and per-user speed are over successful requests (``error_type`` null); ``itl_*_ms`` are over all inter-token gaps of successful requests.
    ``accept_length_*`` use the per-request accept length ``completion_tokens / spec_verify_ct``;
    ``accept_length_mean`` is the token-weighted mean ``sum(completion_tokens) / sum(spec_verify_ct)``.
    """

    sweep_id: str
    job_id: str
    load_level: str
    concurrency: int | None
    rate_rps: float | None
    duration_s: float
    gpus: int
    num_requests: int
    num_ok: int
    num_errors: int
    error_counts: tuple[tuple[str, int], ...]  # (error_type, count), most frequent first
    error_rate: float | None
    achieved_rate_rps: float | None
    output_tokens: int
    output_tok_s: float | None
    output_tok_s_per_gpu: float | None
    output_tok_s_per_user: float | None
    ttft_mean_ms: float | None
    ttft_p50_ms: float | None
    ttft_p90_ms: float | None
    ttft_p99_ms: float | None
    tpot_mean_ms: float | None
    tpot_p50_ms: float | None
    tpot_p90_ms: float | None
    tpot_p99_ms: float | None
    itl_mean_ms: float | None
    itl_p50_ms: float | None
    itl_p90_ms: float | None
    itl_p99_ms: float | None
    e2e_mean_ms: float | None
    e2e_p50_ms: float | None
    e2e_p90_ms: float | None
    e2e_p99_ms: float | None
    accept_length_mean: float | None
    accept_length_p10: float | None
    accept_length_p50: float | None
    accept_length_p90: float | None
    accept_length_hist: tuple[int, ...] | None
    correct_drafts_histogram: tuple[int, ...] | None
    server_accept_length: float | None
    client_delay_p50_us: float | None
    client_delay_p99_us: float | None
    run_index: int | None = None  # the level's position in its job's run order (0 first)
    cache_flushed: bool | None = None  # /flush_cache before the level succeeded; null when not asked
    stop_reason: str | None = None  # "precision" (a sequential level stopped early) or "limit"
    window_start_s: float | None = None  # the measurement window, seconds after the level's start
    window_end_s: float | None = None


def _latency_fields(name: str) -> list[pa.Field]:
    """``<name>_mean_ms`` and ``<name>_p<N>_ms`` for each of LEVEL_PERCENTILES."""
    return [pa.field(f"{name}_mean_ms", pa.float64())] + [
        pa.field(f"{name}_p{p}_ms", pa.float64()) for p in LEVEL_PERCENTILES
    ]


LEVELS_SCHEMA = pa.schema(
    [
        pa.field("sweep_id", pa.string(), nullable=False),
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("load_level", pa.string(), nullable=False),
        pa.field("concurrency", pa.int32()),
        pa.field("rate_rps", pa.float64()),
        pa.field("duration_s", pa.float64(), nullable=False),
        pa.field("gpus", pa.int32(), nullable=False),
        pa.field("num_requests", pa.int64(), nullable=False),
        pa.field("num_ok", pa.int64(), nullable=False),
        pa.field("num_errors", pa.int64(), nullable=False),
        pa.field(
            "error_counts",
            pa.list_(pa.struct([pa.field("error_type", pa.string()), pa.field("count", pa.int64())])),
            nullable=False,
        ),
        pa.field("error_rate", pa.float64()),
        pa.field("achieved_rate_rps", pa.float64()),
        pa.field("output_tokens", pa.int64(), nullable=False),
        pa.field("output_tok_s", pa.float64()),
        pa.field("output_tok_s_per_gpu", pa.float64()),
        pa.field("output_tok_s_per_user", pa.float64()),
        *_latency_fields("ttft"),
        *_latency_fields("tpot"),
        *_latency_fields("itl"),
        *_latency_fields("e2e"),
        pa.field("accept_length_mean", pa.float64()),
        pa.field("accept_length_p10", pa.float64()),
        pa.field("accept_length_p50", pa.float64()),
        pa.field("accept_length_p90", pa.float64()),
        pa.field("accept_length_hist", pa.list_(pa.int64())),
        pa.field("correct_drafts_histogram", pa.list_(pa.int64())),
        pa.field("server_accept_length", pa.float64()),
        pa.field("client_delay_p50_us", pa.float64()),
        pa.field("client_delay_p99_us", pa.float64()),
        pa.field("run_index", pa.int32()),
        pa.field("cache_flushed", pa.bool_()),
        pa.field("stop_reason", pa.string()),
        pa.field("window_start_s", pa.float64()),
        pa.field("window_end_s", pa.float64()),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "levels"},
)

# Numeric levels columns: what a capacity search's SLO clauses may limit.
LEVEL_SLO_COLUMNS: tuple[str, ...] = tuple(
    f.name
    for f in LEVELS_SCHEMA
    if (pa.types.is_floating(f.type) or pa.types.is_integer(f.type)) and f.name not in ("run_index", "gpus")
)

# ---------------------------------------------------------------------------------------------------
# capacity: one row per probe of a capacity search (load.capacity): the probe's levels row (its requests
# are not kept in ``requests``) and what the search made of it.
# ---------------------------------------------------------------------------------------------------

CAPACITY_PROBE_FIELDS: list[pa.Field] = [
    pa.field("capacity_kind", pa.string(), nullable=False),  # rate or concurrency
    pa.field("capacity_slo", pa.string(), nullable=False),  # the clauses every probe was judged by
    pa.field("probe_index", pa.int32(), nullable=False),  # 0 = first probe
    pa.field("probe_load", pa.float64(), nullable=False),  # the rate (requests/s) or concurrency probed
    pa.field("passed", pa.bool_(), nullable=False),
    pa.field("margin", pa.float64()),  # smallest relative slack of the clauses (< 0: failed); null: no value
]
CAPACITY_SCHEMA = pa.schema(
    [*LEVELS_SCHEMA, *CAPACITY_PROBE_FIELDS],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "capacity"},
)

# ---------------------------------------------------------------------------------------------------
# jobs: one row per job in its final state (done or failed). A job is committed iff its row exists.
# ---------------------------------------------------------------------------------------------------

JOB_STATUSES: tuple[str, ...] = ("done", "failed")


@dataclass(frozen=True, slots=True)
class JobRecord:
    """One job: what was asked, what SGLang actually ran, how it went.

    ``requested_*`` come from the plan; ``effective_*`` from the server's ``/server_info`` after
    launch (null when the server never came up). The no-speculation baseline has a null
    ``effective_speculative_algorithm``. ``sglang_argv`` is the exact argv the launcher ran and
    ``launch_command`` the same as one copy-pasteable shell line.
    """

    sweep_id: str
    job_id: str
    status: str  # one of JOB_STATUSES
    attempts: int
    error_class: str | None
    error_message: str | None
    config_label: str  # "baseline", "chain d=4", "tree s=3 k=4 n=8", ...
    role: str  # "sweep" (a grid point), "confirmation" (the adaptive schedule built from the sweep)
    repeat_index: int
    gpus: int
    model_path: str | None
    draft_model_path: str | None
    requested_speculative_algorithm: str | None
    requested_speculative_num_steps: int | None
    requested_speculative_eagle_topk: int | None
    requested_speculative_num_draft_tokens: int | None
    requested_max_running_requests: int | None
    effective_speculative_algorithm: str | None
    effective_speculative_num_steps: int | None
    effective_speculative_eagle_topk: int | None
    effective_speculative_num_draft_tokens: int | None
    effective_max_running_requests: int | None
    requested_points: tuple[str, ...]
    sglang_argv: tuple[str, ...] | None
    launch_command: str | None
    server_info_json: str | None
    node_host: str | None
    started_unix_ns: int | None
    finished_unix_ns: int | None
    startup_s: float | None
    server_metrics_off: str | None  # why no server_metrics rows were sampled; null when they were
    gpu_metrics_off: str | None  # why no gpu_metrics rows were sampled; null when they were
    # JSON object: input kind (prompts, drafter, target, engine) -> content digest the attempt ran with
    input_digests: str | None = None
    # JSON object: server-axis name -> value, in the spec's axis order; null for a sweep without axes
    axes: str | None = None
    # Why the launch is lossy before it ran (an accept threshold below 1.0); null when it is not
    lossy_by_design: str | None = None


JOBS_SCHEMA = pa.schema(
    [
        pa.field("sweep_id", pa.string(), nullable=False),
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("status", pa.string(), nullable=False),
        pa.field("attempts", pa.int32(), nullable=False),
        pa.field("error_class", pa.string()),
        pa.field("error_message", pa.string()),
        pa.field("config_label", pa.string(), nullable=False),
        pa.field("role", pa.string(), nullable=False),
        pa.field("repeat_index", pa.int32(), nullable=False),
        pa.field("gpus", pa.int32(), nullable=False),
        pa.field("model_path", pa.string()),
        pa.field("draft_model_path", pa.string()),
        pa.field("requested_speculative_algorithm", pa.string()),
        pa.field("requested_speculative_num_steps", pa.int32()),
        pa.field("requested_speculative_eagle_topk", pa.int32()),
        pa.field("requested_speculative_num_draft_tokens", pa.int32()),
        pa.field("requested_max_running_requests", pa.int32()),
        pa.field("effective_speculative_algorithm", pa.string()),
        pa.field("effective_speculative_num_steps", pa.int32()),
        pa.field("effective_speculative_eagle_topk", pa.int32()),
        pa.field("effective_speculative_num_draft_tokens", pa.int32()),
        pa.field("effective_max_running_requests", pa.int32()),
        pa.field("requested_points", pa.list_(pa.string()), nullable=False),
        pa.field("sglang_argv", pa.list_(pa.string())),
        pa.field("launch_command", pa.string()),
        pa.field("server_info_json", pa.string()),
        pa.field("node_host", pa.string()),
        pa.field("started_unix_ns", pa.int64()),
        pa.field("finished_unix_ns", pa.int64()),
        pa.field("startup_s", pa.float64()),
        pa.field("server_metrics_off", pa.string()),
        pa.field("gpu_metrics_off", pa.string()),
        pa.field("input_digests", pa.string()),
        pa.field("axes", pa.string()),
        pa.field("lossy_by_design", pa.string()),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "jobs"},
)

# ---------------------------------------------------------------------------------------------------
# lossless: with `lossless_check: true`, one row per job x send mode x check prompt: the token ids the
# server generated at temperature 0 (docs/results.md, the lossless check).
# ---------------------------------------------------------------------------------------------------

LOSSLESS_MODES: tuple[str, ...] = ("serial", "batched")  # one prompt at a time; every prompt at once


@dataclass(frozen=True, slots=True)
class LosslessRecord:
    """One check prompt's greedy output on one server. ``mode`` says how the prompts were sent (the two
    batch sizes the noise floor compares); a failed request has null ``output_ids`` and its ``error``."""

    sweep_id: str
    job_id: str
    mode: str  # one of LOSSLESS_MODES
    prompt_index: int
    output_ids: tuple[int, ...] | None
    error: str | None


LOSSLESS_SCHEMA = pa.schema(
    [
        pa.field("sweep_id", pa.string(), nullable=False),
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("mode", pa.string(), nullable=False),
        pa.field("prompt_index", pa.int32(), nullable=False),
        pa.field("output_ids", pa.list_(pa.int64())),
        pa.field("error", pa.string()),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "lossless"},
)

# ---------------------------------------------------------------------------------------------------
# server_metrics, gpu_metrics: time series sampled while each level ran.
# ---------------------------------------------------------------------------------------------------

TELEMETRY_TABLES: tuple[str, ...] = ("server_metrics", "gpu_metrics")
# gpu_metrics readings the report plots (every reading is listed in docs/results.md).
GPU_POWER_W = "power_w"
GPU_SM_CLOCK_MHZ = "sm_clock_mhz"


@dataclass(frozen=True, slots=True)
class TelemetryRecord:
    """One sampled value: a Prometheus sample of the server's ``/metrics`` or one NVML reading.

    ``time_s`` is on the requests' clock: seconds from the level's measured start (negative while the
    load generator calibrated, warmed up and flushed the cache before it). ``labels`` is a JSON object
    with sorted keys (``{}`` when none), e.g. ``{"gpu": "0"}`` or ``{"is_streaming": "true", ...}``.
    """

    sweep_id: str
    job_id: str
    load_level: str
    time_s: float
    time_unix_ns: int
    metric: str  # the sample name: sglang:num_running_reqs, sglang:spec_verify_calls_total, power_w, ...
    kind: str  # gauge, counter, histogram, summary or unknown (the family's Prometheus type)
    labels: str
    value: float


TELEMETRY_SCHEMA = pa.schema(
    [
        pa.field("sweep_id", pa.string(), nullable=False),
        pa.field("job_id", pa.string(), nullable=False),
        pa.field("load_level", pa.string(), nullable=False),
        pa.field("time_s", pa.float64(), nullable=False),
        pa.field("time_unix_ns", pa.int64(), nullable=False),
        pa.field("metric", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("labels", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "telemetry"},
)

# ---------------------------------------------------------------------------------------------------
# sweep: one row per sweep.
# ---------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class SweepRecord:
    """A sweep as run: its spec text, software versions, host, and the client's own added delay.

    ``client_delay_*_us`` is the load generator's calibration: the delay it adds between a chunk
    leaving the (simulated) server and its arrival stamp, measured on the loopback before the sweep.
    """

    sweep_id: str
    spec_text: str  # the spec as run (YAML)
    specsweep_version: str
    sglang_version: str | None
    ray_version: str | None
    host: str
    client_delay_p50_us: float | None
    client_delay_p99_us: float | None
    created_unix_ns: int
    # JSON object: input kind -> content digest of the sweep's current inputs (as the driver saw them)
    input_digests: str | None = None


SWEEP_SCHEMA = pa.schema(
    [
        pa.field("sweep_id", pa.string(), nullable=False),
        pa.field("spec_text", pa.string(), nullable=False),
        pa.field("specsweep_version", pa.string(), nullable=False),
        pa.field("sglang_version", pa.string()),
        pa.field("ray_version", pa.string()),
        pa.field("host", pa.string(), nullable=False),
        pa.field("client_delay_p50_us", pa.float64()),
        pa.field("client_delay_p99_us", pa.float64()),
        pa.field("created_unix_ns", pa.int64(), nullable=False),
        pa.field("input_digests", pa.string()),
    ],
    metadata={"specsweep.schema_version": str(SCHEMA_VERSION), "specsweep.table": "sweep"},
)

# ---------------------------------------------------------------------------------------------------
# Records <-> tables, and the one way result files are written.
# ---------------------------------------------------------------------------------------------------

# Each record type and the schema it mirrors (same columns, same order).
RECORD_SCHEMAS: dict[type, pa.Schema] = {
    RequestRecord: REQUESTS_SCHEMA,
    LevelRecord: LEVELS_SCHEMA,
    JobRecord: JOBS_SCHEMA,
    SweepRecord: SWEEP_SCHEMA,
    TelemetryRecord: TELEMETRY_SCHEMA,
    LosslessRecord: LOSSLESS_SCHEMA,
}

for _record_type, _schema in RECORD_SCHEMAS.items():  # guards edits to this file
    if tuple(f.name for f in dataclasses.fields(_record_type)) != tuple(_schema.names):
        raise RuntimeError(f"{_record_type.__name__} and its schema disagree on columns or their order")


def _column(values: list[Any], field: pa.Field) -> list[Any]:
    """Python values for one column; tuples of pairs become structs for ``list<struct>`` columns."""
    if pa.types.is_list(field.type) and pa.types.is_struct(field.type.value_type):
        keys = [f.name for f in field.type.value_type]
        return [None if v is None else [dict(zip(keys, pair, strict=True)) for pair in v] for v in values]
    return values


def records_table(records: list[Any], schema: pa.Schema) -> pa.Table:
    """Arrow table of records of one type, column by column (no per-row dicts)."""
    columns = {f.name: _column([getattr(r, f.name) for r in records], f) for f in schema}
    return pa.Table.from_pydict(columns, schema=schema)


def requests_table(records: list[RequestRecord]) -> pa.Table:
    """Arrow table of request records."""
    return records_table(records, REQUESTS_SCHEMA)


def levels_table(records: list[LevelRecord]) -> pa.Table:
    """Arrow table of level records."""
    return records_table(records, LEVELS_SCHEMA)


@dataclass(frozen=True, slots=True)
class CapacityProbeRecord:
    """One probe of a capacity search: its level summary and what the search made of it."""

    level: LevelRecord
    capacity_kind: str
    capacity_slo: str
    probe_index: int
    probe_load: float
    passed: bool
    margin: float | None


def capacity_table(records: list[CapacityProbeRecord]) -> pa.Table:
    """Arrow table of capacity probes: each probe's levels columns, then the probe's own."""
    levels = levels_table([r.level for r in records])
    for field in CAPACITY_PROBE_FIELDS:
        levels = levels.append_column(field, pa.array([getattr(r, field.name) for r in records], field.type))
    return levels.replace_schema_metadata(CAPACITY_SCHEMA.metadata)


def jobs_table(records: list[JobRecord]) -> pa.Table:
    """Arrow table of job records."""
    return records_table(records, JOBS_SCHEMA)


def lossless_table(records: list[LosslessRecord]) -> pa.Table:
    """Arrow table of the lossless check's outputs."""
    return records_table(records, LOSSLESS_SCHEMA)


def telemetry_table(records: list[TelemetryRecord]) -> pa.Table:
    """Arrow table of telemetry samples (server_metrics and gpu_metrics share the schema)."""
    return records_table(records, TELEMETRY_SCHEMA)


def sweep_table(records: list[SweepRecord]) -> pa.Table:
    """Arrow table of sweep records."""
    return records_table(records, SWEEP_SCHEMA)


def write_parquet_atomic(table: pa.Table, path: str | os.PathLike[str]) -> Path:
    """Write ``table`` to ``path`` so readers see the old file or the whole new one, never a part.

    Writes to a unique temporary name in the same directory (same filesystem, so the rename is
    atomic), flushes it to disk, then ``os.replace``s it over ``path``. Parent directories are created.
    """
    import pyarrow.parquet as pq

    target = Path(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex}.tmp")
    try:
        pq.write_table(table, tmp, compression="zstd")
        with open(tmp, "rb+") as handle:
            os.fsync(handle.fileno())
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target
