"""What a node worker is handed and what it hands back: one job (a server config and a load plan).

The planner builds ``JobSpec``s, the queue stores them as JSON, the node worker runs them and answers
with an ``AttemptResult``. The load plan and time limits are the spec's own models, defined here so
the worker layer does not import the harness.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SerializerFunctionWrapHandler,
    model_serializer,
    model_validator,
)

from analysis.slo import Slo
from specsweep.error_classes import ErrorClass
from specsweep.errors import ResultsError
from workers.load.workloads import RandomIdsWorkload, Workload
from workers.sglang import SpecParams
from workers.sglang import deploy as sglang_deploy
from workers.sglang import lossless as sglang_lossless

Engine = Literal["sglang", "sim"]  # which server a job launches: SGLang, or the simulated one
# What a job is for: a sweep point, or the confirmation of the adaptive schedule built from the sweep.
Role = Literal["sweep", "confirmation"]
PositiveInt = Annotated[int, Field(ge=1)]
PositiveFloat = Annotated[float, Field(gt=0)]


def check_one_size(
    count: int | None, duration: float | None, count_name: str, duration_name: str, where: str = ""
) -> None:
    """A level runs for a count of requests or for a time, never both and never neither."""
    if (count is None) == (duration is None):
        raise ValueError(f"{where}give exactly one of {count_name} and {duration_name}")


class StrictModel(BaseModel):
    """Base of every spec model: unknown keys, loose types and non-finite numbers (YAML's ``.nan`` and
    ``.inf``, which would reach the job payload as null) are errors, instances are immutable."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


class CapacitySearch(StrictModel):
    """Find each config's capacity under SLOs: the highest load at which the level SLOs hold, by bisection
    over probe levels on the same server (docs/results.md, the capacity table)."""

    kind: Literal["rate", "concurrency"] = Field(
        description="rate: open-loop arrival rates (requests per second, the load's arrival process); "
        "concurrency: closed-loop requests in flight."
    )
    slo: str = Field(
        description='Level SLOs a probe must meet, as `best --slo` takes them, e.g. "tpot_p99_ms<=50,'
        'ttft_p99_ms<=2000" (any levels column; a probe with failed requests beyond 1% fails too).'
    )
    lo: PositiveFloat = Field(description="Lowest load the search considers (the bracket's bottom).")
    hi: PositiveFloat = Field(description="Highest load the search considers (the bracket's top).")
    max_probes: Annotated[int, Field(ge=1, le=64)] = Field(
        default=8, description="Most probe levels per server launch."
    )
    tolerance: Annotated[float, Field(gt=0, lt=1)] = Field(
        default=0.02,
        description="Stop once the highest passing and lowest failing probes are within this fraction of "
        "each other (concurrency: also once they are adjacent integers).",
    )

    @model_validator(mode="after")
    def _bracket(self) -> CapacitySearch:
        if self.lo >= self.hi:
            raise ValueError(f"lo ({self.lo:g}) must be below hi ({self.hi:g})")
        if self.kind == "concurrency" and self.hi - self.lo < 1:
            raise ValueError("a concurrency bracket needs hi at least lo + 1")
        try:
            self.slos()
        except ResultsError as err:
            raise ValueError(f"slo: {err.problem.splitlines()[0]}; {err.fix}") from None
        return self

    def slos(self) -> tuple[Slo, ...]:
        """The parsed level SLOs (``ResultsError`` for an unknown column or a malformed clause)."""
        from analysis.schema import LEVEL_SLO_COLUMNS
        from analysis.slo import parse_slos

        slos = parse_slos(self.slo, LEVEL_SLO_COLUMNS, where="capacity.slo")
        if not slos:
            raise ResultsError(
                "it is empty",
                where="capacity.slo",
                fix='give level SLOs such as "tpot_p99_ms<=50"',
            )
        return slos


