"""Which config to deploy: per load level, the configs meeting every SLO, ranked, with how sure we are.

For each load level: configs (jobs grouped by ``config_label``; repeats are the jobs sharing a
label) whose median over repeats meets every SLO are ranked by the objective's median. Each gets a
speedup over the no-speculation baseline at the same level with a bootstrap interval (95% by
default), built by resampling requests with replacement within every run (repeat) of the config and
of the baseline, taking the median over repeats in each replicate, and reading the percentiles of the
ratio. Every launch also carries launch noise: a launch of the same config lands a few percent off
another (clocks, placement, memory layout), which no amount of requests within it averages away. Each
replicate multiplies each launch's request-level replicate by its own factor 1 + sigma Z (Z standard
normal), sigma the launch noise, before the median over repeats, so a config's interval over its n
launches holds both, and a speedup (config over baseline) both configs' noise.

Launch noise, sigma, is estimated from repeats: per (level, config) with n >= 2 launches, the sample
variance of the launches' values relative to their mean, less the mean within-launch sampling variance
(each launch's request-level replicates, relative to its value), pooled over the repeated configs with
weights n - 1 as a relative variance (clipped at 0). With no repeated config it is the prior
``launch_noise`` of the spec (``DEFAULT_LAUNCH_NOISE``, 2% relative sd), and the output says so.

Ties: at a level the answer is the tie set, the winner and every config whose difference to it has an
interval holding 0 (not resolved at the confidence, 95% by default, launch noise included), with about
how many launches of each would separate a 1% difference.
The objective may be goodput (``analysis.goodput``): requests meeting per-request SLOs, per second.

Resampling, exactly and cheaply:

- ``Rate`` objectives at a closed-loop level (N requests kept in flight): by Little's law the rate is
  N x sum(value) / sum(latency), so the run's uncertainty lies in the request latencies, not only in
  the per-request values (which may all be equal, as with fixed output lengths). A replicate is the
  point value times the resampled ratio sum(value*) / sum(e2e*) over the full-sample ratio; requests
  are grouped into log-scale cells by latency and by value (``CELLS_PER_OCTAVE`` per doubling), each
  represented by its mean value and mean latency, so both spreads and their correlation are kept.
- ``Rate`` objectives at an open-loop level (arrivals at a set rate): a resample is a multinomial draw
  of counts over the run's per-request values. Values are grouped into at most ``RATE_BINS`` bins by value,
  each represented by its mean, which keeps every replicate's expectation exact and loses only the
  within-bin spread (a few tokens out of hundreds).
- ``Quantile`` objectives: the k-th order statistic of a resample of n values is the empirical
  quantile at U(k), the k-th order statistic of n uniforms ~ Beta(k, n + 1 - k); U(k+1) follows as
  U(k) + (1 - U(k)) Beta(1, n - k). That gives ``quantile_cont``'s interpolated value per replicate
  without drawing n values.
"""

from __future__ import annotations

import dataclasses
import logging
import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import TYPE_CHECKING, Any

import numpy as np

from analysis.goodput import GOODPUT_METRICS, goodput_metrics
from analysis.layout import attempted_job_ids, committed_job_ids
from analysis.metrics import METRICS_BY_NAME, Metric, Rate
from analysis.slo import Slo, check_metric
from analysis.store import ResultStore, as_store
from analysis.views import Location, check_current_inputs, requests_of_jobs
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

log = logging.getLogger(__name__)

RATE_BINS = 16
CELLS_PER_OCTAVE = 4  # closed-loop rate cells: within a cell values differ by < 19%
DEFAULT_REPLICATES = 1000
DEFAULT_OBJECTIVE = "output_tok_s_per_gpu"
# A config whose failed requests exceed this share of a level (median over repeats) is not ranked there:
# its throughput counts only the requests that worked, so a flaky config could otherwise win.
DEFAULT_MAX_ERROR_RATE = 0.01
ERROR_RATE = "error_rate"
DEFAULT_CONFIDENCE = 0.95
SWEEP_ROLES = ("sweep",)  # jobs.role of the grid points (a confirmation launch is ranked on request)
# Objectives by what a team asks for: tokens served, requests served within the SLOs, a user's wait.
OBJECTIVE_ALIASES: dict[str, str] = {
    "throughput": "output_tok_s_per_gpu",
    "goodput": "goodput_rps",
    "latency": "e2e_p50_ms",
}
MAX_MORE_REPEATS = 100  # beyond this, two configs are the same for any practical purpose
# Launch-to-launch relative sd of a level metric assumed when no config was repeated (the spec's
# launch_noise overrides it): real launches of one config differ by a few percent.
DEFAULT_LAUNCH_NOISE = 0.02
SEPARATE_DIFFERENCE = 0.01  # the relative difference "launches that would separate" is stated for

# Level columns that SLOs may name: every scalar metric, SGLang's own accept length, and goodput
# (computed from the request rows under per-request SLOs).
SLO_METRICS: tuple[str, ...] = (*METRICS_BY_NAME, "server_accept_length", *GOODPUT_METRICS)
OBJECTIVE_METRICS: tuple[str, ...] = (
    *OBJECTIVE_ALIASES,
    *(m.name for m in METRICS_BY_NAME.values() if m.can_be_objective),
    "goodput_rps",
)


@dataclass(frozen=True)
class Interval:
    """A bootstrap percentile interval at the selection's confidence (95% by default)."""

    low: float
    high: float


