"""Run a planned sweep on a Ray cluster and survive what a cluster does to it.

One placement group ``[{"GPU": g, "CPU": c}]`` (STRICT_PACK: one server's GPUs on one node) per server
slot, one ``NodeWorker`` actor in each (``max_restarts=0, max_task_retries=0``: the queue, not Ray,
decides about retries). The driver leases a job from the SQLite queue, calls the slot's worker, and on
the answer commits the attempt's files and marks the job done - only while the lease token still
holds, so a late answer of a job that was handed elsewhere is ignored. A worker whose node dies
(``RayActorError``) loses its lease; the job is requeued and the actor replaced (its placement group
comes back when a node can hold it). SIGINT/SIGTERM stop the servers, release the leases and exit;
``--resume`` continues from the queue. A named Ray actor (plus a file lock) keeps a second driver off
the same sweep. The output may be an object store (``harness.results.Output``): the queue then lives
in a local state directory, and the driver marks each attempt it hands out and publishes a copy of its
queue into the bucket every few seconds, for ``best`` and ``status`` on other hosts.
"""

from __future__ import annotations

import logging
import math
import signal
import socket
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from harness import inputs as sweep_inputs
from harness.confirm import confirmation_job_id, plan_confirmation
from harness.plan import Plan
from harness.progress import Progress, SlotView, SweepView
from harness.queue import QUEUE_FILE, STARTED_KEY, JobQueue, Lease, open_read_only, read_meta, readable_queue
from harness.reaper import Reaper
from harness.results import (
    Output,
    claim_output_dir,
    drop_attempts,
    mark_leased,
    median_client_delay_us,
    output_for,
    publish_queue,
    write_sweep_row,
)
from harness.search.session import SearchSession
from harness.settle import Failure, settle_failure, settle_leftovers, settle_success
from harness.spec import SweepSpec
from harness.startup import HASHING, RUNNING, STARTING_RAY, Start, sweep_start
from specsweep.error_classes import ErrorClass
from specsweep.errors import ClusterError, InputsChangedError, StoreError, disk_full_error, is_disk_full
from workers.job import AttemptResult, JobSpec
from workers.node.actor import NodeWorker
from workers.node.inputs import InputDigests, input_digests
from workers.node.ranks import RankWorker
from workers.node.records import AttemptFacts, job_record
from workers.sglang import SGLANG_VERSION

log = logging.getLogger(__name__)

NAMESPACE = "specsweep"
POLL_S = 0.2
QUEUE_PUBLISH_S = 5.0  # how often an object-store output gets a fresh copy of the queue (status reads it)
MAX_ACTOR_START_FAILURES = 5  # a slot whose worker cannot even start this many times in a row is given up
ATTEMPT_MARGIN_S = 120.0
RANKS_READY_S = 60.0  # how long a multi-node slot's other rank workers get to answer once rank 0 did  # on top of the job's own stage limits before the driver gives up on a worker


@ray.remote(num_cpus=0)
class DriverLock:
    """Held (by name) while a driver runs a sweep; the name frees itself when the driver dies."""

    def __init__(self, holder: str) -> None:
        self._holder = holder

    def holder(self) -> str:
        return self._holder


def lost_attempt(job: JobSpec, lease: Lease, error_class: ErrorClass, message: str) -> Failure:
    """A failed attempt no worker answered for (worker or node lost): the driver builds its jobs row."""
    record = job_record(
        job,
        attempt=lease.attempt,
        error_class=error_class,
        error_message=message,
        facts=AttemptFacts(finished_unix_ns=time.time_ns()),
    )
    return Failure(error_class, message, None, None, lost_record=record)


@dataclass
class Slot:
    """One server slot: its placement group, its worker, and what it is doing."""

    index: int
    group: Any  # PlacementGroup
    actor: Any = None  # the NodeWorker (rank 0 of a multi-node server), in bundle 0
    ranks: list[Any] = field(default_factory=list)  # a multi-node server's RankWorkers, bundles 1..N-1
    ready_ref: Any = None
    job_ref: Any = None
    lease: Lease | None = None
    job: JobSpec | None = None
    state: str = "placing"  # placing | idle | busy | lost
    node: str | None = None
    since: float = field(default_factory=time.monotonic)
    deadline: float = math.inf
    start_failures: int = 0

    def set_state(self, state: str) -> None:
        self.state = state
        self.since = time.monotonic()


@dataclass(frozen=True, slots=True)
class SweepSummary:
    """How the run ended; ``inputs_changed``: why the driver stopped it (an attempt measured other inputs
    than the sweep's), raised by ``run_sweep`` once the queue and the sweep row are written."""

    counts: dict[str, int]
    interrupted: bool
    inputs_changed: InputsChangedError | None = None


