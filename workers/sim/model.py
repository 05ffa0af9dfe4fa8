"""Performance model of the simulated SGLang server, and its ground truth.

The simulated server (``workers.sim.server``) runs this model in real time; the search and the tests call
the same functions to know, without running anything, which speculative config is truly best for a load.
Pure functions and frozen data only: no I/O, no clocks, no randomness except through a passed-in RNG.

Model (all times in seconds at time scale 1, i.e. as on the real hardware the profile describes):

- One decode iteration of a batch of ``b`` running requests costs
  ``overhead + draft + verify`` where, with speculative decoding (steps ``s``, topk ``k``, draft tokens
  ``n``), ``draft = (s + 1) * (draft_fixed + draft_per_token * b * k)`` (``s`` draft forwards plus the
  draft-extend pass after verification) and ``verify = target_fixed + target_per_token * b * n``. Without
  speculation it is ``overhead + target_fixed + target_per_token * b``. Big batches therefore make deep
  drafts expensive: the verify pass grows with ``b * n``.
- A prefill iteration over ``t`` prompt tokens costs ``prefill_fixed + prefill_per_token * t`` and yields
  each admitted request's first token. Decode stalls while it runs (SGLang's default, no mixed chunks).
- Acceptance: a draft tree of ``n - 1`` nodes over ``min(s, n - 1)`` depths; depth ``d`` (0-based) holds
  ``c_d`` candidates (1 along the chain, extra siblings given to the shallowest depths first, at most
  ``k`` per depth). The chance that depth ``d`` is accepted once depth ``d - 1`` was is
  ``q_d = 1 - (1 - p_d) ** (1 + topk_gain * (c_d - 1))`` with ``p_d = accept_first * accept_decay ** d``
  scaled down by temperature. A verify step accepts a prefix of the depths plus the bonus token.
- Content: ``accept_first`` and ``accept_decay`` depend on what the request asks for (code and math are
  drafted far better than open prose; random token ids make the target's output degenerate). The rule
  (``content_category``) is deterministic: a prompt of token ids is ``random_ids``; a text prompt (chat
  messages joined) belongs to the first of the profile's ``categories`` one of whose ``markers`` occurs
  in its lowercased text, else to ``default_category`` (which uses the profile's own two parameters).
- Several nodes (``--nnodes N``): tensor parallelism spans the nodes, so each target pass all-reduces
  its activations across them (``cross_node_seconds``): ``allreduces_per_pass * (internode_latency +
  2 (N - 1) / N * allreduce_bytes_per_token * t / internode_bytes_per_s)`` for ``t`` tokens in the pass
  (a ring all-reduce over the nodes' links). It is added to every prefill and verify pass (the
  one-layer draft's all-reduces are left out); within one node the profile's costs already hold NVLink's.
"""

from __future__ import annotations

import bisect
import math
import random
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from statistics import mean
from typing import Any, Protocol

from pydantic import BaseModel, ConfigDict, Field, model_validator

from workers.sglang import capacity
from workers.sglang.rules import SpecParams

RANDOM_IDS = "random_ids"  # the category of a prompt given as token ids
DEFAULT_CATEGORY = "chat"  # the category of a text prompt no marker matches (the default profile's)


