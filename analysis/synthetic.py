"""Synthetic sweep results whose truth is known, written in the exact on-disk layout a sweep writes.

Tests and the analysis benchmark use it to check that ``best`` picks the config the model says is
best and that its intervals cover the true speedup. The model, per config and concurrency ``c``:

- true TPOT = ``base_tpot_ms * (1 + c / 64) * cost / accept_length`` where a speculative verify
  step costs ``step_cost * (1 + c / 32)`` plain decode steps (drafting gets dearer under load);
- each level is a closed loop of ``c`` streams, so its ``duration_s`` is ``sum(e2e) / c`` (each
  stream busy back to back) and, by Little's law, the true output tokens/s is
  ``c * (1 - error_rate) * E[tokens] / E[e2e]`` with ``E[e2e] = true TTFT + true TPOT * (E[tokens] - 1)``;
- per request: tokens ~ uniform integers, TPOT and TTFT lognormal around their truths, accept length
  lognormal around the config's, correct-drafts histogram multinomial from a chain whose positions
  accept with probability a^k.

List columns have realistic lengths (one entry per chunk, per token gap, per draft position) but
their values are slices of a shared pool, so generating ten million rows stays fast.
"""

from __future__ import annotations

import json
import math
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa

from analysis.layout import job_part_path, sweep_part_path
from analysis.levels import summarize_level
from analysis.schema import (
    REQUESTS_SCHEMA,
    JobRecord,
    SweepRecord,
    jobs_table,
    levels_table,
    sweep_table,
    write_parquet_atomic,
)

TPOT_SIGMA = 0.15
TTFT_SIGMA = 0.3
ACCEPT_SIGMA = 0.1
WARMUP_FRACTION = 0.02
POOL_SIZE = 1 << 16


@dataclass(frozen=True)
class SyntheticConfig:
    """One configuration of the synthetic sweep; ``algorithm`` None is the no-speculation baseline."""

    label: str
    algorithm: str | None = None
    num_steps: int | None = None
    eagle_topk: int | None = None
    num_draft_tokens: int | None = None
    accept_length: float = 1.0
    step_cost: float = 1.0
    error_rate: float = 0.0
    repeats: int = 1
    # Per launch (repeat r uses entry r mod len), a factor on every TPOT: launch-to-launch variance such
    # as a different placement or clock; empty = every launch alike.
    launch_tpot_factors: tuple[float, ...] = ()
    gpus: int = 8
    fails: bool = False  # the job failed: a jobs row with status "failed" and no requests
    lossy_by_design: str | None = None  # jobs.lossy_by_design: why the launch is lossy before it ran


