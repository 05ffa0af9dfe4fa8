"""The launcher: argv-only servers in their own session that die with their parent, classified exits,
and a stop that leaves no process of the group behind. Runs the simulated server (no Ray)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from workers.convert.fixtures import TINY, write_target_config
from workers.node.launcher import (
    PidFile,
    ServerConfig,
    ServerFailure,
    classify_exit,
    group_members,
    start_server,
    wait_healthy,
)
from workers.node.preflight import pick_free_port

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_target_config(tmp_path_factory.mktemp("target"), TINY))


def sim(target: str, *extra: str, env: dict[str, str] | None = None) -> ServerConfig:
    return ServerConfig(
        engine="sim",
        python=sys.executable,
        args=("--model-path", target, *extra),
        env=tuple((env or {}).items()),
    )


def test_launcher_starts_healthy_server_in_own_session_when_args_are_valid(
    target: str, tmp_path: Path
) -> None:
    """The server is a direct child, leader of its own session, logging to the given file; stop()
    leaves no process of its group."""
    server = start_server(sim(target), pick_free_port("127.0.0.1"), tmp_path / "server.log")
    try:
        assert wait_healthy(server, timeout_s=60) > 0
        assert os.getsid(server.popen.pid) == server.popen.pid
        assert psutil.Process(server.popen.pid).ppid() == os.getpid()
        assert server.argv[1:3] == ["-m", "workers.sim"] and server.argv[-4:-2] == [
            "--host",
            "127.0.0.1",
        ]
    finally:
        server.stop(grace_s=5)
    assert group_members(server.pgid) == []
    assert (tmp_path / "server.log").read_text()


def test_launcher_times_out_and_kills_group_when_server_hangs_before_ready(
    target: str, tmp_path: Path
) -> None:
    """/health never 200: startup_timeout; after stop() no process of the server's group is left."""
    config = sim(target, env={"SPECSWEEP_SIM_FAULT": "hang_before_ready"})
    server = start_server(config, pick_free_port("127.0.0.1"), tmp_path / "server.log")
    try:
        with pytest.raises(ServerFailure) as caught:
            wait_healthy(server, timeout_s=3)
        assert caught.value.error_class == "startup_timeout"
        assert group_members(server.pgid) != []
    finally:
        server.stop(grace_s=2)
    assert group_members(server.pgid) == []


@pytest.mark.parametrize(
    ("extra", "env", "error_class", "evidence"),
    [
        (("--bogus-flag", "1"), {}, "bad_args", "--bogus-flag"),
        ((), {"SPECSWEEP_SIM_FAULT": "oom"}, "cuda_oom", "CUDA out of memory"),
        ((), {"SPECSWEEP_SIM_FAULT": "nccl"}, "nccl_error", "ncclSystemError"),
        (
            (
                "--speculative-algorithm",
                "NOPE",
                "--speculative-num-steps",
                "1",
                "--speculative-eagle-topk",
                "1",
                "--speculative-num-draft-tokens",
                "2",
            ),
            {},
            "resolve_error",
            "Unknown speculative algorithm",
        ),
        ((), {"SPECSWEEP_SIM_FAULT": "assert"}, "crash", "AssertionError"),
    ],
)
def test_launcher_classifies_exit_from_log_when_server_dies_at_startup(
    target: str, tmp_path: Path, extra: tuple[str, ...], env: dict[str, str], error_class: str, evidence: str
) -> None:
    """An exit before /health is classified from SGLang's own log text, with the line that shows it."""
    server = start_server(sim(target, *extra, env=env), pick_free_port("127.0.0.1"), tmp_path / "server.log")
    try:
        with pytest.raises(ServerFailure) as caught:
            wait_healthy(server, timeout_s=60)
    finally:
        server.stop(grace_s=2)
    assert caught.value.error_class == error_class
    assert evidence in caught.value.message


def test_launcher_classifies_unknown_exit_as_crash_when_log_says_nothing() -> None:
    """No known pattern: crash, with the last line as evidence; exit 2 without usage is not bad_args."""
    assert classify_exit("starting\nsegfault somewhere", -11) == ("crash", "segfault somewhere")
    assert classify_exit("error: argument --x: bad", 1)[0] == "crash"


PARENT = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from workers.node.launcher import ServerConfig, start_server
    config = ServerConfig(engine="sim", python=sys.executable, args=("--model-path", sys.argv[1]))
    server = start_server(config, int(sys.argv[2]), Path(sys.argv[3]))
    print(server.popen.pid, flush=True)
    time.sleep(600)
    """
)


def test_launcher_server_dies_with_parent_when_parent_is_sigkilled(target: str, tmp_path: Path) -> None:
    """PR_SET_PDEATHSIG from the spawner thread: SIGKILL the process that launched the server (as when
    a Ray worker dies) and the server, in its own session, goes too."""
    parent = subprocess.Popen(
        [sys.executable, "-c", PARENT, target, str(pick_free_port("127.0.0.1")), str(tmp_path / "s.log")],
        cwd=REPO,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert parent.stdout is not None
        server_pid = int(parent.stdout.readline())
        assert psutil.pid_exists(server_pid)
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and group_members(server_pid):
        time.sleep(0.05)
    assert group_members(server_pid) == []


def test_pid_file_kills_group_left_behind_when_next_worker_starts(target: str, tmp_path: Path) -> None:
    """A server recorded in the node-local pid file and still running is killed by kill_leftover()."""
    server = start_server(sim(target), pick_free_port("127.0.0.1"), tmp_path / "server.log")
    pid_file = PidFile(tmp_path / "gpus-0-7.json")
    try:
        pid_file.record(server, "job1")
        assert pid_file.kill_leftover() == [server.popen.pid]
        assert group_members(server.pgid) == []
        assert not pid_file.path.exists()
        assert pid_file.kill_leftover() == []  # nothing left the second time
    finally:
        server.stop(grace_s=2)


def test_sglang_command_names_sglang_when_engine_is_sim() -> None:
    """A simulated server's argv is reported as the SGLang launch it stands for (same arguments)."""
    from workers.node.launcher import sglang_command

    sim = ("/venv/bin/python", "-m", "workers.sim", "--tp-size", "8", "--port", "30000")
    assert sglang_command(sim, "/opt/sglang/bin/python") == (
        "/opt/sglang/bin/python", "-m", "sglang.launch_server", "--tp-size", "8", "--port", "30000",
    )  # fmt: skip
    real = ("/opt/sglang/bin/python", "-m", "sglang.launch_server", "--tp-size", "8")
    assert sglang_command(real, None) == real
