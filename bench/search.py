"""Grid vs the model-based search on truths the search's model does not fit: node-hours, answers, intervals.

A benchmark whose truth has the search's own functional form flatters the search (the old one fitted its
truth to 1e-15). Here every scenario's truth is a physics preset of the simulator (``workers.sim.physics``:
roofline step costs, CUDA-graph padding, eager mode above the captured sizes, running-request caps,
non-geometric acceptance by position) with its parameters drawn around one of the four calibrated presets,
and every launch carries per-launch noise. Nothing is launched (this box has 2 cores): the truth is a
callable and the bench plays the measurement device.

- **Truth**: ``truth(candidate, concurrency) -> TrueLevel``, the noise-free output throughput of a config
  at a closed-loop level and the distribution of accepted drafts per verify step. Any callable plugs in
  (``evaluate``); the scenarios use ``Preset.decode_throughput`` at the level's batch and a context from
  the scenario's input/output lengths, and ``Preset.depth_accept_probs`` for the histogram.
- **Noise** (``Noise``): one log-normal factor per launch (sigma drawn per scenario in 1-5%) shared by
  every level that launch runs, times 0.5% per-level sampling noise; histograms sampled over the level's
  verify steps; a launch costs its startup (+-10%) plus its levels' run time. Two slots run in parallel.
- **Answers**: the search's answer at a level is its tie set (``LevelBelief.tie`` when the strategy gives
  one, else its best measured config); the grid's is its measured best plus every config whose 95%
  interval of the mean over repeats overlaps the best's (launch variance pooled over the configs
  repeated). An answer *contains* the truth when some config of it is within 2% of the true best, at
  every level. The speedup it prints (answer's best over the baseline) has a 95% interval (the search's
  answer's from ``answer_interval``: adjusted for being the largest of its tie set); *coverage* is the
  share of those intervals that hold the true speedup.
- **Fit error**: the search's own model family (``harness.search.model``: ``fit_steps`` over
  ``step_features`` and the chain/tree acceptance law) fitted to the scenario's noise-free truth over the
  whole grid; its relative RMS error says how far the scenario is from the search's assumptions.

Goals (issue #28): containment in >= 95% of runs for search and grid; search node-hours median <= 25%
and max <= 33% of the grid's; coverage in [90%, 98%]. Run ``.venv/bin/python -m bench.search`` (20
scenarios x 10 noise draws) or ``--quick`` (4 scenarios x 3 draws); figures in docs/search.md.
"""

from __future__ import annotations

import argparse
import heapq
import math
import random
import statistics
import sys
import time
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from bench.common import emit
from harness.search import model as search_model
from harness.search.model import (
    Candidate,
    LevelResult,
    Observation,
    Prediction,
    accept_length,
    chain_acceptance,
    fit_gain,
    fit_steps,
    launch_noise,
)
from harness.search.strategy import Budget, Decision, SearchState, answer_interval, predictions, propose
from workers.sim.model import DraftShape, accepted_drafts_distribution
from workers.sim.physics import Acceptance, Preset
from workers.sim.presets import PRESETS, categories

SLOTS = 2
TOLERANCE = 0.01  # the search's own tolerance (its spec default)
CONTAIN = 0.02  # an answer contains the truth when one of its configs is within 2% of the true best
Z95 = 1.96
LEVEL_SIGMA = 0.005  # per-level sampling noise of a throughput
ASSUMED_NOISE = 0.02  # a launch's relative sd where no repeats estimate it (the search's own prior)
REPEATS = 2  # most launches of one config, for the grid and the search alike
SCENARIOS = 20
DRAWS = 10
QUICK = (4, 3)  # scenarios, draws under --quick
GOAL_CONTAIN = 0.95
GOAL_SHARE_MEDIAN = 0.25
GOAL_SHARE_MAX = 0.33
GOAL_COVERAGE = (0.90, 0.98)
FIT_ERROR_MARK = 0.02
CHAINS = tuple(range(2, 11))
TREES = tuple(  # trees proper: more draft tokens than depths, no more than the tree holds
    (steps, topk, n)
    for steps in (2, 3, 4, 5)
    for topk in (2, 4, 8)
    for n in (4, 6, 8, 12, 16)
    if steps + 1 < n <= steps * topk + 1
)
LEVEL_SETS = ((1, 8, 32), (1, 16, 64), (2, 8, 24, 48), (1, 4, 16))


