"""Which port a server gets, and who really listens on it.

Real SGLang binds its HTTP port only after loading the weights (minutes for a large target), so a port
that was free when it was chosen can be taken before the server binds it: by the server of another slot
on this node that was handed the same free port, by an orphan server of an earlier run, by anything. Two
defences, both here:

- **Reservation.** ``reserve_port`` hands out a port the OS says is free *and* holds an exclusive
  ``flock`` on ``<pid dir>/ports/<port>.lock`` until the server is stopped. Every slot on the node (Ray
  runs each in its own worker process, all under one user) reserves through the same directory, so two
  concurrent reservations never return one port even while neither server has bound it yet. ``flock``
  was chosen over a bound placeholder socket (which the server could not then bind) and over a pid
  written to a file (which a crashed worker would leave behind): the kernel drops the lock when the
  holder's file is closed, including when its process dies, so a reservation cannot outlive its worker.
- **Listener check.** ``foreign_listeners`` lists the TCP sockets listening on the port and the ones not
  held by the launched process group that a client of the server's address could reach; a server that
  answers ``/health`` while another process holds the port is not the one the harness launched
  (``workers.node.launcher.check_owner`` turns this into a ``port_taken`` failure, retried on another
  port).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import socket
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specsweep.error_classes import ErrorClass
from workers.node.launcher import ServerFailure, pid_dir
from workers.node.preflight import pick_free_port

RESERVE_TRIES = 64  # candidate ports tried before giving up (each one reserved by another slot)


def reservation_dir() -> Path:
    """Where the node's port locks live: beside the node-local server pid files."""
    return pid_dir() / "ports"


def _try_lock(path: Path) -> int | None:
    """An fd holding an exclusive lock on ``path``, or None when another holder has it.

    The file is removed on release, so after locking the fd must still name the file at ``path``: a
    holder that released (and unlinked) between our open and our lock leaves us locking a dead inode."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as err:
        os.close(fd)
        if err.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            return None
        raise
    try:
        current = os.stat(path)
    except FileNotFoundError:
        current = None
    if current is None or current.st_ino != os.fstat(fd).st_ino:
        os.close(fd)
        return _try_lock(path)
    return fd


@dataclass(frozen=True, slots=True)
class PortLease:
    """A reserved port: no other reservation on this node returns it until ``release``."""

    port: int
    path: Path
    fd: int

    def release(self) -> None:
        """Give the port back (unlink first, so no one locks the file while it is being removed)."""
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
        os.close(self.fd)


def try_reserve(port: int, directory: Path | None = None) -> PortLease | None:
    """Reserve ``port`` if no other reservation on this node holds it (it may still be bound by others)."""
    folder = directory or reservation_dir()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{port}.lock"
    fd = _try_lock(path)
    return None if fd is None else PortLease(port, path, fd)


def reserve_port(host: str, directory: Path | None = None) -> PortLease:
    """A port free on ``host`` now and reserved for the caller until ``release``; port_taken when every
    port tried was reserved by another slot."""
    for _ in range(RESERVE_TRIES):
        lease = try_reserve(pick_free_port(host), directory)
        if lease is not None:
            return lease
    raise ServerFailure(
        ErrorClass.PORT_TAKEN, f"{RESERVE_TRIES} free ports on {host} were all reserved by other slots"
    )


@contextlib.contextmanager
def reserved_port(host: str, directory: Path | None = None) -> Iterator[int]:
    """``reserve_port`` for a block of code: the port, released on exit."""
    lease = reserve_port(host, directory)
    try:
        yield lease.port
    finally:
        lease.release()


@dataclass(frozen=True, slots=True)
class Listener:
    """A TCP socket listening on a port: its address and owner (None: a process this user cannot see)."""

    address: str
    pid: int | None


def port_listeners(port: int) -> list[Listener] | None:
    """Every TCP socket (IPv4 and IPv6) listening on ``port``; None where the OS will not say (psutil's
    AccessDenied, e.g. macOS without root). On Linux a socket of another user's process is listed with
    pid None."""
    import psutil

    try:
        connections = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return None
    return [
        Listener(conn.laddr.ip, conn.pid)
        for conn in connections
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port
    ]


WILDCARD_ADDRESSES = frozenset({"0.0.0.0", "::", ""})


def host_addresses(host: str) -> frozenset[str] | None:
    """The IP addresses ``host`` names (itself when it is one); None when it does not resolve."""
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return None
    return frozenset(str(info[4][0]) for info in infos)


def shares_address(listener: Listener, host_ips: frozenset[str] | None) -> bool:
    """Whether a connection to a host with the IP addresses ``host_ips`` (``host_addresses``) on the port
    can reach ``listener``: it listens on one of them or on every address (0.0.0.0, ::), or the server
    itself binds every address. Sockets on other addresses of the same port number are not in the way:
    on a Ray node its processes listen on the node's IP at ports the OS picked, and one may hold the
    number of a server bound to 127.0.0.1. A host that does not resolve (None) shares with everything
    (the check stays strict where it cannot tell)."""
    address = listener.address.removeprefix("::ffff:")  # an IPv4 address seen through an IPv6 socket
    if host_ips is None or address in WILDCARD_ADDRESSES:
        return True
    return address in host_ips or bool(host_ips & WILDCARD_ADDRESSES)


def foreign_listeners(port: int, group: set[int], host: str) -> tuple[list[Listener], bool] | None:
    """Listeners a client of ``host``:``port`` could reach that are outside the process ``group`` (unknown
    owners count as outside), and whether the group itself listens on the port; None where the OS will
    not list sockets."""
    listeners = port_listeners(port)
    if listeners is None:
        return None
    host_ips = host_addresses(host)
    foreign = [x for x in listeners if x.pid not in group and shares_address(x, host_ips)]
    ours = any(x.pid in group for x in listeners)
    return foreign, ours
