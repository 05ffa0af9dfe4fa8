"""Simulated server throughput: streamed chunks per second on one core, and chunk lateness.

Goal (issue #3): >= 5,000 chunks/s with p99 lateness <= 2 ms, the server pinned to one core. Lateness is
``sim_send_ns - sim_scheduled_ns`` of every chunk: how long after its iteration's deadline the server
wrote it. The server runs without speculation (one token per chunk: the most chunks per token) so the
requested rate is ``clients / iteration time``; the time scale sets that rate. The client runs on another
core and only scans each chunk for the two timestamps.
Run: ``make bench`` or ``.venv/bin/python -m bench.sim_server``.
"""

from __future__ import annotations

import asyncio
import os
import time

import aiohttp
import numpy as np
import psutil

from bench.common import REPO, emit
from workers.node.launcher import start_sim
from workers.sglang import api
from workers.sim.model import DEFAULT_PROFILE, decode_step_seconds

TARGET = REPO / "tests" / "fixtures" / "kimi-k2"
GOAL_CHUNKS_PER_S = 5000.0
GOAL_P99_LATENESS_MS = 2.0
RUN_S = 6.0
OUTPUT_TOKENS = 64
_SEND = f'"{api.SIM_SEND_NS}":'.encode()
_SCHEDULED = f'"{api.SIM_SCHEDULED_NS}":'.encode()


def _int_after(line: bytes, key: bytes) -> int:
    start = line.index(key) + len(key)
    end = start
    while line[end : end + 1].isdigit():
        end += 1
    return int(line[start:end])


async def _drive(url: str, clients: int, run_s: float) -> tuple[int, list[int], float]:
    """Closed-loop streams for ``run_s`` seconds: (chunks, lateness ns of each, elapsed s)."""
    lateness: list[int] = []
    stop_at = time.perf_counter() + run_s
    body = {
        "text": "bench",
        "sampling_params": {"max_new_tokens": OUTPUT_TOKENS, "ignore_eos": True},
        "stream": True,
    }

    async def client(session: aiohttp.ClientSession) -> None:
        while time.perf_counter() < stop_at:
            async with session.post(url + api.GENERATE, json=body) as reply:
                async for line in reply.content:
                    if line.startswith(b"data: {"):
                        lateness.append(_int_after(line, _SEND) - _int_after(line, _SCHEDULED))

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        start = time.perf_counter()
        await asyncio.gather(*(client(session) for _ in range(clients)))
        elapsed = time.perf_counter() - start
    return len(lateness), lateness, elapsed


def run_level(clients: int, requested_chunks_per_s: float) -> None:
    step_s = decode_step_seconds(DEFAULT_PROFILE, None, clients)
    scale = clients / requested_chunks_per_s / step_s
    env = {"SPECSWEEP_SIM_TIME_SCALE": f"{scale:.6f}"}
    os.sched_setaffinity(0, {0})  # the server inherits core 0
    with start_sim(["--model-path", str(TARGET)], env=env) as handle:
        os.sched_setaffinity(0, {1} if os.cpu_count() and os.cpu_count() > 1 else {0})
        server = psutil.Process(handle.popen.pid)
        cpu_before = sum(server.cpu_times()[:2])
        chunks, lateness, elapsed = asyncio.run(_drive(handle.url, clients, RUN_S))
        server_cpu_s = sum(server.cpu_times()[:2]) - cpu_before
    late_ms = np.asarray(lateness, dtype=float) / 1e6
    rate = chunks / elapsed
    p99 = float(np.percentile(late_ms, 99))
    emit(
        f"sim_server_chunks_per_s_c{clients}",
        "chunks/s",
        rate,
        clients=clients,
        requested_chunks_per_s=requested_chunks_per_s,
        goal=GOAL_CHUNKS_PER_S,
        ratio_to_goal=rate / GOAL_CHUNKS_PER_S,
        server_cpu_share=server_cpu_s / elapsed,
        server_cpu_us_per_chunk=server_cpu_s / chunks * 1e6,
    )
    emit(
        f"sim_server_chunk_lateness_c{clients}",
        "ms",
        float(np.mean(late_ms)),
        late_ms.tolist(),
        clients=clients,
        goal_p99=GOAL_P99_LATENESS_MS,
        ratio_p99_to_goal=p99 / GOAL_P99_LATENESS_MS,
        max=float(late_ms.max()),
    )


def main() -> None:
    affinity = os.sched_getaffinity(0)
    try:
        # the goal's rate at two batch sizes, then a stress level like bench/loadgen's 1024 streams
        for clients, requested in ((32, 5500.0), (64, 6000.0), (1024, 40000.0)):
            run_level(clients, requested)
    finally:
        os.sched_setaffinity(0, affinity)


if __name__ == "__main__":
    main()
