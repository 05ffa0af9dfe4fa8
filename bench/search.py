"""Grid vs the model-based search: launches, node-hours (startup included) and regret, on 10 scenarios.

The measurement oracle is the simulator's performance model (``ground_truth``), not hundreds of
launched servers (this box has 2 cores): a "launch" of a config returns what a real sweep would
measure - each level's output throughput with 1% measurement noise and a ``correct_drafts_histogram``
drawn from the config's true acceptance over the level's verify steps - and costs a launch time
(startup, 10-30 min per scenario, +-10% per launch) plus the levels' run time. The strategy sees
only those measurements. Regret is the true throughput of the final choice vs the true best, per
level, from the same model. Two slots run in parallel, as on a two-node cluster.

Goal (issue #16): within 2% of the true best at every level in >= 9 of 10 scenarios, with <= 25% of the
grid's launches and <= 25% of its node-hours. Run: ``.venv/bin/python -m bench.search`` (about 5 min on
2 shared cores, most of it computing the ground truth of 44 configs x 3-4 levels x 10 scenarios).
"""

from __future__ import annotations

import heapq
import random
import sys
from dataclasses import dataclass

import numpy as np

from bench.common import emit
from harness.search.model import Candidate, LevelResult, Observation
from harness.search.strategy import Budget, SearchState, propose
from workers.sglang.rules import SpecParams
from workers.sim.model import (
    DEFAULT_PROFILE,
    DraftShape,
    Load,
    SimProfile,
    accepted_drafts_distribution,
    depth_accept_probs,
    ground_truth,
)

SLOTS = 2
NOISE = 0.01
REQUESTS = 200
OUTPUT_LEN = 256
INPUT_LEN = 512
TOLERANCE = 0.01
REGRET_GOAL = 0.02
SHARE_GOAL = 0.25
CHAINS = tuple(range(2, 11))
TREES = tuple(  # trees proper: more draft tokens than depths, no more than the tree holds
    (steps, topk, n)
    for steps in (2, 3, 4, 5)
    for topk in (2, 4, 8)
    for n in (4, 6, 8, 12, 16)
    if steps + 1 < n <= steps * topk + 1
)


@dataclass(frozen=True, slots=True)
class Scenario:
    """One seeded world: a profile, the load levels, the startup time of a launch."""

    name: str
    seed: int
    profile: SimProfile
    concurrency: tuple[int, ...]
    startup_s: float


def scenarios() -> list[Scenario]:
    """Ten seeded profiles around the default one: acceptance, decay, sibling gain, costs, levels."""
    out = []
    level_sets = ((1, 8, 32), (1, 16, 64), (2, 8, 24, 48), (1, 4, 16))
    for i in range(10):
        seed = 1600 + i
        rng = random.Random(seed)
        base = DEFAULT_PROFILE
        profile = base.model_copy(
            update={
                "name": f"scenario-{i}",
                "accept_first": rng.uniform(0.55, 0.9),
                "accept_decay": rng.uniform(0.8, 1.0),
                "topk_gain": rng.uniform(0.2, 0.7),
                "target_per_token_s": base.target_per_token_s * rng.uniform(0.3, 2.5),
                "target_fixed_s": base.target_fixed_s * rng.uniform(0.7, 1.5),
                "draft_fixed_s": base.draft_fixed_s * rng.uniform(0.5, 3.0),
                "draft_per_token_s": base.draft_per_token_s * rng.uniform(0.5, 4.0),
            }
        )
        out.append(
            Scenario(profile.name, seed, profile, level_sets[i % len(level_sets)], rng.uniform(600, 1800))
        )
    return out


def space() -> list[tuple[Candidate, SpecParams]]:
    """The baseline, chains 2..9 and the valid trees: 24 configs."""
    items = [(Candidate("baseline", "baseline", None, None, None), SpecParams())]
    for d in CHAINS:
        items.append((Candidate(f"chain{d}", f"chain d={d}", d - 1, 1, d), SpecParams("EAGLE3", d - 1, 1, d)))
    for s, k, n in TREES:
        label = f"tree s={s} k={k} n={n}"
        items.append((Candidate(label, label, s, k, n), SpecParams("EAGLE3", s, k, n)))
    return items