@dataclass(frozen=True, slots=True)
class TrueLevel:
    """The noise-free measurement of one config at one closed-loop level."""

    throughput: float  # output tokens per second
    accepted_drafts: tuple[float, ...] | None  # P(a verify step accepts exactly j drafts); None: baseline


Truth = Callable[[Candidate, int], TrueLevel]
# what a launch's /server_info says about its batches: (captured decode batch sizes, running-request cap)
Reported = tuple[tuple[int, ...], int | None]
Strategy = Callable[[SearchState, int, Budget, float], Decision]


@dataclass(frozen=True, slots=True)
class Noise:
    """How a launch's measurements and node time differ from the truth."""

    launch_sigma: float  # log-normal sd of the one factor a launch's levels share
    level_sigma: float = LEVEL_SIGMA  # log-normal sd of each level's own sampling noise
    startup_s: float = 1200.0  # server startup before the first request
    startup_jitter: float = 0.1  # +- uniform share of the startup per launch
    requests: int = 200  # requests per level (its run time and histogram size)
    output_len: int = 256


@dataclass(frozen=True, slots=True)
class Outcome:
    """One strategy's result in one noise draw."""

    launches: int
    node_hours: float
    first_pass_hours: float  # node-hours of first launches only (repeat 0): a one-repeat grid's cost
    contains: bool  # the answer holds a config within CONTAIN of the true best at every level
    tie_sizes: tuple[int, ...]  # per level
    covered: tuple[bool, ...]  # per level with a measured baseline: the speedup interval holds the truth


@dataclass(frozen=True, slots=True)
class Evaluation:
    """Grid and search side by side over the noise draws of one truth."""

    grid: tuple[Outcome, ...]
    search: tuple[Outcome, ...]

    def node_hour_shares(self, *, one_repeat_grid: bool = False) -> list[float]:
        """Per draw: the search's node-hours over the grid's (or over the grid's first pass alone)."""
        return [
            s.node_hours / (g.first_pass_hours if one_repeat_grid else g.node_hours)
            for g, s in zip(self.grid, self.search, strict=True)
        ]


def level_name(concurrency: int) -> str:
    return f"concurrency={concurrency}"


def evaluate(
    truth: Truth,
    space: Sequence[Candidate],
    levels: Sequence[int],
    *,
    noise: Noise,
    seed: int,
    draws: int = 1,
    repeats: int = REPEATS,
    strategy: Strategy = propose,
    tolerance: float = TOLERANCE,
    reports: Callable[[Candidate], Reported] | None = None,
) -> Evaluation:
    """Run the grid and ``strategy`` against ``truth`` over ``draws`` seeded noise draws.

    ``truth(candidate, concurrency)`` is called once per config and level (noise-free; the bench adds
    ``noise``). ``space`` must hold exactly one baseline (``steps is None``) for the speedup intervals.
    The grid launches every config ``repeats`` times; the strategy gets ``repeats`` as the spec's.
    ``reports(candidate)``, when given, is what a launch of it says about its batches, handed to the
    search as a real launch's ``/server_info`` would be.
    """
    table = {(c.config_id, conc): truth(c, conc) for c in space for conc in levels}
    reported = {c.config_id: reports(c) for c in space} if reports else {}
    grid, search = [], []
    for draw in range(draws):
        device = _Device(table, reported, noise, random.Random(f"{seed}:{draw}"))
        grid.append(_grid_outcome(device, space, levels, repeats))
        search.append(_search_outcome(device, space, levels, repeats, strategy, tolerance))
    return Evaluation(tuple(grid), tuple(search))


