"""The node worker: one per server slot, one job per call, from preflight to Parquet files.

For each job: preflight (the slot's GPUs idle, or the job fails naming the PIDs that hold them; a
server a previous worker left behind, found through the node-local pid file, is killed), convert the
drafter once per node (the converter's cache), launch the server on a port reserved for it on this node
(``workers.node.ports``) and wait for ``/health`` while watching it, make sure the server answering is the
one launched (port_taken otherwise: ``workers.node.launcher.check_owner``), check the live
``/server_info`` against the plan (config_mismatch), warm up, run each
load level (cache flushed before each) while ``workers.node.telemetry`` samples the server's
``/metrics`` and the slot's GPUs, snapshot ``/server_info`` and ``/metrics``, stop the server (and
confirm its process group is gone), and write the attempt's Parquet files.

The class is plain Python; the driver wraps it with ``ray.remote`` (``max_restarts=0``, two threads so
``cancel`` can run while ``run_job`` does). Every failure it can name becomes an ``AttemptResult``
with an error class; the driver's retry policy decides what happens next.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis import layout
from analysis.schema import (
    CapacityProbeRecord,
    JobRecord,
    LevelRecord,
    LosslessRecord,
    RequestRecord,
    capacity_table,
    jobs_table,
    levels_table,
    lossless_table,
    requests_table,
    write_parquet_atomic,
)
from specsweep.error_classes import ErrorClass
from specsweep.errors import ConversionError, WorkloadError
from workers.convert.cache import drafter_conversion
from workers.job import AttemptResult, JobSpec, LoadLevel
from workers.node.inputs import input_digests
from workers.node.launcher import (
    PidFile,
    ServerConfig,
    ServerFailure,
    ServerProcess,
    classify_exit,
    http_get,
    launch_tag_problem,
    pid_dir,
    python_for,
    server_info_object,
    start_server,
    wait_healthy,
)
from workers.node.ports import reserved_port
from workers.node.preflight import GpusBusy, check_gpus_idle, gpu_processes
from workers.node.ranks import RankGroup
from workers.node.records import AttemptFacts, job_record
from workers.node.telemetry import AttemptTelemetry, start_profile
from workers.node.watch import LevelWatch
from workers.sglang import SpecParams, api, multinode
from workers.sglang.rules import normalize_algorithm

if TYPE_CHECKING:
    import pyarrow as pa

    from workers.load.workloads import Workload

log = logging.getLogger(__name__)

GPU_RELEASE_WAIT_S = 30.0
EXIT_GRACE_S = 5.0  # how long a server that stopped answering gets to show it exited


class JobCancelled(Exception):
    """The driver asked this worker to stop (SIGINT/SIGTERM on the driver)."""


@dataclass
class _Attempt:
    """The state of the attempt in progress (what the jobs row will say)."""

    job: JobSpec
    attempt: int
    token: str
    facts: AttemptFacts
    entered: float  # time.monotonic() when run_job was called
    telemetry: dict[str, pa.Table] = field(default_factory=dict)  # server_metrics, gpu_metrics
    probes: list[CapacityProbeRecord] = field(default_factory=list)  # the capacity search's, if any
    lossless: list[LosslessRecord] = field(default_factory=list)  # the lossless check's, if asked for


def config_mismatches(planned: SpecParams, live: SpecParams) -> list[str]:
    """Fields where the running server differs from the plan (max_running_requests only if planned)."""
    problems = []
    for name, want in planned.as_dict().items():
        got = getattr(live, name)
        if name == api.MAX_RUNNING_REQUESTS and want is None:
            continue
        if name == api.SPEC_ALGORITHM:
            want, got = normalize_algorithm(want), normalize_algorithm(got)
        if want != got:
            problems.append(f"{name}: planned {want}, server runs {got}")
    return problems


def server_accept_length(server_info: dict[str, Any]) -> float | None:
    """SGLang's ``avg_spec_accept_length`` of the first DP rank (null when absent)."""
    states = server_info.get(api.SERVER_INFO_INTERNAL_STATES) or []
    value = states[0].get(api.AVG_SPEC_ACCEPT_LENGTH) if states else None
    return float(value) if isinstance(value, int | float) else None


def _check_prompts(job: JobSpec) -> None:
    """The prompt set's files on this node, before a server launches for nothing (a file the node lacks,
    a Hugging Face dataset its cache does not hold while the Hub is out of reach)."""
    from workers.load.workloads import PromptSetWorkload

    workload = job.load.workload
    if isinstance(workload, PromptSetWorkload):
        try:
            workload.check_readable()
        except WorkloadError as err:
            raise ServerFailure(ErrorClass.PROMPTS_UNREADABLE, str(err)) from None


