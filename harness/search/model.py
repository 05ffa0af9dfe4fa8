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
- Step time. ``b = min(B, cap)`` of ``B`` closed-loop clients decode together, padded to ``P``, the
  next CUDA-graph batch size the launch captured (eager above the largest): what each launch reports in
  ``/server_info`` (``Capacity``). One verify step costs ``c0 + c1 D + c2 P D k + c3 P V + c4 e D +
  c5 max(0, P V - knee)`` for ``D`` draft passes (steps + 1; 0 without speculation), topk ``k``, ``V``
  verified tokens (draft tokens; 1 without speculation), ``e`` 1 when eager; the knee is kept only when
  the data ask for it. A closed-loop level then delivers ``T = a b / y`` output tokens/s with ``y = step
  + K_L a`` (``K_L``: that level's per-request prefill and scheduling time spread over the output
  length). A weighted Bayesian linear fit of ``y`` over every (config, level) measured gives a mean and a
  variance for the ``y`` of every config not yet launched; a Gaussian process on the fit's log residuals
  corrects it near measurements and widens it away from them.
- Launch noise. One launch's mean throughput at a level is off its config's true mean by a relative sd
  that repeats estimate (``launch_noise``); every measured interval and the fit's weights use it.
"""

from __future__ import annotations

import math
import warnings
from dataclasses import dataclass

import numpy as np
from scipy.stats import t as student_t
from sklearn.exceptions import ConvergenceWarning
from sklearn.gaussian_process import GaussianProcessRegressor
from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel

from workers.sglang.capacity import padded_batch

Z = 2.0  # interval half-width in standard deviations (about 95%)
PRIOR_SCALE = 100.0  # prior sd of each cost, in units of the median measured y (vague on purpose)
GAIN_SLACK = 0.02  # gains whose RMS accept-length error is within this many tokens of the best fit's
GAIN_GRID = np.linspace(0.0, 1.0, 101)
MIN_DOF = 5  # residual degrees of freedom before the residuals may also narrow the assumed noise
MIN_NOISE_SCALE = 0.25  # ... down to half the assumed sd at most
NOISE_PRIOR = 0.02  # relative sd of one launch's mean throughput at a level, before repeats say more
NOISE_PRIOR_DOF = 4  # ... worth this many degrees of freedom of repeats
KNEES = (64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0)  # compute knees tried, in verified tokens
KNEE_EVIDENCE = 6.0  # weighted squared residuals a knee must remove to be kept (one parameter more)
MIN_RESIDUALS = 4  # (config, level) measurements before the residual process is fitted
MIN_TREES = 2  # distinct trees measured before the tree law is corrected
SAME, ANY = 1e-3, 1e5  # length scales: only the same value correlates / every value correlates fully
RESIDUAL_FLOOR = 0.01  # least prior sd of the log residual: the structure is never exact away from data


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
    capacity: Capacity | None = None  # what the launch reported (None: unknown, no padding or cap)


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
    for cand, result, q in _measured_trees(candidates, observations, q_by_level):
        predicted = np.array([accept_length(cand, q, g, extrapolate=0.0) for g in GAIN_GRID])
        errors += (predicted - result.accept_length) ** 2
        fitted += 1
    if not fitted:
        return 0.5, 0.0, 1.0
    rms = np.sqrt(errors / fitted)
    inside = GAIN_GRID[rms <= rms.min() + GAIN_SLACK]
    return float(GAIN_GRID[int(np.argmin(rms))]), float(inside.min()), float(inside.max())


def _measured_trees(
    candidates: dict[str, Candidate], observations: list[Observation], q_by_level: dict[str, list[float]]
) -> list[tuple[Candidate, LevelResult, list[float]]]:
    """Every (tree, level) measured within the depth of that level's chains."""
    out = []
    for obs in observations:
        cand = candidates[obs.config_id]
        if not cand.speculative or cand.is_chain:
            continue
        for result in obs.levels:
            q = q_by_level.get(result.level, [])
            if result.histogram and len(q) >= cand.depth:
                out.append((cand, result, q))
    return out


def tree_inputs(cand: Candidate) -> np.ndarray:
    """Where the tree correction places a tree: its depth, topk and draft tokens."""
    return np.array([cand.depth, cand.topk or 0, cand.draft_tokens or 0], dtype=float)


