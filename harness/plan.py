"""From a spec to an ordered list of jobs: expand the grid, validate, drop, collapse, order.

Every grid point becomes an SGLang launch command and all of them are validated in one SGLang process
(``validate_many``). Invalid points are dropped with SGLang's and the project's reasons. Points that
SGLang would run identically (say topk 1 with 16 draft tokens and 1 step, which SGLang rewrites to 2
draft tokens) collapse into one job that says which requested points it serves, so no GPU hour is
spent measuring the same server twice. Job ids hash the effective config, the load plan and the
repeat index: the same sweep always gives the same ids, which makes resume and result files
idempotent. Nothing here touches the disk apart from the validator reading model configs.
"""

from __future__ import annotations

import hashlib
import itertools
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harness.spec import SweepSpec
from specsweep.errors import SpecError
from workers.job import JobSpec, launch_args
from workers.load.workloads import PromptSetWorkload
from workers.sglang import SpecParams, ValidationReport, default_sglang_python, multinode, validate_many
from workers.sglang.axes import axis_flag_args, env_findings

AxisValues = tuple[tuple[str, str], ...]  # (axis name, value) in the spec's axis order

BASELINE_LABEL = "baseline"
POINT_STATUSES: tuple[str, ...] = ("ok", "adjusted", "unchecked", "invalid")


@dataclass(frozen=True, slots=True)
class GridPoint:
    """One requested configuration, as the user wrote it."""

    label: str
    requested: SpecParams
    axes: AxisValues = ()


@dataclass(frozen=True, slots=True)
class PointVerdict:
    """What the validator made of one grid point; ``config_id`` is None for a dropped point."""

    point: GridPoint
    status: str  # "ok" | "adjusted" | "invalid" | "unchecked"
    effective: SpecParams | None
    reasons: tuple[str, ...]  # errors for invalid points, warnings otherwise
    config_id: str | None


@dataclass(frozen=True, slots=True)
class Plan:
    """The validated, collapsed, ordered sweep."""

    sweep_id: str
    verdicts: tuple[PointVerdict, ...]
    jobs: tuple[JobSpec, ...]

    @property
    def dropped(self) -> tuple[PointVerdict, ...]:
        return tuple(v for v in self.verdicts if v.config_id is None)

    def to_json_dict(self) -> dict[str, Any]:
        """The ``specsweep plan --json`` object."""
        return {
            "sweep_id": self.sweep_id,
            "points": [
                {
                    "label": v.point.label,
                    "status": v.status,
                    "requested": v.point.requested.as_dict(),
                    "axes": dict(v.point.axes),
                    "effective": v.effective.as_dict() if v.effective else None,
                    "reasons": list(v.reasons),
                    "config_id": v.config_id,
                }
                for v in self.verdicts
            ],
            "jobs": [
                {
                    "job_id": j.job_id,
                    "config_id": j.config_id,
                    "label": j.config_label,
                    "repeat": j.repeat_index,
                    "serves": list(j.requested_points),
                    "axes": dict(j.axes),
                    "effective": j.effective.as_dict(),
                    "lossy_by_design": j.lossy_by_design(),
                }
                for j in self.jobs
            ],
        }


def axis_combinations(spec: SweepSpec) -> list[AxisValues]:
    """The server-axis settings to run, in order: the listed axis_points, else the cross product of the
    axes' values; one empty setting without axes."""
    names = list(spec.axes)
    if spec.axis_points:
        return [tuple((name, point[name]) for name in names) for point in spec.axis_points]
    return [
        tuple(zip(names, values, strict=True))
        for values in itertools.product(*(spec.axes[n].values for n in names))
    ]


def axes_label(axes: AxisValues) -> str:
    """The suffix a point's label carries for its axis values, e.g. `` [graph_bs=64 spec_v2=1]``, so every
    config label (what ``best``, ``report`` and ``compare`` group and show) names its server setting."""
    return f" [{' '.join(f'{name}={value}' for name, value in axes)}]" if axes else ""


