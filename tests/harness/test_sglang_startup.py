"""A sweep with ``engine: sglang`` runs the real SGLang server, not the simulator: on a node whose SGLang Python
cannot serve (here .venv-sglang, SGLang 0.5.23 installed without its GPU dependencies, on a machine without a
GPU) the job ends as a classified start-up failure that quotes SGLang and says what the node lacks.

Driven as ``specsweep run`` drives it: the driver, one embedded Ray node, a node worker that converts the
drafter and launches ``<sglang_python> -m sglang.launch_server``. The embedded Ray declares GPUs (as a GPU
node's raylet reports them) so the slot is placed on this GPU-less machine; the sweep's own start-up of Ray
and SGLang's import and resolution (7-20 s here) are seconds to tens of seconds, so the whole path is used
rather than the worker's single-attempt entry.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pyarrow.parquet as pq
import pytest

from analysis import layout
from harness.driver import connect_ray
from harness.queue import open_read_only, read_attempts
from harness.spec import parse_spec
from tests.harness.sim_sweeps import run_unchecked
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config
from workers.node.launcher import group_members

pytestmark = [pytest.mark.ray, pytest.mark.no_gpu]

STARTUP_S = 120.0
NO_ACCELERATOR = (
    "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available."
)


class ServerWatch:
    """Every live process whose command line runs ``sglang.launch_server`` on ``model_path``, seen while the
    sweep runs (psutil every 0.1 s): proof that the real server started, and the processes to check after."""

    def __init__(self, model_path: str) -> None:
        self.model_path = model_path
        self.seen: dict[int, float] = {}  # pid -> create time (a reused pid is not the server)
        self.groups: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)

    def __enter__(self) -> ServerWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _loop(self) -> None:
        while not self._stop.wait(0.1):
            for proc in psutil.process_iter(["pid", "cmdline", "create_time"]):
                cmdline = proc.info["cmdline"] or []
                if "sglang.launch_server" in cmdline and self.model_path in cmdline:
                    self.seen[proc.pid] = proc.info["create_time"]
                    try:
                        self.groups.add(os.getpgid(proc.pid))
                    except ProcessLookupError:
                        continue

    def alive(self) -> list[int]:
        """Seen server processes still running (not zombies)."""
        left = []
        for pid, created in self.seen.items():
            try:
                proc = psutil.Process(pid)
                if proc.create_time() == created and proc.status() != psutil.STATUS_ZOMBIE:
                    left.append(pid)
            except psutil.NoSuchProcess:
                continue
        return left


@pytest.fixture
def node_local(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Pid files and the drafter cache private to this test (set before Ray starts: the raylet inherits)."""
    monkeypatch.setenv("SPECSWEEP_PID_DIR", str(tmp_path / "pids"))
    monkeypatch.setenv("SPECSWEEP_DRAFTER_CACHE", str(tmp_path / "drafters"))
    yield tmp_path


def _spec_data(root: Path, sglang_python: str) -> dict[str, Any]:
    """One chain job (depth 3) of a converted speculators drafter on a tiny DeepSeek-V3-shaped target."""
    target = write_target_config(root / "target", TINY)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")
    return {
        "engine": "sglang",
        "sglang_python": sglang_python,
        "model_path": str(target),
        "drafter": {"path": str(drafter), "format": "speculators"},
        "base_args": ["--tp-size", "1"],
        "gpus_per_server": 1,
        "max_servers": 1,
        "speculative": {"chain_depths": [3]},
        "baseline": False,
        "load": {
            "concurrency": [1],
            "requests_per_level": 2,
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 8, "vocab_size": 256},
        },
        "retries": 0,
        "timeouts": {"startup_s": STARTUP_S, "level_s": 60, "stop_s": 5, "placement_s": 120},
        "output_dir": str(root / "out"),
    }


def test_sweep_fails_job_as_node_setup_quoting_sglang_when_node_python_lacks_a_gpu(
    node_local: Path, sglang_python: str
) -> None:
    """engine sglang on a node whose SGLang cannot find a GPU: the real ``sglang.launch_server`` runs and
    exits; the job fails once as node_setup (not resolve_error: the launch is valid), within the start-up
    limit, with SGLang's own error line, what the node's Python lacks and the fix; no server process is left."""
    data = _spec_data(node_local, sglang_python)
    spec = parse_spec(data)
    out = Path(spec.output_dir)
    # An embedded Ray that declares the slot's GPU, as `--ray-address local` does for the simulator: this
    # machine has none for Ray to detect, and SGLang, not Ray, must be what finds out.
    ray_local = connect_ray("local", spec.model_copy(update={"engine": "sim"}))
    try:
        with ServerWatch(spec.model_path) as watch:
            summary, log = run_unchecked(data)
    finally:
        ray_local.close()

    assert summary.counts == {"pending": 0, "leased": 0, "done": 0, "failed": 1}, log
    conn = open_read_only(out)
    try:
        (attempt,) = read_attempts(conn)
    finally:
        conn.close()
    assert attempt.error_class == "node_setup", attempt
    assert attempt.worker_s is not None and attempt.worker_s < STARTUP_S
    message = attempt.error_text or ""
    assert message.startswith("server exited with code 1 before it was healthy: " + NO_ACCELERATOR), message
    assert f"{sglang_python} lacks a GPU it can use" in message
    assert "install SGLang 0.5.23 with its GPU dependencies" in message and "sglang_python" in message

    (row,) = pq.read_table(next(out.glob("jobs/*/*/part-0.parquet"))).to_pylist()
    assert (row["status"], row["error_class"], row["error_message"]) == ("failed", "node_setup", message)
    assert row["sglang_argv"][:3] == [sglang_python, "-m", "sglang.launch_server"]
    assert "--speculative-draft-model-path" in row["sglang_argv"]
    server_log = layout.server_log(out, row["job_id"], attempt.attempt).read_text()
    assert "site-packages/sglang/srt/utils/common.py" in server_log and NO_ACCELERATOR in server_log

    assert watch.seen, "no sglang.launch_server process was seen running"
    assert watch.alive() == []
    assert all(group_members(pgid) == [] for pgid in watch.groups)