def fit_tree_correction(
    candidates: dict[str, Candidate],
    observations: list[Observation],
    q_by_level: dict[str, list[float]],
    gain: float,
    noise: float,
) -> GaussianProcessRegressor | None:
    """The tree law checked against the measured trees: a GP on log(measured / law's accept length) over
    the trees' shapes, which corrects the law near measured trees and widens it away from them (None
    before MIN_TREES distinct trees: one tree is what the gain was fitted to)."""
    rows = _measured_trees(candidates, observations, q_by_level)
    if len({cand.config_id for cand, _, _ in rows}) < MIN_TREES:
        return None
    inputs = np.array([tree_inputs(cand) for cand, _, _ in rows])
    logs = np.array(
        [math.log(r.accept_length / accept_length(c, q, gain, extrapolate=0.0)) for c, r, q in rows]
    )
    return fit_residual(inputs, logs, noise, (0, 1, 2))


# --- launch noise --------------------------------------------------------------------------------------


def launch_noise(observations: list[Observation]) -> tuple[float, int]:
    """(relative sd of one launch's mean throughput at a level, its degrees of freedom): the prior
    NOISE_PRIOR worth NOISE_PRIOR_DOF repeats, pooled with the spread of every config launched more than
    once. A launch moves all its levels together (clocks, NCCL topology, memory layout), so each config
    adds its repeats minus one degrees of freedom and the mean over levels of its squared relative
    deviations, not one per level."""
    by_config: dict[str, dict[str, list[float]]] = {}
    for obs in observations:
        for result in obs.levels:
            if result.throughput > 0:
                by_config.setdefault(obs.config_id, {}).setdefault(result.level, []).append(result.throughput)
    squares, dof = NOISE_PRIOR_DOF * NOISE_PRIOR**2, NOISE_PRIOR_DOF
    for levels in by_config.values():
        runs = [values for values in levels.values() if len(values) > 1]
        if not runs:
            continue
        per_level = [float(np.sum((np.array(v) / np.mean(v) - 1.0) ** 2)) for v in runs]
        squares += float(np.mean(per_level))
        dof += min(len(v) for v in runs) - 1
    return math.sqrt(squares / dof), dof


def quantile(dof: int, tied: int = 1) -> float:
    """The two-sided 95% Student-t quantile (the noise is estimated, not known), Bonferroni-adjusted
    over ``tied`` configs: 95% for all of them at once, so also for whichever of them was picked."""
    return float(student_t.ppf(1.0 - 0.025 / tied, dof))


def measured_interval(values: list[float], noise: float, dof: int, tied: int = 1) -> Prediction:
    """The 95% interval of a config's true mean at a level from its ``n`` launches there; with
    ``tied > 1``, of the config picked as the largest mean of that many (see ``quantile``)."""
    mean = sum(values) / len(values)
    half = quantile(dof, tied) * noise * mean / math.sqrt(len(values))
    return Prediction(mean, mean - half, mean + half, True)


# --- step time -----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Capacity:
    """What one launch reported about its batches (``workers.sglang.capacity.reported_capacity``)."""

    captured: tuple[int, ...]  # CUDA-graph decode batch sizes, ascending; empty: eager throughout
    running_cap: int | None  # running-request cap; None: not reported

    def running(self, clients: int) -> int:
        """Requests decoding together with ``clients`` closed-loop clients (the rest wait in the queue)."""
        return clients if self.running_cap is None else min(clients, self.running_cap)

    def padded(self, batch: int) -> tuple[int, bool]:
        """(the batch a step computes, whether it runs eagerly): the next captured size up, or the batch
        itself above the largest (eager, the knee where per-kernel launch costs come back)."""
        if not self.captured:
            return batch, False
        size = padded_batch(self.captured, batch)
        return (batch, True) if size is None else (size, False)


UNKNOWN_CAPACITY = Capacity((), None)


def step_row(cand: Candidate, capacity: Capacity, clients: int, knee: float | None) -> np.ndarray:
    """The step-time regressors: ``(1, D, P D k, P V)`` at the padded batch ``P``, then ``P`` (each
    request's own reads, its KV cache above all, whatever it verifies), the eager knee ``e (D + 1)``
    (one more launch cost per forward pass) and the compute knee ``max(0, P V - knee)`` (tokens past
    the point where a step stops being bound by reading the weights)."""
    size, eager = capacity.padded(capacity.running(clients))
    base = cand.step_features(size)
    passes = (cand.steps or 0) + 1
    tokens = size * (cand.draft_tokens or 1)
    hinge = max(0.0, tokens - knee) if knee is not None else 0.0
    return np.array([*base, size, passes if eager else 0.0, hinge])