@dataclass(frozen=True)
class LaunchNoise:
    """The launch-to-launch relative sd of the objective that every interval carries, and its source."""

    relative_sd: float
    repeated_configs: int  # configs with >= 2 launches it was estimated from; 0: the prior was used

    @property
    def text(self) -> str:
        """What the output says, e.g. "launch noise 1.8% (from 6 repeated configs)"."""
        value = f"{self.relative_sd:.1%}"
        if self.repeated_configs:
            return f"launch noise {value} (from {self.repeated_configs} repeated configs)"
        return f"launch noise {value} (assumed: no config was repeated; set repeats >= 2 to measure it)"


@dataclass(frozen=True)
class RankedConfig:
    """A config that meets every SLO at a level, with its objective and speedup."""

    rank: int
    config_label: str
    is_baseline: bool
    repeats: int
    job_ids: tuple[str, ...]
    objective: float
    objective_mad: float | None  # median absolute deviation over repeats; null with one repeat
    objective_ci: Interval | None
    speedup: float | None  # vs the baseline at this level; null without a baseline
    speedup_ci: Interval | None
    tie: bool  # in the level's tie set: not distinguishable from the winner (the winner: when one is)
    difference_ci: Interval | None  # winner's objective minus this one's (null for the winner)
    more_repeats: int | None  # about how many more repeats of both would separate a tie; null if none would
    error_rate: float | None  # failed requests / requests at this level, median over repeats
    goodput_rps: float | None  # median over repeats; null without per-request SLOs
    goodput_share: float | None
    slo_values: dict[str, float | None]
    launch_command: str | None
    sglang_argv: tuple[str, ...] | None


@dataclass(frozen=True)
class ExcludedConfig:
    """A config measured at a level that misses at least one SLO, and why."""

    config_label: str
    reasons: tuple[str, ...]
    error_rate: float | None  # failed requests / requests at this level, median over repeats


@dataclass(frozen=True)
class LevelChoice:
    """The ranking at one load level."""

    load_level: str
    baseline_label: str | None
    baseline_objective: float | None
    ranked: tuple[RankedConfig, ...]
    excluded: tuple[ExcludedConfig, ...]
    tie_set: tuple[str, ...] = ()  # the winner and every config tied with it (the winner alone: no tie)
    launches_to_separate: int | None = None  # launches of each that would separate a 1% difference in it

    @property
    def winner(self) -> RankedConfig | None:
        return self.ranked[0] if self.ranked else None


@dataclass(frozen=True)
class Selection:
    """Everything ``best`` reports: per level choices plus notes on what the data lacks."""

    sweep_id: str
    objective: str
    objective_unit: str
    better: str
    slos: tuple[str, ...]
    request_slos: tuple[str, ...]  # per-request limits that define goodput
    confidence: float
    max_error_rate: float
    replicates: int
    levels: tuple[LevelChoice, ...]
    notes: tuple[str, ...]
    launch_noise: LaunchNoise = LaunchNoise(DEFAULT_LAUNCH_NOISE, 0)  # what every interval carries


@dataclass(frozen=True)
class _Run:
    """One job's row at one level (a repeat of a config)."""

    job_id: str
    config_label: str
    is_baseline: bool
    values: dict[str, float | None]
    duration_s: float
    gpus: int
    launch_command: str | None
    sglang_argv: tuple[str, ...] | None


def select_best(
    con: duckdb.DuckDBPyConnection,
    out: Location,
    *,
    objective: str = DEFAULT_OBJECTIVE,
    slos: tuple[Slo, ...] = (),
    request_slos: tuple[Slo, ...] = (),
    at: str | None = None,
    replicates: int = DEFAULT_REPLICATES,
    confidence: float = DEFAULT_CONFIDENCE,
    seed: int = 0,
    allow_partial: bool = False,
    max_error_rate: float = DEFAULT_MAX_ERROR_RATE,
    roles: tuple[str, ...] = SWEEP_ROLES,
    axis: tuple[str, str] | None = None,
    launch_noise: float | None = None,
) -> Selection:
    """Rank configs per level; see the module docstring for the statistics. A config whose error rate
    at a level exceeds ``max_error_rate`` is excluded there, with its rate as the reason. ``roles``:
    the jobs ranked (default the sweep's grid points; add "confirmation" to rank the adaptive launch
    beside them). ``axis``: (name, value) of a server axis: only the jobs run at that value are ranked,
    against the baseline run at it. ``launch_noise``: the relative sd assumed when no config was
    repeated (default: the spec's ``launch_noise``, else ``DEFAULT_LAUNCH_NOISE``)."""
    out = as_store(out)
    metrics = {**METRICS_BY_NAME, **goodput_metrics(request_slos)}
    metric = _objective_metric(objective, metrics)
    _check_goodput_slos(slos, metrics)
    check_bootstrap(confidence, replicates)
    if not 0.0 <= max_error_rate <= 1.0:
        raise ResultsError(
            f"--max-error-rate {max_error_rate:g} is not a share of requests",
            where="--max-error-rate",
            fix="use a value from 0 (no failed request allowed) to 1 (any)",
        )
    notes = _completeness_notes(con, out, allow_partial=allow_partial)
    sweep_id = _single_sweep(con)
    notes.extend(check_current_inputs(con, out.location))
    skipped: set[str] = set()
    if axis is not None:
        from analysis.axes import jobs_elsewhere

        skipped |= jobs_elsewhere(con, *axis)
    runs_by_level = _load_runs(con, out, metric, slos, request_slos, roles, skipped)
    if not runs_by_level and con.sql("SELECT count(*) FROM capacity_results").fetchall()[0][0]:
        raise ResultsError(
            "the sweep ran capacity searches only, no fixed load levels",
            where=out.location,
            fix="rank them with `specsweep best OUT --objective capacity`, or add load.concurrency / "
            "load.rates levels to the spec for per-level rankings and the report",
        )
    if not runs_by_level:
        raise ResultsError(
            "no job finished with measured load levels (every committed job failed)",
            where=out.location,
            fix='see `specsweep sql OUT "SELECT config_label, error_class, error_message FROM jobs"`',
        )
    levels = order_levels(con, list(runs_by_level))
    if at is not None:
        if at not in runs_by_level:
            raise ResultsError(
                f"load level {at!r} was not measured",
                where="--at",
                fix=f"use one of: {', '.join(levels)}",
            )
        levels = [at]
    baselines = sorted({r.config_label for runs in runs_by_level.values() for r in runs if r.is_baseline})
    if not baselines:
        notes.append("no no-speculation baseline was measured: speedups are null")
    elif len(baselines) > 1:
        notes.append(f"several baseline configs {baselines}: speedups use {baselines[0]!r}")
    baseline_label = baselines[0] if baselines else None
    ranked_jobs = {run.job_id for runs in runs_by_level.values() for run in runs}
    resampler = _Resampler(con, metric, replicates, seed, requests_of_jobs(out, ranked_jobs), confidence)
    prior = spec_launch_noise(con) if launch_noise is None else launch_noise
    noise = estimate_launch_noise(runs_by_level, metric, resampler, prior)
    resampler.noise = noise.relative_sd
    choices = tuple(
        _choose_level(
            level, runs_by_level[level], metric, slos, baseline_label, resampler, notes, max_error_rate
        )
        for level in levels
    )
    return Selection(
        sweep_id=sweep_id,
        objective=metric.name,
        objective_unit=metric.unit,
        better=metric.better or "higher",
        slos=tuple(str(s) for s in slos),
        request_slos=tuple(str(s) for s in request_slos),
        confidence=confidence,
        max_error_rate=max_error_rate,
        replicates=replicates,
        levels=choices,
        notes=tuple(notes),
        launch_noise=noise,
    )