class NodeWorker:
    """Runs the jobs of one server slot on the node Ray placed it on."""

    def __init__(self, out_dir: str, slot: int) -> None:
        import ray

        self.out = Path(out_dir)
        self.slot = slot
        self.node_host = socket.gethostname()
        context = ray.get_runtime_context()
        self.node_id = context.get_node_id()
        self.gpu_ids = [int(g) for g in ray.get_gpu_ids()]
        gpus = "-".join(map(str, self.gpu_ids)) or "none"
        self.pid_file = PidFile(pid_dir() / f"{self.node_id[:16]}-gpus-{gpus}.json")
        self._cancel = threading.Event()
        self._server: ServerProcess | None = None
        self._ranks: RankGroup | None = None  # a multi-node job's other ranks (workers.node.ranks)
        self._server_lock = threading.Lock()
        leftover = self.pid_file.kill_leftover()
        if leftover:
            log.warning("slot %d: killed server processes %s left by a previous worker", slot, leftover)

    def ready(self) -> dict[str, Any]:
        """Where this worker runs (the driver shows it)."""
        return {
            "node_host": self.node_host,
            "node_id": self.node_id,
            "gpus": self.gpu_ids,
            "pid": os.getpid(),
        }

    def cancel(self) -> None:
        """Stop the job in progress: kill its server, so the load generator returns at once."""
        self._cancel.set()
        with self._server_lock:
            server = self._server
        if server is not None:
            server.stop(grace_s=5.0)

    # --- one job ---------------------------------------------------------------------------------------

    def run_job(self, payload: str, attempt: int, token: str, ranks: Sequence[Any] = ()) -> AttemptResult:
        """Run one attempt of a job; never raises for a failure it can name. ``ranks``: the slot's
        ``RankWorker`` handles (node ranks 1..N-1) for a job whose server spans N nodes."""
        entered = time.monotonic()
        job = JobSpec.model_validate_json(payload)
        self._cancel.clear()
        self._ranks = RankGroup(ranks) if job.nodes > 1 else None
        state = _Attempt(
            job,
            attempt,
            token,
            AttemptFacts(node_host=self.node_host, started_unix_ns=time.time_ns()),
            entered,
        )
        try:
            requests, levels = self._run(state)
        except (ServerFailure, GpusBusy, ConversionError, JobCancelled) as err:
            if self._cancel.is_set():  # whatever broke, it broke because the driver stopped the server
                return self._failed(state, ErrorClass.CANCELLED, "stopped by the driver", None)
            if isinstance(err, ServerFailure):
                return self._failed(state, err.error_class, err.message, err.log_tail)
            return self._failed(
                state,
                ErrorClass.GPUS_BUSY if isinstance(err, GpusBusy) else ErrorClass.BAD_DRAFTER,
                str(err),
                None,
            )
        return self._finish(state, None, None, None, requests, levels)

    def _run(self, state: _Attempt) -> tuple[list[RequestRecord], list[LevelRecord]]:
        job = state.job
        self._preflight()
        _check_prompts(job)
        draft_path, draft_digest = self._drafter(job)
        state.facts = replace(
            state.facts, input_digests=input_digests(job, on_node=True, drafter=draft_digest)
        )
        log_path = layout.server_log(self.out, job.job_id, state.attempt)
        config = ServerConfig(
            engine=job.engine,
            python=python_for(job.engine, job.sglang_python),
            args=tuple(job.launch_args(draft_path, self._adaptive_config_file(job, log_path.parent))),
            env=self._server_env(job, state.attempt),
        )
        with contextlib.ExitStack() as held:  # the ports are held until the servers are stopped
            port = held.enter_context(reserved_port(config.host))
            if self._ranks is not None:
                config = self._start_other_ranks(held, config, state)
            server = start_server(config, port, log_path)
            with self._server_lock:
                self._server = server
            self.pid_file.record(server, job.job_id)
            state.facts = replace(state.facts, argv=tuple(server.argv), draft_model_path=draft_path)
            try:
                return self._measure(state, server)
            finally:
                self._stop(server, job)

    def _start_other_ranks(
        self, held: contextlib.ExitStack, config: ServerConfig, state: _Attempt
    ) -> ServerConfig:
        """Pick the rendezvous address on this node (a reserved port), start every other rank with it
        (each rank is stopped when ``held`` closes, whatever happens), and return rank 0's config."""
        import ray

        assert self._ranks is not None
        ranks = self._ranks
        job = state.job
        host = ray.util.get_node_ip_address()  # type: ignore[no-untyped-call]
        address = f"{host}:{held.enter_context(reserved_port(host))}"
        held.callback(ranks.stop, job.timeouts.stop_s)
        ranks.start(job.model_dump_json(), state.attempt, address)
        return replace(config, args=(*config.args, *multinode.rank_args(job.nodes, 0, address)))

    def _measure(
        self, state: _Attempt, server: ServerProcess
    ) -> tuple[list[RequestRecord], list[LevelRecord]]:
        job = state.job
        startup_s = wait_healthy(server, job.timeouts.startup_s)
        if self._ranks is not None:
            self._ranks.check()
        state.facts = replace(state.facts, startup_s=startup_s)
        info = self._server_info(server)
        state.facts = replace(state.facts, server_info=info)
        mismatches = config_mismatches(job.effective, SpecParams.from_mapping(info))
        if mismatches:
            raise ServerFailure(ErrorClass.CONFIG_MISMATCH, "; ".join(mismatches), server.log_tail())
        if job.lossless_check:
            self._lossless_check(state, server)
        workload = job.load.workload.model_copy(update={"seed": job.seed})
        requests: list[RequestRecord] = []
        levels: list[LevelRecord] = []
        telemetry = AttemptTelemetry.start(
            job.telemetry,
            server.url,
            self.gpu_ids,
            layout.telemetry_samples(self.out, job.job_id, state.attempt),
        )
        state.facts = replace(
            state.facts, server_metrics_off=telemetry.server_off, gpu_metrics_off=telemetry.gpu_off
        )
        try:
            self._run_levels(state, server, telemetry, workload, requests, levels)
            if job.load.capacity is not None:
                self._search_capacity(state, server, workload)
        finally:
            state.telemetry = telemetry.stop(job.sweep_id, job.job_id)
        self._snapshot_metrics(server, state)
        return requests, levels

    def _lossless_check(self, state: _Attempt, server: ServerProcess) -> None:
        """The lossless check's greedy prompts, before the load levels (which flush the cache after it)."""
        from workers.load.lossless import run_check

        job = state.job
        self._check_cancel()
        with LevelWatch(server, job.timeouts.level_s, job.timeouts.stop_s) as watch:
            state.lossless = run_check(
                server.url, sweep_id=job.sweep_id, job_id=job.job_id, request_timeout_s=job.timeouts.request_s
            )
        self._check_cancel()
        watch.raise_if_ended()
        self._check_alive(server)

    def _run_levels(
        self,
        state: _Attempt,
        server: ServerProcess,
        telemetry: AttemptTelemetry,
        workload: Workload,
        requests: list[RequestRecord],
        levels: list[LevelRecord],
    ) -> None:
        job = state.job
        plan = job.load.levels(seed=job.seed, request_timeout_s=job.timeouts.request_s)
        for run_index, level in enumerate(plan):
            records, summary = self._run_level(state, server, level, workload, run_index, telemetry)
            requests.extend(records)
            levels.append(summary)

    def _run_level(
        self,
        state: _Attempt,
        server: ServerProcess,
        level: LoadLevel,
        workload: Workload,
        run_index: int,
        telemetry: AttemptTelemetry | None = None,
    ) -> tuple[list[RequestRecord], LevelRecord]:
        """Run one level on the server (watched, flushed, checked alive) and summarise it; ``telemetry``
        cuts the sampled series to it (capacity probes are not sampled)."""
        from analysis.levels import summarize_level
        from workers.load.generator import run_load

        job = state.job
        self._check_cancel()
        entered_ns = time.perf_counter_ns()
        if job.telemetry.profile_steps is not None and telemetry is not None:
            self._profile(state, server, level.label)
        with LevelWatch(server, job.timeouts.level_s, job.timeouts.stop_s) as watch:
            result = run_load(server.url, level, workload)
        if telemetry is not None:
            telemetry.level(level.label, entered_ns, result.t0_ns)
        self._check_cancel()
        watch.raise_if_ended()
        self._check_alive(server)
        if result.cache_flushed is False and not job.load.allow_failed_flush:
            raise ServerFailure(
                ErrorClass.CACHE_FLUSH_FAILED,
                f"/flush_cache before level {level.label} did not succeed within "
                f"{level.flush_timeout_s:g} s, so its requests could hit the prefix cache; "
                "set load.allow_failed_flush to keep such levels",
                server.log_tail(),
            )
        info = self._server_info(server)
        summary = summarize_level(
            requests_table(result.records),
            sweep_id=job.sweep_id,
            job_id=job.job_id,
            load_level=level.label,
            window_start_s=result.window_start_s,
            window_end_s=result.window_end_s,
            gpus=job.gpus,
            server_accept_length=server_accept_length(info),
            client_delay_p50_us=result.client_delay.p50_us,
            client_delay_p99_us=result.client_delay.p99_us,
            run_index=run_index,
            cache_flushed=result.cache_flushed,
            stop_reason=result.stop_reason,
        )
        state.facts = replace(state.facts, server_info=info)
        return result.records, summary

    def _search_capacity(self, state: _Attempt, server: ServerProcess, workload: Workload) -> None:
        """Bisect the load at which the capacity SLOs hold, one probe level at a time on this server."""
        from workers.load.capacity import Verdict, search_capacity, verdict

        job = state.job
        search = job.load.capacity
        assert search is not None
        slos = search.slos()

        def probe(load: float) -> Verdict:
            level = job.load.probe_level(load, seed=job.seed, request_timeout_s=job.timeouts.request_s)
            record = self._run_level(state, server, level, workload, len(state.probes))[1]
            judged = verdict(slos, record)
            state.probes.append(
                CapacityProbeRecord(
                    record, search.kind, search.slo, len(state.probes), load, judged.passed, judged.margin
                )
            )
            return judged

        outcome = search_capacity(search, probe)
        log.info(
            "job %s: capacity %s (%s) after %d probes",
            job.job_id,
            outcome.capacity,
            outcome.bound,
            len(outcome.probes),
        )

    # --- steps ------------------------------------------------------------------------------------------

    def _preflight(self) -> None:
        """Kill what a previous worker left, then require idle GPUs (skipped on nodes without NVIDIA)."""
        self.pid_file.kill_leftover()
        if self.gpu_ids:
            check_gpus_idle(self.gpu_ids)

    @staticmethod
    def _adaptive_config_file(job: JobSpec, directory: Path) -> str | None:
        """Write an adaptive job's --speculative-adaptive-config beside its server log; its path."""
        if not job.adaptive_steps:
            return None
        directory.mkdir(parents=True, exist_ok=True)
        path = directory / "adaptive.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(json.dumps(job.adaptive_config(), indent=2) + "\n")
        tmp.replace(path)
        return str(path)

    def _drafter(self, job: JobSpec) -> tuple[str | None, str | None]:
        """The node-local converted drafter (converted once per node: the converter's cache) and the
        digest of the checkpoint it was converted from."""
        if job.drafter is None:
            return None, None
        conversion = drafter_conversion(job.drafter, job.model_path)
        return str(conversion.path), conversion.report.source_digest

    def _server_env(self, job: JobSpec, attempt: int) -> tuple[tuple[str, str], ...]:
        env = dict(job.env)
        env.setdefault("SPECSWEEP_SIM_SEED", str(job.seed))  # the simulator's acceptance draws
        env["SPECSWEEP_JOB_ID"] = job.job_id
        env["SPECSWEEP_ATTEMPT"] = str(attempt)
        return tuple(sorted(env.items()))

    def _server_info(self, server: ServerProcess) -> dict[str, Any]:
        status, body = http_get(server.url + api.SERVER_INFO, timeout_s=30.0)
        if status != 200:
            self._check_alive(server)
            raise ServerFailure(
                ErrorClass.HEALTH_LOST, f"{api.SERVER_INFO} answered {status or 'nothing'}", server.log_tail()
            )
        info = server_info_object(body)
        if info is None:
            raise ServerFailure(
                ErrorClass.HEALTH_LOST,
                f"{api.SERVER_INFO} answered without an SGLang JSON object: {body[:200]!r}",
                server.log_tail(),
            )
        problem = launch_tag_problem(server, info)
        if problem is not None:  # our server held the port at /health; someone shares it now
            raise ServerFailure(ErrorClass.PORT_TAKEN, problem, server.log_tail())
        return info

    def _check_alive(self, server: ServerProcess) -> None:
        """A server that died mid-run is a crash; one that is alive but stopped answering /health is
        health_lost. A failed probe waits a moment for the exit, since a dying server stops answering
        just before its process is gone."""
        status, _ = http_get(server.url + api.HEALTH, timeout_s=30.0)
        deadline = time.monotonic() + (0.0 if status == 200 else EXIT_GRACE_S)
        while (returncode := server.poll()) is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if returncode is not None:
            tail = server.log_tail()
            _, evidence = classify_exit(tail, returncode)
            raise ServerFailure(
                ErrorClass.CRASH, f"server exited with code {returncode} during the load: {evidence}", tail
            )
        if self._ranks is not None:  # another rank's end ends the server: SGLang's rank 0 dies at its
            self._ranks.check()  # next collective, but NCCL's timeouts can take minutes
        if status != 200:
            raise ServerFailure(
                ErrorClass.HEALTH_LOST,
                f"{api.HEALTH} answered {status or 'nothing'} mid-run",
                server.log_tail(),
            )

    def _profile(self, state: _Attempt, server: ServerProcess, label: str) -> None:
        """Start a bounded profiler capture for the level (its traces land next to the server log)."""
        out = layout.log_dir(self.out, state.job.job_id, state.attempt) / "profile" / label
        steps = state.job.telemetry.profile_steps or 0
        problem = start_profile(server.url, out, label.replace("=", "-"), steps)
        if problem:
            log.warning("job %s level %s: no profile: %s", state.job.job_id, label, problem)

    def _snapshot_metrics(self, server: ServerProcess, state: _Attempt) -> None:
        """Keep /metrics next to the server log (Prometheus text; absent without --enable-metrics)."""
        status, body = http_get(server.url + api.METRICS, timeout_s=30.0)
        if status == 200:
            path = layout.log_dir(self.out, state.job.job_id, state.attempt) / "metrics.txt"
            path.write_bytes(body)

    def _check_cancel(self) -> None:
        if self._cancel.is_set():
            raise JobCancelled()

    def _stop(self, server: ServerProcess, job: JobSpec) -> None:
        """Stop the server, confirm its group is gone and (on GPU nodes) its GPUs are free again."""
        try:
            server.stop(job.timeouts.stop_s)
        finally:
            with self._server_lock:
                self._server = None
        self.pid_file.clear()
        deadline = time.monotonic() + GPU_RELEASE_WAIT_S
        while self.gpu_ids and time.monotonic() < deadline:
            holders = gpu_processes(self.gpu_ids)
            if not holders:
                return
            time.sleep(0.5)
        if self.gpu_ids and gpu_processes(self.gpu_ids):
            log.warning("slot %d: GPUs %s still held after the server stopped", self.slot, self.gpu_ids)

    # --- results -----------------------------------------------------------------------------------------

    def _failed(
        self, state: _Attempt, error_class: ErrorClass, message: str, log_tail: str | None
    ) -> AttemptResult:
        log.warning("job %s attempt %d failed: %s: %s", state.job.job_id, state.attempt, error_class, message)
        return self._finish(state, error_class, message, log_tail, [], [])

    def _finish(
        self,
        state: _Attempt,
        error_class: ErrorClass | None,
        message: str | None,
        log_tail: str | None,
        requests: list[RequestRecord],
        levels: list[LevelRecord],
    ) -> AttemptResult:
        """Write the attempt's files (temp name + rename) and return them with the outcome."""
        state.facts = replace(state.facts, finished_unix_ns=time.time_ns())
        record: JobRecord = job_record(
            state.job,
            attempt=state.attempt,
            error_class=error_class,
            error_message=message,
            facts=state.facts,
        )
        tables = {"jobs": jobs_table([record])}
        if error_class is None:
            tables = {
                "requests": requests_table(requests),
                "levels": levels_table(levels),
                **({"capacity": capacity_table(state.probes)} if state.job.load.capacity else {}),
                **({"lossless": lossless_table(state.lossless)} if state.job.lossless_check else {}),
                **state.telemetry,
                **tables,
            }
        files = {}
        for name, table in tables.items():
            path = layout.attempt_path(self.out, state.job.job_id, state.attempt, name)
            write_parquet_atomic(table, path)
            files[name] = path.read_bytes()
        return AttemptResult(
            job_id=state.job.job_id,
            attempt=state.attempt,
            lease_token=state.token,
            error_class=error_class,
            error_text=message,
            log_tail=log_tail,
            node_host=self.node_host,
            worker_s=time.monotonic() - state.entered,
            files=files,
        )