def speculative_points(spec: SweepSpec) -> list[GridPoint]:
    """The requested speculative configurations without axes: the baseline, the grid, the chains."""
    points = [GridPoint(BASELINE_LABEL, SpecParams())] if spec.baseline else []
    grid = spec.speculative
    if grid is None:
        return points
    for steps, topk, draft in itertools.product(grid.num_steps, grid.topk, grid.num_draft_tokens):
        label = f"tree s={steps} k={topk} n={draft}"
        points.append(GridPoint(label, SpecParams(grid.algorithm, steps, topk, draft)))
    for depth in grid.chain_depths:
        points.append(GridPoint(f"chain d={depth}", SpecParams(grid.algorithm, depth - 1, 1, depth)))
    return points


def grid_points(spec: SweepSpec) -> list[GridPoint]:
    """Every requested configuration: each server-axis setting (in order) crossed with the baseline, the
    grid and the chains."""
    return [
        GridPoint(point.label + axes_label(axes), point.requested, axes)
        for axes in axis_combinations(spec)
        for point in speculative_points(spec)
    ]


def point_base_args(spec: SweepSpec, axes: AxisValues) -> list[str]:
    """base_args followed by the point's flag axes at their values."""
    args = list(spec.base_args)
    for name, value in axes:
        flag = spec.axes[name].flag
        if flag is not None:
            args += axis_flag_args(flag, value)
    return args


def point_env(spec: SweepSpec, axes: AxisValues) -> dict[str, str]:
    """The spec's env with the point's environment-variable axes at their values, sorted by name."""
    env = dict(spec.env)
    for name, value in axes:
        variable = spec.axes[name].env
        if variable is not None:
            env[variable] = value
    return dict(sorted(env.items()))


def _draft_path(spec: SweepSpec, params: SpecParams) -> str | None:
    return spec.drafter.path if spec.drafter is not None and params.speculative_algorithm else None


def point_argv(spec: SweepSpec, point: GridPoint) -> list[str]:
    """The launch arguments a grid point asks for (what the validator checks): rank 0's for a server over
    several nodes, with a stand-in rendezvous address (the harness picks the real one at launch)."""
    args = launch_args(
        point_base_args(spec, point.axes),
        spec.model_path,
        point.requested,
        _draft_path(spec, point.requested),
    )
    return args + multinode.rank_args(spec.nodes_per_server, 0, multinode.VALIDATION_DIST_INIT_ADDR)


def _digest(value: Any, length: int) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:length]


def effective_config(spec: SweepSpec, effective: SpecParams, axes: AxisValues = ()) -> dict[str, Any]:
    """Everything that makes two servers different; equal dicts mean one server. The axis values are in
    base_args and env already; their names are added only when there are axes, so the ids of sweeps
    without axes stay as they were."""
    speculative = effective.speculative_algorithm is not None
    config = {
        "engine": spec.engine,
        "model_path": spec.model_path,
        "drafter": spec.drafter.model_dump() if spec.drafter is not None and speculative else None,
        "base_args": point_base_args(spec, axes),
        "env": point_env(spec, axes),
        "gpus": spec.gpus_per_server * spec.nodes_per_server,
        "speculative": effective.as_dict(),
        **({"nodes": spec.nodes_per_server} if spec.nodes_per_server > 1 else {}),  # one-node ids unchanged
    }
    if axes:
        config["axes"] = dict(axes)
    return config


def job_id(config: dict[str, Any], load: dict[str, Any], repeat: int) -> str:
    """Deterministic id of one job: effective config + load plan + repeat index."""
    return _digest({"config": config, "load": load, "repeat": repeat}, 16)


@dataclass(frozen=True, slots=True)
class PointOutcome:
    """The validator's verdict on one point, reduced to what the plan needs."""

    status: str  # "ok" | "adjusted" | "invalid" | "unchecked"
    effective: SpecParams | None
    reasons: tuple[str, ...]


def outcome_of(report: ValidationReport) -> PointOutcome:
    """A validation report as a point outcome: errors for invalid points, warnings otherwise."""
    invalid = report.status == "invalid" or report.effective is None
    findings = report.errors if invalid else report.warnings
    reasons = tuple(f.message + (f" (fix: {f.suggestion})" if f.suggestion else "") for f in findings)
    return PointOutcome("invalid" if invalid else report.status, report.effective, reasons)