def spec_launch_noise(con: duckdb.DuckDBPyConnection) -> float:
    """The spec's ``launch_noise`` (the relative sd assumed when no config was repeated), read from the
    sweep row's YAML; ``DEFAULT_LAUNCH_NOISE`` when the row or the field is absent."""
    import yaml

    rows = con.sql("SELECT spec_text FROM sweep").fetchall()
    spec = yaml.safe_load(rows[0][0]) if rows and rows[0][0] else None
    value = spec.get("launch_noise") if isinstance(spec, dict) else None
    return float(value) if value is not None else DEFAULT_LAUNCH_NOISE


def estimate_launch_noise(
    runs_by_level: dict[str, list[_Run]], metric: Metric, resampler: _Resampler, prior: float
) -> LaunchNoise:
    """The launch-to-launch relative sd of ``metric`` from the repeated configs (see the module
    docstring), or ``prior`` when none was repeated. A repeated config's launches differ by launch noise
    and by each launch's own request sampling; the second is known from the request-level replicates,
    so only the excess counts."""
    excess, weights, repeated = 0.0, 0, set()
    for level, runs in runs_by_level.items():
        by_config: dict[str, list[_Run]] = {}
        for run in runs:
            by_config.setdefault(run.config_label, []).append(run)
        for label, group in by_config.items():
            values = [run.values.get(metric.name) for run in group]
            if len(group) < 2 or any(v is None or not v > 0 for v in values):
                continue
            y = np.asarray(values, dtype=float)
            within = [resampler.within_variance(level, run) / v**2 for run, v in zip(group, y, strict=True)]
            excess += (len(group) - 1) * (float(np.var(y / y.mean(), ddof=1)) - float(np.mean(within)))
            weights += len(group) - 1
            repeated.add(label)
    if not weights:
        return LaunchNoise(prior, 0)
    return LaunchNoise(math.sqrt(max(excess / weights, 0.0)), len(repeated))


def check_bootstrap(confidence: float, replicates: int) -> None:
    """Refuse a confidence or a replicate count no interval can be read from."""
    if not 0.5 <= confidence < 1:
        raise ResultsError(f"--confidence {confidence} is not a probability in [0.5, 1)", fix="e.g. 0.95")
    if replicates < 100:
        raise ResultsError(f"--bootstrap {replicates} is too few for an interval", fix="use at least 100")


def _objective_metric(name: str, metrics: dict[str, Metric]) -> Metric:
    name = OBJECTIVE_ALIASES.get(name, name)
    check_metric(name, SLO_METRICS, where="--objective")
    if name in GOODPUT_METRICS and name not in metrics:
        raise _goodput_needs_slos("--objective")
    metric = metrics.get(name)
    if metric is None or not metric.can_be_objective:
        raise ResultsError(
            f"metric {name!r} cannot be an objective (it is not a rankable rate or percentile)",
            where="--objective",
            fix=f"use one of: {', '.join(OBJECTIVE_METRICS)} (it can still be an SLO)",
        )
    return metric


def _goodput_needs_slos(where: str) -> ResultsError:
    return ResultsError(
        "goodput counts the requests that meet per-request SLOs, and none were given",
        where=where,
        fix='pass --request-slo "ttft_ms<=2000,tpot_ms<=50" (any of ttft_ms, tpot_ms, e2e_ms) '
        "or set request_slo in the spec",
    )


def _check_goodput_slos(slos: tuple[Slo, ...], metrics: dict[str, Metric]) -> None:
    if any(s.metric in GOODPUT_METRICS and s.metric not in metrics for s in slos):
        raise _goodput_needs_slos("--slo")