class _Device:
    """The truth as a measurement device: noisy launches and their node time."""

    def __init__(
        self,
        table: dict[tuple[str, int], TrueLevel],
        reported: dict[str, Reported],
        noise: Noise,
        rng: random.Random,
    ) -> None:
        self.table = table
        self.reported = reported
        self.noise = noise
        self.rng = rng
        self.np_rng = np.random.default_rng(rng.getrandbits(64))

    def launch(self, cid: str, repeat: int, levels: Sequence[int]) -> Observation:
        """What one launch measures: every level scaled by the launch's factor and its own noise."""
        n = self.noise
        factor = math.exp(self.rng.gauss(0.0, n.launch_sigma))
        results, run_s = [], 0.0
        for conc in levels:
            true = self.table[(cid, conc)]
            measured = true.throughput * factor * math.exp(self.rng.gauss(0.0, n.level_sigma))
            hist: tuple[int, ...] | None = None
            if true.accepted_drafts is not None:
                mean_accept = sum((j + 1) * p for j, p in enumerate(true.accepted_drafts))
                steps = max(1, int(n.requests * n.output_len / mean_accept))
                hist = tuple(int(k) for k in self.np_rng.multinomial(steps, true.accepted_drafts))
            results.append(LevelResult(level_name(conc), conc, measured, hist))
            run_s += n.requests * n.output_len / measured
        startup = n.startup_s * self.rng.uniform(1 - n.startup_jitter, 1 + n.startup_jitter)
        return _observation(cid, repeat, startup + run_s, tuple(results), self.reported.get(cid))

    def contains(self, answer: Sequence[str], conc: int, space: Sequence[Candidate]) -> bool:
        best = max(self.table[(c.config_id, conc)].throughput for c in space)
        return any(self.table[(cid, conc)].throughput >= (1 - CONTAIN) * best for cid in answer)

    def true_speedup(self, cid: str, baseline: str, conc: int) -> float:
        return self.table[(cid, conc)].throughput / self.table[(baseline, conc)].throughput


def _observation(
    cid: str, repeat: int, node_s: float, levels: tuple[LevelResult, ...], reported: Reported | None
) -> Observation:
    """One launch, with what it reported about its batches where the search reads that
    (``Observation.capacity``, the surrogate of issue #28); a search without the field gets none."""
    capacity = getattr(search_model, "Capacity", None)
    extra: dict[str, Any] = {"capacity": capacity(*reported)} if capacity and reported else {}
    return Observation(cid, repeat, node_s, levels, **extra)


def _baseline(space: Sequence[Candidate]) -> str:
    return next(c.config_id for c in space if not c.speculative)


def _covers(device: _Device, cid: str, base: str, conc: int, point: float, half_log: float) -> bool:
    """The speedup interval ``point * exp(+-half_log)`` holds the true speedup."""
    true = device.true_speedup(cid, base, conc)
    return abs(math.log(true) - math.log(point)) <= half_log


def grid_ties(means: dict[str, tuple[float, int]], sigma: float) -> tuple[str, ...]:
    """The grid's answer at one level, best first: the best mean and every config whose 95% interval of
    the mean (log scale, ``sigma`` per launch, ``n`` launches) overlaps the best's."""
    best = max(means, key=lambda c: means[c][0])
    top, n_top = means[best]
    tie = [
        cid
        for cid, (mean, n) in means.items()
        if math.log(top) - math.log(mean) <= Z95 * sigma * (1 / math.sqrt(n) + 1 / math.sqrt(n_top))
    ]
    return tuple(sorted(tie, key=lambda c: -means[c][0]))


def pooled_launch_sigma(samples: dict[str, list[float]]) -> float | None:
    """Launch-to-launch sd of log throughput pooled over the configs launched more than once."""
    square, dof = 0.0, 0
    for values in samples.values():
        if len(values) > 1:
            logs = np.log(values)
            square += float(np.sum((logs - logs.mean()) ** 2))
            dof += len(values) - 1
    return math.sqrt(square / dof) if dof else None