def _ready(refs: list[Any]) -> list[Any]:
    """The refs that are ready: wait up to POLL_S for the first, then take every other one ready now
    (``num_returns=len(refs)`` would wait the whole timeout whenever one is still running)."""
    done, rest = ray.wait(refs, num_returns=1, timeout=POLL_S)
    if done and rest:
        more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
        done += more
    return done


@dataclass
class RayConnection:
    """What ``connect_ray`` did: ``started`` when this call started Ray (and must shut it down); ``reaper``
    when it started an embedded Ray, whose processes the reaper stops once the driver is gone."""

    started: bool
    reaper: Reaper | None = None

    def close(self) -> None:
        if self.started:
            ray.shutdown()
        if self.reaper is not None:
            self.reaper.close()


def connect_ray(address: str, spec: SweepSpec) -> RayConnection:
    """Connect to (or start) Ray for ``spec``: ``address`` ``"local"`` starts an embedded cluster sized for its
    slots. A caller that connects first (a test running several sweeps on one cluster) makes every
    ``run_sweep`` after it find Ray up and leave it up; it closes the connection itself."""
    if ray.is_initialized():
        return RayConnection(started=False)
    if address == "local":
        # The simulator needs no GPUs: declare enough for the slots. SGLang uses what Ray detects.
        gpus = spec.gpus_per_server * (spec.max_servers or 2) if spec.engine == "sim" else None
        cpus = max(2, spec.cpus_per_server * (spec.max_servers or 2))
        ray.init(
            address="local",
            namespace=NAMESPACE,
            num_gpus=gpus,
            num_cpus=cpus,
            include_dashboard=False,
            log_to_driver=False,
            _node_ip_address="127.0.0.1",
        )
        return RayConnection(started=True, reaper=Reaper(ray.get_runtime_context().get_session_name()))
    else:
        try:
            ray.init(address=address, namespace=NAMESPACE, log_to_driver=False)
        except ConnectionError as err:
            raise ClusterError(
                f"cannot connect to a Ray cluster at {address!r}: {err}",
                fix="start one (`ray start --head`, `ray up cluster.yaml`), pass its address with "
                "--ray-address, or use --ray-address local for an embedded one",
            ) from None
    return RayConnection(started=True)


def _acquire_driver_lock(sweep_id: str, where: str | Path) -> Any:
    """The named actor that marks ``sweep_id`` as run by this driver (``where``: its output)."""
    name = f"specsweep-driver-{sweep_id}"
    holder = f"{socket.gethostname()}:{where}"
    try:
        lock = DriverLock.options(name=name, namespace=NAMESPACE).remote(holder)  # type: ignore[attr-defined]
        ray.get(lock.holder.remote())
    except ValueError as err:  # the name is taken: another driver holds the sweep
        other = str(ray.get(ray.get_actor(name, namespace=NAMESPACE).holder.remote()))
        raise ClusterError(
            f"another driver is running sweep {sweep_id} on this cluster (held by {other})",
            fix="wait for it to finish, or stop it (ray job stop) before starting another",
        ) from err
    return lock


def _cluster_gpus() -> list[tuple[str, float, float]]:
    """(node address, GPUs, CPUs) of every alive node."""
    return [
        (node["NodeManagerAddress"], node["Resources"].get("GPU", 0.0), node["Resources"].get("CPU", 0.0))
        for node in ray.nodes()  # type: ignore[no-untyped-call]
        if node["Alive"]
    ]


