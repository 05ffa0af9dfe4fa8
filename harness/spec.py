"""The sweep spec: YAML in, one strict, frozen, fully described model out.

A misspelt key, a wrong type or a cross-field mistake is refused here, with the field's dotted path and
what is expected, before the planner or the driver writes anything. Every field has a description:
``specsweep schema`` prints the JSON Schema and ``docs/config.md`` is generated from it.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, ValidationError, model_validator

from specsweep.documents import load_yaml, yaml_problem
from specsweep.errors import SpecError
from workers.job import (
    DrafterSpec,
    Engine,
    LoadPlan,
    PositiveFloat,
    PositiveInt,
    StrictModel,
    TelemetrySpec,
    Timeouts,
)
from workers.sglang import api, multinode
from workers.sglang.axes import switch_problem

# Flags the sweep sets itself, so base_args must not: the grid owns the speculative ones, the launcher
# owns where the server listens and the tag that tells its server from another, the spec owns the model
# and the drafter.
OWNED_FLAGS: tuple[str, ...] = (
    "--model-path",
    "--model",
    "--host",
    "--port",
    api.LAUNCH_TAG_FLAG,
    "--speculative-algorithm",
    "--speculative-draft-model-path",
    "--speculative-draft-model",
    "--speculative-num-steps",
    "--speculative-eagle-topk",
    "--speculative-num-draft-tokens",
    *multinode.RANK_FLAGS,
)
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_AXIS_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")  # a column-safe identifier: it names a results column


class ServerAxis(StrictModel):
    """One server setting swept like the speculative parameters: an SGLang flag or an environment variable,
    with its values (docs/axes.md)."""

    flag: str | None = Field(
        default=None,
        description="An SGLang launch flag, e.g. --cuda-graph-max-bs-decode. A switch (a flag without a "
        "value) takes 'true' (given) or 'false' (left out). Give flag or env.",
    )
    env: str | None = Field(
        default=None,
        description="An environment variable of the server process, e.g. SGLANG_ENABLE_SPEC_V2 (checked "
        "against the project's table of SGLang variables; an unknown one is passed with a warning).",
    )
    values: list[str] = Field(
        default_factory=list,
        description="The values to sweep, as strings, crossed with the other axes' values; leave out when "
        "axis_points lists the combinations.",
    )

    @model_validator(mode="after")
    def _one_setting(self) -> ServerAxis:
        if (self.flag is None) == (self.env is None):
            raise ValueError("give exactly one of flag (an SGLang flag) and env (an environment variable)")
        if self.flag is not None and not self.flag.startswith("--"):
            raise ValueError(f"flag: {self.flag!r} is not a flag (SGLang's start with --)")
        if self.env is not None and not _ENV_NAME.match(self.env):
            raise ValueError(f"env: {self.env!r} is not a valid environment variable name")
        repeated = sorted({v for v in self.values if self.values.count(v) > 1})
        if repeated:
            raise ValueError(f"values: {', '.join(map(repr, repeated))} given twice")
        return self

    @property
    def setting(self) -> str:
        """The flag or the variable, as the user wrote it."""
        return self.flag or self.env or ""


class SpeculativeGrid(StrictModel):
    """The speculative configurations to try: a full (steps x topk x draft tokens) grid and/or chains."""

    algorithm: str = Field(
        default="EAGLE3", description="Value of --speculative-algorithm for every grid point."
    )
    num_steps: list[PositiveInt] = Field(
        default_factory=list,
        description="Values of --speculative-num-steps (grid: with topk and num_draft_tokens).",
    )
    topk: list[PositiveInt] = Field(
        default_factory=list,
        description="Values of --speculative-eagle-topk (grid: with num_steps and num_draft_tokens).",
    )
    num_draft_tokens: list[PositiveInt] = Field(
        default_factory=list,
        description="Values of --speculative-num-draft-tokens (grid: with num_steps and topk).",
    )
    chain_depths: list[Annotated[int, Field(ge=2)]] = Field(
        default_factory=list,
        description="Chain drafts by depth: depth d runs topk 1, num_draft_tokens d, num_steps d - 1.",
    )


class SearchSpec(StrictModel):
    """How the sweep chooses its launches: every point (grid), or a model-based search (docs/search.md)."""

    strategy: Literal["grid", "model"] = Field(
        default="grid",
        description="grid: launch every valid point x repeats; model: launch only the configs a model of "
        "acceptance and step time still holds in contention for the best throughput at some level.",
    )
    max_launches: PositiveInt | None = Field(
        default=None, description="model: stop launching after this many launches (repeats included)."
    )
    max_node_hours: PositiveFloat | None = Field(
        default=None,
        description="model: stop launching once finished and running launches would exceed this many "
        "server-slot hours (startup included).",
    )
    tolerance: Annotated[float, Field(ge=0, lt=1)] = Field(
        default=0.01,
        description="model: a config stays in contention while it may beat the best measured throughput "
        "by more than this fraction (0.01: 1%).",
    )


class RequestSlo(StrictModel):
    """Per-request limits: a request that succeeds within every given one counts towards goodput."""

    ttft_ms: PositiveFloat | None = Field(default=None, description="Most milliseconds to the first token.")
    tpot_ms: PositiveFloat | None = Field(
        default=None, description="Most milliseconds per output token after the first."
    )
    e2e_ms: PositiveFloat | None = Field(default=None, description="Most milliseconds end to end.")

    def clauses(self) -> str:
        """The limits as ``best --request-slo`` takes them, e.g. ``ttft_ms<=2000,tpot_ms<=50``."""
        return ",".join(
            f"{name}<={value:g}" for name, value in self.model_dump().items() if value is not None
        )


# Spec fields that only say how to read the results: they do not change what a sweep measures.
ANALYSIS_FIELDS: frozenset[str] = frozenset({"request_slo", "deploy_weights"})


class SweepSpec(StrictModel):
    """A sweep: which server, which speculative configurations, which load, where results go."""

    engine: Engine = Field(
        default="sglang",
        description="sglang: `<sglang_python> -m sglang.launch_server ...`; sim: the simulated server "
        "`python -m workers.sim ...` with the same arguments.",
    )
    sglang_python: str | None = Field(
        default=None,
        description="Python with SGLang installed, as on the nodes. Default: python3 on the nodes' PATH; "
        "plans are validated with it when it exists on this machine, else with .venv-sglang.",
    )
    model_path: str = Field(description="Target model directory (--model-path), as seen on the nodes.")
    drafter: DrafterSpec | None = Field(
        default=None,
        description="Draft model for EAGLE3; none for targets with a built-in MTP draft or baseline-only sweeps.",
    )
    base_args: list[str] = Field(
        default_factory=list,
        description="SGLang arguments shared by every server, e.g. [--tp-size, '8', --mem-fraction-static, "
        "'0.88']. Not: --model-path, --host, --port, --weight-version (the launch tag) or the speculative "
        "flags (the sweep sets those).",
    )
    gpus_per_server: PositiveInt = Field(
        default=8,
        description="GPUs of one server on each of its nodes; with nodes_per_server 1 all on one node "
        "(STRICT_PACK placement).",
    )
    nodes_per_server: PositiveInt = Field(
        default=1,
        description="Nodes one server spans: one placement bundle of gpus_per_server GPUs per node, each on "
        "a different node (STRICT_SPREAD); every rank gets --nnodes/--node-rank/--dist-init-addr from the "
        "sweep, and --tp-size x --pp-size in base_args must equal gpus_per_server x nodes_per_server. Left "
        "out of sweep and job ids while 1.",
    )
    cpus_per_server: PositiveInt = Field(
        default=1, description="CPUs reserved with each server slot (the node worker and load generator)."
    )
    max_servers: PositiveInt | None = Field(
        default=None,
        description="At most this many servers at once; default: as many as the cluster's GPUs allow.",
    )
    speculative: SpeculativeGrid | None = Field(
        default=None, description="The speculative configurations to try; none for a baseline-only sweep."
    )
    baseline: bool = Field(default=True, description="Also run a server without speculative decoding.")
    axes: dict[str, ServerAxis] = Field(
        default_factory=dict,
        description="Server axes by name (a column-safe identifier): SGLang flags or environment variables "
        "swept with the speculative grid; every combination of their values runs every grid point and the "
        "baseline (docs/axes.md). Not: a flag of base_args or one the sweep sets, a variable of env.",
    )
    axis_points: list[dict[str, str]] = Field(
        default_factory=list,
        description="Explicit combinations of axis values, each naming every axis (e.g. {graph_bs: '64', "
        "spec_v2: '1'}), run instead of the cross product of the axes' values; the axes then give no values.",
    )
    load: LoadPlan = Field(description="Load levels run against every server.")
    repeats: PositiveInt = Field(default=1, description="Times each configuration is run (separate jobs).")
    retries: Annotated[int, Field(ge=0)] = Field(
        default=2, description="Extra attempts for a job that failed transiently (crash, timeout, node lost)."
    )
    timeouts: Timeouts = Field(default_factory=Timeouts, description="Stage time limits.")
    telemetry: TelemetrySpec = Field(
        default_factory=TelemetrySpec,
        description="Server metrics and GPU time series sampled during each load level.",
    )
    output_dir: str = Field(
        default="results",
        description="Results directory (queue, logs, Parquet tables), or an object-store URI "
        "(s3://BUCKET/PREFIX, gs://BUCKET/PREFIX; the queue then stays on the driver's disk); --out overrides.",
    )
    env: dict[str, str] = Field(
        default_factory=dict,
        description="Environment variables for every server process (NCCL_*, CUDA_*, ...), as strings.",
    )
    seed: int = Field(default=0, description="Seed of the workload and anything else random in the sweep.")
    search: SearchSpec = Field(
        default_factory=SearchSpec,
        description="Which points to launch: the whole grid or a model-based search.",
    )
    request_slo: RequestSlo | None = Field(
        default=None,
        description="Per-request SLOs that define goodput for `best` and `report` (--request-slo overrides); "
        "not part of the sweep id.",
    )
    deploy_weights: dict[str, PositiveFloat] = Field(
        default_factory=dict,
        description="The deployment's load mix for `best --emit`: weight per load level name (e.g. "
        '"concurrency=16": 0.5); empty = every level alike. Not part of the sweep id.',
    )

    lossless_check: bool = Field(
        default=False,
        description="Also send every server a fixed set of temperature-0 prompts, one at a time and all at "
        "once, and keep their output token ids (the lossless table): a speculative config whose ids "
        "differ from the baseline's more often than the baseline's own two batch sizes differ is flagged "
        "lossy in `best`, `report` and `--emit` (docs/results.md). Needs the baseline. Left out of the "
        "sweep id while false.",
    )

    confirm_adaptive: bool = Field(
        default=False,
        description="After the sweep's launches, launch the adaptive schedule `best --emit` builds from the "
        "per-level winners among topk-1 chains (and the baseline) on the same load levels: one more job "
        "(jobs.role = confirmation) that `best` and `report` compare with the per-level winners "
        "(`specsweep run --confirm` sets it). Not part of the sweep id.",
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> SweepSpec:
        for check in SPEC_CHECKS:
            check(self)
        return self

    def sweep_id(self) -> str:
        """Stable id of what the sweep measures (the output directory is not part of it)."""
        # The default search is left out, so sweeps started before the field existed keep their id; the
        # analysis fields say how to read results, not what to measure.
        # The confirmation adds a launch after the sweep's own; it changes none of them.
        # Without axes the fields are left out too, so sweeps from before them keep their id; one node per
        # server (the default) is left out for the same reason.
        exclude = (
            {"output_dir", "confirm_adaptive", *ANALYSIS_FIELDS}
            | ({"search"} if self.search == SearchSpec() else set())
            | ({"nodes_per_server"} if self.nodes_per_server == 1 else set())
            | ({"lossless_check"} if not self.lossless_check else set())
        )
        if not self.axes:
            exclude |= {"axes", "axis_points"}
        canonical = json.dumps(self.model_dump(mode="json", exclude=exclude), sort_keys=True)
        return hashlib.sha256(canonical.encode()).hexdigest()[:12]


def check_something_to_run(spec: SweepSpec) -> None:
    """A sweep with neither a grid nor a baseline has no job."""
    if spec.speculative is None and not spec.baseline:
        raise ValueError("speculative: nothing to run: add a `speculative` grid or set `baseline: true`")


def check_grid_is_complete(spec: SweepSpec) -> None:
    """steps, topk and draft tokens go together (SGLang crashes on a partial triple); a grid has points."""
    grid = spec.speculative
    if grid is None:
        return
    lists = {"num_steps": grid.num_steps, "topk": grid.topk, "num_draft_tokens": grid.num_draft_tokens}
    given = [name for name, values in lists.items() if values]
    if given and len(given) != 3:
        missing = sorted(set(lists) - set(given))
        raise ValueError(
            f"speculative: {', '.join(given)} given without {', '.join(missing)}; give all three lists "
            "(or use chain_depths)"
        )
    if not given and not grid.chain_depths:
        raise ValueError("speculative: give num_steps + topk + num_draft_tokens lists and/or chain_depths")


def check_base_args_leave_owned_flags(spec: SweepSpec) -> None:
    """The sweep sets model, drafter, address and speculative flags; base_args repeating one is a mistake."""
    for token in spec.base_args:
        name = token.split("=", 1)[0]
        if name in OWNED_FLAGS:
            raise ValueError(
                f"base_args: {name} is set by the sweep (model_path, drafter, speculative grid, launcher); "
                "remove it from base_args"
            )


def check_server_fits_its_nodes(spec: SweepSpec) -> None:
    """A server over several nodes must split as SGLang splits it and fill the GPUs the sweep holds."""
    if spec.nodes_per_server == 1:
        return
    problem = multinode.server_layout_problem(spec.base_args, spec.gpus_per_server, spec.nodes_per_server)
    if problem is not None:
        raise ValueError(f"base_args: {problem}")


def check_env_names(spec: SweepSpec) -> None:
    """Environment variable names must be valid POSIX names."""
    for name in spec.env:
        if not _ENV_NAME.match(name):
            raise ValueError(f"env: {name!r} is not a valid environment variable name")


def check_axes(spec: SweepSpec) -> None:
    """Axes sweep settings nobody else sets, under column-safe names, with values or explicit points."""
    base_flags = {token.split("=", 1)[0] for token in spec.base_args if token.startswith("--")}
    seen: dict[str, str] = {}
    for name, axis in spec.axes.items():
        where = f"axes.{name}"
        if not _AXIS_NAME.match(name):
            raise ValueError(
                f"{where}: the name must be a letter or _ then letters, digits or _ (a column name)"
            )
        setting = axis.setting
        if setting in seen:
            raise ValueError(f"{where}: {setting} is already swept by axis {seen[setting]!r}")
        seen[setting] = name
        if setting in OWNED_FLAGS:
            raise ValueError(
                f"{where}: {setting} is set by the sweep (model_path, drafter, speculative grid, launcher); "
                "it cannot be an axis"
            )
        if setting in base_flags or (axis.env is not None and axis.env in spec.env):
            field = "base_args" if axis.flag else "env"
            raise ValueError(f"{where}: {setting} is also given in {field}; remove it there")
        if spec.axis_points and axis.values:
            raise ValueError(f"{where}: values are given by axis_points; remove this axis's values")
        if not spec.axis_points and not axis.values:
            raise ValueError(f"{where}: give values (or list the combinations in axis_points)")
        problem = axis.flag and switch_problem(
            axis.flag, axis.values or [point.get(name, "") for point in spec.axis_points]
        )
        if problem:
            raise ValueError(f"{where}: {problem}")
    for i, point in enumerate(spec.axis_points):
        if not spec.axes:
            raise ValueError("axis_points: there are no axes: define them under `axes`")
        if set(point) != set(spec.axes):
            missing = sorted(set(spec.axes) - set(point))
            extra = sorted(set(point) - set(spec.axes))
            detail = "; ".join(
                part
                for part in (f"missing {', '.join(missing)}" if missing else "",
                             f"no such axis {', '.join(extra)}" if extra else "")
                if part
            )  # fmt: skip
            raise ValueError(f"axis_points.{i}: name every axis once ({detail})")
        if spec.axis_points.index(point) != i:
            raise ValueError(
                f"axis_points.{i}: the same combination as axis_points.{spec.axis_points.index(point)}"
            )


def check_search_fits_the_load(spec: SweepSpec) -> None:
    """The model search ranks closed-loop levels by throughput; budgets mean nothing to the grid."""
    search = spec.search
    if search.strategy == "grid":
        if search.max_launches is not None or search.max_node_hours is not None:
            raise ValueError(
                "search: max_launches / max_node_hours limit the model strategy; the grid launches every "
                "point (set `strategy: model` or remove the budget)"
            )
        return
    if spec.load.rates or not spec.load.concurrency:
        raise ValueError(
            "search: the model strategy ranks closed-loop (concurrency) levels by throughput; give "
            "load.concurrency levels (and no load.rates) or use `strategy: grid`"
        )


def check_lossless_has_a_reference(spec: SweepSpec) -> None:
    """The lossless check compares every config's greedy outputs with the baseline's."""
    if spec.lossless_check and not spec.baseline:
        raise ValueError(
            "lossless_check: compares each config's outputs with the baseline's: set `baseline: true`"
        )


SPEC_CHECKS: tuple[Callable[[SweepSpec], None], ...] = (
    check_something_to_run,
    check_lossless_has_a_reference,
    check_grid_is_complete,
    check_base_args_leave_owned_flags,
    check_server_fits_its_nodes,
    check_env_names,
    check_axes,
    check_search_fits_the_load,
)


def _describe(error: Any) -> str:
    """One line for one pydantic error: dotted path, then what is expected."""
    path = ".".join(str(part) for part in error["loc"])
    message = str(error["msg"]).removeprefix("Value error, ")
    if not path:  # a cross-field rule: its message starts with the field's path
        return message
    if error["type"] == "string_type" and isinstance(error.get("input"), int | float | bool):
        message += f" (quote it: '{error['input']}')"
    elif error["type"] == "finite_number":
        message += f", not {error['input']!r} (NaN and infinities are refused)"
    elif error["type"] == "extra_forbidden":
        message = "unknown key (check the spelling against `specsweep schema`)"
    return f"{path}: {message}"


def parse_spec(data: Any, *, source: str = "spec") -> SweepSpec:
    """Validate already-loaded YAML data; a problem raises SpecError listing every bad field."""
    if not isinstance(data, dict):
        raise SpecError(
            f"expected a mapping of spec fields, got {type(data).__name__}",
            where=source,
            fix="see `specsweep schema` for the fields",
        )
    try:
        return SweepSpec.model_validate(data)
    except ValidationError as err:
        lines = "\n  ".join(_describe(e) for e in err.errors())
        raise SpecError(
            f"the sweep spec is invalid:\n  {lines}", where=source, fix="correct the fields above"
        ) from None


def load_spec(path: str | Path) -> tuple[SweepSpec, str]:
    """Read and validate a spec file; returns the model and the file's text (stored with the results)."""
    import yaml

    spec_path = Path(path)
    try:
        text = spec_path.read_text(encoding="utf-8")
    except OSError as err:
        raise SpecError(f"cannot read the spec: {err.strerror}", where=str(spec_path)) from None
    except UnicodeDecodeError as err:
        raise SpecError(
            f"the spec is not UTF-8 text (byte {err.start}: {err.reason})",
            where=str(spec_path),
            fix="save the file as UTF-8",
        ) from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as err:
        raise SpecError(
            f"not valid YAML: {yaml_problem(err)}", where=str(spec_path), fix="correct the YAML at that line"
        ) from None
    return parse_spec(data, source=str(spec_path)), text


def spec_json_schema() -> dict[str, Any]:
    """The JSON Schema of the sweep spec (what `specsweep schema` prints)."""
    return SweepSpec.model_json_schema()
