"""A sweep's inputs across its runs: what a resume compares, and the job ids of inputs that changed.

The sweep id and the plan's job ids hash the spec, not the files it names. So the queue's meta table
keeps the content digests of the inputs (``workers.node.inputs``: input kind -> digest) twice, as JSON:
``inputs_original``, as the sweep's first run saw them, and ``inputs``, as its latest run accepted them.
A resume whose digests differ from ``inputs`` is refused, naming each changed input, unless the user
accepts the change (``run --resume --accept-changed-inputs``); ``inputs`` then becomes the new digests.

Job ids follow the inputs: a job whose inputs (those that concern it: the drafter only for a job that
loads one) are the original ones keeps its plan id, any other gets an id hashing the plan id with its
current digests. Measurements of other inputs are then never one job, and inputs changed back find
their earlier jobs again. The pending jobs of superseded ids are withdrawn from the queue. The
confirmation job (``harness.confirm``) follows the same rule over every input (it loads the drafter).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping

from harness.plan import Plan
from specsweep.errors import InputsChangedError
from workers.job import JobSpec
from workers.load.workloads import PromptSetWorkload

META_ORIGINAL = "inputs_original"
META_CURRENT = "inputs"
ACCEPT_FLAG = "--accept-changed-inputs"


def dumps(digests: Mapping[str, str]) -> str:
    """The stored form of a set of digests (sorted JSON object)."""
    return json.dumps(dict(digests), sort_keys=True)


def loads(text: str | None) -> dict[str, str]:
    """A stored set of digests; empty when none was stored (a sweep from before digests were kept)."""
    if not text:
        return {}
    value = json.loads(text)
    return {str(k): str(v) for k, v in value.items()} if isinstance(value, dict) else {}


def changed_kinds(recorded: Mapping[str, str], current: Mapping[str, str]) -> list[str]:
    """Input kinds both sets hold with different digests (a kind one side could not see is not
    compared: the node workers record what they ran with)."""
    return sorted(kind for kind in recorded.keys() & current.keys() if recorded[kind] != current[kind])


def describe(kind: str, job: JobSpec) -> str:
    """The input of ``kind`` as the user named it in the spec."""
    if kind == "prompts":
        workload = job.load.workload
        if isinstance(workload, PromptSetWorkload):
            label = workload.hf.label if workload.hf is not None else str(workload.path)
            return f"the prompt set {label}"
        return "the prompt set"
    if kind == "drafter" and job.drafter is not None:
        return f"the drafter checkpoint {job.drafter.path}"
    if kind == "target":
        return f"the target's config/tokenizer files in {job.model_path}"
    if kind == "engine":
        return (
            "the simulator's code" if job.engine == "sim" else f"SGLang of {job.sglang_python or 'python3'}"
        )
    return kind


def check_unchanged(
    recorded: Mapping[str, str], current: Mapping[str, str], job: JobSpec, *, where: str, accept: bool
) -> list[str]:
    """The changed kinds (see ``changed_kinds``); ``InputsChangedError`` naming them unless ``accept``."""
    changed = changed_kinds(recorded, current)
    if changed and not accept:
        names = "; ".join(describe(kind, job) for kind in changed)
        raise InputsChangedError(
            f"inputs changed in place since this sweep measured its jobs: {names}",
            where=where,
            fix=f"start the sweep on these inputs in another --out, or resume with {ACCEPT_FLAG} to measure "
            "them under new job ids (earlier results stay, kept apart by `best`)",
        )
    return changed


def concerns(job: JobSpec, digests: Mapping[str, str]) -> dict[str, str]:
    """The digests of ``digests`` that shape ``job``: all but the drafter's for a job without one."""
    return {k: v for k, v in digests.items() if k != "drafter" or job.drafter is not None}


def input_keyed_id(job_id: str, current: Mapping[str, str], original: Mapping[str, str]) -> str:
    """``job_id`` while the ``current`` inputs (those that concern the job) are the ``original`` ones, else
    an id hashing it with the current digests (see the module docstring)."""
    if not changed_kinds(original, current):
        return job_id
    canonical = json.dumps({"job": job_id, "inputs": dict(current)}, sort_keys=True)
    return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def rekeyed(plan: Plan, current: Mapping[str, str], original: Mapping[str, str]) -> tuple[Plan, list[str]]:
    """``plan`` with job ids for the ``current`` inputs (see the module docstring), and the plan ids
    that were superseded."""
    jobs: list[JobSpec] = []
    superseded: list[str] = []
    for job in plan.jobs:
        new_id = input_keyed_id(job.job_id, concerns(job, current), concerns(job, original))
        if new_id == job.job_id:
            jobs.append(job)
            continue
        jobs.append(job.model_copy(update={"job_id": new_id}))
        superseded.append(job.job_id)
    return Plan(sweep_id=plan.sweep_id, verdicts=plan.verdicts, jobs=tuple(jobs)), superseded
