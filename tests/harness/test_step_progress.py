"""A command's long step says where it stands; a short one prints nothing (``harness.progress.ticking``)."""

from __future__ import annotations

import io
import threading

from harness.progress import ticking


def test_ticking_prints_nothing_when_the_step_ends_within_its_quiet_time() -> None:
    """A step that ends before ``quiet_s`` leaves the output exactly as it was without progress."""
    stream = io.StringIO()
    with ticking(lambda: "ranking", stream, quiet_s=30.0):
        pass
    assert stream.getvalue() == ""


def test_ticking_prints_start_and_end_lines_when_the_step_outlasts_its_quiet_time() -> None:
    """Past ``quiet_s`` a step not on a terminal prints timestamped plain lines (no spinner, no escape
    codes), the last one after the step ended."""
    stream = io.StringIO()
    state = {"text": "validating"}
    shown = threading.Event()

    def describe() -> str:
        shown.set()
        return state["text"]

    with ticking(describe, stream, quiet_s=0.05):
        assert shown.wait(timeout=30)  # the step lasts until progress has been shown
        state["text"] = "validated"
    lines = stream.getvalue().splitlines()
    assert len(lines) >= 2 and "\x1b" not in stream.getvalue()
    assert lines[0][8:] == " validating" and lines[-1][8:] == " validated"
    assert all(line[2] == ":" and line[5] == ":" for line in lines)
