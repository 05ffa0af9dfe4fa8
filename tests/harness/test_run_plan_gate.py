"""`specsweep run` never drops grid points silently: it prints what planning did and refuses a partial
grid unless told otherwise; a drafter path that is not there is an error naming it (no Hub lookup)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml

from harness.cli import main
from harness.commands.plan import require_nothing_dropped
from harness.plan import plan_sweep
from harness.spec import parse_spec
from specsweep.errors import SpecError


def write_spec(folder: Path, kimi_target: Path, drafter: Path, **changes: Any) -> Path:
    data: dict[str, Any] = {
        "engine": "sglang",
        "model_path": str(kimi_target),
        "drafter": {"path": str(drafter), "format": "sglang"},
        "base_args": ["--tp-size", "8"],
        "speculative": {"num_steps": [2], "topk": [2], "num_draft_tokens": [5, 9]},
        "load": {"concurrency": [1], "requests_per_level": 4},
        "output_dir": str(folder / "out"),
    }
    data.update(changes)
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_run_refuses_with_the_plan_summary_when_a_point_is_dropped(
    tmp_path: Path, kimi_target: Path, eagle3_draft: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """One invalid point of three: `run` prints the counts and the dropped point's reason, then exits 2
    naming --allow-dropped, before it touches Ray or the output directory."""
    spec = write_spec(tmp_path, kimi_target, eagle3_draft)
    code = main(["run", str(spec), "--builtin-only", "--draft-config", str(eagle3_draft)])
    captured = capsys.readouterr()
    assert code == 2
    assert "3 point(s): 2 ok, 1 invalid -> 2 job(s)" in captured.out
    dropped = [line for line in captured.out.splitlines() if line.strip().startswith("dropped")]
    assert len(dropped) == 1 and "tree s=2 k=2 n=9" in dropped[0] and "9" in dropped[0].split(":", 1)[1]
    assert "--allow-dropped" in captured.err and "Traceback" not in captured.err
    assert not (tmp_path / "out").exists()


def test_run_gate_lets_a_partial_grid_through_when_allow_dropped(
    tmp_path: Path, kimi_target: Path, eagle3_draft: Path
) -> None:
    """With --allow-dropped (allow_dropped=True) the same plan passes the gate; without it, it does not."""
    data = yaml.safe_load(write_spec(tmp_path, kimi_target, eagle3_draft).read_text())
    plan = plan_sweep(parse_spec(data), use_resolver=False)
    require_nothing_dropped(plan, "sweep.yaml", allow_dropped=True)
    with pytest.raises(SpecError, match="allow-dropped"):
        require_nothing_dropped(plan, "sweep.yaml", allow_dropped=False)


@pytest.mark.parametrize("command", ["run", "plan"])
def test_planning_names_the_path_when_the_drafter_path_does_not_exist(
    command: str, tmp_path: Path, kimi_target: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A typo in drafter.path is one error naming drafter.path and the missing path, exit 2: not a
    baseline-only sweep, and not SGLang's Hugging Face "Repo id" message."""
    missing = tmp_path / "drafterr"
    spec = write_spec(tmp_path, kimi_target, missing, speculative={"chain_depths": [3]})
    code = main([command, str(spec)])
    err = capsys.readouterr().err
    assert code == 2
    assert str(missing) in err and "drafter.path" in err and "--draft-config" in err
    assert "Repo id" not in err and "Traceback" not in err


@pytest.mark.parametrize("command", ["run", "plan"])
def test_planning_names_target_config_when_the_target_is_not_on_this_machine(
    command: str,
    tmp_path: Path,
    eagle3_draft: Path,
    sglang_python: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """A model_path that exists only on the GPU nodes, with SGLang's resolver on: one error naming
    model_path and `--target-config DIR`, exit 2 (every point was dropped with SGLang's Hugging Face
    "Repo id" message, which says nothing about the launch)."""
    spec = write_spec(tmp_path, Path("/models/Kimi-K2.5"), eagle3_draft, speculative={"chain_depths": [3]})
    code = main([command, str(spec), "--sglang-python", sglang_python, "--draft-config", str(eagle3_draft)])
    err = capsys.readouterr().err
    assert code == 2
    assert "/models/Kimi-K2.5" in err and "model_path" in err and "--target-config DIR" in err
    assert "Repo id" not in err and "Traceback" not in err