class CostModel(Protocol):
    """What the simulated server and every offline truth price a launch with, so a truth runs the same
    physics as the server: ``workers.sim.physics.Preset`` (the default, ``presets.DEFAULT_PRESET``) or a
    profile file's linear ``SimProfile``. Times are seconds at time scale 1; ``factor`` is the launch's."""

    @property
    def name(self) -> str: ...

    def decode_step_seconds(
        self,
        shape: DraftShape | None,
        batch: int,
        context: int,
        *,
        max_running: int,
        spec_v2: bool = False,
        factor: float = 1.0,
        draft_scale: float = 1.0,
    ) -> float:
        """One decode iteration of ``batch`` running requests of ``context`` KV tokens on average;
        ``draft_scale``: the draft forwards' cost over the launch's one-layer drafter (0: no draft model,
        ``workers.sim.algorithms.Drafting``)."""
        ...

    def prefill_seconds(self, prompt_tokens: int, *, factor: float = 1.0) -> float:
        """One prefill iteration over ``prompt_tokens`` tokens (every request admitted together)."""
        ...

    def depth_accept_probs(self, shape: DraftShape, temperature: float, category: str) -> tuple[float, ...]:
        """Chance each depth of the draft tree is accepted given the one before was."""
        ...

    def running_cap(self, shape: DraftShape | None, requested: int | None) -> int | None:
        """Requests that may decode together (None: no cap)."""
        ...

    def kv_token_capacity(self) -> int | None:
        """KV tokens whole requests are admitted against (None: no limit)."""
        ...

    def launch_factor(self, launch: str) -> float:
        """The factor on every cost of the launch keyed ``launch`` (1: no launch-to-launch variation)."""
        ...


class ContentAcceptance(BaseModel):
    """Acceptance of one content category and the text markers that select it."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(min_length=1, description="Category name, as workloads label their requests.")
    markers: tuple[str, ...] = Field(
        default=(),
        description="Lowercase substrings; a text prompt containing any of them is of this category.",
    )
    accept_first: float = Field(gt=0, lt=1, description="Acceptance chance of the first draft token.")
    accept_decay: float = Field(gt=0, le=1, description="Per-depth factor on the acceptance chance.")


class SimProfile(BaseModel):
    """Costs and acceptance of one (hardware, target, draft) combination; loadable from JSON or YAML."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    name: str = Field(description="Human-readable name of the profile, reported in /server_info.")
    overhead_s: float = Field(ge=0, description="Fixed scheduler, sampling and launch cost per iteration.")
    target_fixed_s: float = Field(gt=0, description="Target forward cost independent of token count.")
    target_per_token_s: float = Field(ge=0, description="Target forward cost per token in the pass.")
    draft_fixed_s: float = Field(ge=0, description="Draft forward cost independent of token count.")
    draft_per_token_s: float = Field(ge=0, description="Draft forward cost per token (batch x topk).")
    prefill_fixed_s: float = Field(ge=0, description="Prefill iteration cost independent of prompt size.")
    prefill_per_token_s: float = Field(ge=0, description="Prefill cost per prompt token (target + draft).")
    accept_first: float = Field(gt=0, lt=1, description="Acceptance chance of the first draft token.")
    accept_decay: float = Field(gt=0, le=1, description="Per-depth factor on the acceptance chance.")
    topk_gain: float = Field(
        ge=0, le=1, description="Worth of each extra sibling candidate relative to the first one (0..1)."
    )
    temperature_penalty: float = Field(
        ge=0, lt=1, description="Fraction of acceptance lost at temperature 1 (linear in temperature)."
    )
    natural_output_tokens: int = Field(
        ge=1, description="Mean output length (exponential) of requests that do not set ignore_eos."
    )
    internode_bytes_per_s: float = Field(
        default=400e9,
        gt=0,
        description="Inter-node bandwidth of one node (all its NICs; 8 x 400 Gb/s InfiniBand = 400e9).",
    )
    internode_latency_s: float = Field(
        default=20e-6, ge=0, description="Latency of one all-reduce across nodes (vs NVLink's within one)."
    )
    allreduces_per_pass: int = Field(
        default=122, ge=0, description="All-reduces per target forward pass: two per layer (61 layers)."
    )
    allreduce_bytes_per_token: float = Field(
        default=14336.0, ge=0, description="Bytes one all-reduce carries per token: hidden 7168 x 2 (bf16)."
    )
    default_category: str = Field(
        default="chat",
        description="Category of a text prompt no marker matches; it uses accept_first and accept_decay.",
    )
    categories: tuple[ContentAcceptance, ...] = Field(
        default=(),
        strict=False,
        description="Text categories in matching order: the first whose marker occurs wins.",
    )
    random_ids: ContentAcceptance | None = Field(
        default=None,
        strict=False,
        description="Acceptance of prompts given as token ids (named random_ids); null = the default's.",
    )

    @model_validator(mode="after")
    def _unique_categories(self) -> SimProfile:
        names = [self.default_category, RANDOM_IDS, *(c.name for c in self.categories)]
        if len(set(names)) != len(names):
            raise ValueError(f"category names must be unique (random_ids is reserved): {names}")
        return self

    def acceptance(self, category: str) -> tuple[float, float]:
        """(accept_first, accept_decay) of a category; ``ValueError`` for a name the profile lacks."""
        if category == self.default_category or (category == RANDOM_IDS and self.random_ids is None):
            return self.accept_first, self.accept_decay
        for c in (*self.categories, *([self.random_ids] if self.random_ids else [])):
            if c.name == category:
                return c.accept_first, c.accept_decay
        raise ValueError(f"profile {self.name!r} has no category {category!r}")

    @property
    def category_names(self) -> tuple[str, ...]:
        """Every category this profile can assign."""
        return (self.default_category, *(c.name for c in self.categories), RANDOM_IDS)

    # --- CostModel: a profile file's linear costs (module docstring), when no preset is set -------------
    def decode_step_seconds(
        self,
        shape: DraftShape | None,
        batch: int,
        context: int,
        *,
        max_running: int,
        spec_v2: bool = False,
        factor: float = 1.0,
        draft_scale: float = 1.0,
    ) -> float:
        """Linear in the batch; context, graphs and the overlap scheduler are not in this model."""
        return factor * decode_step_seconds(self, shape, batch, draft_scale=draft_scale)

    def prefill_seconds(self, prompt_tokens: int, *, factor: float = 1.0) -> float:
        return factor * prefill_seconds(self, prompt_tokens)

    def depth_accept_probs(self, shape: DraftShape, temperature: float, category: str) -> tuple[float, ...]:
        return depth_accept_probs(self, shape, temperature, category)

    def running_cap(self, shape: DraftShape | None, requested: int | None) -> int | None:
        """Only what the launch asks for: a profile has no memory."""
        return requested

    def kv_token_capacity(self) -> int | None:
        return None

    def launch_factor(self, launch: str) -> float:
        """A profile file is a deterministic model: every launch runs it alike."""
        return 1.0