def unchecked_outcome(point: GridPoint) -> PointOutcome:
    """A point taken as written, without validation (``run --no-validate``): SGLang will judge it."""
    return PointOutcome("unchecked", point.requested, ())


def build_plan(spec: SweepSpec, points: list[GridPoint], outcomes: list[PointOutcome]) -> Plan:
    """Drop invalid points, collapse equal effective configs, order the jobs (pure: no I/O)."""
    verdicts: list[PointVerdict] = []
    configs: dict[str, dict[str, Any]] = {}  # config_id -> config, in first-seen order
    served: dict[str, list[GridPoint]] = {}
    effective_of: dict[str, SpecParams] = {}
    for point, outcome in zip(points, outcomes, strict=True):
        if outcome.status == "invalid" or outcome.effective is None:
            verdicts.append(PointVerdict(point, "invalid", outcome.effective, outcome.reasons, None))
            continue
        config = effective_config(spec, outcome.effective, point.axes)
        config_id = _digest(config, 12)
        configs.setdefault(config_id, config)
        served.setdefault(config_id, []).append(point)
        effective_of[config_id] = outcome.effective
        verdicts.append(PointVerdict(point, outcome.status, outcome.effective, outcome.reasons, config_id))

    load = spec.load.model_dump(mode="json")
    jobs = []
    for repeat in range(spec.repeats):  # every config once before any repeats: early results cover all
        for config_id, config in configs.items():
            first = served[config_id][0]
            jobs.append(
                JobSpec(
                    sweep_id=spec.sweep_id(),
                    job_id=job_id(config, load, repeat),
                    config_id=config_id,
                    config_label=first.label,
                    repeat_index=repeat,
                    engine=spec.engine,
                    sglang_python=spec.sglang_python,
                    model_path=spec.model_path,
                    drafter=spec.drafter if effective_of[config_id].speculative_algorithm else None,
                    base_args=tuple(point_base_args(spec, first.axes)),
                    env=tuple(point_env(spec, first.axes).items()),
                    gpus=spec.gpus_per_server * spec.nodes_per_server,
                    nodes=spec.nodes_per_server,
                    requested=first.requested,
                    effective=effective_of[config_id],
                    requested_points=tuple(p.label for p in served[config_id]),
                    load=spec.load,
                    timeouts=spec.timeouts,
                    seed=spec.seed,
                    telemetry=spec.telemetry,
                    axes=first.axes,
                    lossless_check=spec.lossless_check,
                )
            )
    return Plan(sweep_id=spec.sweep_id(), verdicts=tuple(verdicts), jobs=tuple(jobs))


def plan_sweep(
    spec: SweepSpec,
    *,
    sglang_python: str | None = None,
    use_resolver: bool = True,
    target_config_dir: str | None = None,
    draft_config_dir: str | None = None,
) -> Plan:
    """Expand and validate every grid point in one SGLang process, then build the plan.

    ``target_config_dir`` / ``draft_config_dir``: local directories holding the target's and the
    (converted) drafter's config.json, when the spec's paths are node paths this machine cannot read.
    """
    points = grid_points(spec)
    reports = validate_many(
        [point_argv(spec, p) for p in points],
        sglang_python=sglang_python,
        use_resolver=use_resolver,
        target_config_dir=target_config_dir,
        draft_config_dir=draft_config_dir,
    )
    outcomes = [with_env_rules(spec, p, outcome_of(r)) for p, r in zip(points, reports, strict=True)]
    return build_plan(spec, points, outcomes)