@dataclass(frozen=True)
class SyntheticSweep:
    """A whole synthetic sweep: configs x concurrency levels x requests."""

    configs: tuple[SyntheticConfig, ...]
    concurrencies: tuple[int, ...] = (1, 8, 64)
    requests_per_level: int = 400
    output_tokens: tuple[int, int] = (32, 256)  # uniform integers, inclusive
    base_tpot_ms: float = 10.0
    base_ttft_ms: float = 50.0
    sweep_id: str = "synthetic"
    seed: int = 0
    model_path: str = "meta-llama/Llama-3.1-8B-Instruct"
    draft_model_path: str = "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B"
    server_versions: dict[str, str] = field(default_factory=lambda: {"sglang": "0.5.23", "ray": "2.60.0"})

    def config(self, label: str) -> SyntheticConfig:
        """The config called ``label``."""
        return next(c for c in self.configs if c.label == label)

    def true_tpot_ms(self, cfg: SyntheticConfig, concurrency: int) -> float:
        """Mean TPOT of the model (the lognormal's mean)."""
        cost = 1.0 if cfg.algorithm is None else cfg.step_cost * (1 + concurrency / 32)
        return self.base_tpot_ms * (1 + concurrency / 64) * cost / cfg.accept_length

    def true_ttft_ms(self, concurrency: int) -> float:
        """Mean TTFT of the model."""
        return self.base_ttft_ms * (1 + concurrency / 16)

    def true_output_tok_s_per_gpu(self, cfg: SyntheticConfig, concurrency: int) -> float:
        """Expected measured output tokens/s per GPU (Little's law over the closed loop)."""
        mean_tokens = sum(self.output_tokens) / 2
        mean_e2e_ms = self.true_ttft_ms(concurrency) + self.true_tpot_ms(cfg, concurrency) * (mean_tokens - 1)
        ok_tokens = (1 - cfg.error_rate) * mean_tokens
        return concurrency * 1000.0 * ok_tokens / mean_e2e_ms / cfg.gpus

    def true_tpot_quantile_ms(self, cfg: SyntheticConfig, concurrency: int, q: float) -> float:
        """The q-quantile of per-request TPOT under the model."""
        z = _normal_ppf(q)
        mean = self.true_tpot_ms(cfg, concurrency)
        return mean * math.exp(TPOT_SIGMA * z - TPOT_SIGMA**2 / 2)

    def true_speedup(self, label: str, concurrency: int, baseline: str = "baseline") -> float:
        """True output tok/s per GPU of ``label`` over the baseline's at one concurrency."""
        return self.true_output_tok_s_per_gpu(
            self.config(label), concurrency
        ) / self.true_output_tok_s_per_gpu(self.config(baseline), concurrency)


def _normal_ppf(q: float) -> float:
    """Inverse standard normal CDF (bisection on erf; exact enough for a test oracle)."""
    lo, hi = -10.0, 10.0
    for _ in range(100):
        mid = (lo + hi) / 2
        if 0.5 * (1 + math.erf(mid / math.sqrt(2))) < q:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


def _chain_acceptance(accept_length: float, positions: int) -> float:
    """Per-position acceptance a with sum_{k=1..positions} a^k = accept_length - 1."""
    target = min(accept_length - 1, positions - 1e-9)
    lo, hi = 0.0, 1.0
    for _ in range(60):
        a = (lo + hi) / 2
        if sum(a**k for k in range(1, positions + 1)) < target:
            lo = a
        else:
            hi = a
    return (lo + hi) / 2


def job_id_of(sweep: SyntheticSweep, cfg: SyntheticConfig, repeat: int) -> str:
    """Deterministic job id, like the planner's config hash."""
    import hashlib

    key = f"{sweep.sweep_id}|{cfg.label}|{repeat}"
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def sglang_argv(sweep: SyntheticSweep, cfg: SyntheticConfig) -> tuple[str, ...]:
    """A plausible SGLang launch argv for a config."""
    argv = ["python", "-m", "sglang.launch_server", "--model-path", sweep.model_path]
    argv += ["--tp-size", str(cfg.gpus), "--host", "127.0.0.1", "--port", "30000"]
    if cfg.algorithm is not None:
        argv += ["--speculative-algorithm", cfg.algorithm]
        argv += ["--speculative-draft-model-path", sweep.draft_model_path]
        argv += ["--speculative-num-steps", str(cfg.num_steps)]
        argv += ["--speculative-eagle-topk", str(cfg.eagle_topk)]
        argv += ["--speculative-num-draft-tokens", str(cfg.num_draft_tokens)]
    return tuple(argv)


def _pool_lists(rng: np.random.Generator, lengths: np.ndarray, pool: np.ndarray) -> pa.Array:
    """Lists of the given lengths, each a copy of a slice of ``pool`` at a random offset."""
    lengths = np.clip(lengths, 0, len(pool)).astype(np.int64)
    starts = rng.integers(0, len(pool) - lengths + 1)
    offsets = np.zeros(len(lengths) + 1, np.int64)
    np.cumsum(lengths, out=offsets[1:])
    gather = np.repeat(starts - offsets[:-1], lengths) + np.arange(offsets[-1])
    return pa.ListArray.from_arrays(pa.array(offsets.astype(np.int32)), pa.array(pool[gather]))


