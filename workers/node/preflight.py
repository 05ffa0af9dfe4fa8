"""Checks before a server is launched: the GPUs are idle, the port is free.

A server that starts on GPUs another process still holds either fails with an out-of-memory error
after minutes of loading or, worse, runs slower and skews the measurement. NVML (nvidia-ml-py) lists
the processes holding memory on each GPU; on a node without an NVIDIA driver the GPU check is skipped.

Standalone: ``python -m workers.node.preflight [--gpus 0,1,...]`` prints who holds GPU memory and exits 1
when a GPU is busy, 0 when all are idle (or when there is no NVIDIA driver: it says "skipped").
"""

from __future__ import annotations

import argparse
import socket
import sys
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class GpuProcess:
    """A process that holds memory on a GPU."""

    gpu_index: int
    pid: int
    used_mib: float | None  # None when the driver does not report it (e.g. some containers)
    name: str | None  # None when the PID is not visible from here (another PID namespace)

    def describe(self) -> str:
        mem = "?" if self.used_mib is None else f"{self.used_mib:.0f} MiB"
        return f"GPU {self.gpu_index}: pid {self.pid} ({self.name or 'unknown process'}) holds {mem}"


class GpusBusy(Exception):
    """Some of the GPUs a server needs are held by other processes."""

    def __init__(self, holders: list[GpuProcess]) -> None:
        self.holders = holders
        pids = sorted({h.pid for h in holders})
        super().__init__(
            f"GPUs busy: held by PID(s) {', '.join(map(str, pids))}: "
            + "; ".join(h.describe() for h in holders)
        )


def _process_name(pid: int) -> str | None:
    import psutil

    try:
        return " ".join(psutil.Process(pid).cmdline()[:3]) or psutil.Process(pid).name()
    except (psutil.NoSuchProcess, psutil.AccessDenied):
        return None


def gpu_processes(gpu_indices: list[int] | None = None) -> list[GpuProcess] | None:
    """Processes holding memory on the given GPUs (all when None); None when there is no NVIDIA driver."""
    import pynvml

    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:
        return None
    try:
        indices = gpu_indices if gpu_indices is not None else list(range(pynvml.nvmlDeviceGetCount()))
        holders: list[GpuProcess] = []
        for index in indices:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            procs = pynvml.nvmlDeviceGetComputeRunningProcesses(
                handle
            ) + pynvml.nvmlDeviceGetGraphicsRunningProcesses(handle)
            seen: set[int] = set()
            for proc in procs:
                if proc.pid in seen:
                    continue
                seen.add(proc.pid)
                used = proc.usedGpuMemory
                holders.append(
                    GpuProcess(
                        gpu_index=index,
                        pid=proc.pid,
                        used_mib=None if used is None else used / 2**20,
                        name=_process_name(proc.pid),
                    )
                )
        return holders
    finally:
        pynvml.nvmlShutdown()


def check_gpus_idle(gpu_indices: list[int] | None) -> bool:
    """Raise GpusBusy naming the PIDs when a GPU is held; True if checked, False if skipped (no NVIDIA)."""
    holders = gpu_processes(gpu_indices)
    if holders is None:
        return False
    if holders:
        raise GpusBusy(holders)
    return True


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could bind ``host:port`` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def pick_free_port(host: str) -> int:
    """A port the OS says is free on ``host`` (the server binds it moments later)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.node.preflight",
        description="Which processes hold memory on this node's GPUs.",
    )
    parser.add_argument("--gpus", help="comma-separated GPU indices (default: all)")
    args = parser.parse_args(argv)
    indices = [int(i) for i in args.gpus.split(",")] if args.gpus else None
    holders = gpu_processes(indices)
    if holders is None:
        print("skipped: no NVIDIA driver (NVML unavailable) on this node")
        return 0
    for holder in holders:
        print(holder.describe())
    if holders:
        print(f"BUSY: {len({h.pid for h in holders})} process(es) hold GPU memory")
        return 1
    print(f"idle: no process holds memory on GPU(s) {args.gpus or 'all'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
