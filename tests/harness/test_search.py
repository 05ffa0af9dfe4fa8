"""The model-based search, without a server: a synthetic world whose truth is known exactly.

The world follows the model's assumptions (linear step costs, acceptance falling with depth, siblings
worth part of a first candidate), so the search must find its true best per level, with far fewer
launches than the grid, and never launch a (config, repeat) twice.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from harness.cli import main
from harness.plan import unchecked_plan
from harness.queue import JobQueue
from harness.search.model import Candidate, LevelResult, Observation, accept_length, chain_acceptance
from harness.search.session import SearchSession
from harness.search.strategy import Budget, SearchState, propose, seed_order
from harness.spec import parse_spec

LEVELS = (("concurrency=1", 1), ("concurrency=8", 8), ("concurrency=32", 32))
Q = (0.8, 0.75, 0.7, 0.65, 0.6, 0.55, 0.5, 0.45, 0.4)  # true chain acceptance by position
GAIN = 0.4
COSTS = (0.014, 0.0004, 0.000004, 0.0004)  # c0, c1 (per draft pass), c2 (per B D k), c3 (per B V)
PREFILL = 0.0002  # K per level, per batch member


def space() -> tuple[Candidate, ...]:
    """The baseline, chains 2..8 and trees: 21 configs."""
    items = [Candidate("base", "baseline", None, None, None)]
    items += [Candidate(f"c{d}", f"chain d={d}", d - 1, 1, d) for d in range(2, 9)]
    items += [
        Candidate(f"t{s}-{k}-{n}", f"tree s={s} k={k} n={n}", s, k, n)
        for s in (2, 3, 4)
        for k in (2, 4)
        for n in (4, 6, 8, 10)
        if s + 1 < n <= s * k + 1
    ]
    return tuple(items)


def true_accept(cand: Candidate) -> float:
    return accept_length(cand, list(Q), GAIN, extrapolate=0.0) if cand.speculative else 1.0


def true_throughput(cand: Candidate, batch: int) -> float:
    step = sum(c * f for c, f in zip(COSTS, cand.step_features(batch), strict=True))
    a = true_accept(cand)
    return a * batch / (step + PREFILL * batch * a)


def histogram(cand: Candidate, steps: int) -> tuple[int, ...]:
    """Exact expected counts of verify steps accepting j drafts."""
    reach, counts = 1.0, []
    for j, count in enumerate(cand.candidates_per_depth()):
        q = 1.0 - (1.0 - Q[j]) ** (1.0 + GAIN * (count - 1))
        counts.append(round(steps * reach * (1.0 - q)))
        reach *= q
    counts.append(round(steps * reach))
    return tuple(counts)


def measure(cand: Candidate, repeat: int, rng: random.Random) -> Observation:
    levels = tuple(
        LevelResult(
            name,
            batch,
            true_throughput(cand, batch) * (1.0 + rng.gauss(0.0, 0.005)),
            histogram(cand, 20_000) if cand.speculative else None,
        )
        for name, batch in LEVELS
    )
    return Observation(cand.config_id, repeat, 600.0, levels)


def state(observations: list[Observation], in_flight: frozenset[tuple[str, int]] = frozenset(), *,
          failed: frozenset[str] = frozenset(), repeats: int = 1) -> SearchState:  # fmt: skip
    return SearchState(
        space(), LEVELS, repeats, tuple(observations), in_flight, failed, 600.0 * len(observations)
    )


def run_search(
    slots: int, budget: Budget | None = None, repeats: int = 1
) -> tuple[list[Observation], list[str]]:
    """Launch what the search proposes, ``slots`` at a time, until it says it is finished."""
    rng = random.Random(16)
    cands = {c.config_id: c for c in space()}
    done: list[Observation] = []
    reasons = []
    while True:
        decision = propose(state(done, repeats=repeats), slots, budget or Budget(), 0.01)
        reasons.append(decision.reason)
        if decision.finished:
            return done, reasons
        assert decision.launches, decision
        done += [measure(cands[cid], repeat, rng) for cid, repeat in decision.launches]


def test_propose_seeds_baseline_and_deepest_chain_when_nothing_is_measured() -> None:
    """The first launches make the model identifiable: the baseline, then the deepest chain."""
    decision = propose(state([]), 2, Budget(), 0.01)
    assert decision.launches == (("base", 0), ("c8", 0))
    assert decision.reason == "seed" and not decision.finished
    assert [c.config_id for c in seed_order(space())][:3] == ["base", "c8", "c2"]


def test_chain_acceptance_predicts_shallower_chains_when_one_deep_chain_ran() -> None:
    """A depth-8 chain's histogram gives the accept length of every shallower chain."""
    cands = {c.config_id: c for c in space()}
    q = chain_acceptance(cands, [measure(cands["c8"], 0, random.Random(0))], "concurrency=8")
    assert len(q) == 7
    for depth in range(2, 8):
        assert accept_length(cands[f"c{depth}"], q, 0.0, extrapolate=0.0) == pytest.approx(
            true_accept(cands[f"c{depth}"]), rel=1e-3
        )


def test_search_finds_the_true_best_per_level_when_run_to_the_end() -> None:
    """On 21 configs the search ends with each level's true best measured, in less than half the grid's
    launches (4 seeds, then each level's winner and its close rivals), never launching a config twice."""
    done, reasons = run_search(slots=2)
    launched = [o.config_id for o in done]
    assert len(launched) == len(set(launched))
    assert len(done) <= 9, reasons
    for name, batch in LEVELS:
        truth = max(space(), key=lambda c: true_throughput(c, batch))
        assert truth.config_id in launched, name
        measured = {o.config_id: next(r.throughput for r in o.levels if r.level == name) for o in done}
        chosen = max(measured, key=lambda cid: measured[cid])
        regret = 1 - true_throughput(
            next(c for c in space() if c.config_id == chosen), batch
        ) / true_throughput(truth, batch)
        assert regret <= 0.01, (name, chosen, truth.label)
    assert reasons[-1] == "settled"


