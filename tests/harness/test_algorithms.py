"""The speculative algorithm as an axis: a list of algorithms in the spec, each with its own settings,
validated by SGLang's resolver before launch, only EAGLE3/EAGLE converting the drafter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.plan import Plan, plan_sweep
from harness.spec import parse_spec
from specsweep.errors import SpecError
from tests.harness.sim_sweeps import run_refused_before_launch
from workers.sglang.deploy import deploy_args

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
DEEPSEEK = FIXTURES / "deepseek-v3"
DEEPSEEK_DRAFT = FIXTURES / "deepseek-v3-eagle3-draft"


def spec_data(**speculative: Any) -> dict[str, Any]:
    return {
        "engine": "sglang",
        "model_path": str(DEEPSEEK),
        "drafter": {"path": str(DEEPSEEK_DRAFT), "format": "sglang"},
        "base_args": ["--tp-size", "8"],
        "speculative": {"algorithm": ["EAGLE3", "NEXTN", "NGRAM"], "chain_depths": [2, 4], **speculative},
        "load": {"concurrency": [1, 8], "requests_per_level": 16},
    }


@pytest.fixture(scope="module")
def sglang_plan(sglang_python: str) -> Plan:
    """EAGLE3 vs NEXTN vs NGRAM (two chains each) on a DeepSeek-V3 target, checked by SGLang 0.5.23."""
    data = spec_data(per_algorithm={"NGRAM": {"args": ["--speculative-ngram-max-bfs-breadth", "1"]}})
    return plan_sweep(parse_spec(data), sglang_python=sglang_python)


def test_plan_runs_each_algorithm_over_the_grid_when_algorithm_is_a_list(sglang_plan: Plan) -> None:
    """One baseline, then every chain per algorithm; the algorithm is the speculative_algorithm axis of
    each job and its label; NEXTN runs as SGLang's EAGLE on the target's MTP layers and NGRAM's tree is a
    chain because its own flag says so (SGLang takes topk from --speculative-ngram-max-bfs-breadth)."""
    assert [v.status for v in sglang_plan.verdicts] == ["ok"] * 7
    labels = [j.config_label for j in sglang_plan.jobs]
    assert labels[:3] == [
        "baseline",
        "chain d=2 [speculative_algorithm=EAGLE3]",
        "chain d=4 [speculative_algorithm=EAGLE3]",
    ]
    assert len(set(labels)) == 7 and sglang_plan.jobs[0].axes == ()
    by_label = {j.config_label: j for j in sglang_plan.jobs}
    nextn = by_label["chain d=4 [speculative_algorithm=NEXTN]"]
    assert nextn.axes == (("speculative_algorithm", "NEXTN"),)
    assert nextn.effective.speculative_algorithm == "EAGLE"
    ngram = by_label["chain d=4 [speculative_algorithm=NGRAM]"]
    assert ngram.effective.speculative_eagle_topk == 1 and ngram.effective.speculative_num_draft_tokens == 4
    assert "--speculative-ngram-max-bfs-breadth" in ngram.launch_args(None)
    assert "--speculative-ngram-max-bfs-breadth" not in nextn.launch_args(None)


def test_plan_gives_the_drafter_only_to_eagle3_when_algorithms_are_compared(sglang_plan: Plan) -> None:
    """Only EAGLE3 (and EAGLE) jobs carry the drafter, which the node converts before launch; NEXTN and
    NGRAM jobs carry none, so the node skips the conversion and launches without a draft path."""
    for job in sglang_plan.jobs[1:]:
        algorithm = dict(job.axes)["speculative_algorithm"]
        assert (job.drafter is not None) == (algorithm == "EAGLE3"), job.config_label
        if algorithm != "EAGLE3":
            assert not any(a.startswith("--speculative-draft-model") for a in job.launch_args(None))


@pytest.mark.parametrize(
    ("settings", "words"),
    [
        ({"args": ["--speculative-ngram-match-type", "LONGEST"]}, "invalid choice: 'LONGEST'"),
        (
            {"args": ["--enable-dp-attention", "--dp-size", "2"]},
            "Currently ngram speculative decoding does not support dp attention.",
        ),
    ],
)
def test_plan_drops_the_algorithms_points_with_sglangs_message_when_its_parameter_is_wrong(
    sglang_python: str, settings: dict[str, Any], words: str
) -> None:
    """A flag of one algorithm that SGLang refuses drops exactly that algorithm's points, in SGLang's
    words; the other algorithms run."""
    plan = plan_sweep(parse_spec(spec_data(per_algorithm={"NGRAM": settings})), sglang_python=sglang_python)
    dropped = {v.point.label: v.reasons for v in plan.dropped}
    assert set(dropped) == {f"chain d={d} [speculative_algorithm=NGRAM]" for d in (2, 4)}
    assert all(words in reasons[0] for reasons in dropped.values())
    assert len(plan.jobs) == 5


def test_run_refuses_before_launch_with_sglangs_message_when_an_algorithms_parameter_is_wrong(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specsweep run` lists the NGRAM points SGLang refuses and exits 2 before any server starts."""
    data = spec_data(per_algorithm={"NGRAM": {"args": ["--speculative-ngram-match-type", "LONGEST"]}})
    out, err = run_refused_before_launch(tmp_path, data, DEEPSEEK_DRAFT, capsys)
    assert "invalid choice: 'LONGEST'" in out
    assert "2 of 7 point(s) would not run" in err and "Traceback" not in err