def _completeness_notes(
    con: duckdb.DuckDBPyConnection, out: ResultStore, *, allow_partial: bool
) -> list[str]:
    """What the results lack; a sweep with uncommitted jobs is refused unless allow_partial."""
    notes: list[str] = []
    uncommitted = sorted(attempted_job_ids(out) - committed_job_ids(out))
    if uncommitted:
        shown = ", ".join(uncommitted[:5]) + (" ..." if len(uncommitted) > 5 else "")
        message = f"sweep is not finished: {len(uncommitted)} job(s) started but not committed ({shown})"
        if not allow_partial:
            raise ResultsError(
                message,
                where=out.location,
                fix="wait for `specsweep run` to finish (or resume it), or pass --allow-partial "
                "to rank only the committed jobs",
            )
        notes.append(message + "; ranking covers committed jobs only")
    if con.sql("SELECT count(*) FROM sweep").fetchall()[0][0] == 0:
        notes.append("no sweep row (OUT/sweep/...): spec and versions are unknown")
    for label, error_class, error_message in con.sql(
        "SELECT config_label, error_class, error_message FROM jobs WHERE status = 'failed' "
        "ORDER BY config_label, repeat_index"
    ).fetchall():
        notes.append(f"config {label!r} failed ({error_class}: {error_message}): not ranked")
    for (label,) in con.sql(
        "SELECT config_label FROM jobs j WHERE status = 'done' AND NOT EXISTS "
        "(SELECT 1 FROM levels l WHERE l.sweep_id = j.sweep_id AND l.job_id = j.job_id)"
    ).fetchall():
        notes.append(f"config {label!r} is done but has no levels rows: not ranked")
    return notes


def _single_sweep(con: duckdb.DuckDBPyConnection) -> str:
    ids = [row[0] for row in con.sql("SELECT DISTINCT sweep_id FROM jobs ORDER BY 1").fetchall()]
    if len(ids) > 1:
        raise ResultsError(
            f"holds {len(ids)} sweeps ({', '.join(ids)}); best ranks one sweep at a time",
            fix="give each sweep its own output directory",
        )
    return str(ids[0])


def _load_runs(
    con: duckdb.DuckDBPyConnection,
    out: ResultStore,
    metric: Metric,
    slos: tuple[Slo, ...],
    request_slos: tuple[Slo, ...],
    roles: tuple[str, ...],
    skip: set[str] | frozenset[str] = frozenset(),
) -> dict[str, list[_Run]]:
    """Current jobs' level rows of ``roles`` (``results``: done, on the sweep's current inputs), keyed by
    load level, with goodput under ``request_slos``; the jobs in ``skip`` (e.g. run at another value of
    the axis ranked) left out."""
    columns = sorted({metric.name, ERROR_RATE, *(s.metric for s in slos)} - set(GOODPUT_METRICS))
    selected = ", ".join(f"r.{c}" for c in columns)
    rows = con.execute(
        f"SELECT r.load_level, r.job_id, r.config_label, r.effective_speculative_algorithm IS NULL, "
        f"r.duration_s, r.gpus, r.launch_command, j.sglang_argv, {selected} "
        "FROM results r JOIN jobs j USING (sweep_id, job_id) WHERE r.role IN (SELECT unnest(?)) "
        "ORDER BY r.config_label, r.repeat_index",
        [list(roles)],
    ).fetchall()
    rows = [row for row in rows if row[1] not in skip]
    goodput = _goodput_values(con, out, {row[1] for row in rows}, request_slos) if request_slos else {}
    runs: dict[str, list[_Run]] = {}
    for level, job_id, label, baseline, duration_s, gpus, command, argv, *values in rows:
        run_values: dict[str, float | None] = dict(zip(columns, values, strict=True))
        if request_slos:  # a level without request rows: no good request, nothing to share
            run_values |= goodput.get((job_id, level), {"goodput_rps": 0.0, "goodput_share": None})
        runs.setdefault(level, []).append(
            _Run(
                job_id=job_id,
                config_label=label,
                is_baseline=bool(baseline),
                values=run_values,
                duration_s=duration_s,
                gpus=gpus,
                launch_command=command,
                sglang_argv=tuple(argv) if argv is not None else None,
            )
        )
    return runs


def _goodput_values(
    con: duckdb.DuckDBPyConnection, out: ResultStore, job_ids: set[str], request_slos: tuple[Slo, ...]
) -> dict[tuple[str, str], dict[str, float | None]]:
    """Per (job, level): goodput_rps and goodput_share by their one definition (``analysis.goodput``),
    over the level's non-warmup request rows and its window's ``duration_s``."""
    metrics = goodput_metrics(request_slos)
    values = ", ".join(metric.aggregate.sql() for metric in metrics.values())
    rows = con.sql(
        f"SELECT job_id, load_level, {values} FROM (SELECT q.*, l.duration_s "
        f"FROM {requests_of_jobs(out, job_ids)} q "
        "JOIN (SELECT sweep_id, job_id, load_level, duration_s FROM levels) l "
        "USING (sweep_id, job_id, load_level) WHERE NOT q.warmup) GROUP BY job_id, load_level"
    ).fetchall()
    return {(job_id, level): dict(zip(metrics, found, strict=True)) for job_id, level, *found in rows}


def order_levels(con: duckdb.DuckDBPyConnection, levels: list[str]) -> list[str]:
    """Levels by concurrency, then rate, then name."""
    order = con.sql(
        "SELECT load_level FROM levels GROUP BY load_level "
        "ORDER BY min(concurrency) NULLS LAST, min(rate_rps) NULLS LAST, load_level"
    ).fetchall()
    ordered = [row[0] for row in order]
    return [level for level in ordered if level in levels]


