"""The model-based search's predictions: throughput of every config at every level, with an interval.

Pure functions over what a sweep measures (no I/O, no clocks, no simulator). Two parts:

- Acceptance. A chain (topk 1) run at depth ``d`` records, per verify step, how many drafts were
  accepted (``correct_drafts_histogram``); pooled over the chains run at a level this gives the chance
  ``q_j`` that position ``j`` is accepted once ``j - 1`` was, for every ``j <= d``, hence the accept
  length of every shallower chain without launching it. Positions deeper than any chain measured are
  bounded: acceptance does not rise with depth, so ``q_j`` lies in ``[0, q_last]``. A tree gives depth
  ``j`` ``c_j`` candidates (extra nodes to the shallowest depths, at most topk per depth) and accepts it
  with ``1 - (1 - q_j) ** (1 + g (c_j - 1))``; the sibling gain ``g`` in [0, 1] is fitted to the trees
  measured so far (before any: the whole range).
- Step time. One verify step of a batch of ``B`` requests costs ``c0 + c1 D + c2 B D k + c3 B V`` for
  ``D`` draft passes (steps + 1; 0 without speculation), topk ``k`` and ``V`` verified tokens (draft
  tokens; 1 without speculation); the costs are the hardware's, shared by every level. A closed-loop
  level of ``B`` clients then delivers ``T = a B / y`` output tokens/s with ``y = step + K_L a`` (``K_L``:
  that level's per-request prefill and scheduling time spread over the output length). A weighted
  Bayesian linear fit of ``y`` over every (config, level) measured gives a mean and a variance for the
  ``y`` of every config not yet launched.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

Z = 2.0  # interval half-width in standard deviations (about 95%)
PRIOR_SCALE = 100.0  # prior sd of each cost, in units of the median measured y (vague on purpose)
GAIN_SLACK = 0.02  # gains whose RMS accept-length error is within this many tokens of the best fit's
GAIN_GRID = np.linspace(0.0, 1.0, 101)
MIN_DOF = 5  # residual degrees of freedom before the residuals may also narrow the assumed noise
MIN_NOISE_SCALE = 0.25  # ... down to half the assumed sd at most


@dataclass(frozen=True, slots=True)
class Candidate:
    """One effective config of the space (what the plan calls a config_id)."""

    config_id: str
    label: str
    steps: int | None  # None: no speculative decoding (the baseline)
    topk: int | None
    draft_tokens: int | None
    # The server-axis setting it runs ("" without axes): the model assumes nothing across settings, so
    # each is a sub-space of its own (acceptance and step costs fitted within it).
    subspace: str = ""

    @property
    def speculative(self) -> bool:
        return self.steps is not None

    @property
    def depth(self) -> int:
        """Draft positions a verify step can accept (0 for the baseline)."""
        if self.steps is None or self.draft_tokens is None:
            return 0
        return min(self.steps, self.draft_tokens - 1)

    @property
    def is_chain(self) -> bool:
        """One candidate per depth: its histogram measures the chain acceptance by position."""
        return self.speculative and all(c == 1 for c in self.candidates_per_depth())

    def candidates_per_depth(self) -> tuple[int, ...]:
        """Draft nodes per depth: one each, the extra ones to the shallowest depths, at most topk."""
        if self.draft_tokens is None or self.topk is None:
            return ()
        counts = [1] * self.depth
        extra = self.draft_tokens - 1 - self.depth
        for d in range(self.depth):
            add = min(extra, self.topk - 1)
            counts[d] += add
            extra -= add
        return tuple(counts)

    def step_features(self, batch: float) -> tuple[float, float, float, float]:
        """The step-time regressors ``(1, D, B D k, B V)``."""
        if self.steps is None or self.topk is None or self.draft_tokens is None:
            return (1.0, 0.0, 0.0, batch)
        passes = self.steps + 1
        return (1.0, passes, batch * passes * self.topk, batch * self.draft_tokens)


@dataclass(frozen=True, slots=True)
class LevelResult:
    """What one launch measured at one closed-loop level."""

    level: str
    concurrency: int
    throughput: float  # output tokens per second
    histogram: tuple[int, ...] | None  # verify steps that accepted exactly j drafts, j = 0, 1, ...

    @property
    def accept_length(self) -> float:
        """Tokens per verify step, bonus included (1 without speculation)."""
        if not self.histogram or sum(self.histogram) == 0:
            return 1.0
        return 1.0 + sum(j * n for j, n in enumerate(self.histogram)) / sum(self.histogram)


@dataclass(frozen=True, slots=True)
class Observation:
    """One finished launch: its config, which repeat, its node time and its levels."""

    config_id: str
    repeat_index: int
    node_s: float
    levels: tuple[LevelResult, ...]


@dataclass(frozen=True, slots=True)
class Prediction:
    """Throughput of one config at one level: a point and a (low, high) interval."""

    point: float
    low: float
    high: float
    measured: bool


def chain_acceptance(
    candidates: dict[str, Candidate], observations: list[Observation], level: str
) -> list[float]:
    """``q_1 .. q_J`` at ``level``, pooled over every chain measured there (J: the deepest chain)."""
    reached: dict[int, float] = {}  # position j -> verify steps that accepted >= j - 1 drafts
    accepted: dict[int, float] = {}  # position j -> verify steps that accepted >= j drafts
    for obs in observations:
        cand = candidates[obs.config_id]
        if not cand.is_chain:
            continue
        for result in obs.levels:
            if result.level != level or not result.histogram:
                continue
            hist = result.histogram
            for j in range(1, cand.depth + 1):
                reached[j] = reached.get(j, 0.0) + sum(hist[j - 1 :])
                accepted[j] = accepted.get(j, 0.0) + sum(hist[j:])
    q = []
    for j in range(1, max(reached, default=0) + 1):
        if reached.get(j, 0.0) <= 0:
            break
        q.append(accepted[j] / reached[j])
    return q


def accept_length(cand: Candidate, q: list[float], gain: float, *, extrapolate: float) -> float:
    """Expected tokens per verify step of ``cand`` from chain acceptance ``q``; positions past ``q``
    take ``extrapolate`` as their chain acceptance."""
    length, reach = 1.0, 1.0
    for j, count in enumerate(cand.candidates_per_depth()):
        base = q[j] if j < len(q) else extrapolate
        reach *= 1.0 - (1.0 - base) ** (1.0 + gain * (count - 1))
        length += reach
    return length


def fit_gain(
    candidates: dict[str, Candidate], observations: list[Observation], q_by_level: dict[str, list[float]]
) -> tuple[float, float, float]:
    """(point, low, high) of the sibling gain: least squares over the trees measured within the chains'
    depth, with every gain whose RMS error is within GAIN_SLACK of the best; [0, 1] until one is."""
    errors = np.zeros_like(GAIN_GRID)
    fitted = 0
    for obs in observations:
        cand = candidates[obs.config_id]
        if not cand.speculative or cand.is_chain:
            continue
        for result in obs.levels:
            q = q_by_level.get(result.level, [])
            if not result.histogram or len(q) < cand.depth:
                continue
            predicted = np.array([accept_length(cand, q, g, extrapolate=0.0) for g in GAIN_GRID])
            errors += (predicted - result.accept_length) ** 2
            fitted += 1
    if not fitted:
        return 0.5, 0.0, 1.0
    rms = np.sqrt(errors / fitted)
    inside = GAIN_GRID[rms <= rms.min() + GAIN_SLACK]
    return float(GAIN_GRID[int(np.argmin(rms))]), float(inside.min()), float(inside.max())


@dataclass(frozen=True, slots=True)
class StepFit:
    """Posterior of the step-time costs and per-level constants (see the module docstring)."""

    levels: tuple[str, ...]
    mean: np.ndarray
    cov: np.ndarray

    def row(self, cand: Candidate, level: str, batch: float, accept: float) -> np.ndarray:
        x = np.zeros(4 + len(self.levels))
        x[:4] = cand.step_features(batch)
        x[4 + self.levels.index(level)] = accept
        return x

    def predict(self, cand: Candidate, level: str, batch: float, accept: float) -> tuple[float, float]:
        """(mean, sd) of ``y`` for ``cand`` at ``level``."""
        x = self.row(cand, level, batch, accept)
        return float(x @ self.mean), math.sqrt(max(float(x @ self.cov @ x), 0.0))


def fit_steps(
    candidates: dict[str, Candidate], observations: list[Observation], levels: tuple[str, ...], noise: float
) -> StepFit:
    """Weighted Bayesian least squares of ``y = a B / T`` over every measured (config, level). The
    residuals scale the assumed relative noise: up when the model fits worse than it, and, once there
    are MIN_DOF residual degrees of freedom, down to half of it when it fits better."""
    size = 4 + len(levels)
    rows, ys = [], []
    for obs in observations:
        cand = candidates[obs.config_id]
        for result in obs.levels:
            if result.level not in levels or result.throughput <= 0:
                continue
            accept = result.accept_length
            x = np.zeros(size)
            x[:4] = cand.step_features(result.concurrency)
            x[4 + levels.index(result.level)] = accept
            rows.append(x)
            ys.append(accept * result.concurrency / result.throughput)
    if not rows:
        return StepFit(levels, np.zeros(size), np.eye(size) * 1e12)
    X, y = np.array(rows), np.array(ys)
    prior_sd = PRIOR_SCALE * float(np.median(y))
    w = 1.0 / (noise * y) ** 2
    precision = X.T @ (X * w[:, None]) + np.eye(size) / prior_sd**2
    cov = np.linalg.inv(precision)
    mean = cov @ (X.T @ (w * y))
    dof = len(y) - np.linalg.matrix_rank(X)
    if dof > 0:
        scale = float(np.sum(w * (y - X @ mean) ** 2)) / dof
        cov = cov * max(1.0 if dof < MIN_DOF else MIN_NOISE_SCALE, scale)
    return StepFit(levels, mean, cov)