def _grid_outcome(
    device: _Device, space: Sequence[Candidate], levels: Sequence[int], repeats: int
) -> Outcome:
    """Every config ``repeats`` times; per level the tie set of ``grid_ties``."""
    observations = [device.launch(c.config_id, r, levels) for c in space for r in range(repeats)]
    base = _baseline(space)
    contains, ties, covered = True, [], []
    for conc in levels:
        samples: dict[str, list[float]] = defaultdict(list)
        for o in observations:
            for result in o.levels:
                if result.concurrency == conc:
                    samples[o.config_id].append(result.throughput)
        # no repeats, no variance estimate: the assumed launch noise stands in
        sigma = pooled_launch_sigma(samples) or ASSUMED_NOISE
        means = {cid: (float(np.exp(np.mean(np.log(v)))), len(v)) for cid, v in samples.items()}
        tie = grid_ties(means, sigma)
        contains &= device.contains(tie, conc, space)
        ties.append(len(tie))
        (top, n_top), (b, n_b) = means[tie[0]], means[base]
        half = Z95 * sigma * math.sqrt(1 / n_top + 1 / n_b)
        covered.append(_covers(device, tie[0], base, conc, top / b, half))
    return Outcome(len(observations), *_hours(observations), contains, tuple(ties), tuple(covered))


def _hours(observations: Sequence[Observation]) -> tuple[float, float]:
    """Node-hours of every launch, and of the first launches (repeat 0) only."""
    return (
        sum(o.node_s for o in observations) / 3600,
        sum(o.node_s for o in observations if o.repeat_index == 0) / 3600,
    )


def _search_outcome(
    device: _Device,
    space: Sequence[Candidate],
    levels: Sequence[int],
    repeats: int,
    strategy: Strategy,
    tolerance: float,
) -> Outcome:
    """The strategy on two slots, event-driven: it proposes for the free slots whenever one frees."""
    cands = tuple(space)
    named = tuple((level_name(c), c) for c in levels)
    done: list[Observation] = []
    running: list[tuple[float, int, Observation]] = []  # (finish time, tie-break, observation)
    now, seq = 0.0, 0
    while True:
        flying = frozenset((o.config_id, o.repeat_index) for _, _, o in running)
        state = SearchState(
            cands, named, repeats, tuple(done), flying, frozenset(), sum(o.node_s for o in done)
        )
        for cid, repeat in strategy(state, SLOTS - len(running), Budget(), tolerance).launches:
            obs = device.launch(cid, repeat, levels)
            heapq.heappush(running, (now + obs.node_s, seq, obs))
            seq += 1
        if not running:
            break
        now, _, finished = heapq.heappop(running)
        done.append(finished)
    final = strategy(state, 0, Budget(), tolerance)
    ids = {c.label: c.config_id for c in cands}
    noise = launch_noise(list(state.observations))
    preds = predictions(state, noise)
    base = _baseline(space)
    contains, ties, covered = True, [], []
    for belief, conc in zip(final.levels, levels, strict=True):
        best = ids[belief.best_label] if belief.best_label else None
        tie = tuple(getattr(belief, "tie", None) or ((best,) if best else ()))
        contains &= bool(tie) and device.contains(tie, conc, space)
        ties.append(len(tie))
        top, b = answer_interval(state, level_name(conc), noise), preds.get((base, level_name(conc)))
        if top is not None and b is not None and b.measured:
            half = math.hypot(_half_log(top), _half_log(b))
            covered.append(_covers(device, tie[0], base, conc, top.point / b.point, half))
    return Outcome(len(done), *_hours(done), contains, tuple(ties), tuple(covered))


def _half_log(p: Prediction) -> float:
    """Half the width of a prediction's interval on the log scale (infinite when it reaches 0)."""
    return math.log(p.high / p.low) / 2 if p.low > 0 else math.inf


# --- the scenarios --------------------------------------------------------------------------------------


