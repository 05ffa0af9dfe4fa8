"""The other ranks of a server over several nodes: one ``RankWorker`` per non-zero rank, on its own node.

SGLang runs one server over N nodes as the same launch on every node with ``--nnodes N --node-rank R
--dist-init-addr HOST:PORT`` (``workers.sglang.multinode``). The slot's ``NodeWorker`` is rank 0: it
picks the rendezvous address on its node (a port reserved like the HTTP port), asks every ``RankWorker``
to ``start`` its rank, launches its own, and alone is health-checked and loaded. A rank's failure ends
the whole server: SGLang's rank 0 dies at its next collective when another rank's process is gone
(NCCL's remote error), ``RankGroup.check`` finds a rank whose process exited or whose worker (node) is
gone, and ``RankGroup.stop`` stops every rank, whatever happened, before the attempt is reported.

Like ``NodeWorker``, a ``RankWorker`` records its server in a node-local pid file, so a worker that
replaces one whose node or process died kills what it left running before it starts anything.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from analysis import layout
from specsweep.error_classes import ErrorClass
from workers.convert.cache import drafter_conversion
from workers.job import JobSpec
from workers.node.launcher import (
    PidFile,
    ServerConfig,
    ServerFailure,
    ServerProcess,
    classify_exit,
    pid_dir,
    python_for,
    start_server,
)
from workers.node.ports import PortLease, reserve_port
from workers.node.preflight import GpusBusy, check_gpus_idle
from workers.sglang import multinode

log = logging.getLogger(__name__)

RANK_CALL_S = 60.0  # how long rank 0 waits for another rank's worker to answer a start/poll/stop
RANK_STOP_MARGIN_S = 30.0


def rank_log(out: Path, job_id: str, attempt: int, node_rank: int) -> Path:
    """The server log of a non-zero rank, beside rank 0's ``server.log``."""
    return layout.log_dir(out, job_id, attempt) / f"server-rank{node_rank}.log"


@dataclass(frozen=True, slots=True)
class RankExit:
    """A rank that is no longer running: which, and why (the class and message of the server's end)."""

    node_rank: int
    error_class: ErrorClass
    message: str
    log_tail: str | None


def _failure_dict(err: ServerFailure) -> dict[str, Any]:
    return {"error_class": str(err.error_class), "message": err.message, "log_tail": err.log_tail}


class RankWorker:
    """Runs rank ``node_rank`` of each multi-node job of one slot, on the node Ray placed it on."""

    def __init__(self, out_dir: str, slot: int, node_rank: int) -> None:
        import ray

        self.out = Path(out_dir)
        self.slot = slot
        self.node_rank = node_rank
        self.node_host = socket.gethostname()
        self.node_id = ray.get_runtime_context().get_node_id()
        self.gpu_ids = [int(g) for g in ray.get_gpu_ids()]
        gpus = "-".join(map(str, self.gpu_ids)) or "none"
        self.pid_file = PidFile(pid_dir() / f"{self.node_id[:16]}-gpus-{gpus}.json")
        self._server: ServerProcess | None = None
        self._port: PortLease | None = None
        self._lock = threading.Lock()
        leftover = self.pid_file.kill_leftover()
        if leftover:
            log.warning("slot %d rank %d: killed server processes %s left behind", slot, node_rank, leftover)

    def ready(self) -> dict[str, Any]:
        """Where this rank runs (the driver shows it)."""
        return {"node_host": self.node_host, "node_id": self.node_id, "gpus": self.gpu_ids}

    def start(self, payload: str, attempt: int, dist_init_addr: str) -> dict[str, Any]:
        """Launch this rank of the job's server (preflight first); its argv, or the failure as a dict."""
        job = JobSpec.model_validate_json(payload)
        try:
            self.pid_file.kill_leftover()
            if self.gpu_ids:
                check_gpus_idle(self.gpu_ids)
            draft_path = (
                str(drafter_conversion(job.drafter, job.model_path).path) if job.drafter is not None else None
            )
            args = job.launch_args(draft_path) + multinode.rank_args(
                job.nodes, self.node_rank, dist_init_addr
            )
            config = ServerConfig(
                engine=job.engine,
                python=python_for(job.engine, job.sglang_python),
                args=tuple(args),
                env=tuple(sorted({**dict(job.env), "SPECSWEEP_JOB_ID": job.job_id}.items())),
            )
            port = reserve_port(config.host)  # SGLang takes --port on every rank; only rank 0 binds it
            try:
                server = start_server(
                    config, port.port, rank_log(self.out, job.job_id, attempt, self.node_rank)
                )
            except BaseException:
                port.release()
                raise
        except ServerFailure as err:
            return _failure_dict(err)
        except GpusBusy as err:
            return {"error_class": str(ErrorClass.GPUS_BUSY), "message": str(err), "log_tail": None}
        with self._lock:
            self._server, self._port = server, port
        self.pid_file.record(server, job.job_id)
        return {"argv": server.argv, "node_host": self.node_host}

    def poll(self) -> dict[str, Any] | None:
        """None while this rank's server runs; else how it ended (class from its log, as for rank 0)."""
        with self._lock:
            server = self._server
        if server is None:
            return {"error_class": str(ErrorClass.CRASH), "message": "no server running", "log_tail": None}
        returncode = server.poll()
        if returncode is None:
            return None
        tail = server.log_tail()
        error_class, evidence = classify_exit(tail, returncode, server.config.python)
        message = f"node rank {self.node_rank} exited with code {returncode}: {evidence}"
        return {"error_class": str(error_class), "message": message, "log_tail": tail}

    def stop(self, grace_s: float) -> dict[str, Any] | None:
        """Stop this rank's server and release its port; the failure (stop_failed) as a dict, or None."""
        with self._lock:
            server, port = self._server, self._port
            self._server = self._port = None
        try:
            if server is not None:
                server.stop(grace_s)
        except ServerFailure as err:
            return _failure_dict(err)
        finally:
            if port is not None:
                port.release()
            self.pid_file.clear()
        return None


