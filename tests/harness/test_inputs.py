"""The resume's input check and the job ids of changed inputs (harness/inputs.py), without Ray: the
plan of a sweep, and digests as the driver records them."""

from __future__ import annotations

import pytest

from harness.inputs import check_unchanged, rekeyed
from harness.plan import Plan, unchecked_plan
from harness.spec import parse_spec
from specsweep.errors import InputsChangedError

ORIGINAL = {"prompts": "p1", "drafter": "d1", "target": "t1", "engine": "sim s1"}


def _plan() -> Plan:
    return unchecked_plan(
        parse_spec(
            {
                "engine": "sim",
                "model_path": "/models/target",
                "drafter": {"path": "/models/drafter"},
                "speculative": {"chain_depths": [2, 3]},
                "repeats": 2,
                "load": {"concurrency": [1], "requests_per_level": 1},
            }
        )
    )


def test_rekeyed_gives_new_ids_to_speculative_jobs_only_when_drafter_changed() -> None:
    """A drafter change concerns only jobs that load it: they get new ids (all distinct), the baseline
    keeps its ids; the original digests give the plan's own ids back."""
    plan = _plan()
    same, superseded = rekeyed(plan, ORIGINAL, ORIGINAL)
    assert same == plan and superseded == []
    changed, superseded = rekeyed(plan, {**ORIGINAL, "drafter": "d2"}, ORIGINAL)
    for old, new in zip(plan.jobs, changed.jobs, strict=True):
        assert (old.job_id != new.job_id) == (old.drafter is not None), old.config_label
    speculative = {j.job_id for j in plan.jobs if j.drafter is not None}
    assert set(superseded) == speculative and len(speculative) == 4
    assert len({j.job_id for j in changed.jobs} | {j.job_id for j in plan.jobs}) == len(plan.jobs) + 4


def test_rekeyed_gives_every_job_a_new_id_when_prompts_changed() -> None:
    """The prompt set shapes every job, the baseline included; other new digests, other new ids."""
    plan = _plan()
    first, _ = rekeyed(plan, {**ORIGINAL, "prompts": "p2"}, ORIGINAL)
    second, _ = rekeyed(plan, {**ORIGINAL, "prompts": "p3"}, ORIGINAL)
    ids = [{j.job_id for j in p.jobs} for p in (plan, first, second)]
    assert len(ids[0] | ids[1] | ids[2]) == 3 * len(plan.jobs)


def test_check_unchanged_names_the_changed_input_when_resume_not_accepted() -> None:
    """A changed digest refuses with one problem line naming the input by its path and a fix naming both
    ways on; accepted, it returns the changed kinds; a kind one side lacks is not compared."""
    job = next(j for j in _plan().jobs if j.drafter is not None)
    with pytest.raises(InputsChangedError) as caught:
        check_unchanged(ORIGINAL, {**ORIGINAL, "drafter": "d2"}, job, where="OUT", accept=False)
    err = caught.value
    assert "the drafter checkpoint /models/drafter" in err.problem and "\n" not in err.problem
    assert err.where == "OUT" and err.fix is not None
    assert "--accept-changed-inputs" in err.fix and "--out" in err.fix
    changed = check_unchanged(ORIGINAL, {**ORIGINAL, "drafter": "d2"}, job, where="OUT", accept=True)
    assert changed == ["drafter"]
    no_engine = {k: v for k, v in ORIGINAL.items() if k != "engine"}
    assert check_unchanged(no_engine, {**ORIGINAL, "engine": "x"}, job, where="OUT", accept=False) == []