def content_category(profile: SimProfile, prompt: Any) -> str:
    """The category of a prompt (see the module docstring): token ids, else the first marker match."""
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return RANDOM_IDS
    if isinstance(prompt, list):
        text = " ".join(str(m.get("content") or "") for m in prompt if isinstance(m, dict))
    else:
        text = str(prompt)
    lowered = text.lower()
    for category in profile.categories:
        if any(marker in lowered for marker in category.markers):
            return category.name
    return profile.default_category


# 8x H200 (TP 8) serving a ~1T-parameter MoE target (Kimi-K2-like, ~32B active) with a one-layer EAGLE3
# draft. At concurrency 1 the target pass is memory-bound (~14 ms whatever the token count), so deep
# chains pay off; at high concurrency every verified token costs target compute, so shallow chains or
# plain decoding win.
DEFAULT_PROFILE = SimProfile(
    name="h200x8-kimi-k2-eagle3",
    overhead_s=0.0008,
    target_fixed_s=0.0135,
    target_per_token_s=0.0004,
    draft_fixed_s=0.00035,
    draft_per_token_s=0.000004,
    prefill_fixed_s=0.008,
    prefill_per_token_s=0.00004,
    accept_first=0.84,
    accept_decay=0.99,
    topk_gain=0.45,
    temperature_penalty=0.15,
    natural_output_tokens=400,
    default_category="chat",
    categories=(
        ContentAcceptance(
            name="code",
            markers=("```", "def ", "function", "python", "code"),
            accept_first=0.88,
            accept_decay=0.99,
        ),
        ContentAcceptance(
            name="math",
            markers=("solve", "calculate", "how many", "equation"),
            accept_first=0.87,
            accept_decay=0.985,
        ),
    ),
    random_ids=ContentAcceptance(name=RANDOM_IDS, accept_first=0.62, accept_decay=0.9),
)
# The category mix ``ground_truth`` and the demo use when a workload names none.
DEFAULT_MIX: tuple[tuple[str, float], ...] = (("code", 0.3), ("chat", 0.5), ("math", 0.2))


