"""The search session's reading of a sweep: the plan's configs as candidates and each done job's
committed ``levels`` file as its observation, through the real queue and store (no Ray, no server)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from analysis import layout
from harness.plan import unchecked_plan
from harness.queue import JobQueue
from harness.search.model import LevelResult
from harness.search.session import SearchSession
from harness.spec import parse_spec

SPEC = {
    "engine": "sim",
    "model_path": "/m",
    "speculative": {"chain_depths": [2, 3, 4]},
    "load": {"concurrency": [1, 4], "requests_per_level": 4},
    "search": {"strategy": "model"},
}
LEVELS_SCHEMA = pa.schema(
    [
        pa.field("load_level", pa.string()),
        pa.field("concurrency", pa.int64()),
        pa.field("output_tok_s", pa.float64()),
        pa.field("correct_drafts_histogram", pa.list_(pa.int64())),
    ]
)


def _commit_levels(out: Path, sweep_id: str, job_id: str, rows: list[dict[str, object]]) -> None:
    """A job's committed levels file with the columns the session reads."""
    path = out / layout.job_part_path(layout.ROOT, "levels", sweep_id, job_id)
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(rows, schema=LEVELS_SCHEMA), path)


def test_session_candidates_carry_each_configs_shape_when_the_plan_has_a_baseline_and_chains() -> None:
    """One candidate per config in plan order: the baseline has no steps, topk or draft tokens; chain d=k
    runs k - 1 steps, topk 1 and k draft tokens; no server axes, so every subspace is empty."""
    spec = parse_spec(SPEC)
    session = SearchSession(spec, unchecked_plan(spec), Path("/nonexistent"))
    assert [(c.label, c.steps, c.topk, c.draft_tokens, c.subspace) for c in session.candidates] == [
        ("baseline", None, None, None, ""),
        ("chain d=2", 1, 1, 2, ""),
        ("chain d=3", 2, 1, 3, ""),
        ("chain d=4", 3, 1, 4, ""),
    ]
    assert session.levels == (("concurrency=1", 1), ("concurrency=4", 4))


def test_session_state_reads_each_done_jobs_levels_when_they_are_committed(tmp_path: Path) -> None:
    """Both seeds done, each with its levels file: the baseline measured 100 tok/s at 1 client and a
    null throughput at 4 (read as 0), with no histogram; chain d=4 measured 300 tok/s at 1 client with
    the histogram (5, 3, 2, 1, 9). A rate level (no concurrency) is not a closed-loop level: left out.
    Each observation holds exactly those values, in the file's order; a job still pending has none."""
    spec = parse_spec(SPEC)
    plan = unchecked_plan(spec)
    queue = JobQueue(tmp_path)
    session = SearchSession(spec, plan, tmp_path)
    _, jobs = session.next_jobs(queue, 3)
    baseline, chain, pending = jobs
    assert [job.config_label for job in jobs] == ["baseline", "chain d=4", "chain d=2"]
    for _ in (baseline, chain):
        lease = queue.lease(0, other_slots=False)
        assert lease is not None and queue.complete(lease, node="n1", worker_s=1.0)
    _commit_levels(
        tmp_path,
        plan.sweep_id,
        baseline.job_id,
        [
            {"load_level": "concurrency=1", "concurrency": 1, "output_tok_s": 100.0,
             "correct_drafts_histogram": None},
            {"load_level": "rate=2", "concurrency": None, "output_tok_s": 50.0, "correct_drafts_histogram": None},
            {"load_level": "concurrency=4", "concurrency": 4, "output_tok_s": None,
             "correct_drafts_histogram": None},
        ],
    )  # fmt: skip
    _commit_levels(
        tmp_path,
        plan.sweep_id,
        chain.job_id,
        [{"load_level": "concurrency=1", "concurrency": 1, "output_tok_s": 300.0,
          "correct_drafts_histogram": [5, 3, 2, 1, 9]}],
    )  # fmt: skip
    state = session.state(queue)
    queue.close()
    assert {o.config_id: o.levels for o in state.observations} == {
        baseline.config_id: (
            LevelResult("concurrency=1", 1, 100.0, None),
            LevelResult("concurrency=4", 4, 0.0, None),
        ),
        chain.config_id: (LevelResult("concurrency=1", 1, 300.0, (5, 3, 2, 1, 9)),),
    }
    assert state.in_flight == {(pending.config_id, 0)}