def with_env_rules(spec: SweepSpec, point: GridPoint, outcome: PointOutcome) -> PointOutcome:
    """``outcome`` with the SGLang environment-variable rules applied to the point's server environment
    (SGLang's resolver judges flags; variables have no parser): an error makes the point invalid, warnings
    (an unknown swept variable, one SGLang does not read) are added to its reasons."""
    swept = [axis.env for axis in spec.axes.values() if axis.env is not None]
    errors, warnings = env_findings(point_env(spec, point.axes), point.requested, swept=swept)
    reasons = tuple(
        f.message + (f" (fix: {f.suggestion})" if f.suggestion else "") for f in errors or warnings
    )
    if errors:
        return PointOutcome(
            "invalid", outcome.effective, reasons + (outcome.reasons if outcome.status == "invalid" else ())
        )
    return PointOutcome(outcome.status, outcome.effective, outcome.reasons + reasons)


def unchecked_plan(spec: SweepSpec) -> Plan:
    """Every point as written, unvalidated: for forcing a launch SGLang itself must judge."""
    points = grid_points(spec)
    return build_plan(spec, points, [unchecked_outcome(p) for p in points])


def check_prompt_set(spec: SweepSpec) -> None:
    """Read the sweep's prompt set here, before any server launches, so that an unreachable Hugging Face
    dataset (offline and not cached, an unknown id, a bad revision, config or split) or an unusable
    prompt file is one ``WorkloadError`` now, not a failed attempt on every node. A local file or mirror
    this machine does not have is left to the nodes (they check it before they launch)."""
    workload = spec.load.workload
    if isinstance(workload, PromptSetWorkload) and not workload.node_only():
        workload.prompts()


def _local_dir(path: str) -> str | None:
    return path if (Path(path) / "config.json").is_file() else None


def _require_local_drafter(spec: SweepSpec) -> None:
    """A drafter path that is not on this machine cannot be validated (SGLang would take it for a Hub
    repo id and drop every speculative point with a misleading reason): say so, naming the path."""
    if spec.drafter is None or not _speculates(spec):
        return
    if not Path(spec.drafter.path).exists():
        raise SpecError(
            f"the drafter checkpoint {spec.drafter.path!r} does not exist on this machine",
            where="drafter.path",
            fix="correct drafter.path; if the checkpoint exists only on the nodes, pass --draft-config DIR "
            "(a local directory with its converted config.json) or --no-validate",
        )


def _require_local_target(spec: SweepSpec) -> None:
    """SGLang's resolver reads the target's config.json; a model_path that is not on this machine would
    drop every point with SGLang's Hugging Face "Repo id" message: say so, naming the path and the fix."""
    if spec.model_path == "dummy":
        return
    raise SpecError(
        f"the target {spec.model_path!r} has no config.json on this machine, so SGLang's resolver cannot "
        "check the sweep's launches",
        where="model_path",
        fix="pass --target-config DIR (a local directory holding the target's config.json; weights are not "
        "needed), or --builtin-only to check with the built-in rules alone",
    )


def _speculates(spec: SweepSpec) -> bool:
    """Whether any requested point runs a draft model."""
    return any(p.requested.speculative_algorithm for p in grid_points(spec))


def plan_with_local_configs(
    spec: SweepSpec,
    *,
    sglang_python: str | None = None,
    use_resolver: bool = True,
    target_config_dir: str | None = None,
    draft_config_dir: str | None = None,
) -> Plan:
    """Plan the sweep, validating with the configs this machine can read: the target's when its path is
    local, and the drafter's after converting it here (into the same node cache the workers use) when its
    checkpoint is local. The spec's ``sglang_python`` validates when it exists on this machine."""
    python = sglang_python
    if python is None and spec.sglang_python and Path(spec.sglang_python).exists():
        python = spec.sglang_python
    target = target_config_dir or _local_dir(spec.model_path)
    if target is None and use_resolver and (python or default_sglang_python()):
        _require_local_target(spec)
    draft = draft_config_dir
    if draft is None:
        _require_local_drafter(spec)
    if draft is None and spec.drafter is not None and _local_dir(spec.drafter.path):
        from workers.convert.cache import converted_drafter

        draft = str(converted_drafter(spec.drafter, spec.model_path))
    return plan_sweep(
        spec,
        sglang_python=python,
        use_resolver=use_resolver,
        target_config_dir=target,
        draft_config_dir=draft,
    )