@dataclass(frozen=True, slots=True)
class DraftShape:
    """The effective speculative shape the model prices: SGLang's resolved steps, topk and draft tokens."""

    num_steps: int
    topk: int
    num_draft_tokens: int

    @classmethod
    def from_spec(cls, spec: SpecParams) -> DraftShape | None:
        """The shape of an effective (resolved) config; None when speculative decoding is off."""
        if spec.speculative_algorithm is None:
            return None
        steps, topk, draft = (
            spec.speculative_num_steps,
            spec.speculative_eagle_topk,
            spec.speculative_num_draft_tokens,
        )
        if steps is None or topk is None or draft is None:
            raise ValueError(f"speculative config is not resolved: {spec}")
        return cls(steps, topk, draft)


@dataclass(frozen=True, slots=True)
class Load:
    """A closed-loop benchmark run: ``concurrency`` clients start together at time 0, each sending its
    next request as soon as one finishes, until ``num_requests`` requests were sent. Requests ignore EOS
    (fixed ``output_len``), as benchmark runs do. Each request's content category is drawn from ``mix``
    ((category, weight) pairs; empty: every request is of the profile's default category)."""

    concurrency: int
    input_len: int
    output_len: int
    num_requests: int
    temperature: float = 0.0
    mix: tuple[tuple[str, float], ...] = ()


QUANTILES: tuple[float, ...] = (0.5, 0.9, 0.99)  # the per-request TPOT quantiles ground_truth reports


@dataclass(frozen=True, slots=True)
class GroundTruth:
    """What a config delivers under a load, in seconds at time scale 1 (means over requests)."""

    accept_length: float  # tokens per verify step, bonus included (/server_info's avg_spec_accept_length)
    reported_accept_length: float  # completion_tokens / spec_verify_ct as meta_info reports it
    decode_step_s: float  # one decode iteration at the full batch
    batch: int  # requests decoding together at most (concurrency capped by max_running_requests)
    tpot_s: float  # (latency - ttft) / (output_len - 1)
    ttft_s: float
    request_latency_s: float
    output_throughput: float  # output tokens per second over the whole run
    tpot_quantiles: tuple[float, ...] = ()  # per-request TPOT at QUANTILES (linear, as quantile_cont)
    accept_length_by_category: tuple[tuple[str, float], ...] = ()  # each category's expected value


def depth_candidates(shape: DraftShape) -> tuple[int, ...]:
    """Candidates per depth of the draft tree: one per depth, extra nodes to the shallowest depths."""
    depth = min(shape.num_steps, shape.num_draft_tokens - 1)
    counts = [1] * depth
    extra = shape.num_draft_tokens - 1 - depth
    for d in range(depth):
        add = min(extra, shape.topk - 1)
        counts[d] += add
        extra -= add
    return tuple(counts)


def depth_accept_probs(
    profile: SimProfile, shape: DraftShape, temperature: float, category: str | None = None
) -> tuple[float, ...]:
    """Chance that each depth is accepted given the one before it was (see the module docstring), for
    requests of ``category`` (None: the profile's default category)."""
    first, decay = profile.acceptance(category or profile.default_category)
    heat = 1.0 - profile.temperature_penalty * min(max(temperature, 0.0), 1.0)
    probs = []
    for d, candidates in enumerate(depth_candidates(shape)):
        p = first * decay**d * heat
        probs.append(1.0 - (1.0 - p) ** (1.0 + profile.topk_gain * (candidates - 1)))
    return tuple(probs)


def accepted_drafts_distribution(probs: tuple[float, ...]) -> tuple[float, ...]:
    """P(a verify step accepts exactly j drafts), j = 0..len(probs)."""
    dist = []
    reach = 1.0
    for q in probs:
        dist.append(reach * (1.0 - q))
        reach *= q
    dist.append(reach)
    return tuple(dist)