STEP_TERMS = 7


@dataclass(frozen=True, slots=True)
class StepFit:
    """Posterior of the step-time costs and per-level constants, plus the residual process."""

    levels: tuple[str, ...]
    mean: np.ndarray
    cov: np.ndarray
    knee: float | None
    residual: GaussianProcessRegressor | None  # log(measured y / structure's y) over residual_inputs

    def row(
        self, cand: Candidate, level: str, clients: int, accept: float, capacity: Capacity = UNKNOWN_CAPACITY
    ) -> np.ndarray:
        x = np.zeros(STEP_TERMS + len(self.levels))
        x[:STEP_TERMS] = step_row(cand, capacity, clients, self.knee)
        x[STEP_TERMS + self.levels.index(level)] = accept
        return x

    def predict(
        self, cand: Candidate, level: str, clients: int, accept: float, capacity: Capacity = UNKNOWN_CAPACITY
    ) -> tuple[float, float]:
        """(mean, relative sd) of ``y`` for ``cand`` at ``level``: the structure's, corrected and widened
        by the residual process (whose sd grows away from the measurements)."""
        return self.predict_many([(cand, level, clients, accept, capacity)])[0]

    def predict_many(
        self, queries: list[tuple[Candidate, str, int, float, Capacity]]
    ) -> list[tuple[float, float]]:
        """``predict`` for many (config, level, clients, accept length, capacity) at once (one GP call)."""
        out = []
        for cand, level, clients, accept, capacity in queries:
            x = self.row(cand, level, clients, accept, capacity)
            y = float(x @ self.mean)
            sd = math.sqrt(max(float(x @ self.cov @ x), 0.0))
            out.append((y, sd / y if y > 0 else math.inf))
        if self.residual is None or not queries:
            return out
        inputs = np.array([residual_inputs(q[0], q[4], q[2]) for q in queries])
        shifts, spreads = residual_at(self.residual, inputs)
        return [
            (y * math.exp(shift), math.sqrt(rel**2 + spread**2)) if y > 0 else (y, rel)
            for (y, rel), shift, spread in zip(out, shifts, spreads, strict=True)
        ]


def residual_inputs(cand: Candidate, capacity: Capacity, clients: int) -> np.ndarray:
    """Where the residual process places a (config, level): log2 of the batch and of the tokens a step
    verifies, then the config (depth, topk, draft tokens: STEP_CONFIG_DIMS)."""
    size, _ = capacity.padded(capacity.running(clients))
    tokens = math.log2(size * (cand.draft_tokens or 1))
    return np.array(
        [math.log2(size), tokens, cand.depth, cand.topk or 0, cand.draft_tokens or 0], dtype=float
    )


STEP_CONFIG_DIMS = (2, 3, 4)


