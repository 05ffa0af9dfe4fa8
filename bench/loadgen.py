"""Load generator vs SGLang's own client, against the simulated server paced like a real one.

One run (``python -m bench.loadgen``): the simulated server steps every 20 ms, each verify step streams 3
tokens (EAGLE3 chain of 2 drafts, acceptance ~1), prefill takes one 20 ms step, every request asks for
128 random input ids and 256 output tokens with ``ignore_eos``. An ideal client sees TTFT 20 ms, TPOT
20/3 ms and ``streams / 1.72 s`` requests per second (1 prefill + 85 decode steps). At concurrency 256
and 1024, the same requests (count, lengths) are sent by ``workers.load.generator`` and by
``python -m sglang.benchmark.serving --backend sglang`` (random-ids, from .venv-sglang), each against a
fresh server. Reported: achieved req/s and tok/s over the same window for both clients (first request
start to last request end; SGLang's client's is recorded in its process by bench/sglang_client_window.py,
its own figure, whose window also holds task creation, connects and a /server_info call, kept as
``sglang_reported``), TTFT and TPOT medians against the server-side truth
(the server's own send stamps, and the design values), and our client-added delay per chunk (arrival
minus the server's send stamp; p50/p99 over all chunks).

The simulator must never be this bench's bottleneck. The paced profile's step time does not depend on the
batch, so "the server" is ``SIM_PROCESSES`` simulated servers sharing one port (SO_REUSEPORT, each its own
scheduler): every stream still gets exactly the paced schedule and every chunk its send stamp. (The sweep
models one scheduler; this is for the paced bench only.) SGLang's client runs when ``.venv-sglang`` exists
(or ``BENCH_SGLANG_PYTHON`` names an interpreter with sglang installed).
Besides the automatic process count, ours also runs on one process, and on every core the simulator
leaves (when that is more than automatic, which keeps half the cores for the server).

Client CPU per chunk is reported for our runs inside this process only: a multi-process run's CPU includes
its shards' start-up (imports), and SGLang's client's includes its import of torch and sglang.srt (24-32 s
of CPU on the 16-core host, varying more from run to run than its whole streaming work), so neither is a
per-chunk cost.

Goals at 1024 streams: client-added delay p99 <= 2 ms, TPOT within 2% of truth, req/s >= 90% of ideal
and >= 2x SGLang's client. No client can beat the ideal, so the last is reachable only where SGLang's
client gets less than half of it: the ratio line also reports ``most_any_client_can_reach``.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import psutil

from bench.common import REPO, emit
from workers.job import LoadLevel
from workers.load.generator import LoadResult, run_load
from workers.load.workloads import RandomIdsWorkload
from workers.node.launcher import start_sim, wait_healthy
from workers.node.preflight import pick_free_port
from workers.sim.faults import READY_LINE
from workers.sim.settings import ENV_PROFILE, ENV_REUSE_PORT
from workers.sim.tokenizer import write_word_tokenizer

STEP_S = 0.020
TOKENS_PER_STEP = 3
INPUT_TOKENS = 128
OUTPUT_TOKENS = 256
CYCLES = 3  # requests per stream: enough for the streams to cycle and desynchronise if the client lags
CONCURRENCIES = (256, 1024)
# SGLang's client runs in .venv-sglang; elsewhere (a host without that venv) name an interpreter that has
# sglang installed in BENCH_SGLANG_PYTHON.
SGLANG_PYTHON = Path(os.environ.get("BENCH_SGLANG_PYTHON", REPO / ".venv-sglang" / "bin" / "python"))
SIM_PROCESSES = max(1, min(4, (os.cpu_count() or 1) // 4))  # a quarter of the cores; the client gets half
PACED_PROFILE = {
    "name": "paced-20ms-3-tokens",
    "overhead_s": 0.0,
    "target_fixed_s": STEP_S,
    "target_per_token_s": 0.0,
    "draft_fixed_s": 0.0,
    "draft_per_token_s": 0.0,
    "prefill_fixed_s": STEP_S,
    "prefill_per_token_s": 0.0,
    "accept_first": 0.999999,
    "accept_decay": 1.0,
    "topk_gain": 0.0,
    "temperature_penalty": 0.0,
    "natural_output_tokens": OUTPUT_TOKENS,
}
SERVER_ARGS = [
    "--model-path",
    str(REPO / "tests" / "fixtures" / "kimi-k2"),
    "--speculative-algorithm",
    "EAGLE3",
    "--speculative-draft-model-path",
    str(REPO / "tests" / "fixtures" / "eagle3-draft"),
    "--speculative-num-steps",
    str(TOKENS_PER_STEP - 1),
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    str(TOKENS_PER_STEP),
    "--max-running-requests",
    "4096",
]
DECODE_STEPS = math.ceil((OUTPUT_TOKENS - 1) / TOKENS_PER_STEP)
IDEAL_REQUEST_S = (1 + DECODE_STEPS) * STEP_S
TRUE_TTFT_MS = STEP_S * 1e3
TRUE_TPOT_MS = DECODE_STEPS * STEP_S * 1e3 / (OUTPUT_TOKENS - 1)


class CpuMeter:
    """CPU seconds used by this process and its reaped children (the client), and by the servers."""

    def __init__(self, server_pids: list[int]) -> None:
        self._servers = [psutil.Process(pid) for pid in server_pids]
        self._start = self._read()

    def _read(self) -> tuple[float, float]:
        own = resource.getrusage(resource.RUSAGE_SELF)
        kids = resource.getrusage(resource.RUSAGE_CHILDREN)
        client = own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime
        return client, sum(sum(p.cpu_times()[:2]) for p in self._servers)

    def used(self) -> dict[str, float]:
        client, server = self._read()
        return {"client_cpu_s": client - self._start[0], "server_cpu_s": server - self._start[1]}


@dataclass(frozen=True)
class PacedServers:
    """Simulated servers sharing one port: where to reach them and their process ids."""

    url: str
    pids: list[int]


@contextlib.contextmanager
def paced_servers(profile: Path, count: int = SIM_PROCESSES) -> Iterator[PacedServers]:
    """``count`` simulated servers (the paced profile) on one port; all ready before yielding."""
    port = pick_free_port("127.0.0.1")
    env = {ENV_PROFILE: str(profile), ENV_REUSE_PORT: "1"}
    with contextlib.ExitStack() as stack:
        handles = [
            stack.enter_context(start_sim(SERVER_ARGS, env=env, port=port, healthy_within_s=None))
            for _ in range(count)
        ]
        deadline = time.monotonic() + 60
        while not all(READY_LINE in h.log_text() for h in handles):
            if time.monotonic() > deadline or any(h.popen.poll() is not None for h in handles):
                raise RuntimeError("\n".join(h.log_text()[-2000:] for h in handles))
            time.sleep(0.05)
        wait_healthy(handles[0], 30, shared_port=True)
        yield PacedServers(handles[0].url, [h.popen.pid for h in handles])


def run_ours(url: str, streams: int, processes: int | None = None) -> LoadResult:
    level = LoadLevel(concurrency=streams, requests=CYCLES * streams, processes=processes)
    return run_load(url, level, RandomIdsWorkload(input_tokens=INPUT_TOKENS, output_tokens=OUTPUT_TOKENS))


def run_sglang(url: str, streams: int, tokenizer: Path, out: Path) -> dict:
    argv = [
        str(SGLANG_PYTHON),
        str(REPO / "bench" / "sglang_client_window.py"),
        str(out.with_suffix(".window.jsonl")),
        "--backend",
        "sglang",
        "--base-url",
        url,
        "--dataset-name",
        "random-ids",
        "--random-input-len",
        str(INPUT_TOKENS),
        "--random-output-len",
        str(OUTPUT_TOKENS),
        "--random-range-ratio",
        "1.0",
        "--num-prompts",
        str(CYCLES * streams),
        "--max-concurrency",
        str(streams),
        "--tokenizer",
        str(tokenizer),
        "--warmup-requests",
        "0",
        "--disable-tqdm",
        "--output-file",
        str(out),
    ]
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=out.parent)
    if proc.returncode != 0 or not out.exists():
        raise RuntimeError(f"sglang.benchmark.serving failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    result = json.loads(out.read_text().splitlines()[-1])
    result["window"] = json.loads(out.with_suffix(".window.jsonl").read_text().splitlines()[-1])
    return result


def report_ours(streams: int, result: LoadResult, cpu: dict[str, float | int], tag: str) -> float:
    """Our run's lines; truth per request is the server's own send stamps (same clock)."""
    ok = [r for r in result.records if r.error_type is None]
    duration_s = (max(r.end_ns for r in result.records) - min(r.start_ns for r in result.records)) / 1e9
    req_s = len(ok) / duration_s
    ttft = [r.ttft_ms for r in ok]
    tpot = [r.tpot_ms for r in ok]
    server_ttft = float(np.median([r.server_chunk_ns[0] / 1e6 for r in ok]))
    server_tpot = float(
        np.median(
            [(r.server_chunk_ns[-1] - r.server_chunk_ns[0]) / 1e6 / (r.completion_tokens - 1) for r in ok]
        )
    )
    delays_us = [
        (arrival - sent) / 1e3
        for r in ok
        for arrival, sent in zip(r.chunk_arrival_ns, r.server_chunk_ns, strict=True)
    ]
    ideal = streams / IDEAL_REQUEST_S
    common = {
        "streams": streams,
        "requests": len(result.records),
        "errors": len(result.records) - len(ok),
        **cpu,
    }
    emit(
        f"{tag}.req_s",
        "req/s",
        req_s,
        ideal_req_s=ideal,
        ratio_to_ideal=req_s / ideal,
        processes=result.processes,
        **common,
    )
    emit(f"{tag}.tok_s", "tok/s", sum(r.completion_tokens for r in ok) / duration_s, **common)
    if result.processes == 1:  # in this process: no shard start-up in the CPU figure
        emit_cpu_per_chunk(tag, sum(len(r.chunk_tokens or []) for r in result.records), common)
    emit(
        f"{tag}.ttft_p50",
        "ms",
        float(np.median(ttft)),
        ttft,
        server_truth_ms=server_ttft,
        design_truth_ms=TRUE_TTFT_MS,
        **common,
    )
    emit(
        f"{tag}.tpot_p50",
        "ms",
        float(np.median(tpot)),
        tpot,
        server_truth_ms=server_tpot,
        design_truth_ms=TRUE_TPOT_MS,
        error_vs_server_pct=100 * (float(np.median(tpot)) / server_tpot - 1),
        error_vs_design_pct=100 * (float(np.median(tpot)) / TRUE_TPOT_MS - 1),
        **common,
    )
    emit(
        f"{tag}.client_delay_per_chunk",
        "us",
        float(np.percentile(delays_us, 99)),
        delays_us,
        loopback_p50_us=result.client_delay.p50_us,
        loopback_p99_us=result.client_delay.p99_us,
        **common,
    )
    return req_s


def emit_cpu_per_chunk(tag: str, chunks: int, common: dict) -> None:
    """Client CPU per streamed chunk: the cost that decides how many streams one core can drive."""
    per_chunk = common["client_cpu_s"] / chunks * 1e6
    emit(
        f"{tag}.client_cpu_per_chunk",
        "us",
        per_chunk,
        chunks=chunks,
        server_cpu_per_chunk_us=common["server_cpu_s"] / chunks * 1e6,
        **common,
    )


def report_sglang(streams: int, out: dict, cpu: dict[str, float | int]) -> float:
    """SGLang's client's lines, from its own output file (it has no per-request server stamps).

    Throughput is over ours' window definition, first request start to last request end (recorded by
    ``bench/sglang_client_window.py`` in the client's process); SGLang's own figure, whose window also
    holds task creation, connects and a ``/server_info`` call, is kept as ``sglang_reported``.
    """
    ideal = streams / IDEAL_REQUEST_S
    tag = f"loadgen.c{streams}.sglang_client"
    completed = int(out["completed"])
    common = {"streams": streams, "requests": CYCLES * streams, "errors": CYCLES * streams - completed, **cpu}
    window = out["window"]
    duration_s = window["last_end_s"] - window["first_start_s"]
    req_s = completed / duration_s
    tpot = float(out["median_tpot_ms"])
    emit(
        f"{tag}.req_s",
        "req/s",
        req_s,
        ideal_req_s=ideal,
        ratio_to_ideal=req_s / ideal,
        sglang_reported=float(out["request_throughput"]),
        **common,
    )
    emit(
        f"{tag}.tok_s",
        "tok/s",
        float(out["total_output_tokens"]) / duration_s,
        sglang_reported=float(out["output_throughput"]),
        **common,
    )
    emit(f"{tag}.ttft_p50", "ms", float(out["median_ttft_ms"]), design_truth_ms=TRUE_TTFT_MS, **common)
    emit(
        f"{tag}.tpot_p50",
        "ms",
        tpot,
        design_truth_ms=TRUE_TPOT_MS,
        error_vs_design_pct=100 * (tpot / TRUE_TPOT_MS - 1),
        **common,
    )
    return req_s


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="bench-loadgen-") as tmp:
        work = Path(tmp)
        profile = work / "paced.json"
        profile.write_text(json.dumps(PACED_PROFILE))
        tokenizer = write_word_tokenizer(work / "tokenizer")
        for streams in CONCURRENCIES:
            context = {
                "streams": streams,
                "sim_processes": SIM_PROCESSES,
                "cpu_count": os.cpu_count(),
                "load_average_1m": os.getloadavg()[0],
            }
            with paced_servers(profile) as servers:
                meter = CpuMeter(servers.pids)
                result = run_ours(servers.url, streams)
                ours_req_s = report_ours(
                    streams, result, {**meter.used(), **context}, f"loadgen.c{streams}.ours"
                )
            free_cores = (os.cpu_count() or 1) - SIM_PROCESSES
            if free_cores > result.processes:  # the client on every core the simulator leaves
                with paced_servers(profile) as servers:
                    meter = CpuMeter(servers.pids)
                    wide = run_ours(servers.url, streams, processes=free_cores)
                    report_ours(
                        streams, wide, {**meter.used(), **context}, f"loadgen.c{streams}.ours_free_cores"
                    )
            if result.processes > 1:  # the automatic choice, against one process (in this one: no start-up)
                with paced_servers(profile) as servers:
                    meter = CpuMeter(servers.pids)
                    single = run_ours(servers.url, streams, processes=1)
                    report_ours(
                        streams, single, {**meter.used(), **context}, f"loadgen.c{streams}.ours_one_process"
                    )
            if not SGLANG_PYTHON.exists():
                print(f"SGLang's client not run: no {SGLANG_PYTHON}", file=sys.stderr)
                continue
            with paced_servers(profile) as servers:
                meter = CpuMeter(servers.pids)
                out = run_sglang(servers.url, streams, tokenizer, work / f"sglang-{streams}.jsonl")
                sglang_req_s = report_sglang(streams, out, {**meter.used(), **context})
            ideal = streams / IDEAL_REQUEST_S
            emit(
                f"loadgen.c{streams}.ours_vs_sglang_client.req_s",
                "x",
                ours_req_s / sglang_req_s,
                most_any_client_can_reach=ideal / sglang_req_s,  # no client beats the ideal
                **context,
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