def test_session_reads_max_node_hours_as_hours_when_it_sets_the_node_budget(tmp_path: Path) -> None:
    """max_node_hours 1 is 3600 node-seconds: after the baseline's one 600 s attempt, 3000 s are left,
    enough for the next seed (a launch is estimated at the 600 s one took), so the session queues it;
    read as 1/3600 s the budget would be spent already."""
    import sqlite3

    from harness.queue import QUEUE_FILE

    spec = parse_spec(SPEC | {"search": {"strategy": "model", "max_node_hours": 1}})
    queue = JobQueue(tmp_path)
    session = SearchSession(spec, unchecked_plan(spec), tmp_path)
    _, jobs = session.next_jobs(queue, 1)
    lease = queue.lease(0, other_slots=False)
    assert lease is not None and queue.complete(lease, node="n1", worker_s=1.0)
    with sqlite3.connect(tmp_path / QUEUE_FILE) as con:
        con.execute("UPDATE attempts SET started_ns = 0, finished_ns = 600000000000")
    decision, more = session.next_jobs(queue, 1)
    queue.close()
    assert [job.config_label for job in (*jobs, *more)] == ["baseline", "chain d=4"]
    assert decision.reason == "seed"


def test_session_takes_the_tighter_of_both_budgets_when_launches_and_node_hours_are_limited(
    tmp_path: Path,
) -> None:
    """max_launches 2 and max_node_hours 1: after the baseline's 600 s launch the launch budget leaves 1
    launch and the node budget (3600 - 600) / 600 = 5; with 2 slots free only 1 is queued. With every
    seed in flight and nothing to decide, the session says it is waiting for them."""
    import sqlite3

    from harness.queue import QUEUE_FILE

    limits = {"strategy": "model", "max_launches": 2, "max_node_hours": 1}
    spec = parse_spec(SPEC | {"search": limits})
    queue = JobQueue(tmp_path)
    session = SearchSession(spec, unchecked_plan(spec), tmp_path)
    session.next_jobs(queue, 1)
    lease = queue.lease(0, other_slots=False)
    assert lease is not None and queue.complete(lease, node="n1", worker_s=1.0)
    with sqlite3.connect(tmp_path / QUEUE_FILE) as con:
        con.execute("UPDATE attempts SET started_ns = 0, finished_ns = 600000000000")
    _, more = session.next_jobs(queue, 2)
    assert [job.config_label for job in more] == ["chain d=4"]
    unlimited = parse_spec(SPEC | {"load": {"concurrency": [1], "requests_per_level": 4}})
    waiting = SearchSession(unlimited, unchecked_plan(unlimited), tmp_path / "other")
    other = JobQueue(tmp_path / "other")
    _, seeds = waiting.next_jobs(other, 8)
    decision, none = waiting.next_jobs(other, 8)
    other.close()
    queue.close()
    assert seeds and none == []
    assert (decision.reason, decision.finished) == ("waiting for launches in flight", False)


def test_session_proposes_the_next_seed_when_a_chain_finishes_before_the_baseline(tmp_path: Path) -> None:
    """The first two seeds run at once and chain d=4 finishes first (300 and 900 tok/s at 1 and 4
    clients): with the baseline still running, and so predicted rather than measured, the next seed
    (chain d=2) is proposed, and at both levels chain d=4 is the best so far."""
    spec = parse_spec(SPEC)
    plan = unchecked_plan(spec)
    queue = JobQueue(tmp_path)
    session = SearchSession(spec, plan, tmp_path)
    _, (baseline, chain) = session.next_jobs(queue, 2)
    running = queue.lease(0, other_slots=False)
    assert running is not None and running.job_id == baseline.job_id  # still running
    lease = queue.lease(1, other_slots=False)
    assert (
        lease is not None and lease.job_id == chain.job_id and queue.complete(lease, node="n1", worker_s=1.0)
    )
    _commit_levels(
        tmp_path,
        plan.sweep_id,
        chain.job_id,
        [{"load_level": "concurrency=1", "concurrency": 1, "output_tok_s": 300.0,
          "correct_drafts_histogram": [2, 2, 2, 4]},
         {"load_level": "concurrency=4", "concurrency": 4, "output_tok_s": 900.0,
          "correct_drafts_histogram": [3, 2, 2, 3]}],
    )  # fmt: skip
    decision, jobs = session.next_jobs(queue, 1)
    queue.close()
    assert [job.config_label for job in jobs] == ["chain d=2"] and decision.reason == "seed"
    assert [(b.level, b.best_label) for b in decision.levels] == [
        ("concurrency=1", "chain d=4"),
        ("concurrency=4", "chain d=4"),
    ]
