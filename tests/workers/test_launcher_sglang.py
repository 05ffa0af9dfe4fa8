"""The launcher against the real SGLang 0.5.23 (``.venv-sglang``: SGLang without its GPU dependencies, on a
machine without a GPU): its start-up failures are classified from what SGLang really prints, not from the
simulator's imitation of it.

Each case is checked twice against the same expectation: on the output recorded in
``tests/fixtures/sglang-0.5.23/`` (fast, in-process) and on a live ``python -m sglang.launch_server`` started
by the launcher, so a recording that no longer matches what SGLang prints fails here too.
"""

from __future__ import annotations

import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from workers.node.launcher import (
    ServerConfig,
    ServerFailure,
    classify_exit,
    group_members,
    read_log_tail,
    start_server,
    wait_healthy,
)
from workers.node.preflight import pick_free_port

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
RECORDED = FIXTURES / "sglang-0.5.23"
STARTUP_S = 120.0  # the start-up limit the live cases run under (each took 7-20 s on a shared 2-core box)
FIX = "point sglang_python at a Python that has them"


@dataclass(frozen=True)
class Case:
    """One way SGLang 0.5.23 fails to start here: its launch, the class, SGLang's own line, what is said."""

    recording: str  # file under tests/fixtures/sglang-0.5.23/
    args: tuple[str, ...]  # launch arguments (without --host/--port), relative to tests/fixtures
    returncode: int
    error_class: str
    sglang_line: str  # SGLang's (or Python's) own error line, quoted in the message
    says: tuple[str, ...] = ()  # what the message adds: what the Python lacks, the fix
    project_python: bool = False  # run with this project's Python (no SGLang) instead of .venv-sglang's


# The launch a sweep job builds for a chain config on the Kimi-shaped target (job.launch_args).
CHAIN = (
    "--tp-size", "8", "--model-path", "kimi-k2", "--speculative-algorithm", "EAGLE3",
    "--speculative-draft-model-path", "eagle3-draft", "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4",
)  # fmt: skip

CASES = [
    Case(
        "launch-no-accelerator.log",  # live only where no GPU is (the no_gpu mark in LIVE)
        CHAIN,
        1,
        "node_setup",
        "RuntimeError: No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available.",
        ("lacks a GPU it can use", FIX),
    ),
    Case(
        "launch-missing-module.log",
        ("--tp-size", "8", "--model-path", "kimi-k2", "--device", "cuda"),
        1,
        "node_setup",
        "ModuleNotFoundError: No module named 'uvicorn'",
        ("lacks the module 'uvicorn'", FIX),
    ),
    Case(
        "launch-no-sglang.log",
        ("--tp-size", "8", "--model-path", "kimi-k2"),
        1,
        "node_setup",
        "Error while finding module specification for 'sglang.launch_server' (ModuleNotFoundError: No "
        "module named 'sglang')",
        ("lacks SGLang itself", FIX),
        project_python=True,
    ),
    Case(
        "launch-bad-argument.log",
        ("--tp-size", "8", "--model-path", "kimi-k2", "--speculative-draft", "eagle3-draft"),
        2,
        "bad_args",
        "sglang serve: error: ambiguous option: --speculative-draft could match --speculative-draft-model-path",
    ),
]


def _config(case: Case, sglang_python: str) -> ServerConfig:
    fixture_args = {"kimi-k2", "eagle3-draft"}
    args = tuple(str(FIXTURES / a) if a in fixture_args else a for a in case.args)
    python = sys.executable if case.project_python else sglang_python
    return ServerConfig(engine="sglang", python=python, args=args)


def _check(case: Case, error_class: str, message: str) -> None:
    assert error_class == case.error_class, message
    assert case.sglang_line in message
    for said in case.says:
        assert said in message


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.recording.removesuffix(".log"))
def test_classify_exit_names_the_failure_and_fix_when_reading_recorded_sglang_output(case: Case) -> None:
    """SGLang 0.5.23's recorded start-up output is classified (node_setup for a Python that cannot serve on
    this node: no GPU, a missing module, no SGLang) with SGLang's own line, what the Python lacks, the fix."""
    error_class, evidence = classify_exit(
        read_log_tail(RECORDED / case.recording), case.returncode, "/opt/sglang/bin/python"
    )
    assert evidence is not None
    _check(case, error_class, evidence)
    if case.error_class == "node_setup":
        assert "/opt/sglang/bin/python lacks" in evidence


