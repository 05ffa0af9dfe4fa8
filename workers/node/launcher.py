"""Start, watch and stop one inference server without ever leaking it (or its GPUs).

An SGLang server is a main process plus scheduler / tensor-parallel workers (grandchildren of whoever
started it). If the node worker dies, those must not keep 8 GPUs busy. So the server is started as a
direct child, from argv (no shell), in its own session (one ``killpg`` reaches every process of it) and
with a parent-death signal (PR_SET_PDEATHSIG: the kernel SIGKILLs it when its parent goes). The
parent-death signal fires when the forking *thread* exits, so every server is forked from one
long-lived spawner thread. The process group is recorded in a node-local pid file, so the next worker
on the same GPUs can kill whatever a crashed one left behind.

Exit before ``/health`` answers is classified from the log (bad_args, resolve_error, cuda_oom,
nccl_error, port_taken, node_setup, crash); no answer in time is startup_timeout.

A 200 from ``/health`` is only believed from the server this launcher started. Each launch carries a
unique tag SGLang echoes in ``/server_info`` (``api.LAUNCH_TAG_FLAG``), and the TCP socket listening on
the port must belong to the launch's process group (``workers.node.ports``); otherwise another process
answers on the port (an orphan server, a clash) and the launch fails as port_taken, to be retried on
another port, never measured and never a config_mismatch.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import queue
import re
import secrets
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep.documents import load_json
from specsweep.error_classes import ErrorClass
from workers.job import Engine
from workers.sglang import api, failures

log = logging.getLogger(__name__)

ENGINE_MODULES: dict[Engine, str] = {"sglang": "sglang.launch_server", "sim": "workers.sim"}

# Failure classes read from a server log, checked in order; the first whose patterns match wins:
# SGLang's runtime failures (workers.sglang.failures), then the two argument stages: argparse's usage
# errors (exit 2) and a traceback through SGLang's argument resolution.
LOG_CLASSES: tuple[tuple[ErrorClass, tuple[str, ...]], ...] = (
    *failures.LOG_CLASSES,
    (ErrorClass.BAD_ARGS, ("error: unrecognized arguments", "error: ambiguous option", "error: argument ")),
    (ErrorClass.RESOLVE_ERROR, ("server_args.py", "arg_groups/", "resolve_once")),
)
LOG_TAIL_LINES = 40
_EXCEPTION_LINE = re.compile(r"^[\w.]*(Error|Exception)\b")  # "torch.OutOfMemoryError: ...", "AssertionError"
_PR_SET_PDEATHSIG = 1


@dataclass(frozen=True, slots=True)
class ServerConfig:
    """One server to start: which engine, with which interpreter, arguments and environment."""

    engine: Engine
    python: str  # interpreter that runs the engine module
    args: tuple[str, ...]  # SGLang launch arguments, without --host / --port
    env: tuple[tuple[str, str], ...] = ()  # extra environment for the server process
    host: str = "127.0.0.1"

    def argv(self, port: int, launch_tag: str) -> list[str]:
        """The exact argv of the server process (the tag last but for the address, so it wins)."""
        return [
            self.python,
            "-m",
            ENGINE_MODULES[self.engine],
            *self.args,
            api.LAUNCH_TAG_FLAG,
            launch_tag,
            "--host",
            self.host,
            "--port",
            str(port),
        ]


def sglang_command(argv: tuple[str, ...] | list[str], sglang_python: str | None) -> tuple[str, ...]:
    """The SGLang launch a process argv stands for: the simulator takes SGLang's exact arguments, so a
    simulated server's command becomes ``<sglang_python> -m sglang.launch_server <same args>``."""
    if len(argv) >= 3 and tuple(argv[1:3]) == ("-m", ENGINE_MODULES["sim"]):
        return (sglang_python or "python3", "-m", ENGINE_MODULES["sglang"], *argv[3:])
    return tuple(argv)


class ServerFailure(Exception):
    """The server did not come up, or went away: ``error_class`` says how, ``log_tail`` shows why."""

    def __init__(self, error_class: ErrorClass, message: str, log_tail: str | None = None) -> None:
        super().__init__(f"{error_class}: {message}")
        self.error_class = error_class
        self.message = message
        self.log_tail = log_tail


# --- forking ------------------------------------------------------------------------------------------

_LIBC = ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent_pid: int) -> Callable[[], None]:
    """preexec_fn: ask the kernel to SIGKILL the child when its parent (thread) goes away."""

    def preexec() -> None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent_pid:  # the parent died before prctl took effect
            os._exit(1)

    return preexec