class _Pools:
    """Shared value pools for the list columns."""

    def __init__(self, rng: np.random.Generator) -> None:
        gaps_ns = rng.lognormal(math.log(20e6), 0.3, POOL_SIZE).astype(np.int64)
        self.arrival_ns = np.cumsum(gaps_ns)
        self.chunk_tokens = rng.integers(1, 5, POOL_SIZE).astype(np.int32)
        self.itl_ms = rng.lognormal(math.log(10.0), 0.3, POOL_SIZE)


def _level_requests(
    sweep: SyntheticSweep,
    cfg: SyntheticConfig,
    concurrency: int,
    rng: np.random.Generator,
    pools: _Pools,
    t0_ns: int,
    launch_factor: float = 1.0,
) -> tuple[pa.Table, float]:
    """One level's request rows (warmup rows included) and its measured duration in seconds."""
    n_measured = sweep.requests_per_level
    n_warm = max(1, int(n_measured * WARMUP_FRACTION))
    n = n_measured + n_warm
    lo, hi = sweep.output_tokens
    tokens = rng.integers(lo, hi + 1, n).astype(np.int32)
    failed = rng.random(n) < cfg.error_rate
    tpot_mean = sweep.true_tpot_ms(cfg, concurrency) * launch_factor
    tpot = tpot_mean * rng.lognormal(-(TPOT_SIGMA**2) / 2, TPOT_SIGMA, n)
    ttft = sweep.true_ttft_ms(concurrency) * rng.lognormal(-(TTFT_SIGMA**2) / 2, TTFT_SIGMA, n)
    e2e = ttft + tpot * (tokens - 1)
    duration_s = float(e2e[n_warm:].sum()) / 1000.0 / concurrency  # closed loop: streams busy back to back
    start = t0_ns + np.sort(rng.integers(0, int(duration_s * 1e9), n)).astype(np.int64)
    end = start + (e2e * 1e6).astype(np.int64)
    speculative = cfg.algorithm is not None
    if speculative:
        draft = int(cfg.num_draft_tokens or 2) - 1
        req_accept = np.clip(cfg.accept_length * rng.lognormal(0, ACCEPT_SIGMA, n), 1.0, draft + 1)
        verify_ct = np.maximum(1, np.ceil(tokens / req_accept)).astype(np.int64)
        a = _chain_acceptance(cfg.accept_length, draft)
        probs = [a**k - a ** (k + 1) for k in range(draft)] + [a**draft]
        histogram = rng.multinomial(verify_ct, probs).astype(np.int64)
        chunks = verify_ct
    else:
        chunks = tokens.astype(np.int64)
    ok = ~failed
    level = f"concurrency={concurrency}"

    def ok_only(values: np.ndarray, arrow_type: pa.DataType) -> pa.Array:
        return pa.array(values, arrow_type, mask=failed)

    def spec_only(values: np.ndarray | None, arrow_type: pa.DataType) -> pa.Array:
        if not speculative or values is None:
            return pa.nulls(n, arrow_type)
        return pa.array(values, arrow_type, mask=failed)

    hist_array = pa.nulls(n, pa.list_(pa.int64()))
    if speculative:
        flat = pa.array(histogram.reshape(-1), pa.int64())
        offsets = pa.array(np.arange(0, (n + 1) * (draft + 1), draft + 1, dtype=np.int32))
        hist_array = pa.ListArray.from_arrays(offsets, flat, mask=pa.array(failed))
    columns = {
        "request_id": pa.array([f"{level}-{i}" for i in range(n)], pa.string()),
        "load_level": pa.array([level] * n, pa.string()),
        "concurrency": pa.array(np.full(n, concurrency, np.int32)),
        "rate_rps": pa.nulls(n, pa.float64()),
        "endpoint": pa.array(["/generate"] * n, pa.string()),
        "warmup": pa.array(np.arange(n) < n_warm),
        "scheduled_ns": pa.array(start),
        "start_ns": pa.array(start),
        "end_ns": pa.array(end),
        "ttft_ms": ok_only(ttft, pa.float64()),
        "e2e_ms": ok_only(e2e, pa.float64()),
        "tpot_ms": ok_only(tpot, pa.float64()),
        "prompt_tokens": pa.array(rng.integers(64, 1024, n).astype(np.int32)),
        "completion_tokens": ok_only(tokens, pa.int32()),
        "chunk_arrival_ns": _pool_lists(rng, chunks, pools.arrival_ns),
        "chunk_tokens": _pool_lists(rng, chunks, pools.chunk_tokens),
        "server_chunk_ns": pa.nulls(n, pa.list_(pa.int64())),
        "itl_per_token_ms": _pool_lists(rng, tokens.astype(np.int64) - 1, pools.itl_ms),
        "itl_per_step_ms": _pool_lists(rng, chunks - 1, pools.itl_ms),
        "finish_reason": ok_only(np.array(["length"] * n), pa.string()),
        "spec_verify_ct": spec_only(verify_ct if speculative else None, pa.int32()),
        "spec_accept_length": spec_only(tokens / verify_ct if speculative else None, pa.float64()),
        "spec_accept_rate": spec_only(
            (tokens - verify_ct) / (verify_ct * draft) if speculative else None, pa.float64()
        ),
        "spec_num_correct_drafts": spec_only(tokens - verify_ct if speculative else None, pa.int64()),
        "spec_num_proposed_drafts": spec_only(verify_ct * draft if speculative else None, pa.int64()),
        "spec_correct_drafts_histogram": hist_array,
        "http_status": pa.array(np.where(ok, 200, 500).astype(np.int32)),
        "error_type": pa.array([None if good else "http_500" for good in ok], pa.string()),
        "error_message": pa.array([None if good else "Internal Server Error" for good in ok], pa.string()),
        "cached_tokens": pa.array(np.zeros(n, np.int32)),
        "category": pa.array(["random_ids"] * n, pa.string()),
        "dataset": pa.nulls(n, pa.string()),
        "turn": pa.nulls(n, pa.int32()),
        "in_window": pa.array(np.arange(n) >= n_warm),  # steady from the start: the window is the level
        "window_tokens": ok_only(tokens, pa.int32()),
    }
    return pa.Table.from_pydict(columns, schema=REQUESTS_SCHEMA), duration_s