def space() -> list[Candidate]:
    """The baseline, chains 2..10 and the valid trees: 44 configs."""
    items = [Candidate("baseline", "baseline", None, None, None)]
    for d in CHAINS:
        items.append(Candidate(f"chain{d}", f"chain d={d}", d - 1, 1, d))
    for s, k, n in TREES:
        label = f"tree s={s} k={k} n={n}"
        items.append(Candidate(label, label, s, k, n))
    return items


@dataclass(frozen=True, slots=True)
class Scenario:
    """One seeded world: a physics preset with randomised parameters, its load and its launch noise."""

    name: str
    seed: int
    preset: Preset
    acceptance: str  # the shape of the drawn chat acceptance vector
    levels: tuple[int, ...]
    input_len: int
    output_len: int
    max_running: int | None  # the launches' --max-running-requests (None: SGLang's default)
    noise: Noise

    def truth(self, cand: Candidate, concurrency: int) -> TrueLevel:
        """The preset's steady-state decode throughput at the level's batch, and its acceptance."""
        shape = self.shape(cand)
        context = self.input_len + self.output_len // 2
        throughput = self.preset.decode_throughput(
            shape, concurrency, context, requested_max_running=self.max_running
        )
        dist = None
        if shape is not None:
            dist = accepted_drafts_distribution(self.preset.depth_accept_probs(shape, 0.0, "chat"))
        return TrueLevel(throughput, dist)

    def reports(self, cand: Candidate) -> Reported:
        """What a launch of ``cand`` reports: its captured decode batch sizes and running-request cap."""
        shape = self.shape(cand)
        cap = self.preset.running_cap(shape, self.max_running)
        return self.preset.captured_batches(shape, cap), cap

    @staticmethod
    def shape(cand: Candidate) -> DraftShape | None:
        """The simulator's shape of a candidate (None: the baseline)."""
        if cand.steps is None:
            return None
        return DraftShape(cand.steps, cand.topk or 1, cand.draft_tokens or 1)


def _acceptance(rng: random.Random, preset: Preset) -> tuple[str, tuple[float, ...]]:
    """A chat acceptance vector by depth, non-geometric: the preset's own (jittered), a plateau, two easy
    tokens then a cliff, or a decline."""
    kind = rng.choice(("preset", "plateau", "cliff", "decline"))
    if kind == "preset":
        vec = [a * rng.uniform(0.9, 1.05) for a in preset.acceptance["chat"].positions]
    elif kind == "plateau":
        level = rng.uniform(0.55, 0.9)
        vec = [level * rng.uniform(0.97, 1.03) for _ in range(10)]
    elif kind == "cliff":
        easy, hard = rng.uniform(0.85, 0.95), rng.uniform(0.25, 0.5)
        vec = [easy, easy * rng.uniform(0.95, 1.0)] + [hard] * 8
    else:
        vec = [rng.uniform(0.7, 0.9)]
        for _ in range(9):
            vec.append(vec[-1] * rng.uniform(0.8, 0.97))
    return kind, tuple(min(0.97, max(0.05, a)) for a in vec)


def scenarios(count: int = SCENARIOS) -> list[Scenario]:
    """``count`` seeded scenarios, cycling over the presets, each with its parameters drawn around it."""
    out = []
    names = sorted(PRESETS)
    for i in range(count):
        seed = 2800 + i
        rng = random.Random(seed)
        base = PRESETS[names[i % len(names)]]
        kind, chat = _acceptance(rng, base)
        acceptance: dict[str, Acceptance] = categories(chat)
        preset = replace(
            base,
            acceptance=acceptance,
            sibling_recall=tuple(min(0.9, r * rng.uniform(0.5, 1.8)) for r in base.sibling_recall),
            mem_eff=rng.uniform(0.6, 0.9),
            flop_eff=min(1.0, base.flop_eff * rng.uniform(0.6, 1.2)),
            forward_fixed_s=base.forward_fixed_s * rng.uniform(0.5, 2.0),
            draft_fixed_s=base.draft_fixed_s * rng.uniform(0.5, 2.0),
            overhead_s=base.overhead_s * rng.uniform(0.5, 2.0),
            target_token_s=base.target_token_s * rng.uniform(0.5, 2.0),
            eager_s=rng.uniform(0.0005, 0.003),
            graph_max_bs=rng.choice((None, 8, 16, 32)),
        )
        noise = Noise(
            launch_sigma=rng.uniform(0.01, 0.05),
            startup_s=rng.uniform(600, 1800),
            output_len=(output_len := rng.choice((128, 256, 512))),
        )
        out.append(
            Scenario(
                name=f"scenario-{i} ({base.name})",
                seed=seed,
                preset=preset,
                acceptance=kind,
                levels=rng.choice(LEVEL_SETS),
                input_len=rng.choice((256, 1024, 2048)),
                output_len=output_len,
                max_running=rng.choice((None, 16, 24, 32, 64)),
                noise=noise,
            )
        )
    return out


