"""Tables printed into a pipe or a file keep every cell on one line (rich folds them at 80 columns)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from harness.cli import build_parser
from harness.commands.plan import validated_plan
from harness.spec import load_spec

REPO = Path(__file__).resolve().parents[2]
SPEC = REPO / "examples" / "kimi-k25-eagle3.yaml"
CONFIGS = ["--target-config", str(REPO / "tests/fixtures/kimi-k25"), "--builtin-only"]
CONFIGS += ["--draft-config", str(REPO / "tests/fixtures/eagle3-draft")]


def test_plan_prints_every_job_id_whole_when_its_output_is_a_pipe() -> None:
    """`specsweep plan ... | less` shows each job id on one line, as in the plan itself (at rich's default
    80 columns for a pipe, the ids and reasons column folded ids across lines)."""
    args = build_parser().parse_args(["plan", str(SPEC), *CONFIGS])
    spec, _ = load_spec(SPEC)
    job_ids = [job.job_id for job in validated_plan(spec, args).jobs]
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "plan", str(SPEC), *CONFIGS],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert len(job_ids) >= 4
    for job_id in job_ids:
        assert job_id in proc.stdout, f"{job_id} is not whole in:\n{proc.stdout}"
    assert max(len(line) for line in proc.stdout.splitlines()) > 80  # the table was not folded to fit
