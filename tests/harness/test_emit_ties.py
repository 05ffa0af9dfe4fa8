"""``best --emit`` inside a tie: the simpler launch is deployed, and the output and deploy.json say why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KIMI, DRAFT = str(FIXTURES / "kimi-k2"), str(FIXTURES / "eagle3-draft")
SPEC = f"""engine: sglang
model_path: {KIMI}
drafter:
  path: {DRAFT}
  format: speculators
speculative:
  algorithm: EAGLE3
  chain_depths: [4, 5]
load:
  concurrency: [1, 16]
  requests_per_level: 2000
"""


def test_best_emit_deploys_the_simpler_static_launch_when_it_ties_with_the_best_and_the_schedule(
    tmp_path: Path,
) -> None:
    """chain d=5 (accept length 2.72) leads chain d=4 (2.68) by ~1.5% at both levels, one launch each:
    under the assumed 2% launch noise their mix scores (1.000 and ~0.985) differ by far less than
    1.96 x sqrt(2) x 1% x ~1 = 2.8%, a tie, so the 4-draft-token chain d=4 is the static launch. The
    adaptive schedule runs chain d=5's depth at both levels, the same launch as static chain d=5: its
    1.000 does not separate from chain d=4 either, so static is recommended (launch.sh is static),
    and both preferences are printed and written to deploy.json."""
    out, dest = tmp_path / "out", tmp_path / "deploy"
    configs = (
        SyntheticConfig("baseline"),
        SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.68, step_cost=1.1),
        SyntheticConfig("chain d=5", "EAGLE3", 4, 1, 5, accept_length=2.72, step_cost=1.1),
    )
    sweep = SyntheticSweep(
        configs=configs, concurrencies=(1, 16), requests_per_level=2000, seed=11, model_path=KIMI,
        draft_model_path=DRAFT,
    )  # fmt: skip
    write_sweep(out, sweep, spec_text=SPEC)
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "best", str(out), "--emit", str(dest)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads((dest / "deploy.json").read_text())
    assert result["adaptive"]["chosen"] == {"concurrency=1": "chain d=5", "concurrency=16": "chain d=5"}
    assert result["static"]["config_label"] == "chain d=4" and result["recommended"] == "static"
    assert result["tie"] == ["chain d=5", "chain d=4", "adaptive"]
    static_why, adaptive_why = result["preference"]
    assert static_why.startswith("static 'chain d=4' (0.98") and "the simpler launch" in static_why
    assert adaptive_why.startswith("adaptive (1.000) and static 'chain d=4' (0.98")
    assert "not separable at 95% on the mix: static recommended, the simpler launch" in adaptive_why
    assert "recommended static" in done.stdout
    assert f"   prefer: {static_why}" in done.stdout and f"   prefer: {adaptive_why}" in done.stdout
    assert "--speculative-adaptive" not in (dest / "launch.sh").read_text()
    assert "--speculative-num-draft-tokens 4" in (dest / "launch.sh").read_text()