def _slot_capacity(spec: SweepSpec) -> int:
    """How many servers the alive nodes can hold at once: node bundles, each server's on distinct nodes."""
    bundles = [
        min(int(gpus // spec.gpus_per_server), int(cpus // spec.cpus_per_server))
        for _, gpus, cpus in _cluster_gpus()
    ]
    nodes = spec.nodes_per_server
    if nodes == 1:
        return sum(bundles)
    # k servers fit iff the nodes hold k * nodes bundles with at most k of them on one node (STRICT_SPREAD)
    return max(k for k in range(sum(bundles) // nodes + 1) if sum(min(b, k) for b in bundles) >= k * nodes)


def _placement_error(spec: SweepSpec, waited_s: float) -> ClusterError:
    nodes = _cluster_gpus()
    gpus = [int(g) for _, g, _ in nodes]
    if spec.nodes_per_server > 1:
        return ClusterError(
            f"no server slot could be placed within {waited_s:.0f} s: each server asks for "
            f"{spec.nodes_per_server} different nodes with {spec.gpus_per_server} GPUs and {spec.cpus_per_server} "
            f"CPUs each (nodes_per_server, STRICT_SPREAD); the cluster has {len(nodes)} alive node(s) with GPUs "
            f"{gpus or 'none'}",
            fix=f"add nodes with {spec.gpus_per_server} GPUs (at least {spec.nodes_per_server}), lower "
            "nodes_per_server (with a matching --tp-size), or raise timeouts.placement_s if nodes are still joining",
        )
    return ClusterError(
        f"no server slot could be placed within {waited_s:.0f} s: each server asks for {spec.gpus_per_server} "
        f"GPUs and {spec.cpus_per_server} CPUs on ONE node (gpus_per_server, STRICT_PACK); the cluster has "
        f"{len(nodes)} alive node(s) with GPUs {gpus or 'none'} ({sum(gpus)} in total, at most "
        f"{max(gpus, default=0)} on one node)",
        fix=f"set gpus_per_server to at most {max(gpus, default=0)} (with a matching --tp-size), add nodes with "
        f"{spec.gpus_per_server} GPUs, or raise timeouts.placement_s if nodes are still joining",
    )


class Driver:
    """The dispatch loop over slots and the queue (one thread: the queue's only writer)."""

    def __init__(self, spec: SweepSpec, plan: Plan, out: Output, queue: JobQueue, progress: Progress) -> None:
        self.spec = spec
        self.plan = plan
        self.out = out
        self.queue = queue
        self.progress = progress
        self.jobs = {job.job_id: job for job in plan.jobs}
        self.slots: list[Slot] = []
        self._stop_signal: int | None = None
        self._inputs_changed: InputsChangedError | None = None
        self._job_seconds: list[float] = []
        self._worker_class = ray.remote(NodeWorker)
        self._rank_class = ray.remote(RankWorker)
        self.search = SearchSession(spec, plan, out.store) if spec.search.strategy == "model" else None
        self._published_at = -math.inf
        self._search_asked_at: tuple[int, int] | None = None  # (done, failed) when it last had nothing

    # --- lifecycle ------------------------------------------------------------------------------------

    def run(self) -> SweepSummary:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            if self.search is not None:  # a resume first runs what the last driver had queued
                slots = max(1, min(_slot_capacity(self.spec), self.spec.max_servers or math.inf))
                self._ask_search(slots - self.queue.counts()["pending"])
            if self.queue.counts()["pending"] == 0 and not self._queue_confirmation():
                return SweepSummary(self.queue.counts(), interrupted=False)  # a resume of a finished sweep
            self._create_slots()
            return self._loop()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._teardown()

    def _on_signal(self, signum: int, frame: object) -> None:
        self._stop_signal = signum

    def _create_slots(self) -> None:
        pending = self.queue.counts()["pending"]
        jobs = pending if self.search is None else math.inf  # a search queues more as slots free up
        count = int(max(1, min(_slot_capacity(self.spec), self.spec.max_servers or math.inf, jobs)))
        bundle = {"GPU": float(self.spec.gpus_per_server), "CPU": float(self.spec.cpus_per_server)}
        nodes = self.spec.nodes_per_server
        strategy = "STRICT_PACK" if nodes == 1 else "STRICT_SPREAD"  # one bundle per node of the server
        for index in range(count):
            slot = Slot(index=index, group=placement_group([bundle] * nodes, strategy=strategy))
            self.slots.append(slot)
            self._start_worker(slot)
        shape = f"{self.spec.gpus_per_server} GPUs" + (f" on each of {nodes} nodes" if nodes > 1 else "")
        self.progress.event(f"{count} server slot(s) of {shape} for {pending} pending job(s)")

    def _start_worker(self, slot: Slot) -> None:
        def options(bundle: int, concurrency: int) -> dict[str, Any]:
            return {
                "num_gpus": self.spec.gpus_per_server,
                "num_cpus": self.spec.cpus_per_server,
                "max_restarts": 0,
                "max_task_retries": 0,
                "max_concurrency": concurrency,
                "scheduling_strategy": PlacementGroupSchedulingStrategy(
                    slot.group, placement_group_bundle_index=bundle
                ),
            }

        out = str(self.out.state.resolve())
        slot.ranks = [
            self._rank_class.options(**options(rank, 2)).remote(out, slot.index, rank)  # poll() beside stop()
            for rank in range(1, self.spec.nodes_per_server)
        ]
        # cancel() runs beside run_job()
        slot.actor = self._worker_class.options(**options(0, 2)).remote(out, slot.index)
        slot.ready_ref = slot.actor.ready.remote()
        slot.set_state("placing")

    def _kill_workers(self, slot: Slot) -> None:
        for actor in [slot.actor, *slot.ranks]:
            try:
                ray.kill(actor, no_restart=True)
            except Exception:  # an actor on an unreachable node cannot be killed; its lease is fenced anyway
                log.debug("ray.kill failed for slot %d", slot.index, exc_info=True)

    def _replace_worker(self, slot: Slot) -> None:
        self._kill_workers(slot)
        slot.job_ref = slot.lease = slot.job = None
        slot.deadline = math.inf
        slot.node = None
        self._start_worker(slot)

    def _teardown(self) -> None:
        for slot in self.slots:
            self._kill_workers(slot)
            remove_placement_group(slot.group)

    # --- the loop -------------------------------------------------------------------------------------

    def _loop(self) -> SweepSummary:
        started = time.monotonic()
        last_alive = started
        while True:
            if self._stop_signal is not None:
                self._stop(signal.Signals(self._stop_signal).name)
                return SweepSummary(self.queue.counts(), interrupted=True)
            if self._inputs_changed is not None:
                self._stop("inputs changed")
                return SweepSummary(
                    self.queue.counts(), interrupted=True, inputs_changed=self._inputs_changed
                )
            counts = self.queue.counts()
            if self.search is not None and counts["pending"] == 0:
                counts = self._ask_search(sum(1 for s in self.slots if s.state == "idle"))
            if counts["pending"] == 0 and not any(s.state == "busy" for s in self.slots):
                if self._queue_confirmation():
                    continue
                return SweepSummary(counts, interrupted=False)
            self._dispatch()
            self._wait_and_handle()
            self._check_deadlines()
            now = time.monotonic()
            if any(s.state in ("idle", "busy") for s in self.slots):
                last_alive = now
            elif now - last_alive > self.spec.timeouts.placement_s:
                raise _placement_error(self.spec, now - last_alive)
            self.progress.update(self._view())
            self._publish_queue(now)

    def _publish_queue(self, now: float) -> None:
        """Every QUEUE_PUBLISH_S, a copy of the queue for ``status`` on an object store (run_sweep
        publishes the last one)."""
        if now - self._published_at >= QUEUE_PUBLISH_S:
            self._published_at = now
            try:
                publish_queue(self.out, self.queue)
            except StoreError as err:  # only `status` elsewhere reads it: the sweep goes on
                self.progress.event(f"queue copy not published: {err.problem}")

    def _dispatch(self) -> None:
        alive = sum(1 for s in self.slots if s.state in ("idle", "busy"))
        for slot in self.slots:
            if slot.state != "idle":
                continue
            lease = self.queue.lease(slot.index, other_slots=alive > 1)
            if lease is None:
                continue
            job = self.jobs.get(lease.job_id) or JobSpec.model_validate_json(lease.payload)
            mark_leased(self.out, lease.job_id, lease.attempt)
            slot.lease, slot.job = lease, job
            slot.job_ref = slot.actor.run_job.remote(lease.payload, lease.attempt, lease.token, slot.ranks)
            slot.deadline = time.monotonic() + self._attempt_budget(job)
            slot.set_state("busy")
            self.progress.event(
                f"start  {job.config_label} r{job.repeat_index} ({job.job_id}) attempt {lease.attempt} "
                f"on slot {slot.index} ({slot.node})"
            )

    def _ask_search(self, free: float) -> dict[str, int]:
        """Queue the search's next launches for ``free`` slots; asked again only once something
        finished or failed since it last had nothing to add."""
        assert self.search is not None
        counts = self.queue.counts()
        seen = (counts["done"], counts["failed"])
        if free < 1 or seen == self._search_asked_at:
            return counts
        decision, jobs = self.search.next_jobs(self.queue, int(free))
        self._search_asked_at = None if jobs else seen
        for job in jobs:
            self.progress.event(f"search: launch {job.config_label} r{job.repeat_index} ({decision.reason})")
        if not jobs and decision.finished:
            self.progress.event(f"search: {decision.reason}")
        return self.queue.counts()

    def _queue_confirmation(self) -> bool:
        """Once the sweep's own jobs are settled, queue the adaptive schedule's confirmation job (when the
        spec asks for it and the queue does not hold it yet: harness.confirm); True when queued now."""
        if not self.spec.confirm_adaptive:
            return False
        job_id = sweep_inputs.input_keyed_id(
            confirmation_job_id(self.plan.sweep_id),
            sweep_inputs.loads(self.queue.get_meta(sweep_inputs.META_CURRENT)),
            sweep_inputs.loads(self.queue.get_meta(sweep_inputs.META_ORIGINAL)),
        )
        if any(row.id == job_id for row in self.queue.jobs()):
            return False
        confirmation = plan_confirmation(self.spec, self.plan, self.out.store, job_id)
        if confirmation.job is None:
            self.progress.event(f"confirmation: none ({confirmation.note})")
            self.queue.event("confirmation_skipped", confirmation.note)
            return False
        job = confirmation.job
        self.queue.add_jobs([(job.job_id, job.config_label, job.model_dump_json())])
        self.jobs[job.job_id] = job
        self.progress.event(
            f"confirmation: launch the adaptive schedule ({confirmation.note}) ({job.job_id})"
        )
        return True

    @staticmethod
    def _attempt_budget(job: JobSpec) -> float:
        levels = len(job.load.concurrency) + len(job.load.rates)
        t = job.timeouts
        return t.startup_s + levels * t.level_s + 2 * t.stop_s + ATTEMPT_MARGIN_S

    def _wait_and_handle(self) -> None:
        refs = {}
        for slot in self.slots:
            if slot.state == "placing" and slot.ready_ref is not None:
                refs[slot.ready_ref] = slot
            elif slot.state == "busy":
                refs[slot.job_ref] = slot
        if not refs:
            time.sleep(POLL_S)
            return
        for ref in _ready(list(refs)):
            slot = refs[ref]
            if slot.state == "placing":
                self._on_ready(slot, ref)
            else:
                self._on_job_answer(slot, ref)

    def _on_ready(self, slot: Slot, ref: Any) -> None:
        try:
            info = ray.get(ref)
            # the other ranks' workers sit in the same placement group, placed with rank 0's
            ranks = ray.get([r.ready.remote() for r in slot.ranks], timeout=RANKS_READY_S)
        except (RayActorError, GetTimeoutError) as err:
            slot.start_failures += 1
            if slot.start_failures >= MAX_ACTOR_START_FAILURES:
                slot.set_state("lost")
                self.progress.event(
                    f"slot {slot.index}: worker failed to start {slot.start_failures} times: {err}"
                )
                self.queue.event("slot_lost", f"slot {slot.index}: {err}")
                return
            self._replace_worker(slot)
            return
        slot.ready_ref = None
        slot.start_failures = 0
        slot.node = info["node_host"]
        slot.set_state("idle")
        where = ", ".join(f"{r['node_host']} ({r['node_id'][:12]})" for r in [info, *ranks])
        self.queue.event("slot_ready", f"slot {slot.index} on {where}")
        self.progress.event(f"slot {slot.index} ready on {where}")

    def _on_job_answer(self, slot: Slot, ref: Any) -> None:
        lease, job = slot.lease, slot.job
        assert lease is not None and job is not None  # a busy slot always holds both
        try:
            result: AttemptResult = ray.get(ref)
        except RayActorError as err:
            self._worker_lost(slot, ErrorClass.NODE_LOST, f"worker lost: {type(err).__name__}: {err}")
            return
        except RayTaskError as err:
            if is_disk_full(err.cause):  # the worker could not write the attempt's files: stop, count nothing
                raise disk_full_error(
                    err.cause,
                    where=str(self.out.state),
                    doing=f"slot {slot.index} wrote job {job.job_id}'s files",
                ) from None
            self._free(slot)
            self._record_failure(
                lease, job, lost_attempt(job, lease, ErrorClass.WORKER_ERROR, str(err)[-2000:])
            )
            return
        self._free(slot)
        if result.error_class == ErrorClass.CANCELLED:
            self.queue.release(lease, "stopped by the driver")
            return
        if not result.ok:
            failure = Failure(
                result.error_class or ErrorClass.CRASH, result.error_text or "", result.log_tail, result
            )
            self._record_failure(lease, job, failure)
            if not self._ranks_alive(slot):  # a rank's worker (or node) went: the slot starts afresh
                self.queue.event("slot_lost", f"slot {slot.index}: a node rank's worker is gone")
                self._replace_worker(slot)
            return
        changed = self._changed_inputs(job, result)
        if changed is not None:
            self.queue.release(lease, changed.problem, ErrorClass.INPUTS_CHANGED)
            self.progress.event(
                f"STOP   {job.config_label} r{job.repeat_index} ({job.job_id}) attempt {lease.attempt}: "
                f"{ErrorClass.INPUTS_CHANGED}: {changed.problem}"
            )
            self._inputs_changed = self._inputs_changed or changed
            return
        if not settle_success(self.out, self.queue, job, lease, result):
            return
        self._job_seconds.append(time.monotonic() - slot.since)
        self.progress.event(
            f"done   {job.config_label} r{job.repeat_index} ({job.job_id}) on {result.node_host}"
        )

    def _changed_inputs(self, job: JobSpec, result: AttemptResult) -> InputsChangedError | None:
        """Compare the digests the worker measured with (its jobs row) with the sweep's accepted ones
        (harness.inputs), kind by kind where both have one: a difference is an ``InputsChangedError``
        naming the input, and the attempt is not committed. A kind the driver could not see (an input only
        on the nodes) is taken from the first worker that reports it, so every node must agree with it."""
        reported = _reported_inputs(result)
        accepted = sweep_inputs.loads(self.queue.get_meta(sweep_inputs.META_CURRENT))
        new = {kind: digest for kind, digest in reported.items() if kind not in accepted}
        if new:  # kept as the sweep's, first run's and current alike
            original = sweep_inputs.loads(self.queue.get_meta(sweep_inputs.META_ORIGINAL))
            self.queue.set_meta(sweep_inputs.META_ORIGINAL, sweep_inputs.dumps({**new, **original}))
            self.queue.set_meta(sweep_inputs.META_CURRENT, sweep_inputs.dumps({**new, **accepted}))
        changed = sweep_inputs.changed_kinds(accepted, reported)
        if not changed:
            return None
        names = "; ".join(
            f"{sweep_inputs.describe(kind, job)} (digest {reported[kind][:12]}, the sweep's {accepted[kind][:12]})"
            for kind in changed
        )
        return InputsChangedError(
            f"inputs changed while the sweep ran: job {job.job_id} ({job.config_label} r{job.repeat_index}) on "
            f"{result.node_host} measured {names}; its results are not kept",
            where=self.out.store.describe(),
            fix="restore the input (on every node) and continue with `specsweep run SPEC --out OUT --resume`; "
            f"to measure the changed input, resume with {sweep_inputs.ACCEPT_FLAG} (new job ids) where this "
            "host can read it, else start the sweep in another --out",
        )

    @staticmethod
    def _ranks_alive(slot: Slot) -> bool:
        """Whether every other rank's worker of a multi-node slot still answers."""
        try:
            ray.get([r.ready.remote() for r in slot.ranks], timeout=RANKS_READY_S)
        except (RayActorError, GetTimeoutError):
            return False
        return True

    def _free(self, slot: Slot) -> None:
        slot.job_ref = slot.lease = slot.job = None
        slot.deadline = math.inf
        slot.set_state("idle")

    def _worker_lost(self, slot: Slot, error_class: ErrorClass, message: str) -> None:
        """The worker (or its node) is gone or hung: fail the attempt, replace the worker."""
        lease, job = slot.lease, slot.job
        self.progress.event(f"slot {slot.index} ({slot.node}): {message}")
        self.queue.event("slot_lost", f"slot {slot.index} on {slot.node}: {message}")
        self._replace_worker(slot)
        if lease is not None and job is not None:
            self._record_failure(lease, job, lost_attempt(job, lease, error_class, message))

    def _record_failure(self, lease: Lease, job: JobSpec, failure: Failure) -> None:
        """Apply the retry policy (see harness.settle: a final failure's jobs row, then the state)."""
        state = settle_failure(self.out, self.queue, job, lease, failure, retries=self.spec.retries)
        if state is None:
            return
        verdict = "FAILED" if state == "failed" else "retry "
        message = failure.message
        self.progress.event(
            f"{verdict} {job.config_label} r{job.repeat_index} ({job.job_id}) attempt {lease.attempt}: "
            f"{failure.error_class}: {message.splitlines()[0] if message else ''}"
        )

    def _check_deadlines(self) -> None:
        now = time.monotonic()
        for slot in self.slots:
            if slot.state == "busy" and now > slot.deadline:
                self._worker_lost(
                    slot, ErrorClass.ATTEMPT_TIMEOUT, "the worker did not answer within the job's time limits"
                )

    def _stop(self, reason: str) -> None:
        """Stop every server, release every lease; results that arrive meanwhile are still committed."""
        self.progress.event(f"{reason}: stopping servers and releasing leases")
        self.queue.event("driver_stop", reason)
        busy = [s for s in self.slots if s.state == "busy"]
        for slot in busy:
            slot.actor.cancel.remote()
        deadline = time.monotonic() + self.spec.timeouts.stop_s + 15.0
        while any(s.state == "busy" for s in busy) and time.monotonic() < deadline:
            refs = {s.job_ref: s for s in busy if s.state == "busy"}
            for ref in _ready(list(refs)):
                self._on_job_answer(refs[ref], ref)
        for slot in busy:
            if slot.state == "busy" and slot.lease is not None:
                self.queue.release(slot.lease, f"driver stopped ({reason})")

    def _view(self) -> SweepView:
        counts = self.queue.counts()
        alive = max(1, sum(1 for s in self.slots if s.state in ("idle", "busy")))
        mean = sum(self._job_seconds) / len(self._job_seconds) if self._job_seconds else None
        eta = None if mean is None else (counts["pending"] + counts["leased"]) * mean / alive
        slots = tuple(
            SlotView(
                index=s.index,
                state=s.state,
                node=s.node,
                job=f"{s.job.config_label} r{s.job.repeat_index} attempt {s.lease.attempt}"
                if s.job and s.lease
                else None,
                since=s.since,
            )
            for s in self.slots
        )
        return SweepView(counts=counts, slots=slots, eta_s=eta)


def _reported_inputs(result: AttemptResult) -> dict[str, str]:
    """The input digests of an attempt's jobs row as its worker wrote them (none without a row)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    row = result.files.get("jobs")
    if row is None:
        return {}
    (text,) = pq.read_table(pa.BufferReader(row), columns=["input_digests"]).column(0).to_pylist()
    return sweep_inputs.loads(text)


def _prepare_queue(queue: JobQueue, plan: Plan, out: Output, progress: Progress, *, search: bool) -> int:
    """Add the plan's jobs (ids already there are kept; a search adds its own as it decides) and settle
    jobs a dead driver left leased (harness.settle: by their committed rows). Returns the sweep's
    creation time."""
    created = queue.get_meta(STARTED_KEY)
    if created is None:
        created = str(time.time_ns())
        queue.set_meta(STARTED_KEY, created)
        queue.set_meta("sweep_id", plan.sweep_id)
    if not search:
        queue.add_jobs([(job.job_id, job.config_label, job.model_dump_json()) for job in plan.jobs])
    settle_leftovers(queue, out, plan.sweep_id)
    counts = queue.counts()
    progress.event(
        f"sweep {plan.sweep_id}: {len(plan.jobs)} job(s); done {counts['done']}, failed {counts['failed']}, "
        f"pending {counts['pending']}"
    )
    return int(created)


@contextmanager
def _disk_full_stops(out: Output) -> Iterator[None]:
    """A write of the driver that finds the disk full ends the sweep with a DiskFullError: whatever it was
    writing is a temporary file or an SQLite transaction, both undone, and the jobs it leased are settled
    by ``--resume`` as after any driver death (harness.settle)."""
    try:
        yield
    except (OSError, sqlite3.Error) as err:
        if not is_disk_full(err):
            raise
        raise disk_full_error(err, where=str(out.state), doing="the driver wrote the sweep's files") from None


def _recorded_inputs(out: Output) -> dict[str, str]:
    """The input digests the sweep in ``out`` last accepted (none without a queue, or from before digests
    were kept)."""
    path = out.state / QUEUE_FILE
    if not path.is_file():
        return {}
    with readable_queue(path):
        conn = open_read_only(out.state)
        try:
            return sweep_inputs.loads(read_meta(conn).get(sweep_inputs.META_CURRENT))
        finally:
            conn.close()


def _apply_inputs(
    queue: JobQueue, plan: Plan, current: InputDigests, progress: Progress, out: Output
) -> Plan:
    """Record the run's input digests in the queue and give the plan's jobs the ids of these inputs
    (harness.inputs); jobs of superseded ids that have not finished are withdrawn (the confirmation of the
    earlier inputs among them; those a dead driver left leased first settled by their committed rows),
    with their attempt files, so `best` does not wait for them."""
    original = sweep_inputs.loads(queue.get_meta(sweep_inputs.META_ORIGINAL))
    accepted = sweep_inputs.loads(queue.get_meta(sweep_inputs.META_CURRENT))
    changed = sweep_inputs.changed_kinds(accepted, current)
    queue.set_meta(sweep_inputs.META_ORIGINAL, sweep_inputs.dumps({**current, **original}))
    queue.set_meta(sweep_inputs.META_CURRENT, sweep_inputs.dumps({**accepted, **current}))
    plan, superseded = sweep_inputs.rekeyed(plan, current, {**current, **original})
    if changed:
        earlier_confirmation = sweep_inputs.input_keyed_id(
            confirmation_job_id(plan.sweep_id), accepted, original
        )
        settle_leftovers(queue, out, plan.sweep_id)
        withdrawn = queue.withdraw(
            [*superseded, earlier_confirmation], f"inputs changed ({', '.join(changed)}): new job ids"
        )
        for job_id in withdrawn:
            drop_attempts(out, job_id)
        queue.event("inputs_accepted", f"{', '.join(changed)} accepted ({sweep_inputs.ACCEPT_FLAG})")
        progress.event(
            f"inputs changed ({', '.join(changed)}): {len(superseded)} job(s) measured under new ids, "
            f"{len(withdrawn)} pending job(s) of the earlier inputs withdrawn"
        )
    return plan


def run_sweep(
    spec: SweepSpec,
    spec_text: str,
    plan: Plan,
    out: Output | Path | str,
    *,
    ray_address: str,
    resume: bool,
    progress: Progress,
    accept_changed_inputs: bool = False,
    start: Start | None = None,
) -> SweepSummary:
    """Run (or resume) a planned sweep into ``out`` (a directory, an object-store URI, or an Output with
    its state directory); see the module docstring. A resume whose inputs changed in place is refused
    (``InputsChangedError``) unless ``accept_changed_inputs`` (harness.inputs); an attempt that measured
    other inputs than the sweep's stops the run, which then raises ``InputsChangedError`` naming it.
    ``start``: the hold ``specsweep run`` took on ``out`` before planning (harness.startup); without one it
    is taken here."""
    if not plan.jobs:
        raise ClusterError("no valid job to run", fix="see `specsweep plan` for why each point was dropped")
    out = output_for(out)
    if start is None:
        with sweep_start(out, plan.sweep_id, resume=resume) as begun:
            return _run_started(
                spec, spec_text, plan, begun, ray_address, resume, progress, accept_changed_inputs
            )
    return _run_started(spec, spec_text, plan, start, ray_address, resume, progress, accept_changed_inputs)


def _run_started(
    spec: SweepSpec,
    spec_text: str,
    plan: Plan,
    start: Start,
    ray_address: str,
    resume: bool,
    progress: Progress,
    accept_changed_inputs: bool,
) -> SweepSummary:
    """``run_sweep`` once ``out`` is held: hash the inputs, start Ray, then run the driver."""
    out = start.out
    probe = next((job for job in plan.jobs if job.drafter is not None), plan.jobs[0])
    _phase(start, progress, HASHING, "prompt files, drafter, target configs, engine")
    current = input_digests(probe, on_node=False)  # once per run; the workers record their own
    if resume:
        sweep_inputs.check_unchanged(
            _recorded_inputs(out),
            current,
            probe,
            where=out.store.describe(),
            accept=accept_changed_inputs,
        )
    _phase(start, progress, STARTING_RAY, _ray_target(ray_address))
    connection = connect_ray(ray_address, spec)
    where = out.store.describe() if out.remote else str(out.state.resolve())
    try:
        with _disk_full_stops(out):
            claim_output_dir(out, plan.sweep_id, spec_text, resume=resume)
            lock = _acquire_driver_lock(plan.sweep_id, where)  # before the jobs: a refusal adds none
            queue = start.queue
            try:
                plan = _apply_inputs(queue, plan, current, progress, out)
                created = _prepare_queue(queue, plan, out, progress, search=spec.search.strategy == "model")
                start.phase(RUNNING)
                accepted = queue.get_meta(sweep_inputs.META_CURRENT)
                write_sweep_row(
                    out.store,
                    plan.sweep_id,
                    spec_text,
                    sglang_version=SGLANG_VERSION,
                    created_ns=created,
                    input_digests=accepted,
                )
                queue.event("driver_start", f"{socket.gethostname()} ray {ray.__version__}")
                publish_queue(out, queue)
                summary = Driver(spec, plan, out, queue, progress).run()
                write_sweep_row(
                    out.store,
                    plan.sweep_id,
                    spec_text,
                    sglang_version=SGLANG_VERSION,
                    created_ns=created,
                    client_delay_us=median_client_delay_us(out.store, plan.sweep_id),
                    input_digests=queue.get_meta(sweep_inputs.META_CURRENT),  # with the nodes' own inputs
                )
                queue.event("driver_exit", "interrupted" if summary.interrupted else "finished")
                publish_queue(out, queue)
                if summary.inputs_changed is not None:
                    raise summary.inputs_changed
                return summary
            finally:
                ray.kill(lock)
    finally:
        connection.close()


def _phase(start: Start, progress: Progress, phase: str, detail: str) -> None:
    """Say what the driver starts doing now: a progress line, and the phase ``status`` shows."""
    progress.event(f"{phase}: {detail}")
    start.phase(phase, detail)


def _ray_target(address: str) -> str:
    """What ``connect_ray`` will do with ``address``, in words."""
    if ray.is_initialized():
        return "using the Ray this process already runs"
    if address == "local":
        return "an embedded one on this machine"
    return "connecting to the running cluster" if address == "auto" else f"connecting to {address}"
