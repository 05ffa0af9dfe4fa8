"""Server axes in the spec and the plan: crossed with the grid, validated by SGLang's parser and resolver
(flags) and the environment-variable rule table, owned flags refused, ids of sweeps without axes kept."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.plan import Plan, plan_sweep, unchecked_plan
from harness.spec import parse_spec
from specsweep.errors import SpecError
from tests.harness.sim_sweeps import run_refused_before_launch


def spec_data(kimi_target: Path, eagle3_draft: Path, **changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "engine": "sglang",
        "model_path": str(kimi_target),
        "drafter": {"path": str(eagle3_draft), "format": "sglang"},
        "base_args": ["--tp-size", "8"],
        "speculative": {"chain_depths": [2, 4]},
        "axes": {
            "graph_bs": {"flag": "--cuda-graph-max-bs-decode", "values": ["64", "128"]},
            "spec_v2": {"env": "SGLANG_ENABLE_SPEC_V2", "values": ["0", "1"]},
        },
        "load": {"concurrency": [1, 8], "requests_per_level": 16},
    }
    data.update(changes)
    return data


@pytest.fixture(scope="module")
def sglang_plan(kimi_target: Path, eagle3_draft: Path, sglang_python: str) -> Plan:
    """Two server axes x (baseline + two chains), validated by SGLang 0.5.23's own parser and resolver."""
    return plan_sweep(parse_spec(spec_data(kimi_target, eagle3_draft)), sglang_python=sglang_python)


def test_plan_crosses_every_axis_setting_with_the_grid_when_two_axes_given(sglang_plan: Plan) -> None:
    """Each combination of axis values runs the baseline and every grid point; each job launches with its
    flag value in argv and its variable in the environment, under its own id and a label naming both."""
    assert [v.status for v in sglang_plan.verdicts] == ["ok"] * 12
    assert len(sglang_plan.jobs) == len({j.job_id for j in sglang_plan.jobs}) == 12
    job = next(j for j in sglang_plan.jobs if j.config_label == "chain d=4 [graph_bs=128 spec_v2=1]")
    assert job.axes == (("graph_bs", "128"), ("spec_v2", "1"))
    assert job.launch_args("/d")[:4] == ["--tp-size", "8", "--cuda-graph-max-bs-decode", "128"]
    assert dict(job.env)["SGLANG_ENABLE_SPEC_V2"] == "1"
    labels = [j.config_label for j in sglang_plan.jobs[:3]]
    assert labels == [
        "baseline [graph_bs=64 spec_v2=0]",
        "chain d=2 [graph_bs=64 spec_v2=0]",
        "chain d=4 [graph_bs=64 spec_v2=0]",
    ]


def test_plan_warns_with_the_source_when_an_axis_sweeps_a_variable_sglang_does_not_read(
    sglang_plan: Plan,
) -> None:
    """SGLang 0.5.23 has no SGLANG_ENABLE_SPEC_V2 (spec v2 is its only EAGLE path): every point says so,
    naming the flag that does switch the overlap scheduler, and still runs."""
    for verdict in sglang_plan.verdicts:
        assert any("does not read SGLANG_ENABLE_SPEC_V2" in r for r in verdict.reasons)
        assert any("--disable-overlap-schedule" in r for r in verdict.reasons)


def test_plan_drops_the_points_with_sglangs_message_when_an_axis_value_is_wrong(
    kimi_target: Path, eagle3_draft: Path, sglang_python: str
) -> None:
    """A flag value SGLang's parser refuses drops exactly that value's points, with argparse's words."""
    data = spec_data(kimi_target, eagle3_draft)
    data["axes"]["graph_bs"]["values"] = ["64", "lots"]
    plan = plan_sweep(parse_spec(data), sglang_python=sglang_python)
    dropped = {v.point.label: v.reasons for v in plan.dropped}
    assert len(dropped) == 6 and all("graph_bs=lots" in label for label in dropped)
    assert all("invalid int value: 'lots'" in reasons[0] for reasons in dropped.values())
    assert len(plan.jobs) == 6


