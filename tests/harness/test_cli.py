"""The command line's last line of defence: an OSError that a user's path caused is one line, exit 2."""

from __future__ import annotations

from pathlib import Path

import pytest

from harness.cli import main


@pytest.mark.parametrize("case", ["under a file", "on a read-only file system"])
def test_main_reports_one_line_when_an_oserror_comes_from_the_users_path(
    case: str, tmp_path: Path, request: pytest.FixtureRequest, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --out` under a file or on a read-only mount (root is refused there too) fails where no
    command checks the path first: one line naming the path and a fix, exit 2, no traceback (it used to
    be NotADirectoryError's or OSError's traceback)."""
    if case == "under a file":
        taken = tmp_path / "taken"
        taken.write_text("")
        out = taken / "demo"
    else:
        out = request.getfixturevalue("read_only_disk") / "demo"
    assert main(["demo", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert err.startswith(f"specsweep demo: error: {out}: ") and "fix:" in err