class _Spawner:
    """One long-lived thread that forks every server, so the parent-death signal is tied to a thread
    that lives as long as the worker process (a pool thread could exit and kill a healthy server)."""

    def __init__(self) -> None:
        self._requests: queue.Queue[
            tuple[Future[subprocess.Popen[bytes]], Callable[[], subprocess.Popen[bytes]]]
        ]
        self._requests = queue.Queue()
        threading.Thread(target=self._loop, name="specsweep-spawner", daemon=True).start()

    def _loop(self) -> None:
        while True:
            future, start = self._requests.get()
            try:
                future.set_result(start())
            except BaseException as err:  # handed to the caller
                future.set_exception(err)

    def spawn(self, start: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
        future: Future[subprocess.Popen[bytes]] = Future()
        self._requests.put((future, start))
        return future.result()


_SPAWNER_LOCK = threading.Lock()
_SPAWNER: _Spawner | None = None


def _spawner() -> _Spawner:
    global _SPAWNER
    with _SPAWNER_LOCK:
        if _SPAWNER is None:
            _SPAWNER = _Spawner()
        return _SPAWNER


# --- the server process ---------------------------------------------------------------------------------


def group_members(pgid: int) -> list[int]:
    """Live (non-zombie) processes of process group ``pgid``."""
    import psutil

    members = []
    for proc in psutil.process_iter(["pid", "status"]):
        try:
            if os.getpgid(proc.pid) == pgid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


def kill_group(pgid: int, sig: int) -> None:
    """Signal a whole process group; a group already gone is fine."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, sig)


@dataclass
class ServerProcess:
    """A running server: its process (the group leader), port and log."""

    config: ServerConfig
    popen: subprocess.Popen[bytes]
    port: int
    log_path: Path
    argv: list[str]
    started: float  # time.monotonic() at launch
    launch_tag: str  # unique to this launch; the server reports it as /server_info's api.LAUNCH_TAG

    @property
    def pgid(self) -> int:
        return self.popen.pid  # leader of its own session

    @property
    def url(self) -> str:
        return f"http://{self.config.host}:{self.port}"

    def poll(self) -> int | None:
        return self.popen.poll()

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return read_log_tail(self.log_path, lines)

    def log_text(self) -> str:
        """The whole server log so far."""
        return self.log_path.read_text(encoding="utf-8", errors="replace")

    def stop(self, grace_s: float) -> None:
        """SIGTERM the group, wait up to ``grace_s``, SIGKILL what is left, and confirm the group is gone."""
        kill_group(self.pgid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline:
            self.popen.poll()
            if not group_members(self.pgid):
                break
            time.sleep(0.05)
        kill_group(self.pgid, signal.SIGKILL)
        self.popen.wait()
        deadline = time.monotonic() + 10.0
        while (left := group_members(self.pgid)) and time.monotonic() < deadline:
            time.sleep(0.05)
        if left:
            raise ServerFailure(
                ErrorClass.STOP_FAILED, f"processes {left} of server group {self.pgid} survived SIGKILL"
            )


def start_server(config: ServerConfig, port: int, log_path: Path) -> ServerProcess:
    """Start the server as a direct child in its own session, dying with this process; log to a file.
    An interpreter the node cannot run (missing, not executable) is node_setup, not a worker error."""
    launch_tag = f"specsweep-{secrets.token_hex(8)}"
    argv = config.argv(port, launch_tag)
    env = {**os.environ, **dict(config.env)}
    if config.engine == "sim":  # the simulator is part of this package: make it importable from anywhere
        package_root = str(Path(__file__).resolve().parent.parent)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH")) if p)
    log_path.parent.mkdir(parents=True, exist_ok=True)

    def start() -> subprocess.Popen[bytes]:
        with open(log_path, "ab") as log_file:
            return subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,
                preexec_fn=_die_with_parent(os.getpid()),
            )

    try:
        popen = _spawner().spawn(start)
    except OSError as err:
        if err.filename != config.python:  # the log file, not the interpreter
            raise
        raise ServerFailure(ErrorClass.NODE_SETUP, failures.python_unusable(config.python, err)) from None
    log.info("started server pid %d on port %d: %s", popen.pid, port, " ".join(argv))
    return ServerProcess(
        config=config,
        popen=popen,
        port=port,
        log_path=log_path,
        argv=argv,
        started=time.monotonic(),
        launch_tag=launch_tag,
    )


# --- health and classification ----------------------------------------------------------------------


def read_log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file (at most 64 KiB read)."""
    try:
        with open(path, "rb") as handle:
            handle.seek(0, os.SEEK_END)
            size = handle.tell()
            handle.seek(max(0, size - 65536))
            text = handle.read().decode("utf-8", errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def classify_exit(
    log_text: str, returncode: int, python: str = "the server's Python"
) -> tuple[ErrorClass, str | None]:
    """Failure class of a server that exited, from its log (SGLang's messages) and exit code, with
    the log line that shows it; for node_setup also what ``python`` lacks and the fix, since the
    sweep's arguments are not what is wrong."""
    lines = [line.strip() for line in log_text.splitlines() if line.strip()]
    exception = next((line for line in reversed(lines) if _EXCEPTION_LINE.match(line)), None)
    fallback = exception or (lines[-1] if lines else None)
    for error_class, patterns in LOG_CLASSES:
        if error_class == ErrorClass.BAD_ARGS and returncode != 2:
            continue
        for line in reversed(lines):
            if any(p in line for p in patterns):
                if error_class == ErrorClass.NODE_SETUP:
                    return error_class, failures.node_setup_evidence(line, python)
                # a resolution error matches on a traceback frame; the exception line says more
                return error_class, fallback if error_class == ErrorClass.RESOLVE_ERROR else line
    return ErrorClass.CRASH, fallback


def http_get(url: str, timeout_s: float) -> tuple[int, bytes]:
    """GET returning (status, body); connection problems are status 0."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def wait_healthy(
    server: ServerProcess, timeout_s: float, poll_s: float = 0.25, *, shared_port: bool = False
) -> float:
    """Wait until ``/health`` answers 200 while watching the process; returns seconds since launch.

    An exit raises ServerFailure classified from the log; no answer within ``timeout_s`` raises
    startup_timeout; a 200 from a process that is not this launch raises port_taken (``check_owner``),
    unless ``shared_port`` says several servers listen on the port on purpose (SO_REUSEPORT benchmarks).
    The caller stops the server."""
    deadline = server.started + timeout_s
    while True:
        returncode = server.poll()
        if returncode is not None:
            tail = server.log_tail()
            error_class, evidence = classify_exit(tail, returncode, server.config.python)
            message = f"server exited with code {returncode} before it was healthy"
            raise ServerFailure(error_class, f"{message}: {evidence}" if evidence else message, tail)
        status, _ = http_get(server.url + api.HEALTH, timeout_s=2.0)
        if status == 200:
            if not shared_port:
                check_owner(server)
            return time.monotonic() - server.started
        if time.monotonic() > deadline:
            raise ServerFailure(
                ErrorClass.STARTUP_TIMEOUT,
                f"/health not 200 within {timeout_s:g} s of launch",
                server.log_tail(),
            )
        time.sleep(poll_s)


# --- ownership: is the server on the port the one we launched? --------------------------------------------


def launch_tag_problem(server: ServerProcess, info: Mapping[str, object]) -> str | None:
    """Why a ``/server_info`` body is not this launch's (its tag differs), or None."""
    reported = info.get(api.LAUNCH_TAG)
    if reported == server.launch_tag:
        return None
    return f"{api.SERVER_INFO} reports {api.LAUNCH_TAG} {reported!r}, not this launch's {server.launch_tag!r}"


def server_info_object(body: bytes) -> dict[str, Any] | None:
    """A ``/server_info`` body as SGLang's JSON object, or None for anything else (not JSON, not an
    object, an integer past Python's digit limit, nesting too deep): a body we cannot read is no answer."""
    try:
        info = load_json(body)
    except ValueError:  # json.JSONDecodeError and UnicodeDecodeError are ValueErrors
        return None
    return info if isinstance(info, dict) else None


def check_owner(server: ServerProcess) -> None:
    """Raise port_taken unless the launched process group holds the port's listening socket and the
    server answering there reports this launch's tag.

    The socket check names the intruder and catches a copy of our own launch (same argv, same tag); the
    tag check still works where the OS will not list sockets (psutil's AccessDenied) and catches a
    server reached on the port that another process group listens on beside ours (SO_REUSEPORT)."""
    from workers.node.ports import foreign_listeners

    problems = []
    group = set(group_members(server.pgid))
    listeners = foreign_listeners(server.port, group, server.config.host)
    if listeners is not None:
        foreign, ours = listeners
        if foreign:
            owners = ", ".join(f"pid {x.pid}" if x.pid else "a process of another user" for x in foreign)
            problems.append(f"port {server.port} is also held by {owners}, outside group {server.pgid}")
        elif not ours:
            problems.append(f"no process of group {server.pgid} listens on port {server.port}")
    status, body = http_get(server.url + api.SERVER_INFO, timeout_s=30.0)
    info = server_info_object(body) if status == 200 else None
    if info is None:
        problems.append(f"{api.SERVER_INFO} answered {status or 'nothing'} without an SGLang body")
    elif (problem := launch_tag_problem(server, info)) is not None:
        problems.append(problem)
    if problems:
        raise ServerFailure(
            ErrorClass.PORT_TAKEN,
            "another server answers on the port (not this launch): " + "; ".join(problems),
            server.log_tail(),
        )


# --- node-local pid file ----------------------------------------------------------------------------------


def pid_dir() -> Path:
    """Node-local directory of server pid files (SPECSWEEP_PID_DIR overrides)."""
    default = Path("/tmp") / f"specsweep-{os.getuid()}" / "servers"
    return Path(os.environ.get("SPECSWEEP_PID_DIR", default))


@dataclass(frozen=True, slots=True)
class PidFile:
    """Where a worker records the server it runs, so the next worker on the same GPUs can clean up."""

    path: Path

    def record(self, server: ServerProcess, job_id: str) -> None:
        import psutil

        entry = {
            "pgid": server.pgid,
            "pid": server.popen.pid,
            "create_time": psutil.Process(server.popen.pid).create_time(),
            "job_id": job_id,
            "argv": server.argv,
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(entry))
        os.replace(tmp, self.path)

    def clear(self) -> None:
        self.path.unlink(missing_ok=True)

    def kill_leftover(self) -> list[int]:
        """Kill the process group recorded here if it is still there; returns the PIDs it had."""
        try:
            entry = json.loads(self.path.read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return []
        pgid = int(entry["pgid"])
        members = [] if _leader_replaced(pgid, float(entry["create_time"])) else group_members(pgid)
        if members:
            log.warning(
                "killing server group %d left by a previous worker (job %s): pids %s",
                pgid,
                entry.get("job_id"),
                members,
            )
            kill_group(pgid, signal.SIGKILL)
            deadline = time.monotonic() + 10.0
            while group_members(pgid) and time.monotonic() < deadline:
                time.sleep(0.05)
        self.clear()
        return members


def _leader_replaced(pgid: int, create_time: float) -> bool:
    """Whether the recorded group leader's PID now belongs to another process (PID reuse)."""
    import psutil

    try:
        return psutil.Process(pgid).create_time() != create_time
    except psutil.NoSuchProcess:
        return False  # leader gone; a PID is not reused while its process group has members


def python_for(config_engine: Engine, sglang_python: str | None) -> str:
    """Interpreter for the engine: this one for the simulator, the given (or python3) for SGLang."""
    if config_engine == "sim":
        return sys.executable
    return sglang_python or "python3"


# --- one server for a block of code (tests, benchmarks, tools) -------------------------------------------


@contextlib.contextmanager
def running_server(
    config: ServerConfig,
    *,
    port: int | None = None,
    log_path: Path | None = None,
    healthy_within_s: float | None = 30.0,
    stop_grace_s: float = 5.0,
    shared_port: bool = False,
) -> Iterator[ServerProcess]:
    """Start ``config`` on ``port`` (default: one reserved for it, ``workers.node.ports``), wait for
    ``/health`` unless ``healthy_within_s`` is None (from any of the servers on a ``shared_port``), and
    stop its whole process group on exit. The log goes to ``log_path`` (default: a temporary file, removed
    on exit)."""
    from workers.node.ports import reserved_port

    owns_log = log_path is None
    if log_path is None:
        fd, name = tempfile.mkstemp(prefix="specsweep-server-", suffix=".log")
        os.close(fd)
        log_path = Path(name)
    with contextlib.ExitStack() as stack:
        if port is None:
            port = stack.enter_context(reserved_port(config.host))
        server = start_server(config, port, log_path)
        try:
            if healthy_within_s is not None:
                wait_healthy(server, healthy_within_s, poll_s=0.05, shared_port=shared_port)
            yield server
        finally:
            server.stop(stop_grace_s)
            if owns_log:
                log_path.unlink(missing_ok=True)


def start_sim(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    port: int | None = None,
    log_path: Path | None = None,
    healthy_within_s: float | None = 30.0,
    shared_port: bool = False,
) -> contextlib.AbstractContextManager[ServerProcess]:
    """``running_server`` for the simulated server with SGLang launch ``args`` and SPECSWEEP_SIM_* ``env``."""
    config = ServerConfig(
        engine="sim", python=sys.executable, args=tuple(args), env=tuple(sorted((env or {}).items()))
    )
    return running_server(
        config, port=port, log_path=log_path, healthy_within_s=healthy_within_s, shared_port=shared_port
    )