class LoadPlan(StrictModel):
    """The load levels run against every server, in order, with the cache flushed between them."""

    concurrency: list[PositiveInt] = Field(
        default_factory=list, description="Closed-loop levels: requests kept in flight."
    )
    rates: list[PositiveFloat] = Field(
        default_factory=list, description="Open-loop levels: arrival rates in requests per second."
    )
    arrival: Literal["poisson", "gamma"] = Field(
        default="poisson",
        description="Arrival process of the rate levels: Poisson, or gamma (see burstiness).",
    )
    burstiness: PositiveFloat = Field(
        default=1.0,
        description="Gamma arrivals: shape of the inter-arrival gamma; below 1 burstier than Poisson, above 1 "
        "more regular. Only with arrival: gamma.",
    )
    level_order: Literal["ascending", "descending", "shuffled"] = Field(
        default="ascending",
        description="Run order of the levels (closed loop first, then open loop, each sorted by load), or "
        "all shuffled with the sweep's seed; each levels row records its position (run_index).",
    )
    flush_timeout_s: PositiveFloat = Field(
        default=30.0,
        description="Seconds /flush_cache is retried before a level (SGLang refuses while busy).",
    )
    allow_failed_flush: bool = Field(
        default=False,
        description="Keep a level whose /flush_cache failed (its rows may include prefix-cache hits); by "
        "default the attempt fails with cache_flush_failed.",
    )
    max_concurrency: PositiveInt | None = Field(
        default=None,
        description="Cap on requests in flight for the open-loop (rate) levels; none when unset.",
    )
    requests_per_level: PositiveInt | None = Field(
        default=None, description="Requests per level (give this or duration_s)."
    )
    duration_s: PositiveFloat | None = Field(
        default=None, description="Seconds per level (give this or requests_per_level)."
    )
    warmup_requests: Annotated[int, Field(ge=0)] = Field(
        default=8, description="Requests sent before each level (at its load) and left out of the results."
    )
    ramp_up_s: Annotated[float, Field(ge=0)] = Field(
        default=0.0,
        description="Seconds over which a closed-loop level's streams start, evenly spaced, so their "
        "prefills do not all land at once (0: all at once); the level's measurement window opens this "
        "long after its start (open loop too) and closes when the first stream stops (docs/workloads.md). "
        "Give about one request's latency at the highest load, well under duration_s.",
    )
    precision: Annotated[float, Field(gt=0, lt=1)] | None = Field(
        default=None,
        description="Sequential levels: a closed-loop level stops sending once the 95% interval of its "
        "output throughput is narrower than this fraction of it (0.02: 2%); requests_per_level or "
        "duration_s is then the most it runs. None: every level runs in full. Open-loop levels ignore it.",
    )
    capacity: CapacitySearch | None = Field(
        default=None,
        description="After the levels, search each server's capacity under SLOs with up to max_probes "
        "probe levels of requests_per_level / duration_s each (docs/results.md: capacity).",
    )
    workload: Workload = Field(
        default_factory=lambda: RandomIdsWorkload(input_tokens=128, output_tokens=128),
        description="What each request asks for: random_ids (token ids on /generate, exact lengths) or "
        "prompt_set (a JSONL/Parquet/CSV prompt file on /v1/chat/completions, by category). Its seed is replaced by the sweep's seed.",
    )

    @model_validator(mode="after")
    def _one_size_and_some_levels(self) -> LoadPlan:
        if not self.concurrency and not self.rates and self.capacity is None:
            raise ValueError(
                "load: give at least one load level in `concurrency` or `rates`, or a `capacity` search"
            )
        check_one_size(
            self.requests_per_level, self.duration_s, "`requests_per_level`", "`duration_s`", where="load: "
        )
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise ValueError("load: `burstiness` shapes gamma arrivals only: set `arrival: gamma`")
        if self.duration_s is not None and self.ramp_up_s >= self.duration_s:
            raise ValueError(
                f"load: `ramp_up_s` ({self.ramp_up_s:g}) leaves no measurement window in a "
                f"{self.duration_s:g} s level: make it shorter than `duration_s`"
            )
        return self

    def levels(self, *, seed: int, request_timeout_s: float) -> list[LoadLevel]:
        """The load generator's levels in ``level_order`` (ascending: closed loop first, then open loop,
        each by load). Warmup runs before every level (at its load, not recorded), then the cache is
        flushed, so no level starts cold or on the previous level's cached prefixes, and SGLang's
        server-side averages cover one level each."""
        shapes: list[dict[str, Any]] = [{"concurrency": c} for c in sorted(self.concurrency)]
        arrival = {"arrival": self.arrival, "burstiness": self.burstiness}
        shapes += [
            {"rate_rps": r, "max_concurrency": self.max_concurrency, **arrival} for r in sorted(self.rates)
        ]
        if self.level_order == "descending":
            shapes.reverse()
        elif self.level_order == "shuffled":
            random.Random(seed).shuffle(shapes)
        return [self._level(shape, seed=seed, request_timeout_s=request_timeout_s) for shape in shapes]

    def probe_level(self, load: float, *, seed: int, request_timeout_s: float) -> LoadLevel:
        """One probe of the capacity search at ``load`` (a rate or a concurrency, as its kind says),
        sized, warmed up and flushed like every level."""
        assert self.capacity is not None
        shape: dict[str, Any] = (
            {"concurrency": int(load)}
            if self.capacity.kind == "concurrency"
            else {
                "rate_rps": load,
                "max_concurrency": self.max_concurrency,
                "arrival": self.arrival,
                "burstiness": self.burstiness,
            }
        )
        return self._level(shape, seed=seed, request_timeout_s=request_timeout_s)

    def _level(self, shape: dict[str, Any], *, seed: int, request_timeout_s: float) -> LoadLevel:
        size = (
            {"requests": self.requests_per_level}
            if self.requests_per_level is not None
            else {"duration_s": self.duration_s}
        )
        return LoadLevel(
            **shape,
            **size,
            warmup_requests=self.warmup_requests,
            ramp_up_s=self.ramp_up_s,
            flush_cache=True,
            flush_timeout_s=self.flush_timeout_s,
            request_timeout_s=request_timeout_s,
            precision=self.precision if "concurrency" in shape else None,
            seed=seed,
        )