def family_fit_error(truth: Truth, space: Sequence[Candidate], levels: Sequence[int]) -> float:
    """Relative RMS error of the search's model family (step model + acceptance law) fitted to the
    noise-free truth of every config at every level: what no amount of data would fix."""
    cands = {c.config_id: c for c in space}
    names = tuple(level_name(c) for c in levels)
    table = {(c.config_id, conc): truth(c, conc) for c in space for conc in levels}
    observations = []
    for c in space:
        results = []
        for conc in levels:
            true = table[(c.config_id, conc)]
            hist = (
                None if true.accepted_drafts is None else tuple(round(p * 1e9) for p in true.accepted_drafts)
            )
            results.append(LevelResult(level_name(conc), conc, true.throughput, hist))
        observations.append(Observation(c.config_id, 0, 0.0, tuple(results)))
    q = {name: chain_acceptance(cands, observations, name) for name in names}
    gain, _, _ = fit_gain(cands, observations, q)
    fit = fit_steps(cands, observations, names, ASSUMED_NOISE)
    errors = []
    for c in space:
        for name, conc in zip(names, levels, strict=True):
            accept = accept_length(c, q[name], gain, extrapolate=q[name][-1]) if c.speculative else 1.0
            y, _ = fit.predict(c, name, conc, accept)
            errors.append(accept * conc / y / table[(c.config_id, conc)].throughput - 1.0)
    return float(np.sqrt(np.mean(np.square(errors))))


def _share(values: Sequence[bool]) -> float:
    return sum(values) / len(values) if values else math.nan


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be 1 or more")
    return value


