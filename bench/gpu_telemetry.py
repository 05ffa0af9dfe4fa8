"""NVML sampling on a real NVIDIA GPU: idle, then while a torch bf16 matmul loop holds GPU 0.

One run (``python -m bench.gpu_telemetry [SECONDS]``, default 10 s per phase, samples every 0.25 s):
the node worker's GPU sampler (``workers.node.telemetry.GpuSampler``) reads every GPU while nothing
runs, then while a child process multiplies 8192x8192 bf16 matrices on GPU 0. Printed per phase and
GPU: mean and max of every reading. Goal: GPU 0's utilisation and power clearly above idle while busy,
idle utilisation near 0. On a host without an NVIDIA driver it says so and exits 0.

Needs only pyarrow, nvidia-ml-py and (for the load) torch, so it runs with a CUDA image's own python3.
"""

from __future__ import annotations

import subprocess
import sys
import time

from bench.common import emit
from workers.node.telemetry import GpuSampler, GpuUnavailable, SamplerLoop, sample, summarize

INTERVAL_S = 0.25
BURN = """
import sys, time, torch
a = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
b = torch.randn(8192, 8192, device="cuda:0", dtype=torch.bfloat16)
end = time.monotonic() + float(sys.argv[1])
print("ready", flush=True)
while time.monotonic() < end:
    for _ in range(20):
        a @ b
    torch.cuda.synchronize()
"""


def phase(seconds: float) -> dict[tuple[str, str], tuple[float, float, int]]:
    sampler = GpuSampler(None)
    summary = summarize(sample([SamplerLoop(sampler, INTERVAL_S)], lambda: time.sleep(seconds)))
    sampler.close()
    return summary


def main(argv: list[str]) -> int:
    seconds = float(argv[0]) if argv else 10.0
    try:
        idle = phase(seconds)
    except GpuUnavailable as err:
        print(f"skipped: {err}")
        return 0
    burn = subprocess.Popen(
        [sys.executable, "-c", BURN, str(seconds + 30)], stdout=subprocess.PIPE, text=True
    )
    try:
        assert burn.stdout is not None
        if burn.stdout.readline().strip() != "ready":
            print("skipped: the torch matmul load did not start (torch with CUDA missing?)")
            return 0
        time.sleep(1.0)  # let the clocks ramp
        busy = phase(seconds)
    finally:
        burn.kill()
        burn.wait()
    for name, summary in (("idle", idle), ("matmul on GPU 0", busy)):
        print(f"== {name}: mean / max over {seconds:g} s, every {INTERVAL_S} s")
        for (labels, metric), (mean, top, count) in summary.items():
            print(f"  {labels} {metric}: {mean:.1f} / {top:g} ({count} samples)")
    gpu0 = '{"gpu": "0"}'
    for metric, unit in (("gpu_utilization_pct", "%"), ("power_w", "W"), ("sm_clock_mhz", "MHz")):
        emit(f"gpu_telemetry.{metric}.idle", unit, idle[(gpu0, metric)][0])
        emit(f"gpu_telemetry.{metric}.busy", unit, busy[(gpu0, metric)][0])
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
