"""The ``jobs`` row of an attempt: what was asked, what the server really ran, how it ended.

Built in one place for the worker (every attempt it runs) and the driver (a job whose node was lost
has no worker left to write it).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import Any

from analysis.schema import JobRecord
from specsweep.error_classes import ErrorClass
from workers.job import JobSpec
from workers.node.launcher import sglang_command
from workers.sglang import SpecParams


@dataclass(frozen=True, slots=True)
class AttemptFacts:
    """What an attempt learnt about its server (all None when it never came up)."""

    argv: tuple[str, ...] | None = None
    draft_model_path: str | None = None
    server_info: dict[str, Any] | None = None
    node_host: str | None = None
    started_unix_ns: int | None = None
    finished_unix_ns: int | None = None
    startup_s: float | None = None
    server_metrics_off: str | None = None  # why the server's /metrics was not sampled
    gpu_metrics_off: str | None = None  # why NVML was not sampled
    input_digests: dict[str, str] | None = None  # workers.node.inputs: what the attempt measured with


def job_record(
    job: JobSpec,
    *,
    attempt: int,
    error_class: ErrorClass | None,
    error_message: str | None,
    facts: AttemptFacts,
) -> JobRecord:
    """The jobs row for one attempt of ``job``; status follows from ``error_class``."""
    live = SpecParams.from_mapping(facts.server_info) if facts.server_info is not None else SpecParams()
    return JobRecord(
        sweep_id=job.sweep_id,
        job_id=job.job_id,
        status="failed" if error_class else "done",
        attempts=attempt,
        error_class=None if error_class is None else error_class.value,
        error_message=error_message,
        config_label=job.config_label,
        role=job.role,
        repeat_index=job.repeat_index,
        gpus=job.gpus,
        model_path=job.model_path,
        draft_model_path=facts.draft_model_path,
        requested_speculative_algorithm=job.requested.speculative_algorithm,
        requested_speculative_num_steps=job.requested.speculative_num_steps,
        requested_speculative_eagle_topk=job.requested.speculative_eagle_topk,
        requested_speculative_num_draft_tokens=job.requested.speculative_num_draft_tokens,
        requested_max_running_requests=job.requested.max_running_requests,
        effective_speculative_algorithm=live.speculative_algorithm,
        effective_speculative_num_steps=live.speculative_num_steps,
        effective_speculative_eagle_topk=live.speculative_eagle_topk,
        effective_speculative_num_draft_tokens=live.speculative_num_draft_tokens,
        effective_max_running_requests=live.max_running_requests,
        requested_points=job.requested_points,
        sglang_argv=sglang_command(facts.argv, job.sglang_python) if facts.argv else None,
        launch_command=shlex.join(sglang_command(facts.argv, job.sglang_python)) if facts.argv else None,
        server_info_json=json.dumps(facts.server_info, sort_keys=True)
        if facts.server_info is not None
        else None,
        node_host=facts.node_host,
        started_unix_ns=facts.started_unix_ns,
        finished_unix_ns=facts.finished_unix_ns,
        startup_s=facts.startup_s,
        server_metrics_off=facts.server_metrics_off,
        gpu_metrics_off=facts.gpu_metrics_off,
        input_digests=json.dumps(facts.input_digests, sort_keys=True)
        if facts.input_digests is not None
        else None,
        axes=json.dumps(dict(job.axes)) if job.axes else None,
        lossy_by_design=job.lossy_by_design(),
    )
