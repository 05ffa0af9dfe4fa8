"""The search inside a running sweep: from the queue and the committed results to the next jobs.

The queue stays the single source of truth: a job enters it only when the strategy proposes it, so the
queue holds exactly the launches decided so far, and its states say what finished (done), what failed
for good (failed) and what is still to run (pending, leased). A resumed driver rebuilds the same state
from the queue and the committed ``levels`` files, and the pure strategy continues the same search.
The latest belief is stored in the queue's meta table for ``specsweep status``.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from analysis import layout
from analysis.store import ResultStore, as_store
from harness.plan import Plan
from harness.queue import JobQueue
from harness.search.model import Candidate, Capacity, LevelResult, Observation
from harness.search.strategy import Budget, Decision, SearchState, propose
from harness.spec import SweepSpec
from workers.job import JobSpec
from workers.sglang.capacity import reported_capacity

BELIEF_KEY = "search_belief"
LEVEL_COLUMNS = ("load_level", "concurrency", "output_tok_s", "correct_drafts_histogram")


def candidates_of(plan: Plan) -> tuple[Candidate, ...]:
    """One candidate per effective config of the plan, in plan order."""
    seen: dict[str, Candidate] = {}
    for job in plan.jobs:
        eff = job.effective
        seen.setdefault(
            job.config_id,
            Candidate(
                job.config_id,
                job.config_label,
                eff.speculative_num_steps if eff.speculative_algorithm else None,
                eff.speculative_eagle_topk if eff.speculative_algorithm else None,
                eff.speculative_num_draft_tokens if eff.speculative_algorithm else None,
                " ".join(f"{name}={value}" for name, value in job.axes),
            ),
        )
    return tuple(seen.values())


def read_capacity(store: ResultStore, sweep_id: str, job_id: str) -> Capacity | None:
    """What one committed job's server reported about its batches (its ``jobs`` row's ``/server_info``):
    the captured CUDA-graph sizes and the running-request cap; None when it reported nothing."""
    table = store.read_table(
        layout.job_part_path(layout.ROOT, "jobs", sweep_id, job_id), columns=["server_info_json"]
    )
    infos = [row["server_info_json"] for row in table.to_pylist()] if table is not None else []
    if not infos or infos[-1] is None:
        return None
    captured, running_cap = reported_capacity(json.loads(infos[-1]))
    return Capacity(captured, running_cap)


def read_levels(store: ResultStore, sweep_id: str, job_id: str) -> tuple[LevelResult, ...]:
    """The closed-loop levels one committed job measured (its ``levels`` file)."""
    table = store.read_table(
        layout.job_part_path(layout.ROOT, "levels", sweep_id, job_id), columns=list(LEVEL_COLUMNS)
    )
    if table is None:
        return ()
    rows = table.to_pylist()
    return tuple(
        LevelResult(
            level=row["load_level"],
            concurrency=row["concurrency"],
            throughput=row["output_tok_s"] or 0.0,
            histogram=tuple(row["correct_drafts_histogram"]) if row["correct_drafts_histogram"] else None,
        )
        for row in rows
        if row["concurrency"] is not None
    )


class SearchSession:
    """The driver's handle on the search: reads what happened, asks the strategy, queues its answer."""

    def __init__(self, spec: SweepSpec, plan: Plan, out: ResultStore | Path) -> None:
        self.spec = spec
        self.sweep_id = plan.sweep_id
        self.out = as_store(out)
        self.candidates = candidates_of(plan)
        self.jobs = {(job.config_id, job.repeat_index): job for job in plan.jobs}
        self.levels = tuple((f"concurrency={c}", c) for c in spec.load.concurrency)
        self._levels_of: dict[str, tuple[LevelResult, ...]] = {}  # committed job -> its levels
        self._capacity_of: dict[str, Capacity | None] = {}  # committed job -> what its server reported

    def state(self, queue: JobQueue) -> SearchState:
        """What the sweep knows now, from the queue and the committed results."""
        by_id = {job.job_id: job for job in self.jobs.values()}
        node_s: dict[str, float] = {}
        for attempt in queue.attempts():
            if attempt.finished_ns is not None:
                node_s[attempt.job_id] = (
                    node_s.get(attempt.job_id, 0.0) + (attempt.finished_ns - attempt.started_ns) / 1e9
                )
        observations, in_flight, failed = [], set(), set()
        for row in queue.jobs():
            job = by_id.get(row.id)
            if job is None:
                continue
            if row.state == "done":
                if row.id not in self._levels_of:
                    self._levels_of[row.id] = read_levels(self.out, self.sweep_id, row.id)
                    self._capacity_of[row.id] = read_capacity(self.out, self.sweep_id, row.id)
                observations.append(
                    Observation(
                        job.config_id,
                        job.repeat_index,
                        node_s.get(row.id, 0.0),
                        self._levels_of[row.id],
                        self._capacity_of[row.id],
                    )
                )
            elif row.state == "failed":
                failed.add(job.config_id)
            else:
                in_flight.add((job.config_id, job.repeat_index))
        return SearchState(
            candidates=self.candidates,
            levels=self.levels,
            repeats=self.spec.repeats,
            observations=tuple(observations),
            in_flight=frozenset(in_flight),
            failed=frozenset(failed),
            spent_node_s=sum(node_s.values()),
        )

    def next_jobs(self, queue: JobQueue, free: int) -> tuple[Decision, list[JobSpec]]:
        """Ask the strategy for up to ``free`` launches, queue them, store the belief."""
        search = self.spec.search
        budget = Budget(
            max_launches=search.max_launches,
            max_node_s=search.max_node_hours * 3600 if search.max_node_hours is not None else None,
        )
        decision = propose(self.state(queue), free, budget, search.tolerance)
        jobs = [self.jobs[key] for key in decision.launches]
        queue.add_jobs([(job.job_id, job.config_label, job.model_dump_json()) for job in jobs])
        queue.set_meta(BELIEF_KEY, belief_json(decision))
        return decision, jobs


def belief_json(decision: Decision) -> str:
    """The decision as ``specsweep status`` shows it."""
    return json.dumps(
        {
            "reason": decision.reason,
            "finished": decision.finished,
            "launch_noise": decision.launch_noise,
            "levels": [asdict(level) for level in decision.levels],
        }
    )