def _job_record(
    sweep: SyntheticSweep, cfg: SyntheticConfig, repeat: int, job_id: str, now_ns: int
) -> JobRecord:
    argv = sglang_argv(sweep, cfg)
    spec = cfg.algorithm is not None
    failed = cfg.fails
    return JobRecord(
        sweep_id=sweep.sweep_id,
        job_id=job_id,
        status="failed" if failed else "done",
        attempts=3 if failed else 1,
        error_class="ServerStartupError" if failed else None,
        error_message="server exited with code 1 during startup (CUDA out of memory)" if failed else None,
        config_label=cfg.label,
        role="sweep",
        repeat_index=repeat,
        gpus=cfg.gpus,
        model_path=sweep.model_path,
        draft_model_path=sweep.draft_model_path if spec else None,
        requested_speculative_algorithm=cfg.algorithm,
        requested_speculative_num_steps=cfg.num_steps,
        requested_speculative_eagle_topk=cfg.eagle_topk,
        requested_speculative_num_draft_tokens=cfg.num_draft_tokens,
        requested_max_running_requests=None,
        effective_speculative_algorithm=None if failed else cfg.algorithm,
        effective_speculative_num_steps=None if failed else cfg.num_steps,
        effective_speculative_eagle_topk=None if failed else cfg.eagle_topk,
        effective_speculative_num_draft_tokens=None if failed else cfg.num_draft_tokens,
        effective_max_running_requests=None if failed else 256,
        requested_points=tuple(f"{cfg.label} @ concurrency={c}" for c in sweep.concurrencies),
        sglang_argv=argv,
        launch_command=shlex.join(argv),
        server_info_json=None if failed else '{"version": "0.5.23"}',
        node_host="node-0",
        started_unix_ns=now_ns,
        finished_unix_ns=now_ns + 60_000_000_000,
        startup_s=None if failed else 42.0,
        server_metrics_off=None if failed else "synthetic results: nothing was sampled",
        gpu_metrics_off=None if failed else "synthetic results: nothing was sampled",
        lossy_by_design=cfg.lossy_by_design,
    )


