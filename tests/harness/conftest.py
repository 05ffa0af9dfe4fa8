"""Fixtures the harness's driver tests share."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def node_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node-local dirs (pid files, port locks, drafter cache) private to this test; the embedded Ray's
    raylets and workers inherit them from this process's environment."""
    monkeypatch.setenv("SPECSWEEP_PID_DIR", str(tmp_path / "pids"))
    monkeypatch.setenv("SPECSWEEP_DRAFTER_CACHE", str(tmp_path / "drafters"))