def test_classify_exit_says_the_node_lacks_a_driver_when_torch_finds_none() -> None:
    """torch's own CUDA initialisation without a driver (recorded from .venv-sglang's torch 2.14.1, as
    SGLang's scheduler would hit it with --device cuda) is node_setup, not a crash."""
    log = read_log_tail(RECORDED / "torch-cuda-init-no-driver.log")
    error_class, evidence = classify_exit(log, 1, "/opt/sglang/bin/python")
    assert error_class == "node_setup"
    assert evidence is not None and "Found no NVIDIA driver on your system" in evidence
    assert "lacks an NVIDIA driver" in evidence and FIX in evidence


@pytest.mark.parametrize(
    "line",
    [
        "RuntimeError: Not enough memory. Please try to increase --mem-fraction-static. Current value: "
        "mem_fraction_static=0.88",
        "ValueError: Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static=0.88. "
        "Raise --mem-fraction-static above 0.912 (minimum viable = 1 - available/pre = 0.9115). If using "
        "speculative decoding, draft weights are now counted.",
    ],
)
def test_classify_exit_says_cuda_oom_when_sglang_finds_no_room_for_the_kv_cache(line: str) -> None:
    """SGLang 0.5.23's own start-up memory errors (text from model_executor/pool_configurator.py and
    mem_cache/kv_cache_configurator.py; a GPU is needed to see them) are cuda_oom, final, not a crash that
    is retried; SGLang's advice is the evidence."""
    log = f"[2026-12-05 04:29:54] Load weight end.\nTraceback (most recent call last):\n  File x\n{line}\n"
    assert classify_exit(log, 1) == ("cuda_oom", line)


# On a GPU machine SGLang finds the accelerator, so the no-accelerator launch is checked live only without one.
LIVE = [
    pytest.param(case, marks=pytest.mark.no_gpu) if "accelerator" in case.recording else case
    for case in CASES
]


@pytest.mark.parametrize("case", LIVE, ids=lambda c: c.recording.removesuffix(".log"))
def test_launcher_classifies_real_sglang_exit_as_recorded_when_launched_live(
    case: Case, sglang_python: str, tmp_path: Path
) -> None:
    """The real ``python -m sglang.launch_server`` started by the launcher fails on this GPU-less machine
    within the start-up limit, classified as its recording is (same class, same SGLang line), and no
    process of its group is left."""
    config = _config(case, sglang_python)
    server = start_server(config, pick_free_port("127.0.0.1"), tmp_path / "server.log")
    started = time.monotonic()
    try:
        with pytest.raises(ServerFailure) as caught:
            wait_healthy(server, timeout_s=STARTUP_S)
    finally:
        server.stop(grace_s=5)
    assert time.monotonic() - started < STARTUP_S
    assert server.argv[1:3] == ["-m", "sglang.launch_server"]
    assert server.popen.returncode == case.returncode
    assert f"server exited with code {case.returncode} before it was healthy" in caught.value.message
    _check(case, caught.value.error_class, caught.value.message)
    if case.error_class == "node_setup":
        assert f"{config.python} lacks" in caught.value.message
    assert group_members(server.pgid) == []


def test_start_server_fails_as_node_setup_when_sglang_python_does_not_exist(tmp_path: Path) -> None:
    """An sglang_python the node does not have is node_setup naming it and the fix (the worker would
    otherwise raise FileNotFoundError and the attempt end as an unexplained worker_error)."""
    config = ServerConfig(engine="sglang", python=str(tmp_path / "no-such-python"), args=())
    with pytest.raises(ServerFailure) as caught:
        start_server(config, pick_free_port("127.0.0.1"), tmp_path / "server.log")
    assert caught.value.error_class == "node_setup"
    assert caught.value.message.startswith(
        f"cannot run {config.python} on this node: No such file or directory"
    )
    assert FIX in caught.value.message
