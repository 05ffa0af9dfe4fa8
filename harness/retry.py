"""Which failures are worth another attempt.

A deterministic failure would happen again on any node (a flag SGLang refuses, a config it resolves
differently from the plan, a model that does not fit in memory at load): the job fails at once. A
transient one depends on the node or on luck (a crash, a hang, a lost node, a busy GPU, a node whose
SGLang Python lacks a GPU or a module: another node's image may have them): the job gets up to
``retries`` more attempts, on another slot when there is one. Every class is listed in exactly one of
the two sets (a test checks), so adding a class forces a decision. An attempt that measured other inputs
than the sweep's (``inputs_changed``: a prompt file edited mid-run, a node's own copy of an input) is
never retried: another attempt would read the same changed input, so the driver stops the sweep instead
(``harness.driver``) and the job waits, pending, for the user to restore the input or accept it.
"""

from __future__ import annotations

from specsweep.error_classes import ErrorClass

DETERMINISTIC_CLASSES: frozenset[ErrorClass] = frozenset(
    {
        ErrorClass.BAD_ARGS,
        ErrorClass.RESOLVE_ERROR,
        ErrorClass.CONFIG_MISMATCH,
        ErrorClass.CUDA_OOM,
        ErrorClass.BAD_DRAFTER,
        ErrorClass.INPUTS_CHANGED,
    }
)
TRANSIENT_CLASSES: frozenset[ErrorClass] = frozenset(
    {
        ErrorClass.NCCL_ERROR,
        ErrorClass.NODE_SETUP,
        ErrorClass.CRASH,
        ErrorClass.STARTUP_TIMEOUT,
        ErrorClass.HEALTH_LOST,
        ErrorClass.LEVEL_TIMEOUT,
        ErrorClass.CACHE_FLUSH_FAILED,
        ErrorClass.STOP_FAILED,
        ErrorClass.GPUS_BUSY,
        ErrorClass.PORT_TAKEN,
        ErrorClass.PROMPTS_UNREADABLE,
        ErrorClass.NODE_LOST,
        ErrorClass.ATTEMPT_TIMEOUT,
        ErrorClass.WORKER_ERROR,
        ErrorClass.CANCELLED,
    }
)


def allowed_failures(error_class: ErrorClass, retries: int) -> int:
    """How many failed attempts a job may have and still be retried (0: this failure is final)."""
    return 0 if error_class in DETERMINISTIC_CLASSES else retries