class LoadLevel(BaseModel):
    """One load level: closed loop (``concurrency``) or open loop (``rate_rps``), for a count or a time."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    concurrency: int | None = Field(default=None, ge=1, description="Closed loop: requests kept in flight.")
    rate_rps: float | None = Field(default=None, gt=0, description="Open loop: target requests per second.")
    arrival: Literal["poisson", "gamma", "constant"] = Field(
        default="poisson",
        description="Open loop arrival process: Poisson, gamma (see burstiness) or evenly spaced.",
    )
    burstiness: float = Field(
        default=1.0,
        gt=0,
        description="Gamma arrivals: shape of the inter-arrival gamma; 1 is Poisson, below 1 burstier, "
        "above 1 more regular (coefficient of variation 1/sqrt(burstiness)).",
    )
    max_concurrency: int | None = Field(
        default=None, ge=1, description="Open loop: at most this many in flight (sends wait, and are late)."
    )
    requests: int | None = Field(default=None, ge=1, description="Measured requests to send.")
    duration_s: float | None = Field(default=None, gt=0, description="Seconds to keep sending.")
    warmup_requests: int = Field(default=0, ge=0, description="Unrecorded requests sent before measuring.")
    ramp_up_s: float = Field(
        default=0.0,
        ge=0,
        description="Closed loop: stream i of c starts i/c of this after the run start; the measurement "
        "window opens this long after the start (open loop too).",
    )
    flush_cache: bool = Field(
        default=False, description="POST /flush_cache after warmup, so server-side averages exclude it."
    )
    flush_timeout_s: float = Field(
        default=30.0, gt=0, description="Seconds /flush_cache is retried before the flush counts as failed."
    )
    request_timeout_s: float = Field(default=600.0, gt=0, description="Whole-request timeout.")
    drain_s: float = Field(
        default=60.0,
        ge=0,
        description="After a duration ends, seconds in-flight requests get before cut-off.",
    )
    processes: int | None = Field(
        default=None, ge=1, description="Client processes; null = automatic by concurrency."
    )
    precision: float | None = Field(
        default=None,
        gt=0,
        lt=1,
        description="Closed loop: stop sending once the throughput's 95% interval is narrower than this "
        "fraction of it (each client process judges its own requests).",
    )
    seed: int = Field(default=0, description="Seed of the arrival schedule.")

    @model_validator(mode="after")
    def _check_shape(self) -> LoadLevel:
        if (self.concurrency is None) == (self.rate_rps is None):
            raise ValueError("give exactly one of concurrency (closed loop) or rate_rps (open loop)")
        check_one_size(self.requests, self.duration_s, "requests", "duration_s")
        if self.max_concurrency is not None and self.rate_rps is None:
            raise ValueError("max_concurrency caps an open loop; with concurrency it has no meaning")
        if self.burstiness != 1.0 and self.arrival != "gamma":
            raise ValueError("burstiness shapes gamma arrivals only: set arrival: gamma")
        if self.precision is not None and self.concurrency is None:
            raise ValueError("precision stops a closed loop early; an open loop runs its schedule")
        if self.duration_s is not None and self.ramp_up_s >= self.duration_s:
            raise ValueError("ramp_up_s must be shorter than duration_s: the window opens after the ramp")
        return self

    @property
    def label(self) -> str:
        """The ``load_level`` column value: ``concurrency=64`` or ``rate=12.5``."""
        return f"concurrency={self.concurrency}" if self.concurrency else f"rate={self.rate_rps:g}"

    @property
    def streams(self) -> int | None:
        """Most requests in flight at once, when bounded."""
        return self.concurrency or self.max_concurrency


class Timeouts(StrictModel):
    """How long each stage may take before it counts as failed."""

    placement_s: PositiveFloat = Field(
        default=300.0, description="Seconds to wait for the cluster to place the first server slot."
    )
    startup_s: PositiveFloat = Field(
        default=1800.0, description="Seconds from launch until /health answers 200 (model load, CUDA graphs)."
    )
    level_s: PositiveFloat = Field(
        default=3600.0,
        description="Upper bound in seconds for one load level's wall time: past it the node worker stops "
        "the server and the attempt fails as level_timeout (retried like a crash).",
    )
    request_s: PositiveFloat = Field(
        default=600.0,
        description="Whole-request timeout of the load generator: one request's wait from send to its last "
        "token (separate from level_s).",
    )
    stop_s: PositiveFloat = Field(
        default=60.0, description="Seconds between SIGTERM to the server's process group and SIGKILL."
    )


class TelemetrySpec(StrictModel):
    """Time series sampled while each load level runs (the server_metrics and gpu_metrics tables)."""

    server_metrics_interval_s: PositiveFloat | None = Field(
        default=1.0,
        description="Seconds between scrapes of the server's Prometheus /metrics (SGLang serves it with "
        "--enable-metrics in base_args; without it the series is off and the jobs row says why); null: off.",
    )
    gpu_interval_s: PositiveFloat | None = Field(
        default=1.0,
        description="Seconds between NVML samples of the slot's GPUs (utilisation, memory, power, SM clock, "
        "temperature, throttle reasons); off on nodes without NVIDIA GPUs, the jobs row says why; null: off.",
    )
    profile_steps: PositiveInt | None = Field(
        default=None,
        description="Capture SGLang's profiler for this many forward steps at the start of each level "
        "(/start_profile; traces under OUT/logs/<job_id>/attempt-<n>/profile/<level>/ on the node); null: off.",
    )


class DrafterSpec(StrictModel):
    """The trained draft model, converted once per node into the layout SGLang loads."""

    path: str = Field(
        description="Directory of the drafter checkpoint (config.json + weights), as seen on the nodes."
    )
    format: Literal["auto", "speculators", "sglang", "eagle", "sglang-mla"] = Field(
        default="auto",
        description="Checkpoint format: speculators, sglang (SpecForge / SGLang-native), eagle (original "
        "EAGLE), sglang-mla (Eagle3DeepseekV2ForCausalLM, Kimi-K2.x; checked, passed through), or auto "
        "to detect it from the config and keys.",
    )
    allow_external_shards: bool = Field(
        default=False,
        description="Convert even when a weight file (a shard index entry or a symlink) resolves outside "
        "path (`specsweep convert --allow-external-shards`); by default such a checkpoint is refused, so "
        "it cannot make the nodes read and copy files elsewhere. Hugging Face cache snapshots count as "
        "inside. Left out of sweep and job ids while false.",
    )

    @model_serializer(mode="wrap")
    def _leave_out_the_default_permission(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        """Dumps (and so sweep and job ids) omit the field while false: ids of sweeps that predate it
        stay; a worker re-reading the job gets the default back."""
        data: dict[str, Any] = handler(self)
        if not self.allow_external_shards:
            data.pop("allow_external_shards", None)
        return data


class JobSpec(BaseModel):
    """One job: start this server, run this load plan, once (``repeat_index`` tells repeats apart)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    sweep_id: str
    job_id: str
    config_id: str  # same for every repeat of one effective config
    config_label: str  # "baseline", "chain d=4", "tree s=3 k=4 n=8"
    repeat_index: int
    engine: Engine
    sglang_python: str | None
    model_path: str
    drafter: DrafterSpec | None
    base_args: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    gpus: int  # of the whole server: gpus // nodes on each node
    requested: SpecParams  # what the first grid point it serves asked for
    effective: SpecParams  # what the validator says the server runs (and the worker checks live)
    requested_points: tuple[str, ...]
    load: LoadPlan
    timeouts: Timeouts
    seed: int
    telemetry: TelemetrySpec = TelemetrySpec()
    role: Role = "sweep"
    # A confirmation job's adaptive schedule: (batch-size threshold, draft steps) pairs, 0 = no drafting.
    adaptive_steps: tuple[tuple[int, int], ...] = ()
    # The server-axis values this job runs, (axis name, value) in the spec's order; already in base_args
    # and env, named here for the results' jobs.axes column.
    axes: tuple[tuple[str, str], ...] = ()
    nodes: int = 1  # nodes the server spans (one rank per node, workers.sglang.multinode)
    # Also send the lossless check's greedy prompts (workers.load.lossless) and keep their output ids.
    lossless_check: bool = False

    def launch_args(self, draft_path: str | None, adaptive_config_path: str | None = None) -> list[str]:
        """SGLang arguments of this job's server (without --host/--port), with the drafter at
        ``draft_path`` (the node's converted copy) and, for an adaptive schedule, its config file at
        ``adaptive_config_path`` (written there from ``adaptive_config()``)."""
        args = launch_args(self.base_args, self.model_path, self.effective, draft_path)
        if not self.adaptive_steps:
            return args
        if adaptive_config_path is None:
            raise ValueError("an adaptive job needs the path of its --speculative-adaptive-config file")
        return sglang_deploy.adaptive_args(args, dict(self.adaptive_steps), adaptive_config_path)

    def lossy_by_design(self) -> str | None:
        """Why this job's launch is lossy before it runs (an accept threshold below 1.0), or None."""
        return sglang_lossless.lossy_by_design(
            self.base_args, speculative=self.effective.speculative_algorithm is not None
        )

    def adaptive_config(self) -> dict[str, Any]:
        """The --speculative-adaptive-config JSON of this job's schedule."""
        return sglang_deploy.adaptive_config(dict(self.adaptive_steps))


