"""Every sub-command's help reads as written: argparse's %-escapes never reach the user."""

from __future__ import annotations

import pytest

from harness.cli import COMMAND_MODULES, build_parser


@pytest.mark.parametrize("name", list(COMMAND_MODULES))
def test_help_prints_no_argparse_escape_when_subcommand_help_is_shown(
    name: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``specsweep NAME --help`` and ``specsweep --help`` show a single ``%`` where the text means one."""
    for argv in ([name, "--help"], ["--help"]):
        with pytest.raises(SystemExit) as exit_info:
            build_parser().parse_args(argv)
        assert exit_info.value.code == 0
        out = capsys.readouterr().out
        assert "%%" not in out, f"{argv}: {out}"


def test_best_help_names_its_interval_when_shown(capsys: pytest.CaptureFixture[str]) -> None:
    """``best --help`` says "95% interval" (it printed "95%%" when the text was escaped for argparse)."""
    with pytest.raises(SystemExit):
        build_parser().parse_args(["best", "--help"])
    assert "95% interval" in capsys.readouterr().out