def write_sweep(
    out: Path,
    sweep: SyntheticSweep,
    *,
    spec_text: str = "synthetic: true\n",
    input_digests: dict[str, str] | None = None,
) -> None:
    """Write every committed file of ``sweep`` under ``out`` (sweep row, then each job, jobs last);
    ``input_digests``: the sweep row's (none by default)."""
    rng = np.random.default_rng(sweep.seed)
    pools = _Pools(rng)
    now_ns = time.time_ns()
    for cfg in sweep.configs:
        for repeat in range(cfg.repeats):
            job_id = job_id_of(sweep, cfg, repeat)
            if not cfg.fails:
                factors = cfg.launch_tpot_factors or (1.0,)
                _write_job_results(out, sweep, cfg, job_id, rng, pools, factors[repeat % len(factors)])
            record = _job_record(sweep, cfg, repeat, job_id, now_ns)
            write_parquet_atomic(jobs_table([record]), job_part_path(out, "jobs", sweep.sweep_id, job_id))
    sweep_row = SweepRecord(
        sweep_id=sweep.sweep_id,
        spec_text=spec_text,
        specsweep_version="0.1.0",
        sglang_version=sweep.server_versions.get("sglang"),
        ray_version=sweep.server_versions.get("ray"),
        host="synthetic-host",
        client_delay_p50_us=45.0,
        client_delay_p99_us=180.0,
        created_unix_ns=now_ns,
        input_digests=json.dumps(input_digests) if input_digests is not None else None,
    )
    write_parquet_atomic(sweep_table([sweep_row]), sweep_part_path(out, sweep.sweep_id))


def _write_job_results(
    out: Path,
    sweep: SyntheticSweep,
    cfg: SyntheticConfig,
    job_id: str,
    rng: np.random.Generator,
    pools: _Pools,
    launch_factor: float,
) -> None:
    tables, levels = [], []
    t0_ns = 0
    for concurrency in sweep.concurrencies:
        table, duration_s = _level_requests(sweep, cfg, concurrency, rng, pools, t0_ns, launch_factor)
        window_start_s = t0_ns / 1e9
        t0_ns += int(duration_s * 1e9) + 1_000_000_000
        tables.append(table)
        levels.append(
            summarize_level(
                table,
                sweep_id=sweep.sweep_id,
                job_id=job_id,
                load_level=f"concurrency={concurrency}",
                window_start_s=window_start_s,
                window_end_s=window_start_s + duration_s,
                gpus=cfg.gpus,
                server_accept_length=cfg.accept_length if cfg.algorithm else None,
            )
        )
    requests = pa.concat_tables(tables)
    write_parquet_atomic(requests, job_part_path(out, "requests", sweep.sweep_id, job_id))
    write_parquet_atomic(levels_table(levels), job_part_path(out, "levels", sweep.sweep_id, job_id))


def standard_sweep(**overrides: object) -> SyntheticSweep:
    """A small sweep with a clear winner per level: used by tests and the report's demo."""
    configs = (
        SyntheticConfig("baseline"),
        SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.15),
        SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4, step_cost=1.6),
        SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.0, step_cost=1.35),
    )
    params: dict[str, object] = {"configs": configs}
    params.update(overrides)
    return SyntheticSweep(**params)  # type: ignore[arg-type]
