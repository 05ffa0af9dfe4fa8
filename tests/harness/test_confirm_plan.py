"""The confirmation job the driver queues, built from a sweep's committed results (no Ray, no server)."""

from __future__ import annotations

from pathlib import Path

import yaml

from analysis.synthetic import SyntheticSweep, write_sweep
from harness.confirm import CONFIRMATION_LABEL, confirmation_job_id, plan_confirmation
from harness.plan import unchecked_plan
from harness.spec import parse_spec
from tests.harness.test_emit import CONFIGS, DRAFT, KIMI, SPEC


def _results(out: Path) -> None:
    sweep = SyntheticSweep(
        configs=CONFIGS, concurrencies=(1, 16, 64), requests_per_level=300, seed=7, model_path=KIMI,
        draft_model_path=DRAFT,
    )  # fmt: skip
    write_sweep(out, sweep, spec_text=SPEC)


def test_plan_confirmation_turns_the_deepest_scheduled_chain_adaptive_when_chains_win(tmp_path: Path) -> None:
    """The job is the deepest scheduled chain's launch at that depth, topk 1, adaptive, with the schedule
    best --emit builds (midpoint thresholds), role confirmation and the sweep's one confirmation id."""
    _results(tmp_path)
    spec = parse_spec(yaml.safe_load(SPEC))
    plan = unchecked_plan(spec)
    confirmation = plan_confirmation(spec, plan, tmp_path)
    job = confirmation.job
    assert job is not None and job.role == "confirmation" and job.config_label == CONFIRMATION_LABEL
    assert job.job_id == confirmation_job_id(plan.sweep_id) != confirmation_job_id("another sweep")
    assert dict(job.adaptive_steps) == {1: 3, 4: 3, 32: 0}
    assert confirmation.note == "batch>=1: 3 steps, batch>=4: 3 steps, batch>=32: 0 steps"
    eff = job.effective
    assert (eff.speculative_num_steps, eff.speculative_eagle_topk, eff.speculative_num_draft_tokens) == (
        3,
        1,
        4,
    )
    assert eff.speculative_adaptive and job.requested == eff
    args = job.launch_args("/node/drafter", "/node/logs/adaptive.json")
    assert args[-3:] == [
        "--speculative-adaptive",
        "--speculative-adaptive-config",
        "/node/logs/adaptive.json",
    ]
    assert job.adaptive_config() == {
        "1": {"candidate_steps": [3]}, "4": {"candidate_steps": [3]}, "32": {"candidate_steps": [0]},
    }  # fmt: skip


def test_plan_confirmation_says_why_instead_of_raising_when_weights_name_an_unknown_level(
    tmp_path: Path,
) -> None:
    """A load mix the results cannot serve leaves the sweep done, with the reason, and no job."""
    _results(tmp_path)
    spec = parse_spec({**yaml.safe_load(SPEC), "deploy_weights": {"concurrency=2": 1}})
    confirmation = plan_confirmation(spec, unchecked_plan(spec), tmp_path)
    assert confirmation.job is None
    assert "concurrency=2" in confirmation.note and "deploy_weights" in confirmation.note