class Oracle:
    """The simulator as a measurement device: true values, noisy measurements, launch times."""

    def __init__(self, scenario: Scenario) -> None:
        self.scenario = scenario
        self.rng = np.random.default_rng(scenario.seed)
        self.truth: dict[tuple[str, int], tuple[float, float]] = {}  # -> (throughput, accept length)
        self.params = dict((c.config_id, p) for c, p in space())
        for cid, params in self.params.items():
            for conc in scenario.concurrency:
                load = Load(conc, INPUT_LEN, OUTPUT_LEN, max(REQUESTS // 4, 4 * conc))
                truth = ground_truth(scenario.profile, params, load, seed=scenario.seed)
                self.truth[(cid, conc)] = (truth.output_throughput, truth.accept_length)

    def level(self, conc: int) -> str:
        return f"concurrency={conc}"

    def launch(self, cid: str, repeat: int) -> Observation:
        """What one launch measures, and its node time (startup + levels)."""
        levels, run_s = [], 0.0
        params = self.params[cid]
        shape = DraftShape.from_spec(params)
        for conc in self.scenario.concurrency:
            throughput, accept = self.truth[(cid, conc)]
            hist: tuple[int, ...] | None = None
            if shape is not None:
                dist = accepted_drafts_distribution(depth_accept_probs(self.scenario.profile, shape, 0.0))
                steps = int(REQUESTS * OUTPUT_LEN / accept)
                hist = tuple(int(n) for n in self.rng.multinomial(steps, dist))
            measured = throughput * (1.0 + self.rng.normal(0.0, NOISE))
            levels.append(LevelResult(self.level(conc), conc, measured, hist))
            run_s += REQUESTS * OUTPUT_LEN / throughput
        startup = self.scenario.startup_s * self.rng.uniform(0.9, 1.1)
        return Observation(cid, repeat, startup + run_s, tuple(levels))

    def regret(self, choice: dict[str, str]) -> dict[str, float]:
        """Per level: 1 - true throughput of the choice / true best."""
        out = {}
        for conc in self.scenario.concurrency:
            best = max(self.truth[(cid, conc)][0] for cid in self.params)
            out[self.level(conc)] = 1.0 - self.truth[(choice[self.level(conc)], conc)][0] / best
        return out


def best_measured(observations: list[Observation], levels: list[str]) -> dict[str, str]:
    """Per level, the config with the highest mean measured throughput (what `best` would pick)."""
    sums: dict[tuple[str, str], list[float]] = {}
    for o in observations:
        for r in o.levels:
            sums.setdefault((o.config_id, r.level), []).append(r.throughput)
    return {
        lv: max((k[0] for k in sums if k[1] == lv), key=lambda cid: float(np.mean(sums[(cid, lv)])))
        for lv in levels
    }


def run_grid(oracle: Oracle) -> list[Observation]:
    return [oracle.launch(c.config_id, 0) for c, _ in space()]


def run_search(oracle: Oracle) -> tuple[list[Observation], int]:
    """Two slots, event-driven: the strategy proposes for the free slots whenever one frees."""
    cands = tuple(c for c, _ in space())
    levels = tuple((oracle.level(c), c) for c in oracle.scenario.concurrency)
    done: list[Observation] = []
    running: list[tuple[float, int, Observation]] = []  # (finish time, tie-break, observation)
    now, seq, decisions = 0.0, 0, 0
    while True:
        state = SearchState(
            cands,
            levels,
            1,
            tuple(done),
            frozenset((o.config_id, o.repeat_index) for _, _, o in running),
            frozenset(),
            sum(o.node_s for o in done),
        )
        decision = propose(state, SLOTS - len(running), Budget(), TOLERANCE)
        decisions += 1
        for cid, repeat in decision.launches:
            obs = oracle.launch(cid, repeat)
            heapq.heappush(running, (now + obs.node_s, seq, obs))
            seq += 1
        if not running:
            return done, decisions
        now, _, finished = heapq.heappop(running)
        done.append(finished)


def main() -> int:
    rows = []
    print("# oracle: the simulator's performance model (workers.sim.model.ground_truth) with 1% throughput")
    print("# noise and sampled acceptance histograms; launch time = startup + level run time; 2 slots")
    print("# configs:", ", ".join(c.label for c, _ in space()), f"({len(space())})")
    for sc in scenarios():
        oracle = Oracle(sc)
        levels = [oracle.level(c) for c in sc.concurrency]
        grid = run_grid(oracle)
        grid_regret = oracle.regret(best_measured(grid, levels))
        found, _ = run_search(oracle)
        regret = oracle.regret(best_measured(found, levels))
        grid_h = sum(o.node_s for o in grid) / 3600
        search_h = sum(o.node_s for o in found) / 3600
        ok = max(regret.values()) <= REGRET_GOAL
        rows.append((ok, len(found) / len(grid), search_h / grid_h))
        print(
            f"{sc.name} seed={sc.seed} levels={list(sc.concurrency)} startup={sc.startup_s:.0f}s "
            f"accept_first={sc.profile.accept_first:.2f} decay={sc.profile.accept_decay:.2f} "
            f"gain={sc.profile.topk_gain:.2f}\n"
            f"  grid:   launches {len(grid):3d}  node-h {grid_h:6.2f}  max regret {max(grid_regret.values()):.2%}\n"
            f"  search: launches {len(found):3d}  node-h {search_h:6.2f}  max regret {max(regret.values()):.2%}"
            f"  ({', '.join(f'{lv} {r:.2%}' for lv, r in regret.items())}) {'ok' if ok else 'MISS'}",
            flush=True,
        )
    within = sum(ok for ok, _, _ in rows)
    launch_share = max(r for _, r, _ in rows)
    hour_share = max(h for _, _, h in rows)
    met = within >= 9 and launch_share <= SHARE_GOAL and hour_share <= SHARE_GOAL
    emit(
        "search_scenarios_within_2pct", "scenarios", float(within), goal=">= 9 of 10", meets_goal=within >= 9
    )
    emit("search_launch_share_max", "ratio", launch_share, [r for _, r, _ in rows], goal=f"<= {SHARE_GOAL}",
         meets_goal=launch_share <= SHARE_GOAL)  # fmt: skip
    emit("search_node_hour_share_max", "ratio", hour_share, [h for _, _, h in rows], goal=f"<= {SHARE_GOAL}",
         meets_goal=hour_share <= SHARE_GOAL)  # fmt: skip
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
