"""Why an attempt failed: the one list of error classes.

The node worker and the launcher produce them, the driver's retry policy reads them, the queue and the
``jobs`` table store them (as their string values). A class not listed here cannot be constructed, so a
typo cannot silently make a failure retryable.
"""

from __future__ import annotations

from enum import StrEnum


class ErrorClass(StrEnum):
    """How an attempt failed; the value is what the queue, the ``jobs`` table and the logs show."""

    BAD_ARGS = "bad_args"  # SGLang's parser refused the launch (exit 2)
    RESOLVE_ERROR = "resolve_error"  # SGLang's argument resolution raised
    CONFIG_MISMATCH = "config_mismatch"  # the live server runs another config than planned
    CUDA_OOM = "cuda_oom"  # out of GPU memory
    BAD_DRAFTER = "bad_drafter"  # the drafter checkpoint cannot be converted
    PROMPTS_UNREADABLE = "prompts_unreadable"  # the node cannot read the prompt set (file or Hub dataset)
    NCCL_ERROR = "nccl_error"  # NCCL failed (node or network)
    NODE_SETUP = "node_setup"  # the node's SGLang Python cannot serve: no usable GPU, a module it lacks
    CRASH = "crash"  # the server exited for another reason
    STARTUP_TIMEOUT = "startup_timeout"  # /health not 200 within the startup limit
    HEALTH_LOST = "health_lost"  # the server stopped answering while alive
    LEVEL_TIMEOUT = "level_timeout"  # a load level ran past timeouts.level_s (the server was stopped)
    CACHE_FLUSH_FAILED = "cache_flush_failed"  # /flush_cache before a level did not succeed
    STOP_FAILED = "stop_failed"  # processes of the server survived SIGKILL
    GPUS_BUSY = "gpus_busy"  # other processes hold the slot's GPUs
    PORT_TAKEN = "port_taken"  # another process holds or answers on the server's port (not our server)
    NODE_LOST = "node_lost"  # the worker (or its node) went away
    ATTEMPT_TIMEOUT = "attempt_timeout"  # the worker did not answer within the job's limits
    WORKER_ERROR = "worker_error"  # the worker raised an unexpected exception
    CANCELLED = "cancelled"  # the driver stopped the attempt (SIGINT/SIGTERM): not a failure
    INPUTS_CHANGED = "inputs_changed"  # the node measured other inputs than the sweep's: the sweep stops