def _no_value_reason(metric: str, error_rate: float | None, is_baseline: bool) -> str:
    """Why a config has no objective value: every request failed, or its requests do not report the
    metric (the baseline does not speculate, so it has no accept length)."""
    if error_rate is None or error_rate >= 1:
        return f"{metric} has no value (no successful requests)"
    if is_baseline:
        return f"{metric} has no value (its requests do not report it: the baseline does not speculate)"
    return f"{metric} has no value (its successful requests do not report it)"


def _median(values: list[float]) -> float:
    return float(np.median(values))


def _choose_level(
    level: str,
    runs: list[_Run],
    metric: Metric,
    slos: tuple[Slo, ...],
    baseline_label: str | None,
    resampler: _Resampler,
    notes: list[str],
    max_error_rate: float,
) -> LevelChoice:
    by_config: dict[str, list[_Run]] = {}
    for run in runs:
        by_config.setdefault(run.config_label, []).append(run)
    baseline_runs = by_config.get(baseline_label) if baseline_label else None
    if baseline_label and baseline_runs is None:
        notes.append(f"{level}: the baseline was not measured here: speedups are null")
    baseline_reps = resampler.replicates_of(level, baseline_runs) if baseline_runs else None
    baseline_objective = _config_value(baseline_runs, metric.name) if baseline_runs else None
    qualified: list[tuple[str, list[_Run], float, dict[str, float | None]]] = []
    excluded: list[ExcludedConfig] = []
    error_rates = {label: _config_value(config_runs, ERROR_RATE) for label, config_runs in by_config.items()}
    for label, config_runs in by_config.items():
        slo_values = {s.metric: _config_value(config_runs, s.metric) for s in slos}
        reasons = tuple(
            f"{s.metric} = {_fmt(slo_values[s.metric])} is not {s.op} {s.threshold:g}"
            for s in slos
            if not s.holds(slo_values[s.metric])
        )
        error_rate = error_rates[label]
        if error_rate is not None and error_rate > max_error_rate:
            reasons += (
                f"error rate {error_rate:.1%} is above the limit {max_error_rate:.1%} (--max-error-rate)",
            )
        objective = _config_value(config_runs, metric.name)
        if objective is None:
            reasons += (_no_value_reason(metric.name, error_rate, label == baseline_label),)
        if reasons:
            excluded.append(ExcludedConfig(label, reasons, error_rate))
        else:
            qualified.append((label, config_runs, objective, slo_values))  # type: ignore[arg-type]
    sign = -1.0 if metric.better == "lower" else 1.0
    qualified.sort(key=lambda item: (-sign * item[2], item[0]))
    ranked: list[RankedConfig] = []
    winner: tuple[float, np.ndarray, int] | None = None  # objective, replicates, repeats
    confidence = resampler.confidence
    for rank, (label, config_runs, objective, slo_values) in enumerate(qualified, start=1):
        reps = resampler.replicates_of(level, config_runs)
        objective_ci = _interval(reps, confidence)
        speedup = speedup_ci = None
        is_baseline = label == baseline_label
        if baseline_objective is not None and baseline_reps is not None:
            speedup = _point_ratio(objective, baseline_objective, metric)
            if not is_baseline:
                speedup_ci = _speedup_interval(reps, baseline_reps, metric, confidence)
        difference_ci = more_repeats = None
        if winner is None:
            winner = (objective, reps, len(config_runs))
        else:
            difference_ci = _interval(sign * (winner[1] - reps), confidence)
            repeats = min(winner[2], len(config_runs))
            more_repeats = _more_repeats(sign * (winner[0] - objective), difference_ci, repeats)
        values = [r.values[metric.name] for r in config_runs]
        first = config_runs[0]
        ranked.append(
            RankedConfig(
                rank=rank,
                config_label=label,
                is_baseline=is_baseline,
                repeats=len(config_runs),
                job_ids=tuple(r.job_id for r in config_runs),
                objective=objective,
                objective_mad=_mad(values) if len(values) > 1 else None,  # type: ignore[arg-type]
                objective_ci=objective_ci,
                speedup=speedup,
                speedup_ci=speedup_ci,
                tie=difference_ci is not None and difference_ci.low <= 0,
                difference_ci=difference_ci,
                more_repeats=more_repeats if difference_ci is not None and difference_ci.low <= 0 else None,
                error_rate=error_rates[label],
                goodput_rps=_config_value(config_runs, "goodput_rps"),
                goodput_share=_config_value(config_runs, "goodput_share"),
                slo_values=slo_values,
                launch_command=first.launch_command,
                sglang_argv=first.sglang_argv,
            )
        )
    tied = [r for r in ranked if r.rank == 1 or r.tie]
    if len(tied) > 1:  # the winner is one of a tie set, not a winner by itself
        ranked[0] = tied[0] = dataclasses.replace(ranked[0], tie=True)
    return LevelChoice(
        level,
        baseline_label,
        baseline_objective,
        tuple(ranked),
        tuple(excluded),
        tie_set=tuple(r.config_label for r in tied),
        launches_to_separate=_launches_to_separate(level, tied, by_config, metric, resampler)
        if len(tied) > 1
        else None,
    )


def _launches_to_separate(
    level: str,
    tied: list[RankedConfig],
    by_config: dict[str, list[_Run]],
    metric: Metric,
    resampler: _Resampler,
) -> int:
    """Launches of each of two tied configs whose difference's interval would be narrower than a
    ``SEPARATE_DIFFERENCE`` relative difference: n >= 2 z^2 (sigma^2 + w) / d^2, with sigma the launch
    noise and w the tie set's mean within-launch relative variance (requests per launch as now)."""
    z = NormalDist().inv_cdf(1 - (1 - resampler.confidence) / 2)
    values = [(run, run.values.get(metric.name)) for r in tied for run in by_config[r.config_label]]
    within = [resampler.within_variance(level, run) / v**2 for run, v in values if v]
    variance = resampler.noise**2 + (float(np.mean(within)) if within else 0.0)
    return max(1, math.ceil(2 * z**2 * variance / SEPARATE_DIFFERENCE**2))