def _index(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench.search", description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help=f"{QUICK[0]} scenarios x {QUICK[1]} draws")
    parser.add_argument("--repeats", type=int, default=REPEATS, help="most launches of a config (both)")
    parser.add_argument("--scenarios", type=_positive, help=f"scenarios to run (default {SCENARIOS})")
    parser.add_argument("--draws", type=_positive, help=f"noise draws per scenario (default {DRAWS})")
    parser.add_argument(
        "--only",
        type=_index,
        action="append",
        metavar="I",
        help="run scenario I alone (0-based, as numbered in the output; repeatable): the slow ones in isolation",
    )
    args = parser.parse_args(argv)
    count, draws = QUICK if args.quick else (SCENARIOS, DRAWS)
    count, draws = args.scenarios or count, args.draws or draws
    selected = (
        [sc for i, sc in enumerate(scenarios(max(args.only) + 1)) if i in args.only]
        if args.only
        else scenarios(count)
    )
    count = len(selected)
    configs = space()
    started = time.monotonic()
    print(
        f"# {len(configs)} configs (baseline, chains 2-10, trees); {count} scenarios x {draws} noise draws;"
    )
    print(
        f"# repeats {args.repeats} for grid and search; 2 slots; answer contains a config within {CONTAIN:.0%}"
    )
    print(
        "# of the true best at every level; coverage: 95% speedup intervals (answer / baseline) holding the truth"
    )
    fit_errors, grid_all, search_all, shares, shares_one = [], [], [], [], []
    for sc in selected:
        fit_error = family_fit_error(sc.truth, configs, sc.levels)
        ev = evaluate(
            sc.truth,
            configs,
            sc.levels,
            noise=sc.noise,
            seed=sc.seed,
            draws=draws,
            repeats=args.repeats,
            reports=sc.reports,
        )
        fit_errors.append(fit_error)
        grid_all += ev.grid
        search_all += ev.search
        shares += ev.node_hour_shares()
        shares_one += ev.node_hour_shares(one_repeat_grid=True)
        print(
            f"{sc.name} seed={sc.seed} levels={list(sc.levels)} acceptance={sc.acceptance} "
            f"in/out={sc.input_len}/{sc.output_len} max_running={sc.max_running} "
            f"graph_max_bs={sc.preset.graph_max_bs} launch_sigma={sc.noise.launch_sigma:.1%} "
            f"startup={sc.noise.startup_s:.0f}s\n  model-family fit error {fit_error:.1%}"
        )
        for name, outs in (("grid", ev.grid), ("search", ev.search)):
            print(
                f"  {name:6s} launches {statistics.median(o.launches for o in outs):5.1f}  "
                f"node-h {statistics.median(o.node_hours for o in outs):6.2f}  "
                f"contains {sum(o.contains for o in outs):2d}/{len(outs)}  "
                f"coverage {_share([c for o in outs for c in o.covered]):.0%}  "
                f"tie median {statistics.median(t for o in outs for t in o.tie_sizes):.0f}"
            )
        share, one = ev.node_hour_shares(), ev.node_hour_shares(one_repeat_grid=True)
        print(
            f"  search/grid node-h: median {statistics.median(share):.1%} max {max(share):.1%} "
            f"(over the grid's first pass alone: median {statistics.median(one):.1%} max {max(one):.1%})",
            flush=True,
        )
    above = sum(e > FIT_ERROR_MARK for e in fit_errors)
    print(
        f"# model-family fit error: median {statistics.median(fit_errors):.1%}, above 2% in {above} of {count}"
    )
    result = {
        "grid_contains": _share([o.contains for o in grid_all]),
        "search_contains": _share([o.contains for o in search_all]),
        "grid_coverage": _share([c for o in grid_all for c in o.covered]),
        "search_coverage": _share([c for o in search_all for c in o.covered]),
        "share_median": statistics.median(shares),
        "share_max": max(shares),
        "share_of_first_pass_median": statistics.median(shares_one),
        "share_of_first_pass_max": max(shares_one),
        "grid_tie_median": statistics.median(t for o in grid_all for t in o.tie_sizes),
        "search_tie_median": statistics.median(t for o in search_all for t in o.tie_sizes),
    }
    for key, value in result.items():
        print(f"# {key}: {value:.3f}")
    goals = {
        "grid_contains": result["grid_contains"] >= GOAL_CONTAIN,
        "search_contains": result["search_contains"] >= GOAL_CONTAIN,
        "share_median": result["share_median"] <= GOAL_SHARE_MEDIAN,
        "share_max": result["share_max"] <= GOAL_SHARE_MAX,
        "search_coverage": GOAL_COVERAGE[0] <= result["search_coverage"] <= GOAL_COVERAGE[1],
    }
    emit("search_fit_error_median", "ratio", statistics.median(fit_errors), fit_errors,
         above_2pct=above, scenarios=count)  # fmt: skip
    emit(
        "search_vs_grid",
        "share of runs",
        result["search_contains"],
        [float(o.contains) for o in search_all],
        runs=len(search_all),
        repeats=args.repeats,
        seconds=round(time.monotonic() - started, 1),
        **result,
        goals={k: bool(v) for k, v in goals.items()},
        goal=(
            f"contains >= {GOAL_CONTAIN:.0%} (grid and search), node-h share median <= {GOAL_SHARE_MEDIAN:.0%} "
            f"max <= {GOAL_SHARE_MAX:.0%}, search coverage in [{GOAL_COVERAGE[0]:.0%}, {GOAL_COVERAGE[1]:.0%}]"
        ),
        meets_goal=all(goals.values()),
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
