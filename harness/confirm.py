"""The confirmation job: after the sweep's launches, one launch of the adaptive schedule built from them.

``best --emit`` predicts what an adaptive server (``--speculative-adaptive``, one depth per batch-size
slot) would deliver from the per-level winners among topk-1 chains and the baseline; this job measures
it. It is the deepest scheduled chain's job turned adaptive (``JobSpec.adaptive_steps``; the node writes
the config file), on the same load levels, with ``role = "confirmation"`` in its jobs row.

The queue stays the single source of truth: the job's id is derived from the sweep id alone (one
confirmation per sweep and set of inputs), so a driver queues it only when the queue does not hold it in
any state. A resumed driver therefore never relaunches a finished confirmation, and one that died before
queueing it builds it from the same committed results (the same schedule) and queues it then. After
``run --resume --accept-changed-inputs`` the id also hashes the new inputs' digests
(``harness.inputs.input_keyed_id``), as the sweep's own jobs do: a confirmation measured on the earlier
inputs is never taken for the new one, which is built from the new inputs' results and launched.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from analysis.deploy import config_shapes, level_concurrency, plan_deployment
from analysis.select import select_best
from analysis.store import ResultStore
from analysis.views import connect, readable_results
from harness.plan import Plan, job_id
from harness.spec import SweepSpec
from specsweep.errors import ResultsError
from workers.job import JobSpec

CONFIRMATION_LABEL = "adaptive"
SCHEDULE_REPLICATES = 100  # the schedule needs only the per-level rankings; the intervals are not used


@dataclass(frozen=True, slots=True)
class ConfirmationPlan:
    """The confirmation job to queue, or why there is none."""

    job: JobSpec | None
    note: str


def confirmation_job_id(sweep_id: str) -> str:
    """The one confirmation job id of a sweep."""
    return job_id({"confirmation": sweep_id}, {}, 0)


def schedule_text(steps_by_batch_size: dict[int, int]) -> str:
    """``batch>=1: 7 steps, batch>=16: 3 steps, ...`` (0 steps: no drafting)."""
    return ", ".join(f"batch>={bs}: {steps} steps" for bs, steps in sorted(steps_by_batch_size.items()))


def plan_confirmation(
    spec: SweepSpec, plan: Plan, store: ResultStore, job_id: str | None = None
) -> ConfirmationPlan:
    """Build the confirmation job from the committed results (as ``best --emit`` ranks them by default:
    throughput, no SLO, the spec's load mix: the jobs of the current inputs); a sweep whose results give
    no schedule gets none, and why. ``job_id``: its id on the sweep's current inputs (default: on its first
    ones, ``confirmation_job_id``)."""
    try:
        with readable_results(store):
            con = connect(store)
            try:
                selection = select_best(con, store, replicates=SCHEDULE_REPLICATES, allow_partial=True)
                deployment = plan_deployment(
                    selection, config_shapes(con), level_concurrency(con), spec.deploy_weights or None
                )
            finally:
                con.close()
    except ResultsError as err:  # nothing ranked, bad deploy_weights, ...: the sweep itself is done
        return ConfirmationPlan(None, f"{err.problem} ({err.where})" if err.where else err.problem)
    adaptive = deployment.adaptive
    if adaptive is None:
        return ConfirmationPlan(None, deployment.adaptive_note or "no adaptive schedule")
    base = next(
        (job for job in plan.jobs if job.config_label == adaptive.chain_label and job.repeat_index == 0), None
    )
    if base is None:
        return ConfirmationPlan(None, f"the plan has no job of {adaptive.chain_label!r} to build on")
    schedule = adaptive.steps_by_batch_size
    steps = max(schedule.values())
    effective = replace(
        base.effective,
        speculative_num_steps=steps,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=steps + 1,
        speculative_adaptive=True,
    )
    text = schedule_text(schedule)
    job_id = job_id or confirmation_job_id(plan.sweep_id)
    job = base.model_copy(
        update={
            "job_id": job_id,
            "config_id": job_id[:12],
            "config_label": CONFIRMATION_LABEL,
            "repeat_index": 0,
            "requested": effective,
            "effective": effective,
            "requested_points": (f"{CONFIRMATION_LABEL} {text}",),
            "role": "confirmation",
            "adaptive_steps": tuple(sorted(schedule.items())),
        }
    )
    return ConfirmationPlan(job, text)