def _call(ref: Any, timeout_s: float) -> Any:
    """``ray.get`` of a rank worker's answer; a worker (or node) that is gone or silent is node_lost."""
    import ray
    from ray.exceptions import GetTimeoutError, RayActorError

    try:
        return ray.get(ref, timeout=timeout_s)
    except (RayActorError, GetTimeoutError) as err:
        raise ServerFailure(ErrorClass.NODE_LOST, f"{type(err).__name__}: {err}"[:500]) from None


class RankGroup:
    """The non-zero ranks of one attempt: started together, checked together, always stopped together."""

    def __init__(self, workers: Sequence[Any]) -> None:
        self.workers = list(workers)  # ray actor handles of RankWorker, node rank i + 1
        self._started: list[Any] = []

    def start(self, payload: str, attempt: int, dist_init_addr: str) -> None:
        """Start every rank (concurrently); the first failure ends them all (raises ServerFailure)."""
        refs = [w.start.remote(payload, attempt, dist_init_addr) for w in self.workers]
        self._started = list(self.workers)
        for rank, ref in enumerate(refs, start=1):
            answer = _call(ref, RANK_CALL_S)
            if "error_class" in answer:
                raise ServerFailure(
                    ErrorClass(answer["error_class"]),
                    f"node rank {rank} did not start: {answer['message']}",
                    answer["log_tail"],
                )

    def check(self) -> None:
        """Raise the ServerFailure of a rank that is no longer running (the first, by rank)."""
        ended = self.first_exit()
        if ended is not None:
            raise ServerFailure(ended.error_class, ended.message, ended.log_tail)

    def first_exit(self) -> RankExit | None:
        """The first rank whose process exited or whose worker is gone, or None while all run."""
        for rank, worker in enumerate(self._started, start=1):
            try:
                answer = _call(worker.poll.remote(), RANK_CALL_S)
            except ServerFailure as err:
                return RankExit(
                    rank, err.error_class, f"node rank {rank}'s worker is gone: {err.message}", None
                )
            if answer is not None:
                return RankExit(
                    rank, ErrorClass(answer["error_class"]), answer["message"], answer["log_tail"]
                )
        return None

    def stop(self, grace_s: float) -> None:
        """Stop every started rank (concurrently); a rank that survives SIGKILL raises stop_failed after
        all were asked. A rank whose worker is gone is left to its node (gone too) or its next worker."""
        refs = [(rank, w.stop.remote(grace_s)) for rank, w in enumerate(self._started, start=1)]
        self._started = []
        failures = []
        for rank, ref in refs:
            try:
                answer = _call(ref, grace_s + RANK_STOP_MARGIN_S)
            except ServerFailure as err:
                log.warning("node rank %d not stopped by its worker: %s", rank, err.message)
                continue
            if answer is not None:
                failures.append(f"node rank {rank}: {answer['message']}")
        if failures:
            raise ServerFailure(ErrorClass.STOP_FAILED, "; ".join(failures))
