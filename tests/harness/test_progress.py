"""Progress output: a live table (rich) on a terminal, timestamped lines otherwise; retry classes."""

from __future__ import annotations

import io
import time

import pytest

from harness.progress import LiveProgress, LogProgress, SlotView, SweepView, progress_for
from harness.retry import DETERMINISTIC_CLASSES, TRANSIENT_CLASSES, allowed_failures
from specsweep.error_classes import ErrorClass

VIEW = SweepView(
    counts={"pending": 3, "leased": 1, "done": 2, "failed": 0},
    slots=(SlotView(0, "busy", "node-a", "chain d=4 r0 attempt 1", time.monotonic()),),
    eta_s=42.0,
)


def test_progress_prints_plain_lines_when_not_a_terminal() -> None:
    """Pipes and logs get one timestamped line per event, no escape codes."""
    stream = io.StringIO()
    progress = progress_for(stream)
    assert isinstance(progress, LogProgress)
    progress.event("done   chain d=4 r0 (abc) on node-a")
    progress.update(VIEW)
    progress.close()
    (line,) = stream.getvalue().splitlines()
    assert line.endswith("done   chain d=4 r0 (abc) on node-a") and "\x1b" not in line


def test_progress_shows_counts_slots_and_eta_when_live() -> None:
    """The live table names each slot's node, state and job, and the counts with the ETA."""
    stream = io.StringIO()
    progress = LiveProgress(stream)
    progress.update(VIEW)
    progress.close()
    text = stream.getvalue()
    assert "done 2" in text and "pending 3" in text and "ETA 42s" in text
    assert "node-a" in text and "chain d=4 r0 attempt 1" in text


def test_retry_policy_fails_at_once_when_class_is_deterministic() -> None:
    """bad_args, resolve_error, config_mismatch, cuda_oom, bad_drafter: no retry; crash, timeouts, lost
    nodes: retries."""
    for error_class in ("bad_args", "resolve_error", "config_mismatch", "cuda_oom", "bad_drafter"):
        assert allowed_failures(ErrorClass(error_class), retries=3) == 0
    for error_class in ("crash", "startup_timeout", "node_lost", "health_lost", "gpus_busy"):
        assert allowed_failures(ErrorClass(error_class), retries=3) == 3


def test_retry_policy_classifies_every_error_class_once_when_listed() -> None:
    """Each error class is deterministic or transient, never both, never neither; an unknown class cannot
    be made at all (a typo cannot turn a failure retryable)."""
    assert DETERMINISTIC_CLASSES.isdisjoint(TRANSIENT_CLASSES)
    assert set(ErrorClass) == DETERMINISTIC_CLASSES | TRANSIENT_CLASSES
    with pytest.raises(ValueError):
        ErrorClass("cuda_oomm")