def test_propose_stops_when_the_launch_budget_is_spent() -> None:
    """max_launches 3: three launches, then the search ends with reason 'budget spent'."""
    done, reasons = run_search(slots=2, budget=Budget(max_launches=3))
    assert len(done) == 3 and reasons[-1] == "budget spent"


def test_propose_counts_running_launches_when_the_node_hour_budget_is_near() -> None:
    """Node-hours: finished launches took 600 s each; one in flight is counted at that mean, so a
    1.5-launch budget left allows one more launch, not two."""
    cands = {c.config_id: c for c in space()}
    rng = random.Random(1)
    done = [measure(cands[cid], 0, rng) for cid in ("base", "c8")]
    in_flight = frozenset({("c2", 0)})
    decision = propose(state(done, in_flight), 2, Budget(max_node_s=600.0 * 4.5), 0.01)
    assert len(decision.launches) == 1


def test_propose_never_relaunches_when_configs_failed_or_are_in_flight() -> None:
    """Seeds already in flight or failed for good are skipped: the next seed comes instead."""
    decision = propose(state([], frozenset({("base", 0)}), failed=frozenset({"c8"})), 1, Budget(), 0.01)
    assert decision.launches == (("c2", 0),)


def test_propose_repeats_only_tied_configs_when_repeats_are_allowed() -> None:
    """With repeats 2 the only second runs go to configs whose interval overlaps their level's best."""
    done, _ = run_search(slots=1, repeats=2)
    again = {o.config_id for o in done if o.repeat_index == 1}
    first = {o.config_id for o in done if o.repeat_index == 0}
    assert again <= first and len(again) < len(first)
    keys = [(o.config_id, o.repeat_index) for o in done]
    assert len(keys) == len(set(keys))


def _spec(**search: object) -> dict[str, object]:
    return {
        "model_path": "/m",
        "speculative": {"chain_depths": [2, 3]},
        "load": {"concurrency": [1], "requests_per_level": 4},
        "search": search,
    }


def test_spec_search_defaults_to_grid_and_keeps_the_sweep_id_when_left_out() -> None:
    """No search section: the grid, and the same sweep id as a spec written before the field."""
    data = _spec()
    del data["search"]
    spec = parse_spec(data)
    assert spec.search.strategy == "grid"
    assert spec.sweep_id() == parse_spec(_spec(strategy="grid")).sweep_id()
    assert spec.sweep_id() != parse_spec(_spec(strategy="model")).sweep_id()


def test_spec_refuses_search_when_model_meets_rates_or_grid_gets_a_budget() -> None:
    """Rate levels cannot be ranked by the model; a budget on the grid would be silently ignored."""
    from specsweep.errors import SpecError

    rates = _spec(strategy="model")
    rates["load"] = {"rates": [2.0], "requests_per_level": 4}
    with pytest.raises(SpecError, match="search: the model strategy ranks closed-loop"):
        parse_spec(rates)
    with pytest.raises(SpecError, match="search: max_launches / max_node_hours limit the model"):
        parse_spec(_spec(max_launches=4))
    assert parse_spec(_spec(strategy="model", max_node_hours=2)).search.max_node_hours == 2


def test_session_queues_each_launch_once_and_status_shows_the_belief_when_seeds_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The driver's side without a server: the seeds enter the queue as proposed, a finished one is not
    proposed again, and `specsweep status` prints node-hours and the search's belief per level."""
    spec = parse_spec(
        {
            "engine": "sim",
            "model_path": "/m",
            "speculative": {"chain_depths": [2, 3, 4]},
            "load": {"concurrency": [1, 4], "requests_per_level": 4},
            "search": {"strategy": "model"},
        }
    )
    queue = JobQueue(tmp_path)
    session = SearchSession(spec, unchecked_plan(spec), tmp_path)
    _, jobs = session.next_jobs(queue, 2)
    assert [j.config_label for j in jobs] == ["baseline", "chain d=4"]
    lease = queue.lease(0, other_slots=True)
    assert lease is not None and queue.complete(lease, node="n1", worker_s=1.0)
    decision, jobs = session.next_jobs(queue, 1)
    assert [j.config_label for j in jobs] == ["chain d=2"] and decision.reason == "seed"
    assert [row.label for row in queue.jobs()] == ["baseline", "chain d=4", "chain d=2"]
    queue.close()
    assert main(["status", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "node-hours spent: 0.000" in printed and "search (running: seed):" in printed
    assert "concurrency=4: best so far none yet; in contention: baseline, chain d=2" in printed


def test_plan_says_the_search_picks_launches_when_strategy_is_model(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`specsweep plan` of a model search lists the space and says the run launches only what it picks."""
    import yaml

    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(
        yaml.safe_dump(
            {
                "engine": "sim",
                "model_path": str(Path(__file__).resolve().parents[1] / "fixtures" / "kimi-k2-mtp"),
                "base_args": ["--tp-size", "8"],
                "speculative": {"chain_depths": [2, 3]},
                "load": {"concurrency": [1], "requests_per_level": 4},
                "search": {"strategy": "model"},
            }
        )
    )
    assert main(["plan", str(spec_file), "--builtin-only"]) == 0
    printed = capsys.readouterr().out
    assert "chain d=3" in printed and "search: model - these jobs are the space" in printed
