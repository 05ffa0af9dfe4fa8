"""The driver's state directory: found again from the same URI, whatever endpoint spelling it carries."""

from __future__ import annotations

from pathlib import Path

import pytest

from analysis.store import open_store
from harness.state import state_dir
from specsweep.errors import ResultsError


def test_state_dir_is_the_same_when_only_the_uri_query_differs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The key is scheme, bucket and prefix: an endpoint in the query or the environment finds the same
    state; another prefix, bucket or scheme gets its own; all live under SPECSWEEP_STATE_DIR."""
    monkeypatch.setenv("SPECSWEEP_STATE_DIR", str(tmp_path))
    plain = state_dir(open_store("s3://team/kimi/run1"))
    assert plain.parent == tmp_path and plain.name.startswith("team-")
    assert state_dir(open_store("s3://team/kimi/run1/?endpoint_override=127.0.0.1:9000&scheme=http")) == plain
    others = {
        state_dir(open_store(uri))
        for uri in ("s3://team/kimi/run2", "s3://other/kimi/run1", "gs://team/kimi/run1?anonymous=true")
    }
    assert plain not in others and len(others) == 3


def test_state_dir_is_the_given_directory_when_state_dir_is_passed(tmp_path: Path) -> None:
    assert state_dir(open_store("gs://team/p?anonymous=true"), tmp_path / "mine") == tmp_path / "mine"


def test_state_dir_refuses_a_state_dir_when_out_is_local(tmp_path: Path) -> None:
    """A local OUT holds its own queue: --state-dir elsewhere is refused rather than silently ignored."""
    assert state_dir(open_store(tmp_path)) == tmp_path
    with pytest.raises(ResultsError, match="--state-dir is for object-store outputs"):
        state_dir(open_store(tmp_path), tmp_path / "elsewhere")