def residual_at(gp: GaussianProcessRegressor, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(mean, sd) of the log residual at each row of ``inputs``, without the white noise and the launch
    term (a launch's noise is not the config's; at a config never launched the launch term is its prior)."""
    mean, sd = gp.predict(inputs, return_std=True)
    noise_var = float(gp.kernel_.k2.noise_level) + float(gp.kernel_.k1.k2.k1.constant_value)
    return np.asarray(mean, dtype=float), np.sqrt(
        np.maximum(np.asarray(sd, dtype=float) ** 2 - noise_var, 0.0)
    )


def _solve(
    X: np.ndarray, y: np.ndarray, w: np.ndarray, prior_sd: float
) -> tuple[np.ndarray, np.ndarray, float]:
    """Weighted Bayesian least squares: (mean, cov, weighted residual sum of squares)."""
    precision = X.T @ (X * w[:, None]) + np.eye(X.shape[1]) / prior_sd**2
    cov = np.linalg.inv(precision)
    mean = cov @ (X.T @ (w * y))
    return mean, cov, float(np.sum(w * (y - X @ mean) ** 2))


def fit_steps(
    candidates: dict[str, Candidate],
    observations: list[Observation],
    levels: tuple[str, ...],
    noise: float,
    capacity_of: dict[str, Capacity] | None = None,
) -> StepFit:
    """Weighted Bayesian least squares of ``y = a b / T`` (``b`` running requests) over every measured
    (config, level), with the compute knee that fits best when it beats no knee by KNEE_EVIDENCE; the
    residuals scale the assumed relative noise (up when the structure fits worse than it, down to half
    of it at most once there are MIN_DOF residual degrees of freedom); then a Gaussian process on the
    log residuals (fitted when there are MIN_RESIDUALS of them)."""
    capacity_of = capacity_of or {}
    size = STEP_TERMS + len(levels)
    points: list[tuple[Candidate, Capacity, str, int, float, float]] = []
    for obs in observations:
        cand = candidates[obs.config_id]
        capacity = obs.capacity or capacity_of.get(obs.config_id, UNKNOWN_CAPACITY)
        for result in obs.levels:
            if result.level not in levels or result.throughput <= 0:
                continue
            running = capacity.running(result.concurrency)
            accept = result.accept_length
            points.append(
                (
                    cand,
                    capacity,
                    result.level,
                    result.concurrency,
                    accept,
                    accept * running / result.throughput,
                )
            )
    if not points:
        return StepFit(levels, np.zeros(size), np.eye(size) * 1e12, None, None)

    def design(knee: float | None) -> np.ndarray:
        X = np.zeros((len(points), size))
        for i, (cand, capacity, level, clients, accept, _) in enumerate(points):
            X[i, :STEP_TERMS] = step_row(cand, capacity, clients, knee)
            X[i, STEP_TERMS + levels.index(level)] = accept
        return X

    y = np.array([p[5] for p in points])
    prior_sd = PRIOR_SCALE * float(np.median(y))
    w = 1.0 / (noise * y) ** 2
    X = design(None)
    mean, cov, sse = _solve(X, y, w, prior_sd)
    knee = None
    for candidate_knee in KNEES:
        Xk = design(candidate_knee)
        if not Xk[:, STEP_TERMS - 1].any():
            continue
        mk, ck, sk = _solve(Xk, y, w, prior_sd)
        if sk < sse - KNEE_EVIDENCE:
            X, mean, cov, sse, knee = Xk, mk, ck, sk - 0.0, candidate_knee
    dof = len(y) - np.linalg.matrix_rank(X)
    if dof > 0:
        cov = cov * max(1.0 if dof < MIN_DOF else MIN_NOISE_SCALE, sse / dof)
    residual = None
    logs = np.log(y / np.maximum(X @ mean, 1e-12))
    pooled: dict[tuple[str, str], list[int]] = {}  # a config's repeats at a level: one mean residual
    for i, (cand, _, level, _, _, _) in enumerate(points):
        pooled.setdefault((cand.config_id, level), []).append(i)
    if len(pooled) >= MIN_RESIDUALS:
        rows = list(pooled.values())
        firsts = [points[r[0]] for r in rows]
        inputs = np.array(
            [residual_inputs(cand, capacity, clients) for cand, capacity, _, clients, _, _ in firsts]
        )
        residual = fit_residual(inputs, np.array([logs[r].mean() for r in rows]), noise, STEP_CONFIG_DIMS)
    return StepFit(levels, mean, cov, knee, residual)


def fit_residual(
    inputs: np.ndarray, logs: np.ndarray, noise: float, config_dims: tuple[int, ...]
) -> GaussianProcessRegressor:
    """A GP on a structure's log residuals: a smooth term with an amplitude at least RESIDUAL_FLOOR (the
    structure is never trusted exactly away from data) and length scales per input; a launch term, the
    launch noise shared by every point of one config (``config_dims`` say which inputs name it: a launch
    moves all its levels together, and without this term the smooth one would learn that as structure);
    white noise for the rest. Deterministic (no random restarts)."""
    smooth = ConstantKernel(RESIDUAL_FLOOR**2, (RESIDUAL_FLOOR**2, 1.0)) * RBF(
        length_scale=np.ones(inputs.shape[1]) * 2.0, length_scale_bounds=(0.5, 50.0)
    )
    same_config = [SAME if i in config_dims else ANY for i in range(inputs.shape[1])]
    launch = ConstantKernel(noise**2, "fixed") * RBF(length_scale=same_config, length_scale_bounds="fixed")
    kernel = smooth + launch + WhiteKernel(noise**2 / 4.0, (1e-6, max(4.0 * noise**2, 1e-6)))
    gp = GaussianProcessRegressor(kernel=kernel, normalize_y=False, n_restarts_optimizer=0, random_state=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(inputs, logs)
    return gp