@pytest.mark.parametrize(
    ("speculative", "words"),
    [
        (
            {"algorithm": ["EAGLE3", "STANDALONE"]},
            "per_algorithm.STANDALONE.draft_model_path: STANDALONE drafts",
        ),
        (
            {"per_algorithm": {"NGRAM": {"draft_model_path": "/m"}}},
            "per_algorithm.NGRAM.draft_model_path: NGRAM takes no draft model",
        ),
        (
            {"per_algorithm": {"EAGLE3": {"draft_model_path": "/m"}}},
            "EAGLE3 takes the spec's drafter",
        ),
        ({"per_algorithm": {"MEDUSA": {}}}, "per_algorithm.MEDUSA: MEDUSA is not in speculative.algorithm"),
        (
            {"per_algorithm": {"NGRAM": {"args": ["--speculative-num-steps", "2"]}}},
            "per_algorithm.NGRAM.args: --speculative-num-steps is set by the sweep",
        ),
        (
            {"per_algorithm": {"NGRAM": {"args": ["--tp-size", "4"]}}},
            "--tp-size is also given in base_args",
        ),
        ({"algorithm": ["EAGLE3", "eagle3"]}, "EAGLE3 given twice"),
    ],
)
def test_spec_refuses_the_algorithm_settings_with_their_path_when_inconsistent(
    speculative: dict[str, Any], words: str
) -> None:
    """Each algorithm gets the draft model it loads and flags the sweep does not set; one line each."""
    with pytest.raises(SpecError) as err:
        parse_spec(spec_data(**speculative))
    assert words in err.value.problem


def test_sweep_id_stays_when_the_algorithm_is_one_string() -> None:
    """A spec with one algorithm string and no per-algorithm settings keeps the sweep id it had before
    algorithms could be listed (the value was computed with the code before this change)."""
    spec = parse_spec(
        {
            "engine": "sim",
            "model_path": "dummy",
            "speculative": {"algorithm": "EAGLE3", "chain_depths": [2, 4]},
            "load": {"concurrency": [1], "requests_per_level": 4},
        }
    )
    assert spec.sweep_id() == SWEEP_ID_BEFORE


SWEEP_ID_BEFORE = "c3aa051a1423"


def test_deploy_args_keep_a_standalone_draft_when_the_drafter_is_published() -> None:
    """`best --emit` points an EAGLE3 launch at the published drafter; a STANDALONE launch's small draft
    model is its own, not the drafter's, and stays."""
    draft = ["--speculative-draft-model-path"]
    eagle3 = ["--model-path", "/n/t", "--speculative-algorithm", "EAGLE3", *draft, "/cache/converted"]
    standalone = ["--model-path", "/n/t", "--speculative-algorithm=STANDALONE", *draft, "/models/small"]
    assert deploy_args(eagle3, model_path="/t", draft_path="/pub")[-1] == "/pub"
    assert deploy_args(standalone, model_path="/t", draft_path="/pub")[-1] == "/models/small"
