"""Which failures are worth another attempt.

A deterministic failure would happen again on any node (a flag SGLang refuses, a config it resolves
differently from the plan, a model that does not fit in memory at load): the job fails at once. A
transient one depends on the node or on luck (a crash, a hang, a lost node, a busy GPU): the job gets up
to ``retries`` more attempts, on another slot when there is one. Unknown classes count as transient.
"""

from __future__ import annotations

DETERMINISTIC_CLASSES = frozenset({"bad_args", "resolve_error", "config_mismatch", "cuda_oom", "bad_drafter"})


def allowed_failures(error_class: str, retries: int) -> int:
    """How many failed attempts a job may have and still be retried (0: this failure is final)."""
    return 0 if error_class in DETERMINISTIC_CLASSES else retries