def _config_value(runs: list[_Run], name: str) -> float | None:
    """Median over repeats; null if any repeat has no value."""
    values = [r.values.get(name) for r in runs]
    if any(v is None for v in values):
        return None
    return _median(values)  # type: ignore[arg-type]


def _more_repeats(difference: float, interval: Interval, repeats: int) -> int | None:
    """About how many more repeats of both configs would make ``interval`` (of a difference whose point
    value ``difference`` >= 0) exclude 0, if its half-width shrinks as 1 / sqrt(repeats); null when the
    point values are equal or it would take more than ``MAX_MORE_REPEATS``."""
    half_width = (interval.high - interval.low) / 2
    if difference <= 0:
        return None
    needed = math.ceil(repeats * (half_width / difference) ** 2)
    more = max(1, needed - repeats)
    return more if more <= MAX_MORE_REPEATS else None


def _mad(values: list[float]) -> float:
    center = _median(values)
    return _median([abs(v - center) for v in values])


def _ratio(config: Any, baseline: Any, metric: Metric) -> Any:
    """Speedup: config / baseline for higher-is-better objectives, baseline / config otherwise.

    Works alike on point values (float) and on bootstrap replicates (arrays)."""
    return baseline / config if metric.better == "lower" else config / baseline


def _point_ratio(config: float, baseline: float, metric: Metric) -> float | None:
    """The speedup of point values; null when its denominator is 0 (e.g. a baseline with no goodput)."""
    denominator = config if metric.better == "lower" else baseline
    return _ratio(config, baseline, metric) if denominator != 0 else None


def _speedup_interval(
    reps: np.ndarray, baseline_reps: np.ndarray, metric: Metric, confidence: float
) -> Interval | None:
    """Interval of the speedup over paired replicates.

    A resample whose denominator is 0 (with few requests, a draw can hold no tokens) has no ratio and is
    left out; with none left the interval is null.
    """
    with np.errstate(divide="ignore", invalid="ignore"):
        ratios = _ratio(reps, baseline_reps, metric)
    finite = ratios[np.isfinite(ratios)]
    return _interval(finite, confidence) if finite.size else None


def _interval(replicates: np.ndarray, confidence: float) -> Interval:
    tail = (1 - confidence) / 2 * 100
    low, high = np.percentile(replicates, [tail, 100 - tail])
    return Interval(float(low), float(high))


def tie_text(level: LevelChoice, confidence: float) -> str | None:
    """The level's tie set as the answer, with the launches that would separate a 1% difference; None
    when the winner is alone."""
    if len(level.tie_set) < 2:
        return None
    repeats = min(r.repeats for r in level.ranked if r.tie)
    more = (level.launches_to_separate or 0) - repeats
    separate = (
        f"about {more} more launches of each would separate a {SEPARATE_DIFFERENCE:.0%} difference"
        if more > 0
        else f"a {SEPARATE_DIFFERENCE:.0%} difference would already be separated: they differ by less"
    )
    return f"tie: {', '.join(level.tie_set)} - not separable at {confidence:.0%}; {separate}"


def share_text(value: float | None) -> str:
    """A share (an error rate) as a percentage, "-" when unknown."""
    return "-" if value is None else f"{value:.1%}"


def _fmt(value: float | None) -> str:
    return "null" if value is None else f"{value:.4g}"