def sample_accepted_drafts(probs: tuple[float, ...], rng: random.Random) -> int:
    """Drafts one verify step accepts: the accepted prefix of the tree's depths."""
    accepted = 0
    for q in probs:
        if rng.random() >= q:
            break
        accepted += 1
    return accepted


def expected_accept_length(probs: tuple[float, ...]) -> float:
    """Tokens per verify step, bonus token included: 1 + sum over depths of P(prefix accepted)."""
    dist = accepted_drafts_distribution(probs)
    return sum((j + 1) * pj for j, pj in enumerate(dist))


def decode_step_seconds(
    profile: SimProfile, shape: DraftShape | None, batch: int, *, draft_scale: float = 1.0
) -> float:
    """One decode iteration for ``batch`` running requests; ``draft_scale``: the draft forward's cost
    over the profile's one-layer drafter (``workers.sim.algorithms.Drafting``; 0: no draft model)."""
    if shape is None:
        return profile.overhead_s + profile.target_fixed_s + profile.target_per_token_s * batch
    draft_pass = (profile.draft_fixed_s + profile.draft_per_token_s * batch * shape.topk) * draft_scale
    verify = profile.target_fixed_s + profile.target_per_token_s * batch * shape.num_draft_tokens
    return profile.overhead_s + (shape.num_steps + 1) * draft_pass + verify


def cross_node_seconds(profile: SimProfile, nnodes: int, tokens: int) -> float:
    """What a target pass over ``tokens`` tokens adds when its tensor parallelism spans ``nnodes`` nodes."""
    if nnodes <= 1:
        return 0.0
    ring = 2 * (nnodes - 1) / nnodes
    one = (
        profile.internode_latency_s
        + ring * profile.allreduce_bytes_per_token * tokens / profile.internode_bytes_per_s
    )
    return profile.allreduces_per_pass * one


def prefill_seconds(profile: SimProfile, prompt_tokens: int) -> float:
    """One prefill iteration over ``prompt_tokens`` tokens (all requests admitted together)."""
    return profile.prefill_fixed_s + profile.prefill_per_token_s * prompt_tokens


def admissions(
    waiting: Sequence[int], running: Sequence[int], max_running: int | None, token_budget: int | None
) -> int:
    """Requests a scheduler iteration admits (one prefill for all of them), in arrival order; 0 means run a
    decode step. ``waiting`` and ``running`` are each request's whole-life KV tokens
    (``capacity.request_token_reserve``): a request joins while the running count stays within
    ``max_running`` and every admitted request's tokens fit in ``token_budget`` (None: no limit) next to
    the running ones', as SGLang's ``PrefillAdder`` decides. A request alone on an idle server is admitted
    whatever its size (SGLang refuses one longer than the context before it is queued)."""
    room = len(waiting) if max_running is None else max_running - len(running)
    used = sum(running)
    admitted = 0
    for need in waiting[: max(0, room)]:
        if token_budget is not None and used + need > token_budget and (running or admitted):
            break
        used += need
        admitted += 1
    return admitted


def _reserve(shape: DraftShape | None, prompt_tokens: int, max_new_tokens: int) -> int:
    """One request's whole-life KV tokens under ``shape``."""
    return capacity.request_token_reserve(
        prompt_tokens, max_new_tokens, shape.num_draft_tokens if shape is not None else 0
    )


@dataclass(slots=True)
class _Flight:
    """One request in the reference run."""

    arrival: float
    probs: tuple[float, ...] = ()
    tokens: int = 0
    first_token: float = 0.0
    verify_steps: int = 0


