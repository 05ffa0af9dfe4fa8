"""The simulated server over several nodes: rank 0's rendezvous and the other ranks' link to it.

SGLang 0.5.23 launched with ``--nnodes N --node-rank R --dist-init-addr HOST:PORT`` initialises
torch.distributed with rank 0 hosting the store at that address; rank 0 alone serves HTTP, the other
ranks run their schedulers and wait. Every TP all-reduce needs every rank, so when one dies the others
fail at their next collective: NCCL reports a remote error (or, at start-up, the store times out waiting
for clients), the scheduler raises, and the server dies as on any scheduler exception
(``workers.sim.faults.die_like_sglang``). The simulator reproduces that with one TCP connection per
non-zero rank to rank 0's address: rank 0 waits for all of them before it loads, and dies with NCCL's
words when one closes; a non-zero rank dies the same way when rank 0's side closes.
"""

from __future__ import annotations

import signal
import socket
import sys
import threading
import time
from collections.abc import Mapping
from typing import Any

from workers.sglang import multinode
from workers.sim.faults import die_like_sglang, log_line

DEFAULT_JOIN_TIMEOUT_S = 60.0  # without --dist-timeout (torch's own default is far longer)
CONNECT_RETRY_S = 0.2

PEER_LOST_TRACEBACK = (
    "Traceback (most recent call last):\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/managers/scheduler.py", line 6373, '
    "in run_scheduler_process\n    scheduler.run_event_loop()\n"
    '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/distributed/device_communicators/'
    'pynccl.py", line 142, in all_reduce\n    self.nccl.ncclAllReduce(\n'
    "torch.distributed.DistBackendError: NCCL error: remote process exited or there was a network error, "
    "NCCL version 2.27.5\n"
    "ncclRemoteError: A call failed possibly due to a network error or a remote process exiting "
    "prematurely.\n"
)


def _join_timeout_traceback(timeout_s: float, joined: int, expected: int) -> str:
    return (
        "Traceback (most recent call last):\n"
        '  File "/usr/local/lib/python3.12/dist-packages/sglang/srt/distributed/parallel_state.py", '
        "line 1432, in init_distributed_environment\n    torch.distributed.init_process_group(\n"
        f"torch.distributed.DistStoreError: Timed out after {timeout_s:g} seconds waiting for clients. "
        f"{joined}/{expected} clients joined.\n"
    )


def _address(resolved: Mapping[str, Any]) -> tuple[str, int]:
    host, _, port = str(resolved.get(multinode.DIST_INIT_ADDR) or "").rpartition(":")
    if not host or not port.isdigit():
        sys.stderr.write(f"ValueError: --dist-init-addr must be HOST:PORT for --nnodes > 1, got {port!r}\n")
        sys.exit(1)
    return host.strip("[]"), int(port)


def _timeout(resolved: Mapping[str, Any]) -> float:
    return float(resolved.get("dist_timeout") or DEFAULT_JOIN_TIMEOUT_S)


def _die_when_closed(conn: socket.socket, *, starting: bool) -> None:
    """Block until the other side closes (its process died), then die like SGLang's scheduler."""
    while True:
        try:
            data = conn.recv(64)
        except OSError:
            data = b""
        if not data:
            die_like_sglang(PEER_LOST_TRACEBACK, starting=starting)


def serve_rendezvous(resolved: Mapping[str, Any], nnodes: int) -> list[socket.socket]:
    """Rank 0: accept every other rank at --dist-init-addr (or die as torch's store does on timeout),
    then watch each link on a thread; returns the links (kept open for as long as the server runs)."""
    host, port = _address(resolved)
    timeout_s = _timeout(resolved)
    listener = socket.create_server((host, port), reuse_port=False)
    listener.settimeout(0.5)
    links: list[socket.socket] = []
    deadline = time.monotonic() + timeout_s
    while len(links) < nnodes - 1:
        if time.monotonic() > deadline:
            die_like_sglang(_join_timeout_traceback(timeout_s, len(links) + 1, nnodes), starting=True)
        try:
            conn, _ = listener.accept()
        except TimeoutError:
            continue
        conn.settimeout(None)
        links.append(conn)
    listener.close()
    sys.stderr.write(log_line(f"init_distributed_environment: {nnodes} nodes joined") + "\n")
    for conn in links:
        threading.Thread(
            target=_die_when_closed, args=(conn,), kwargs={"starting": False}, daemon=True
        ).start()
    return links


def run_follower(resolved: Mapping[str, Any], node_rank: int) -> int:
    """A non-zero rank: join rank 0's rendezvous (retrying until --dist-timeout), then run until SIGTERM
    (exit 0) or until rank 0 goes away (die with NCCL's remote error)."""
    host, port = _address(resolved)
    timeout_s = _timeout(resolved)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            conn = socket.create_connection((host, port), timeout=2.0)
            break
        except OSError:
            if time.monotonic() > deadline:
                die_like_sglang(_join_timeout_traceback(timeout_s, 0, 1), starting=True)
            time.sleep(CONNECT_RETRY_S)
    conn.settimeout(None)
    conn.sendall(f"rank {node_rank}\n".encode())
    sys.stderr.write(
        log_line(f"node rank {node_rank} joined {host}:{port}; no HTTP server on this rank") + "\n"
    )
    sys.stderr.flush()
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    threading.Thread(target=_die_when_closed, args=(conn,), kwargs={"starting": False}, daemon=True).start()
    stop.wait()
    conn.close()
    return 0
