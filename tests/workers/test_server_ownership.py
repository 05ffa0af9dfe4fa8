"""The harness measures only the server it launched: ports are reserved per node so two slots never get
one, and a 200 from ``/health`` is believed only when the launch's process group holds the port and the
answer carries the launch's tag. Runs the simulated server (its bind delay stands for SGLang's weight
loading, before which real SGLang has not bound its port) and SGLang's own resolver; no Ray."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from specsweep.error_classes import ErrorClass
from workers.convert.fixtures import TINY, write_target_config
from workers.node.launcher import (
    ServerConfig,
    ServerFailure,
    check_owner,
    classify_exit,
    http_get,
    kill_group,
    server_info_object,
    start_server,
    wait_healthy,
)
from workers.node.ports import Listener, host_addresses, reserve_port, shares_address, try_reserve
from workers.node.preflight import pick_free_port
from workers.sglang import SGLangResolver, api

REPO = Path(__file__).resolve().parents[2]
LOADING = {"SPECSWEEP_SIM_BIND_DELAY_S": "60"}  # our server is still "loading the weights": port unbound


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> str:
    return str(write_target_config(tmp_path_factory.mktemp("target"), TINY))


def sim(target: str, env: dict[str, str] | None = None) -> ServerConfig:
    return ServerConfig(
        engine="sim", python=sys.executable, args=("--model-path", target), env=tuple((env or {}).items())
    )


def _popen_group(
    argv: list[str], env: dict[str, str] | None = None, **kwargs: object
) -> subprocess.Popen[bytes]:
    """A process in its own session (an unrelated one: not the launch's group)."""
    full_env = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
    return subprocess.Popen(argv, env=full_env, start_new_session=True, **kwargs)  # type: ignore[call-overload]


def _kill_group(proc: subprocess.Popen[bytes]) -> None:
    kill_group(proc.pid, signal.SIGKILL)
    proc.wait(timeout=10)


def _wait_listening(port: int, path: str = "/", timeout_s: float = 30.0, address: str = "127.0.0.1") -> None:
    deadline = time.monotonic() + timeout_s
    while http_get(f"http://{address}:{port}{path}", timeout_s=1.0)[0] == 0:
        assert time.monotonic() < deadline, f"nothing answers on port {port}"
        time.sleep(0.05)


@contextlib.contextmanager
def _http_server(address: str, port: int, folder: Path) -> Iterator[int]:
    """An unrelated HTTP server (Python's http.server) answering on ``address``:``port``: its pid."""
    proc = _popen_group(
        [sys.executable, "-m", "http.server", "--bind", address, str(port)],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(port, address=address)
        yield proc.pid
    finally:
        _kill_group(proc)


@pytest.fixture
def unrelated_http(tmp_path: Path) -> Iterator[tuple[int, int]]:
    """An unrelated HTTP server listening on a free port of 127.0.0.1: (port, pid)."""
    port = pick_free_port("127.0.0.1")
    with _http_server("127.0.0.1", port, tmp_path) as pid:
        yield port, pid


HOLDER = textwrap.dedent(
    """
    import json, sys
    from pathlib import Path
    from workers.node.ports import reserve_port
    leases = [reserve_port("127.0.0.1", Path(sys.argv[1])) for _ in range(int(sys.argv[2]))]
    print(json.dumps([lease.port for lease in leases]), flush=True)
    sys.stdin.read()  # hold every reservation until the test closes stdin
    """
)


def test_reserve_port_never_hands_one_port_to_two_slots_when_processes_reserve_at_once(
    tmp_path: Path,
) -> None:
    """Four worker processes each reserve 150 ports and hold them (no server has bound any): all 600 are
    distinct, a held port cannot be reserved again, and a reservation dies with its process. (Free ports
    picked without reserving repeat: 3 repeats in 400 picks on this machine's 28k-port range.)"""
    locks = tmp_path / "ports"
    holders = [
        _popen_group(
            [sys.executable, "-c", HOLDER, str(locks), "150"], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        for _ in range(4)
    ]
    try:
        held = [json.loads(proc.stdout.readline()) for proc in holders]  # type: ignore[union-attr]
        ports = [port for group in held for port in group]
        assert len(ports) == 600 and len(set(ports)) == 600
        assert try_reserve(held[0][0], locks) is None
        _kill_group(holders[0])  # SIGKILL: no release runs, the kernel drops the lock
        lease = try_reserve(held[0][0], locks)
        assert lease is not None
        lease.release()
        assert not (locks / f"{held[0][0]}.lock").exists()
    finally:
        for proc in holders:
            _kill_group(proc)


def test_check_owner_names_the_process_when_an_unrelated_process_holds_the_port(
    target: str, tmp_path: Path, unrelated_http: tuple[int, int]
) -> None:
    """A socket on the launch's port held by a process outside the launch's group: port_taken naming
    that process's pid, never a pass (and never config_mismatch)."""
    port, intruder = unrelated_http
    server = start_server(sim(target, LOADING), port, tmp_path / "server.log")
    try:
        with pytest.raises(ServerFailure) as caught:
            check_owner(server)
    finally:
        server.stop(grace_s=5)
    assert caught.value.error_class == ErrorClass.PORT_TAKEN
    assert (
        f"pid {intruder}" in caught.value.message and f"outside group {server.pgid}" in caught.value.message
    )


def test_wait_healthy_passes_when_another_process_listens_on_the_port_number_at_another_address(
    target: str, tmp_path: Path
) -> None:
    """A socket of an unrelated process on the same port number but another address (127.0.0.2, as a Ray
    process on the node's IP) cannot receive a connection to our server's 127.0.0.1: the launch is ours
    and healthy, not port_taken (the check once failed a suite run on a Ray worker's port this way)."""
    port = pick_free_port("127.0.0.1")
    with _http_server("127.0.0.2", port, tmp_path):
        server = start_server(sim(target), port, tmp_path / "server.log")
        try:
            assert wait_healthy(server, timeout_s=60) > 0
        finally:
            server.stop(grace_s=5)


@pytest.mark.parametrize(
    ("address", "host", "shared"),
    [
        ("127.0.0.1", "127.0.0.1", True),
        ("127.0.0.2", "127.0.0.1", False),
        ("192.0.2.2", "127.0.0.1", False),
        ("0.0.0.0", "127.0.0.1", True),  # every address: a client of 127.0.0.1 may reach it
        ("::", "127.0.0.1", True),
        ("::ffff:127.0.0.1", "127.0.0.1", True),  # IPv4 through an IPv6 socket
        ("192.0.2.2", "0.0.0.0", True),  # our server on every address meets every listener
        ("127.0.0.1", "localhost", True),
        ("127.0.0.2", "localhost", False),
        ("192.0.2.2", "no-such-host.invalid", True),  # cannot tell: strict
    ],
)
def test_shares_address_says_whether_a_client_of_the_host_can_reach_the_listener(
    address: str, host: str, shared: bool
) -> None:
    assert shares_address(Listener(address, 1), host_addresses(host)) is shared


def test_wait_healthy_fails_as_port_taken_when_a_copy_of_the_launch_answers_before_it_binds(
    target: str, tmp_path: Path
) -> None:
    """Our server still loading (port unbound); an exact copy of its launch (same arguments, same tag,
    another seed) started by someone else binds the port and answers 200: wait_healthy fails as
    port_taken naming the copy, although its /server_info matches ours field for field but the seed."""
    lease = reserve_port("127.0.0.1", tmp_path / "ports")
    server = start_server(sim(target, LOADING), lease.port, tmp_path / "server.log")
    copy = _popen_group(
        [sys.executable, "-m", "workers.sim", *server.argv[3:]],
        env={"SPECSWEEP_SIM_SEED": "999"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        _wait_listening(lease.port, api.HEALTH)
        with pytest.raises(ServerFailure) as caught:
            wait_healthy(server, timeout_s=30)
        status, body = http_get(server.url + api.SERVER_INFO, timeout_s=5)
    finally:
        server.stop(grace_s=5)
        _kill_group(copy)
        lease.release()
    assert caught.value.error_class == ErrorClass.PORT_TAKEN
    assert f"pid {copy.pid}" in caught.value.message
    assert status == 200 and json.loads(body)[api.LAUNCH_TAG] == server.launch_tag  # the tag alone can't tell


def test_sim_and_sglang_report_the_launch_tag_when_launched_with_it(
    target: str, tmp_path: Path, sglang_python: str
) -> None:
    """The launch tag is echoed the same way by both: the simulator's /server_info (and /model_info) and
    SGLang 0.5.23's resolved_dict(), which is what its /server_info returns, carry the value passed."""
    server = start_server(sim(target), pick_free_port("127.0.0.1"), tmp_path / "server.log")
    try:
        wait_healthy(server, timeout_s=60)
        info = json.loads(http_get(server.url + api.SERVER_INFO, timeout_s=5)[1])
        model = json.loads(http_get(server.url + api.MODEL_INFO, timeout_s=5)[1])
    finally:
        server.stop(grace_s=5)
    assert info[api.LAUNCH_TAG] == model[api.LAUNCH_TAG] == server.launch_tag
    with SGLangResolver(sglang_python) as resolver:
        result = resolver.resolve(["--model-path", target, api.LAUNCH_TAG_FLAG, server.launch_tag])
    assert result.resolved is not None and result.resolved[api.LAUNCH_TAG] == server.launch_tag


def test_launcher_classifies_exit_as_port_taken_when_the_port_was_bound_by_another() -> None:
    """The server that loaded and then could not bind (uvicorn's line; the multi-tokenizer probe's
    errno text) is port_taken, a transient failure, not a crash."""
    uvicorn = "ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', 30000): address already in use"
    probe = "OSError: [Errno 98] Address already in use"
    assert classify_exit(f"Load weight end.\n{uvicorn}\n", 1) == (ErrorClass.PORT_TAKEN, uvicorn)
    assert classify_exit(f"Traceback (most recent call last):\n{probe}\n", 1) == (
        ErrorClass.PORT_TAKEN,
        probe,
    )


def test_wait_healthy_fails_as_port_taken_when_the_server_cannot_bind_its_port(
    target: str, tmp_path: Path, unrelated_http: tuple[int, int]
) -> None:
    """A port bound by another process when the server comes to bind it: the server exits with the
    bind error, and the launch fails as port_taken quoting it (retried on another port), not as crash."""
    port, _ = unrelated_http
    server = start_server(sim(target), port, tmp_path / "server.log")
    try:
        with pytest.raises(ServerFailure) as caught:
            wait_healthy(server, timeout_s=60)
    finally:
        server.stop(grace_s=5)
    assert caught.value.error_class == ErrorClass.PORT_TAKEN
    assert "address already in use" in caught.value.message


@pytest.mark.parametrize(
    "body",
    [
        b'{"weight_version": ' + b"9" * 5000 + b"}",
        b"[" * 100_000,
        b"[1, 2]",
        b"<html>busy</html>",
        b"\xff\xfe",
    ],
    ids=["5000-digit integer", "deep nesting", "not an object", "not JSON", "not text"],
)
def test_server_info_object_is_none_when_a_hostile_body_is_read(body: bytes) -> None:
    """A ``/server_info`` body that is not SGLang's JSON object reads as no answer (the attempt fails as
    classified, port_taken or health_lost), never a ValueError or RecursionError out of the worker."""
    assert server_info_object(body) is None
    assert server_info_object(b'{"weight_version": "specsweep-1"}') == {"weight_version": "specsweep-1"}