def launch_args(
    base_args: tuple[str, ...] | list[str], model_path: str, params: SpecParams, draft_path: str | None
) -> list[str]:
    """The one way a grid point becomes SGLang arguments (the planner validates exactly these)."""
    args = [*base_args, "--model-path", model_path]
    if params.speculative_algorithm is None:
        return args
    args += ["--speculative-algorithm", params.speculative_algorithm]
    if draft_path is not None:
        args += ["--speculative-draft-model-path", draft_path]
    for flag, value in (
        ("--speculative-num-steps", params.speculative_num_steps),
        ("--speculative-eagle-topk", params.speculative_eagle_topk),
        ("--speculative-num-draft-tokens", params.speculative_num_draft_tokens),
    ):
        if value is not None:
            args += [flag, str(value)]
    return args


@dataclass(frozen=True, slots=True)
class AttemptResult:
    """How one attempt ended. ``files`` maps table name -> Parquet bytes of the attempt (also written by
    the worker under ``_attempts/``; the driver rewrites them from here when it cannot see the worker's
    disk). On failure ``error_class`` is set and ``files`` holds only the ``jobs`` row."""

    job_id: str
    attempt: int
    lease_token: str
    error_class: ErrorClass | None
    error_text: str | None
    log_tail: str | None
    node_host: str
    worker_s: float  # run_job's own wall time, entry to return (the driver's overhead is the rest)
    files: dict[str, bytes] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.error_class is None