def test_run_refuses_before_launch_with_sglangs_message_when_an_axis_value_is_wrong(
    kimi_target: Path, eagle3_draft: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specsweep run` lists the dropped points with SGLang's message and exits 2 before any server (or
    Ray) starts; nothing is written to OUT."""
    data = spec_data(kimi_target, eagle3_draft)
    data["axes"]["graph_bs"]["values"] = ["64", "lots"]
    out, err = run_refused_before_launch(tmp_path, data, eagle3_draft, capsys)
    assert "invalid int value: 'lots'" in out
    assert "6 of 12 point(s) would not run" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("variable", "value", "words"),
    [
        ("SGLANG_ENABLE_DP_SPEC_PREFILL_COORDINATION", "maybe", '"maybe" is not a valid boolean value'),
        ("SGLANG_SIMULATE_ACC_LEN", "2.5", "measures no drafter"),
    ],
)
def test_plan_drops_the_point_when_a_variable_axis_value_is_refused_by_the_rule_table(
    kimi_target: Path, eagle3_draft: Path, variable: str, value: str, words: str
) -> None:
    """A value SGLang would not parse (it warns and runs the default) or one that fakes acceptance makes
    the point invalid; the other value runs."""
    data = spec_data(kimi_target, eagle3_draft, axes={"v": {"env": variable, "values": ["0", value]}})
    plan = plan_sweep(parse_spec(data), use_resolver=False)
    assert {v.point.label for v in plan.dropped} == {
        f"{p} [v={value}]" for p in ("baseline", "chain d=2", "chain d=4")
    }
    assert all(words in v.reasons[0] for v in plan.dropped)
    assert len(plan.jobs) == 3


def test_plan_warns_and_runs_when_an_axis_sweeps_a_variable_the_table_does_not_know(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """An unknown variable is passed through, with a warning on every point that names the table."""
    data = spec_data(kimi_target, eagle3_draft, axes={"x": {"env": "MY_ALLOCATOR", "values": ["a", "b"]}})
    plan = plan_sweep(parse_spec(data), use_resolver=False)
    assert not plan.dropped and len(plan.jobs) == 6
    assert all(any("ENV_RULES" in r for r in v.reasons) for v in plan.verdicts)


def test_plan_gives_a_switch_or_leaves_it_out_when_a_flag_axis_is_a_switch(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """'true' puts a switch in argv, 'false' leaves it out; any other value is refused in the spec."""
    axes = {"overlap_off": {"flag": "--disable-overlap-schedule", "values": ["true", "false"]}}
    plan = plan_sweep(parse_spec(spec_data(kimi_target, eagle3_draft, axes=axes)), use_resolver=False)
    argv = {j.config_label: j.launch_args("/d") for j in plan.jobs}
    assert "--disable-overlap-schedule" in argv["baseline [overlap_off=true]"]
    assert "--disable-overlap-schedule" not in argv["baseline [overlap_off=false]"]
    axes["overlap_off"]["values"] = ["1"]
    with pytest.raises(SpecError, match="takes no value"):
        parse_spec(spec_data(kimi_target, eagle3_draft, axes=axes))


@pytest.mark.parametrize(
    ("axes", "changes", "words"),
    [
        ({"p": {"flag": "--port", "values": ["1"]}}, {}, "--port is set by the sweep"),
        ({"t": {"flag": "--weight-version", "values": ["x"]}}, {}, "--weight-version is set by the sweep"),
        ({"k": {"flag": "--speculative-eagle-topk", "values": ["2"]}}, {}, "is set by the sweep"),
        ({"m": {"flag": "--tp-size", "values": ["4"]}}, {}, "also given in base_args"),
        (
            {"e": {"env": "NCCL_DEBUG", "values": ["INFO"]}},
            {"env": {"NCCL_DEBUG": "WARN"}},
            "also given in env",
        ),
        ({"a": {"flag": "--tp-size", "env": "X", "values": ["1"]}}, {}, "exactly one of flag"),
        ({"a b": {"flag": "--dp-size", "values": ["1"]}}, {}, "a column name"),
        ({"a": {"flag": "--dp-size"}}, {}, "give values"),
        ({"a": {"flag": "--dp-size", "values": ["1", "1"]}}, {}, "given twice"),
        ({"a": {"flag": "--dp-size", "values": [1]}}, {}, "quote it"),
        (
            {"a": {"flag": "--dp-size"}, "b": {"env": "X"}},
            {"axis_points": [{"a": "1"}]},
            "axis_points.0: name every axis once (missing b)",
        ),
        ({}, {"axis_points": [{"a": "1"}]}, "there are no axes"),
    ],
)
def test_spec_refuses_the_axis_with_its_path_when_it_is_malformed_or_owned(
    kimi_target: Path, eagle3_draft: Path, axes: dict[str, Any], changes: dict[str, Any], words: str
) -> None:
    """Axes cannot set what the sweep sets (model, drafter, speculative grid, host, port, the launch tag),
    repeat base_args or env, or be ambiguous; each mistake is one line naming the field."""
    with pytest.raises(SpecError) as err:
        parse_spec(spec_data(kimi_target, eagle3_draft, axes=axes, **changes))
    assert words in err.value.problem


def test_plan_runs_only_the_listed_combinations_when_axis_points_given(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """axis_points replace the cross product: two points, each with the whole grid."""
    data = spec_data(
        kimi_target,
        eagle3_draft,
        axes={"graph_bs": {"flag": "--cuda-graph-max-bs-decode"}, "mrr": {"flag": "--max-running-requests"}},
        axis_points=[{"graph_bs": "64", "mrr": "32"}, {"graph_bs": "256", "mrr": "128"}],
    )
    plan = plan_sweep(parse_spec(data), use_resolver=False)
    assert [j.axes for j in plan.jobs][::3] == [
        (("graph_bs", "64"), ("mrr", "32")),
        (("graph_bs", "256"), ("mrr", "128")),
    ]
    assert len(plan.jobs) == 6 and plan.jobs[-1].effective.max_running_requests == 128


def test_sweep_and_job_ids_stay_when_the_spec_has_no_axes() -> None:
    """A sweep without axes keeps the sweep id and job ids it had before axes existed (resume and result
    files depend on them); the values were computed with the code before this change."""
    spec = parse_spec(
        {
            "engine": "sim",
            "model_path": "dummy",
            "base_args": ["--tp-size", "8"],
            "env": {"NCCL_DEBUG": "INFO"},
            "speculative": {"chain_depths": [2, 4]},
            "load": {"concurrency": [1], "requests_per_level": 4},
        }
    )
    assert spec.sweep_id() == "6edde3f5118a"
    assert [j.job_id for j in unchecked_plan(spec).jobs] == [
        "eb49777886d96fd8",
        "d66ac7c42008af37",
        "3da601d1c67fb8b4",
    ]


def test_search_carries_nothing_across_axis_settings_when_the_sweep_has_axes() -> None:
    """The model has no term for an axis: each setting is seeded on its own, and what one setting
    measured changes no prediction in another."""
    from harness.search.model import Candidate, LevelResult, Observation
    from harness.search.strategy import SearchState, predictions, seed_order

    def space(setting: str) -> list[Candidate]:
        return [
            Candidate(f"{setting}-base", "baseline", None, None, None, setting),
            Candidate(f"{setting}-d2", "chain d=2", 1, 1, 2, setting),
            Candidate(f"{setting}-d4", "chain d=4", 3, 1, 4, setting),
        ]

    candidates = tuple(space("mrr=16") + space("mrr=64"))
    assert [c.config_id for c in seed_order(candidates)] == [
        "mrr=16-base", "mrr=16-d4", "mrr=16-d2", "mrr=64-base", "mrr=64-d4", "mrr=64-d2",
    ]  # fmt: skip

    def observed(setting: str, scale: float) -> list[Observation]:
        return [
            Observation(f"{setting}-base", 0, 60.0, (LevelResult("concurrency=8", 8, 800.0 * scale, None),)),
            Observation(f"{setting}-d4", 0, 60.0, (LevelResult("concurrency=8", 8, 1500.0 * scale, (2, 3, 4, 5)),)),
        ]  # fmt: skip

    def state(observations: list[Observation]) -> SearchState:
        return SearchState(
            candidates, (("concurrency=8", 8),), 1, tuple(observations), frozenset(), frozenset(), 0.0
        )

    alone = predictions(state(observed("mrr=16", 1.0)))
    beside = predictions(state(observed("mrr=16", 1.0) + observed("mrr=64", 3.0)))
    assert beside[("mrr=16-d2", "concurrency=8")] == alone[("mrr=16-d2", "concurrency=8")]
