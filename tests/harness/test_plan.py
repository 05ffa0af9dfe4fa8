"""The planner: grid expansion, validation in one SGLang process, drops with reasons, collapse, ids."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.plan import Plan, grid_points, plan_sweep
from harness.spec import parse_spec


def spec_data(kimi_target: Path, eagle3_draft: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "engine": "sglang",
        "model_path": str(kimi_target),
        "drafter": {"path": str(eagle3_draft), "format": "sglang"},
        "base_args": ["--tp-size", "8"],
        "speculative": {
            "num_steps": [1, 3],
            "topk": [1],
            "num_draft_tokens": [2, 16],
            "chain_depths": [4, 2],
        },
        "load": {"concurrency": [1, 8], "requests_per_level": 16},
        "repeats": 2,
    }
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def sglang_plan(kimi_target: Path, eagle3_draft: Path, sglang_python: str) -> Plan:
    """The grid validated by SGLang 0.5.23's own resolver (one process for all points)."""
    return plan_sweep(parse_spec(spec_data(kimi_target, eagle3_draft)), sglang_python=sglang_python)


def test_plan_expands_chains_as_topk_one_when_chain_depths_given(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """chain_depths d means topk 1, d draft tokens, d - 1 steps; the baseline comes first."""
    points = grid_points(parse_spec(spec_data(kimi_target, eagle3_draft)))
    labels = [p.label for p in points]
    assert labels[0] == "baseline" and "chain d=4" in labels and len(points) == 1 + 4 + 2
    chain = next(p for p in points if p.label == "chain d=4").requested
    assert (
        chain.speculative_num_steps,
        chain.speculative_eagle_topk,
        chain.speculative_num_draft_tokens,
    ) == (3, 1, 4)


def test_plan_collapses_points_that_sglang_runs_identically_when_validated(sglang_plan: Plan) -> None:
    """topk 1 with 16 draft tokens and 1 step runs as 2 draft tokens: one job serves both points,
    and the chain d=2 point too; s=3 points collapse with chain d=4."""
    config_of = {v.point.label: v.config_id for v in sglang_plan.verdicts}
    assert config_of["tree s=1 k=1 n=16"] == config_of["tree s=1 k=1 n=2"] == config_of["chain d=2"]
    assert config_of["tree s=3 k=1 n=16"] == config_of["chain d=4"]
    adjusted = next(v for v in sglang_plan.verdicts if v.point.label == "tree s=1 k=1 n=16")
    assert adjusted.status == "adjusted" and adjusted.effective is not None
    assert adjusted.effective.speculative_num_draft_tokens == 2
    configs = {j.config_id for j in sglang_plan.jobs}
    assert len(configs) == 3  # baseline, depth 2, depth 4
    served = next(j for j in sglang_plan.jobs if j.config_id == config_of["chain d=2"]).requested_points
    assert set(served) == {"tree s=1 k=1 n=2", "tree s=1 k=1 n=16", "chain d=2"}


def test_plan_orders_repeats_after_every_config_when_repeats_given(sglang_plan: Plan) -> None:
    """All configs once (baseline first) before any repeat; job ids differ per repeat."""
    assert [j.repeat_index for j in sglang_plan.jobs] == [0, 0, 0, 1, 1, 1]
    assert sglang_plan.jobs[0].config_label == "baseline"
    assert sglang_plan.jobs[0].effective.speculative_algorithm is None
    assert len({j.job_id for j in sglang_plan.jobs}) == 6


def test_plan_gives_same_job_ids_when_planned_again(
    kimi_target: Path, eagle3_draft: Path, sglang_plan: Plan
) -> None:
    """Ids hash the effective config, load plan and repeat: the built-in layer gives the same ids."""
    again = plan_sweep(parse_spec(spec_data(kimi_target, eagle3_draft)), use_resolver=False)
    assert [j.job_id for j in again.jobs] == [j.job_id for j in sglang_plan.jobs]
    other_load = plan_sweep(
        parse_spec(spec_data(kimi_target, eagle3_draft, load={"concurrency": [1], "requests_per_level": 16})),
        use_resolver=False,
    )
    assert not {j.job_id for j in other_load.jobs} & {j.job_id for j in sglang_plan.jobs}


def test_plan_drops_points_with_reasons_when_sglang_refuses_them(
    kimi_target: Path, eagle3_draft: Path, sglang_python: str
) -> None:
    """A point SGLang 0.5.23's own resolver refuses (topk > 1 with page size 16 on torch_native) is dropped
    with SGLang's exception as the reason; the chain point on the same base args stays."""
    base_args = ["--tp-size", "8", "--page-size", "16", "--attention-backend", "torch_native"]
    speculative = {"num_steps": [2], "topk": [1, 2], "num_draft_tokens": [3]}
    data = spec_data(kimi_target, eagle3_draft, base_args=base_args, speculative=speculative)
    plan = plan_sweep(parse_spec(data), sglang_python=sglang_python)
    (dropped,) = plan.dropped
    assert dropped.point.label == "tree s=2 k=2 n=3" and dropped.status == "invalid"
    (reason,) = dropped.reasons
    assert reason.startswith(
        "SGLang's resolver raised ValueError: speculative_eagle_topk > 1 with page_size > 1"
    )
    assert {j.config_label for j in plan.jobs} == {"baseline", "tree s=2 k=1 n=3"}


def test_plan_drops_points_with_reasons_when_drafts_exceed_the_tree(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """A draft-token count above steps * topk + 1 (a project rule SGLang does not enforce) is dropped with
    the reason by the built-in layer; the rest stay."""
    data = spec_data(
        kimi_target, eagle3_draft, speculative={"num_steps": [2], "topk": [2], "num_draft_tokens": [5, 9]}
    )
    plan = plan_sweep(parse_spec(data), use_resolver=False)
    (dropped,) = plan.dropped
    assert dropped.point.label == "tree s=2 k=2 n=9" and dropped.status == "invalid"
    assert any("9" in reason for reason in dropped.reasons)
    assert {j.config_label for j in plan.jobs} == {"baseline", "tree s=2 k=2 n=5"}


def test_plan_refuses_every_point_naming_the_flag_when_base_args_have_an_unknown_flag(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """An unknown flag in base_args invalidates every point, and each reason names it."""
    data = spec_data(kimi_target, eagle3_draft, base_args=["--tp-size", "8", "--num-speculative-tokens", "4"])
    plan = plan_sweep(parse_spec(data), use_resolver=False)
    assert plan.jobs == ()
    assert all("--num-speculative-tokens" in " ".join(v.reasons) for v in plan.verdicts)
