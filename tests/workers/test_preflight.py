"""Preflight: ports, and the NVML GPU check (names the PIDs holding GPU memory; skipped without NVIDIA)."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from workers.node.preflight import (
    GpuProcess,
    GpusBusy,
    check_gpus_idle,
    gpu_processes,
    pick_free_port,
    port_is_free,
)


def test_preflight_sees_port_taken_when_something_listens() -> None:
    """A bound port is not free; once closed it is."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        assert not port_is_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", port)
    assert port_is_free("127.0.0.1", pick_free_port("127.0.0.1"))


def test_preflight_error_names_every_pid_when_gpus_are_held() -> None:
    """The busy-GPU error lists each holder's PID, GPU and memory."""
    err = GpusBusy([GpuProcess(0, 4242, 1024.0, "python -m sglang"), GpuProcess(3, 77, None, None)])
    assert "PID(s) 77, 4242" in str(err)
    assert "GPU 0: pid 4242 (python -m sglang) holds 1024 MiB" in str(err)


def test_preflight_skips_gpu_check_when_no_nvidia_driver() -> None:
    """Without NVML the GPU check is skipped (None / False), never a failure."""
    if gpu_processes() is not None:
        pytest.skip("this machine has an NVIDIA driver")
    assert check_gpus_idle([0, 1]) is False


def test_preflight_cli_reports_skip_when_no_nvidia_driver() -> None:
    """`python -m workers.node.preflight` says what it checked and exits 0 when nothing holds a GPU."""
    done = subprocess.run(
        [sys.executable, "-m", "workers.node.preflight"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 1)
    assert done.stdout.startswith(("skipped: no NVIDIA driver", "idle:", "GPU "))


# Holds 1 GiB on GPU 0 through the CUDA driver API (libcuda ships with the driver; no torch needed).
GPU_HOLDER = """
import ctypes, time
cuda = ctypes.CDLL("libcuda.so.1")
device, context, pointer = ctypes.c_int(), ctypes.c_void_p(), ctypes.c_uint64()
assert cuda.cuInit(0) == 0 and cuda.cuDeviceGet(ctypes.byref(device), 0) == 0
assert cuda.cuCtxCreate_v2(ctypes.byref(context), 0, device) == 0
assert cuda.cuMemAlloc_v2(ctypes.byref(pointer), 1 << 30) == 0
print("holding", flush=True)
time.sleep(600)
"""


@pytest.mark.gpu
def test_preflight_names_holder_then_passes_when_process_exits() -> None:
    """On a GPU machine: a process holding GPU memory is named; once it exits the check passes."""
    holder = subprocess.Popen([sys.executable, "-c", GPU_HOLDER], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        with pytest.raises(GpusBusy) as caught:
            check_gpus_idle([0])
        assert str(holder.pid) in str(caught.value)
    finally:
        holder.kill()
        holder.wait()
    deadline = time.monotonic() + 10
    while gpu_processes([0]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert check_gpus_idle([0]) is True
