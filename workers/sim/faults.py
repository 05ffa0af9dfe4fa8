"""SGLang's own failure text and exit behaviour, reproduced for the simulator's fault modes.

The launcher classifies a dead server by reading its log, so the simulator must print what SGLang 0.5.23
prints. When a scheduler process raises, SGLang logs ``Scheduler hit an exception: <traceback>`` (prefixed
with the TP rank), sends SIGQUIT to the server process, which logs ``Received sigquit from a child process.
It usually means the child failed.`` (while starting) or ``SIGQUIT received. ... It usually means one
child failed.`` (while serving) and then SIGKILLs its own process tree: the exit status is -9 (137 in a
shell). Argument errors never reach a scheduler: the parser exits 2, a resolution error is an ordinary
uncaught traceback, exit 1.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from workers.sim.model import DraftShape
from workers.sim.settings import FaultMode, SimSettings

_SCHEDULER_FRAME = (
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 6367, '
    "in run_scheduler_process\n    scheduler = Scheduler(server_args, port_args)\n"
)

STARTUP_TRACEBACKS: dict[FaultMode, str] = {
    FaultMode.OOM: (
        "Traceback (most recent call last):\n"
        + _SCHEDULER_FRAME
        + '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/model_executor/model_runner.py", '
        "line 1290, in load_model\n    self.model = get_model(model_config=self.model_config)\n"
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.75 GiB. GPU 0 has a total "
        "capacity of 139.72 GiB of which 1.12 GiB is free. Including non-PyTorch memory, this process has "
        "138.59 GiB memory in use. Of the allocated memory 135.02 GiB is allocated by PyTorch, and 1.31 GiB "
        "is reserved by PyTorch but unallocated. If reserved but unallocated memory is large try setting "
        "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for "
        "Memory Management  (https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)\n"
    ),
    FaultMode.NCCL: (
        "Traceback (most recent call last):\n"
        + _SCHEDULER_FRAME
        + '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/distributed/parallel_state.py", '
        "line 1466, in init_distributed_environment\n    torch.distributed.barrier()\n"
        "torch.distributed.DistBackendError: NCCL error in: "
        "/pytorch/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp:3356, unhandled system error (run with "
        "NCCL_DEBUG=INFO for details), NCCL version 2.27.5\n"
        "ncclSystemError: System call (e.g. socket, malloc) or external library call failed or device "
        "error. \nLast error:\nsocketStartConnect: Connect to 10.0.0.2<45821> failed : Software caused "
        "connection abort\n"
    ),
    FaultMode.ASSERT: (
        "Traceback (most recent call last):\n"
        + _SCHEDULER_FRAME
        + '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/speculative/eagle_worker.py", '
        "line 142, in __init__\n    assert self.hot_token_id is not None\n"
        "AssertionError\n"
    ),
}

RUNTIME_CRASH_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 6373, '
    "in run_scheduler_process\n    scheduler.run_event_loop()\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/speculative/eagle_worker.py", line 411, '
    "in verify\n    accept_index = accept_index[accept_index != -1]\n"
    "RuntimeError: CUDA error: an illegal memory access was encountered\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below "
    "might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)

STARTUP_SIGQUIT_LINE = "Received sigquit from a child process. It usually means the child failed."
RUNTIME_SIGQUIT_LINE = "SIGQUIT received. signum=3, frame=None. It usually means one child failed."
READY_LINE = "The server is fired up and ready to roll!"


def log_line(message: str, *, rank: str = "") -> str:
    """One line in SGLang's log format: ``[YYYY-mm-dd HH:MM:SS TP0] message``."""
    stamp = time.strftime("%Y-%m-%d %H:%M:%S")
    return f"[{stamp}{' ' + rank if rank else ''}] {message}"


def die_like_sglang(traceback_text: str, *, starting: bool) -> None:
    """Print the scheduler's exception and the server's SIGQUIT line, then SIGKILL this process."""
    sys.stderr.write(log_line(f"Scheduler hit an exception: {traceback_text}", rank="TP0") + "\n")
    sys.stderr.write(log_line(STARTUP_SIGQUIT_LINE if starting else RUNTIME_SIGQUIT_LINE) + "\n")
    sys.stderr.write(
        log_line(f"kill_process_tree called: parent_pid={os.getpid()}, include_parent=True") + "\n"
    )
    sys.stderr.flush()
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def lossy_from(settings: SimSettings, shape: DraftShape | None) -> int | None:
    """The output position from which this server's token ids go wrong under a lossy fault (None: they
    never do). Only speculative decoding can be lossy: the baseline always emits the greedy ids."""
    if shape is None:
        return None
    if settings.fault is FaultMode.LOSSY or (settings.fault is FaultMode.LOSSY_TREE and shape.topk > 1):
        return settings.fault_after
    return None