@dataclass(frozen=True, slots=True)
class _Launch:
    """One launch of a config as the truths run it: its costs, shape, acceptance per category and caps."""

    costs: CostModel
    shape: DraftShape | None
    probs: Mapping[str, tuple[float, ...]]
    mix: tuple[tuple[str, float], ...]
    max_running: int | None  # the running-request cap (the engine's)
    token_budget: int | None  # the KV tokens whole requests are admitted against
    factor: float  # the launch's factor on every cost
    # Step and prefill seconds already priced, by (batch, context) and by tokens: a run revisits the same
    # few hundred, and the physics is pure, so each is priced once.
    _steps: dict[tuple[int, int], float] = field(default_factory=dict)
    _prefills: dict[int, float] = field(default_factory=dict)

    @classmethod
    def of(cls, costs: CostModel, spec: SpecParams, load: Load, factor: float) -> _Launch:
        shape = DraftShape.from_spec(spec)
        mix = load.mix or ((DEFAULT_CATEGORY, 1.0),)
        probs = {
            name: costs.depth_accept_probs(shape, load.temperature, name) if shape is not None else ()
            for name, _ in mix
        }
        return cls(
            costs,
            shape,
            probs,
            mix,
            costs.running_cap(shape, spec.max_running_requests),
            costs.kv_token_capacity(),
            factor,
        )

    def batch(self, load: Load) -> int:
        """Requests decoding together at most: the streams, within the cap and the KV pool."""
        batch = min(load.concurrency, self.max_running or load.concurrency)
        if self.token_budget is not None:
            batch = min(batch, self.token_budget // _reserve(self.shape, load.input_len, load.output_len))
        return max(1, batch)

    def decode_step_s(self, batch: int, context: int) -> float:
        step = self._steps.get((batch, context))
        if step is None:
            step = self._steps[batch, context] = self.costs.decode_step_seconds(
                self.shape, batch, context, max_running=self.max_running or batch, factor=self.factor
            )
        return step

    def prefill_s(self, tokens: int) -> float:
        seconds = self._prefills.get(tokens)
        if seconds is None:
            seconds = self._prefills[tokens] = self.costs.prefill_seconds(tokens, factor=self.factor)
        return seconds

    def accept_lengths(self) -> tuple[tuple[str, float], ...]:
        """Each category's expected tokens per verify step."""
        return tuple(
            (name, expected_accept_length(p) if self.shape is not None else 1.0)
            for name, p in self.probs.items()
        )


def ground_truth(
    costs: CostModel, spec: SpecParams, load: Load, *, seed: int = 0, factor: float = 1.0
) -> GroundTruth:
    """What the server delivers for an effective config under a load: the true value the search seeks.

    Runs the simulated server's own scheduling (``admissions``, the step costs at the running batch's mean
    context, the acceptance draws) as a discrete-event simulation of the load, with clients that answer
    instantly: a replacement request reaches the scheduler just after the iteration that finished its
    predecessor has begun. ``factor`` is the launch's (``CostModel.launch_factor``; /server_info's
    ``simulator.launch_factor``). Seeded, so repeatable; the run is repeated until it holds >= 20,000
    verify steps, which keeps the sampling noise of the means well under 1%. ``decode_step_s`` is one step
    of the full batch at mid-run context (prompt + half the output).
    """
    launch = _Launch.of(costs, spec, load, factor)
    shape = launch.shape
    batch = launch.batch(load)
    rng = random.Random(seed)
    finished: list[tuple[_Flight, float]] = []
    wall = 0.0
    while True:
        finished += _closed_loop_run(launch, load, rng)
        wall += max(end for _, end in finished[-load.num_requests :])
        if sum(f.verify_steps for f, _ in finished) >= 20_000 or shape is None:
            break
    decode_tokens = load.output_len - 1
    verify_ct = sum(f.verify_steps for f, _ in finished)
    by_category = launch.accept_lengths()
    return GroundTruth(
        accept_length=mix_accept_length(by_category, launch.mix),
        reported_accept_length=mean(load.output_len / f.verify_steps for f, _ in finished if f.verify_steps)
        if verify_ct
        else math.nan,
        decode_step_s=launch.decode_step_s(batch, load.input_len + load.output_len // 2),
        batch=batch,
        tpot_s=mean((end - f.first_token) / decode_tokens for f, end in finished)
        if decode_tokens
        else math.nan,
        ttft_s=mean(f.first_token - f.arrival for f, _ in finished),
        request_latency_s=mean(end - f.arrival for f, end in finished),
        output_throughput=len(finished) * load.output_len / wall,
        accept_length_by_category=by_category,
        tpot_quantiles=tuple(
            quantile([(end - f.first_token) / decode_tokens for f, end in finished], q) for q in QUANTILES
        )
        if decode_tokens
        else (),
    )


def quantile(values: list[float], q: float) -> float:
    """The q-quantile with linear interpolation between order statistics (DuckDB's ``quantile_cont``)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    low = math.floor(position)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (position - low)


def open_loop_tpot_quantiles(
    costs: CostModel,
    spec: SpecParams,
    rate_rps: float,
    load: Load,
    *,
    runs: int,
    burstiness: float = 1.0,
    seed: int = 0,
    factor: float = 1.0,
) -> tuple[float, ...]:
    """Per-request TPOT at QUANTILES (simulated seconds) of an open loop: ``load.num_requests`` requests
    arriving on an idle server at ``rate_rps`` with gamma gaps of shape ``burstiness`` (1: Poisson), as
    one open-loop level sends them (``load.concurrency`` is unused); the requests of ``runs`` seeded
    runs are pooled; ``factor`` is the launch's."""
    launch = _Launch.of(costs, spec, load, factor)
    rng = random.Random(seed)
    tpots: list[float] = []
    for _ in range(runs):
        schedule, at = [], 0.0
        for _ in range(load.num_requests):  # the first request after one gap, as the load generator
            at += rng.gammavariate(burstiness, 1.0 / (rate_rps * burstiness))
            schedule.append(at)
        finished = _closed_loop_run(launch, load, rng, schedule)
        tpots += [(end - f.first_token) / (load.output_len - 1) for f, end in finished]
    return tuple(quantile(tpots, q) for q in QUANTILES)


@dataclass(frozen=True, slots=True)
class SteadyState:
    """A closed loop's steady state, in seconds at time scale 1, over requests that arrive once every
    stream has cycled a few times (so neither the start nor the drain is in it)."""

    ttft_p99_s: float
    ttft_mean_s: float
    tpot_s: float  # mean (latency - ttft) / (output_len - 1)
    output_throughput: float  # concurrency x output_len / mean latency (Little's law; clients never wait)
    requests: int  # requests the statistics are over


STEADY_REQUESTS = 2000  # about the steady requests a steady-state run holds (sampling noise well under 1%)


def steady_state(
    costs: CostModel,
    spec: SpecParams,
    load: Load,
    *,
    ramp_up_s: float | None = None,
    seed: int = 0,
    factor: float = 1.0,
) -> SteadyState:
    """What a closed loop of ``load.concurrency`` streams sees once it is steady: the streams' first
    requests arrive evenly spread over ``ramp_up_s`` (None: over one request's latency), as the load
    generator's ramp-up starts them, so no burst of simultaneous prefills recurs (without acceptance
    noise, as for the baseline, the phases a ramp leaves persist, and with them how many requests share
    a prefill), then each stream sends its next request as soon as one finishes
    (``ground_truth``'s clients); ``factor`` is the launch's. ``load.num_requests`` is ignored: the run lasts about as many request
    latencies as ``STEADY_REQUESTS`` need (at least 12), and the statistics are over the requests that
    arrive after the first two and before the last two. A replacement request lands just after the
    iteration that finished its predecessor has begun, so its TTFT is a whole decode step plus its
    prefill: the steady-state tail. The ramp must be shorter than a request (no request ends before the
    last stream starts).
    """
    launch = _Launch.of(costs, spec, load, factor)
    mix = launch.mix
    accept = mix_accept_length(launch.accept_lengths(), mix)
    step = launch.decode_step_s(launch.batch(load), load.input_len + load.output_len // 2)
    cycle = launch.prefill_s(load.input_len) + step * (load.output_len - 1) / accept
    spread = cycle if ramp_up_s is None else ramp_up_s
    starts = [i * spread / load.concurrency for i in range(load.concurrency)]
    cycles = max(12, math.ceil(STEADY_REQUESTS / load.concurrency) + 4)
    run = Load(
        load.concurrency, load.input_len, load.output_len, load.concurrency * cycles, load.temperature, mix
    )
    done = _closed_loop_run(launch, run, random.Random(seed), starts)
    steady = [(f, end) for f, end in done if 2 * cycle <= f.arrival <= (cycles - 2) * cycle]
    ttfts = [f.first_token - f.arrival for f, _ in steady]
    latency = mean(end - f.arrival for f, end in steady)
    return SteadyState(
        ttft_p99_s=quantile(ttfts, 0.99),
        ttft_mean_s=mean(ttfts),
        tpot_s=mean((end - f.first_token) / (load.output_len - 1) for f, end in steady),
        output_throughput=load.concurrency * load.output_len / latency,
        requests=len(steady),
    )


def mix_accept_length(
    by_category: tuple[tuple[str, float], ...], mix: tuple[tuple[str, float], ...]
) -> float:
    """Tokens per verify step over a mix of equally long requests: each request of category ``c`` takes
    ``L / a_c`` steps, so the server-wide average is the weight-harmonic mean of the ``a_c``."""
    lengths = dict(by_category)
    total = sum(w for _, w in mix)
    return total / sum(w / lengths[name] for name, w in mix)


def draw_category(mix: tuple[tuple[str, float], ...], rng: random.Random) -> str:
    """One category drawn from (category, weight) pairs (no draw for a single one, so it uses no RNG)."""
    if len(mix) == 1:
        return mix[0][0]
    names = [name for name, _ in mix]
    return rng.choices(names, weights=[w for _, w in mix])[0]


def _closed_loop_run(
    launch: _Launch, load: Load, rng: random.Random, schedule: list[float] | None = None
) -> list[tuple[_Flight, float]]:
    """One run of ``load``: (request, finish time) for every request. With ``schedule`` (sorted arrival
    times) the first requests arrive then instead of all at 0: ``load.num_requests`` of them make an open
    loop (nothing is sent when a request finishes), one per stream a closed loop that ramps up. Each step
    is priced at the running requests' mean context (prompt + output so far), as the engine prices it."""
    shape, mix, probs = launch.shape, launch.mix, launch.probs
    reserve = _reserve(shape, load.input_len, load.output_len)
    now = 0.0
    arrivals = deque(schedule if schedule is not None else [0.0] * min(load.concurrency, load.num_requests))
    to_send = load.num_requests - len(arrivals)
    waiting: list[_Flight] = []
    running: list[_Flight] = []
    done: list[tuple[_Flight, float]] = []
    while len(done) < load.num_requests:
        if not running and not waiting and arrivals[0] > now:
            now = arrivals[0]  # idle: the next arrival starts an iteration at once
        while arrivals and arrivals[0] <= now:  # arrivals stay sorted
            waiting.append(_Flight(arrivals.popleft(), probs[draw_category(mix, rng)]))
        admitted = admissions(
            [reserve] * len(waiting), [reserve] * len(running), launch.max_running, launch.token_budget
        )
        if admitted:
            batch, waiting = waiting[:admitted], waiting[admitted:]
            now += launch.prefill_s(load.input_len * admitted)
            for flight in batch:
                flight.tokens, flight.first_token = 1, now
            running += batch
        else:
            context = sum(load.input_len + f.tokens for f in running) // len(running)
            now += launch.decode_step_s(len(running), context)
            for flight in running:
                flight.tokens += 1 + (sample_accepted_drafts(flight.probs, rng) if shape is not None else 0)
                flight.verify_steps += shape is not None
        still: list[_Flight] = []
        for flight in running:
            if flight.tokens >= load.output_len:
                done.append((flight, now))
                if to_send:  # the client's next request lands just after this iteration boundary,
                    bisect.insort(arrivals, math.nextafter(now, math.inf))  # before later ramp starts
                    to_send -= 1
            else:
                still.append(flight)
        running = still
    return done