class _Resampler:
    """Bootstrap replicates of the objective per run, from the request rows (one query per kind)."""

    def __init__(
        self,
        con: duckdb.DuckDBPyConnection,
        metric: Metric,
        replicates: int,
        seed: int,
        requests: str,
        confidence: float,
    ) -> None:
        self.confidence = confidence
        self._con = con
        self._requests = requests  # the ranked jobs' request rows (views.requests_of_jobs)
        self._metric = metric
        self._replicates = replicates
        self._rng = np.random.default_rng(seed)
        self._samples: dict[tuple[str, str], tuple[np.ndarray, np.ndarray]] | None = None
        self._bins: dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]] | None = None
        self._per_run: dict[tuple[str, str], np.ndarray] = {}
        self.noise = 0.0  # launch noise (relative sd) each launch's replicates carry; set once estimated

    def replicates_of(self, level: str, runs: list[_Run]) -> np.ndarray:
        """Replicates of the config's objective: per replicate, the median over its repeats of each
        launch's request-level replicate times that launch's noise factor 1 + noise x Z."""
        per_run = np.stack([self._cached(level, run) for run in runs])
        if self.noise:
            factors = 1 + self.noise * self._rng.standard_normal(per_run.shape)
            per_run = per_run * np.maximum(factors, 0.0)
        return np.asarray(np.median(per_run, axis=0))

    def within_variance(self, level: str, run: _Run) -> float:
        """The variance of one launch's value from its request sampling alone (0 where none is known)."""
        replicates = self._cached(level, run)
        finite = replicates[np.isfinite(replicates)]
        return float(np.var(finite)) if finite.size > 1 else 0.0

    def _cached(self, level: str, run: _Run) -> np.ndarray:
        """A launch's request-level replicates, drawn once: the noise estimate and its interval share them."""
        key = (run.job_id, level)
        if key not in self._per_run:
            self._per_run[key] = self._run_replicates(level, run)
        return self._per_run[key]

    def _run_replicates(self, level: str, run: _Run) -> np.ndarray:
        aggregate = self._metric.aggregate
        if isinstance(aggregate, Rate):
            cells = self._latency_cells().get((run.job_id, level))
            point = run.values.get(self._metric.name)
            if cells is not None and point is not None:
                return point * ratio_replicates(self._rng, *cells, self._replicates)
        sample = self._load().get((run.job_id, level))
        if sample is None:
            return np.full(self._replicates, np.nan)
        values, counts = sample
        if isinstance(aggregate, Rate):
            scale = run.duration_s * (run.gpus if aggregate.per_gpu else 1)
            return rate_replicates(self._rng, values, counts, self._replicates) / scale
        return quantile_replicates(self._rng, values, aggregate.q, self._replicates)  # type: ignore[union-attr]

    def _latency_cells(self) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Per closed-loop (job, level): per (latency, value) cell, request count, sum of values, sum of e2e.

        Cells are log-scale, ``CELLS_PER_OCTAVE`` per doubling of latency and of value: one GROUP BY pass
        over the requests, no per-level bounds to join back. Cells come in a fixed order, so a seed
        reproduces the intervals.
        """
        if self._bins is not None:
            return self._bins
        value = self._metric.aggregate.value  # type: ignore[union-attr]
        table = self._con.sql(
            f"""
            SELECT job_id, load_level, list(n ORDER BY t_cell, v_cell) AS n, list(v ORDER BY t_cell, v_cell) AS v,
                   list(t ORDER BY t_cell, v_cell) AS t FROM (
                SELECT job_id, load_level,
                       floor(log2(greatest(t, 1e-3)) * {CELLS_PER_OCTAVE})::INT AS t_cell,
                       floor(log2(1 + v) * {CELLS_PER_OCTAVE})::INT AS v_cell,
                       count(*)::DOUBLE AS n, sum(v) AS v, sum(t) AS t
                FROM (SELECT job_id, load_level, coalesce(({value})::DOUBLE, 0) AS v, e2e_ms AS t
                      FROM {self._requests}
                      WHERE NOT warmup AND concurrency IS NOT NULL AND e2e_ms IS NOT NULL)
                GROUP BY ALL)
            GROUP BY job_id, load_level
            """
        ).fetchall()
        self._bins = {
            (job_id, level): (np.asarray(n), np.asarray(v), np.asarray(t)) for job_id, level, n, v, t in table
        }
        return self._bins

    def _load(self) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
        """Per (job, level): distinct per-request values ascending and how many requests had each.

        Rate values repeat (token counts), so counting them keeps the transfer small; quantile
        values are continuous, so every request keeps its own entry (count 1).
        """
        if self._samples is not None:
            return self._samples
        aggregate = self._metric.aggregate
        per_request = (
            f"SELECT job_id, load_level, ({aggregate.value})::DOUBLE AS v "  # type: ignore[union-attr]
            f"FROM {self._requests} WHERE NOT warmup"
        )
        if isinstance(aggregate, Rate):
            counted = (
                f"SELECT job_id, load_level, coalesce(v, 0) AS v, count(*) AS n FROM ({per_request}) "
                "GROUP BY ALL"
            )
        else:
            counted = f"SELECT job_id, load_level, v, 1 AS n FROM ({per_request}) WHERE v IS NOT NULL"
        table = self._con.sql(
            "SELECT job_id, load_level, list(v ORDER BY v) AS v, list(n ORDER BY v) AS n "
            f"FROM ({counted}) GROUP BY job_id, load_level"
        ).to_arrow_table()
        values = table.column("v").combine_chunks()
        counts = table.column("n").combine_chunks()
        flat_values = _float64_view(values.flatten())
        flat_counts = _float64_view(counts.flatten().cast("float64"))
        offsets = _float64_view(values.offsets.cast("float64")).astype(np.int64)
        offsets -= offsets[0]  # flatten() starts at the first list's first value
        keys = zip(table.column("job_id").to_pylist(), table.column("load_level").to_pylist(), strict=True)
        self._samples = {
            key: (flat_values[offsets[i] : offsets[i + 1]], flat_counts[offsets[i] : offsets[i + 1]])
            for i, key in enumerate(keys)
        }
        return self._samples


def ratio_replicates(
    rng: np.random.Generator,
    counts: np.ndarray,
    value_sums: np.ndarray,
    latency_sums: np.ndarray,
    replicates: int,
) -> np.ndarray:
    """Bootstrap replicates of sum(value) / sum(latency), relative to the full sample's ratio (1 = same).

    ``counts[i]`` requests fell in cell i, with these sums of values and of latencies, each cell
    represented by its means. A resample draws each cell's count independently, as in the Poisson
    bootstrap, from the normal approximation N(counts[i], counts[i]) of Poisson(counts[i]) (for a ratio
    of sums over thousands of requests it matches the multinomial bootstrap, at a fraction of the cost).
    """
    used = counts > 0
    counts, value_sums, latency_sums = counts[used], value_sums[used], latency_sums[used]
    noise = rng.standard_normal((replicates, counts.size))
    draws = np.maximum(counts + np.sqrt(counts) * noise, 0.0)
    full = value_sums.sum() / latency_sums.sum()
    if full == 0:  # every value 0 (no good request): every resample is 0 too
        return np.ones(replicates)
    ratios = (draws @ (value_sums / counts)) / np.maximum(draws @ (latency_sums / counts), 1e-12)
    return np.asarray(ratios / full)


def rate_replicates(
    rng: np.random.Generator, values: np.ndarray, counts: np.ndarray, replicates: int
) -> np.ndarray:
    """Bootstrap replicates of the sum over n = sum(counts) requests resampled with replacement.

    ``values`` ascending, ``counts[i]`` requests had ``values[i]``. Values are grouped into
    RATE_BINS bins, each represented by its mean; the multinomial draw of bin counts is the resample.
    """
    n = int(counts.sum())
    edges = np.linspace(values[0], values[-1], RATE_BINS + 1)
    bins = np.clip(np.searchsorted(edges, values, side="right") - 1, 0, RATE_BINS - 1)
    bin_counts = np.bincount(bins, weights=counts, minlength=RATE_BINS)
    bin_sums = np.bincount(bins, weights=values * counts, minlength=RATE_BINS)
    used = bin_counts > 0
    means = bin_sums[used] / bin_counts[used]
    draws = rng.multinomial(n, bin_counts[used] / n, size=replicates)
    return draws @ means


def quantile_replicates(
    rng: np.random.Generator, values: np.ndarray, q: float, replicates: int
) -> np.ndarray:
    """Bootstrap replicates of ``quantile_cont(values, q)`` (values ascending), via uniform order stats."""
    n = len(values)
    if n == 1:
        return np.full(replicates, values[0])
    h = (n - 1) * q  # 0-based interpolation position
    k = int(np.floor(h)) + 1  # 1-based lower order statistic
    frac = h - (k - 1)
    u_low = rng.beta(k, n + 1 - k, replicates)
    u_high = u_low + (1 - u_low) * rng.beta(1, n - k, replicates) if k < n else u_low
    low = values[np.clip(np.ceil(u_low * n).astype(int) - 1, 0, n - 1)]
    high = values[np.clip(np.ceil(u_high * n).astype(int) - 1, 0, n - 1)]
    return np.asarray(low + frac * (high - low))


def _float64_view(array: pa.Array) -> np.ndarray:
    """A null-free float64 Arrow array as numpy without a copy (pyarrow's own conversion imports
    pandas, which costs more than the whole ranking)."""
    data = array.buffers()[1]
    return np.frombuffer(data, dtype=np.float64, count=len(array), offset=array.offset * 8)


@dataclass(frozen=True)
class Measured:
    """One config at one level as ``best`` measures it, for comparing sweeps (``analysis.compare``)."""

    config_label: str
    is_baseline: bool
    job_ids: tuple[str, ...]
    value: float | None  # median over repeats; null without one
    replicates: np.ndarray  # per bootstrap replicate: requests resampled, launch noise drawn; NaN where none
    error_rate: float | None
    sglang_argv: tuple[str, ...] | None


@dataclass(frozen=True)
class Measurements:
    """A sweep's configs per level (in ``best``'s level order) under one metric."""

    sweep_id: str
    metric: Metric
    levels: dict[str, dict[str, Measured]]
    notes: tuple[str, ...]
    launch_noise: LaunchNoise  # carried by every replicate


def measure_configs(
    con: duckdb.DuckDBPyConnection,
    out: Location,
    metric_name: str,
    *,
    replicates: int = DEFAULT_REPLICATES,
    seed: int = 0,
    allow_partial: bool = False,
    category: str | None = None,
) -> Measurements:
    """Per level and config, ``metric_name`` as ``best`` ranks it and its bootstrap replicates, over the
    jobs ``best`` ranks (the sweep's current inputs; an unfinished sweep refused unless ``allow_partial``).
    ``category`` (as ``category_results`` names it): a percentile over that category's requests only; a
    rate has no value per category (a level serves its categories in one batch)."""
    out = as_store(out)
    metric = _objective_metric(metric_name, METRICS_BY_NAME)
    notes = _completeness_notes(con, out, allow_partial=allow_partial)
    sweep_id = _single_sweep(con)
    notes.extend(check_current_inputs(con, out.location))
    runs_by_level = _load_runs(con, out, metric, (), (), SWEEP_ROLES)
    requests = requests_of_jobs(out, {run.job_id for runs in runs_by_level.values() for run in runs})
    if category is not None:
        if isinstance(metric.aggregate, Rate):
            raise ResultsError(
                f"{metric.name} is a rate of a whole level: it has no value per request category",
                where="--by category",
                fix="compare a percentile per category (e.g. tpot_p50_ms), or rates --by level",
            )
        quoted = category.replace("'", "''")
        requests = f"(SELECT * FROM {requests} WHERE coalesce(category, '(none)') = '{quoted}')"
        of_category = {
            (job_id, level): value
            for job_id, level, value in con.sql(
                f"SELECT job_id, load_level, {metric.aggregate.sql()} FROM {requests} WHERE NOT warmup "
                "GROUP BY ALL"
            ).fetchall()
        }
        runs_by_level = {
            level: [
                dataclasses.replace(
                    run, values={**run.values, metric.name: of_category.get((run.job_id, level))}
                )
                for run in runs
            ]
            for level, runs in runs_by_level.items()
        }
    resampler = _Resampler(con, metric, replicates, seed, requests, DEFAULT_CONFIDENCE)
    noise = estimate_launch_noise(runs_by_level, metric, resampler, spec_launch_noise(con))
    resampler.noise = noise.relative_sd
    levels: dict[str, dict[str, Measured]] = {}
    for level in order_levels(con, list(runs_by_level)):
        by_config: dict[str, list[_Run]] = {}
        for run in runs_by_level[level]:
            by_config.setdefault(run.config_label, []).append(run)
        levels[level] = {
            label: Measured(
                config_label=label,
                is_baseline=runs[0].is_baseline,
                job_ids=tuple(r.job_id for r in runs),
                value=_config_value(runs, metric.name),
                replicates=resampler.replicates_of(level, runs),
                error_rate=_config_value(runs, ERROR_RATE),
                sglang_argv=runs[0].sglang_argv,
            )
            for label, runs in sorted(by_config.items())
        }
    return Measurements(sweep_id, metric, levels, tuple(notes), noise)
