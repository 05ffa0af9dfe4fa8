"""Simulated server throughput: streamed chunks per second on one core, and chunk lateness.

Goal (issue #3): >= 5,000 chunks/s with p99 lateness <= 2 ms, the server pinned to one core. Lateness is
``sim_send_ns - sim_scheduled_ns`` of every chunk: how long after its iteration's deadline the server
wrote it. The server runs without speculation (one token per chunk: the most chunks per token) so the
requested rate is ``clients / iteration time``; the time scale sets that rate. The capacity is measured:
the server is asked for 10x the goal's rate and what it achieves is reported (asked for the goal's rate,
it would report the goal by construction); lateness is measured at the goal's rate and reported as its
p99, the statistic the goal names. The client runs on another core and only scans each chunk for the two
timestamps.
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
from workers.sim.presets import DEFAULT_PRESET

TARGET = REPO / "tests" / "fixtures" / "kimi-k2"
GOAL_CHUNKS_PER_S = 5000.0
GOAL_P99_LATENESS_MS = 2.0
RUN_S = 6.0
OVERDRIVE = 10.0  # the capacity run asks for 10x the goal's rate
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


def run_level(clients: int, requested_chunks_per_s: float) -> tuple[float, np.ndarray, float]:
    """Serve ``clients`` closed-loop streams paced at the requested rate: (achieved chunks/s, lateness
    ms of each chunk, server CPU share)."""
    # the default preset's step at mid-output context, every launch at factor 1
    step_s = DEFAULT_PRESET.decode_step_seconds(None, clients, OUTPUT_TOKENS // 2, max_running=clients)
    scale = clients / requested_chunks_per_s / step_s
    env = {"SPECSWEEP_SIM_TIME_SCALE": f"{scale:.6f}", "SPECSWEEP_SIM_LAUNCH_SIGMA": "0"}
    os.sched_setaffinity(0, {0})  # the server inherits core 0
    with start_sim(["--model-path", str(TARGET)], env=env) as handle:
        os.sched_setaffinity(0, {1} if os.cpu_count() and os.cpu_count() > 1 else {0})
        server = psutil.Process(handle.popen.pid)
        cpu_before = sum(server.cpu_times()[:2])
        chunks, lateness, elapsed = asyncio.run(_drive(handle.url, clients, RUN_S))
        server_cpu_s = sum(server.cpu_times()[:2]) - cpu_before
    return chunks / elapsed, np.asarray(lateness, dtype=float) / 1e6, server_cpu_s / elapsed


def measure(clients: int) -> None:
    """Capacity measured, not requested: the server asked for OVERDRIVE x the goal's rate (far more than
    one core can pace) serves what it can, and that achieved rate is the capacity; lateness is then
    judged at the goal's own rate, on the statistic the goal names (p99)."""
    requested = OVERDRIVE * GOAL_CHUNKS_PER_S
    capacity, _, cpu_share = run_level(clients, requested)
    emit(
        f"sim_server_capacity_chunks_per_s_c{clients}",
        "chunks/s",
        capacity,
        clients=clients,
        requested_chunks_per_s=requested,
        saturated=capacity < 0.9 * requested,  # False: the pace, not the server, limited it (a lower bound)
        goal=GOAL_CHUNKS_PER_S,
        ratio_to_goal=capacity / GOAL_CHUNKS_PER_S,
        server_cpu_share=cpu_share,
    )
    rate, late_ms, _ = run_level(clients, GOAL_CHUNKS_PER_S)
    p99 = float(np.percentile(late_ms, 99))
    emit(
        f"sim_server_chunk_lateness_p99_c{clients}",
        "ms",
        p99,
        late_ms.tolist(),
        clients=clients,
        chunks_per_s=rate,
        goal_p99=GOAL_P99_LATENESS_MS,
        ratio_p99_to_goal=p99 / GOAL_P99_LATENESS_MS,
        mean=float(np.mean(late_ms)),
        max=float(late_ms.max()),
    )


def main() -> None:
    affinity = os.sched_getaffinity(0)
    try:
        # the goal at two batch sizes, then a stress level like bench/loadgen's 1024 streams
        for clients in (32, 64, 1024):
            measure(clients)
    finally:
        os.sched_setaffinity(0, affinity)


if __name__ == "__main__":
    main()
