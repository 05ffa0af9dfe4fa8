"""Watch a server while a load level runs, and end the level when it must not go on.

The load generator waits for every request, so a server that hangs mid-stream would hold the attempt
until each request's own timeout. While a level runs, a thread probes ``/health`` every
``HEALTH_PROBE_INTERVAL_S``: a probe answered with anything but 200, or not answered within
``HEALTH_PROBE_TIMEOUT_S`` (longer than SGLang's own 20 s /health generation timeout, so a busy but
working server passes), ends the level as ``health_lost``; a level that runs past ``timeouts.level_s``
ends as ``level_timeout``. Ending means stopping the server: every stream closes, the load generator
returns what it measured, and the node worker reports the failure, which the driver's retry policy
then handles. A server that exits by itself is left to the worker's usual crash check.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from types import TracebackType

from specsweep.error_classes import ErrorClass
from workers.node.launcher import ServerFailure, ServerProcess, http_get
from workers.sglang import api

log = logging.getLogger(__name__)

HEALTH_PROBE_INTERVAL_S = 5.0
HEALTH_PROBE_TIMEOUT_S = 30.0


class LevelWatch:
    """A context manager around one load level (see the module docstring)."""

    def __init__(
        self,
        server: ServerProcess,
        level_s: float,
        stop_s: float,
        *,
        probe_interval_s: float = HEALTH_PROBE_INTERVAL_S,
        probe_timeout_s: float = HEALTH_PROBE_TIMEOUT_S,
    ) -> None:
        self._server = server
        self._level_s = level_s
        self._stop_s = stop_s
        self._interval_s = probe_interval_s
        self._probe_timeout_s = probe_timeout_s
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="level-watch", daemon=True)
        self._failure: tuple[ErrorClass, str] | None = None
        self._deadline = math.inf

    def __enter__(self) -> LevelWatch:
        self._deadline = time.monotonic() + self._level_s
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._done.set()
        self._thread.join()

    def raise_if_ended(self) -> None:
        """Raise the failure that ended the level, if the watch ended it."""
        if self._failure is not None:
            error_class, message = self._failure
            raise ServerFailure(error_class, message, self._server.log_tail())

    def _watch(self) -> None:
        while not self._done.wait(min(self._interval_s, max(0.0, self._deadline - time.monotonic()))):
            if self._server.poll() is not None:
                return  # it exited: the load ends by itself and the worker classifies the crash
            left_s = self._deadline - time.monotonic()
            if left_s <= 0:
                self._end(
                    ErrorClass.LEVEL_TIMEOUT,
                    f"the load level ran past timeouts.level_s ({self._level_s:g} s)",
                )
                return
            timeout_s = min(self._probe_timeout_s, left_s)
            status, _ = http_get(self._server.url + api.HEALTH, timeout_s=timeout_s)
            if self._done.is_set() or self._server.poll() is not None:
                return
            if status != 200 and (status != 0 or timeout_s >= self._probe_timeout_s):
                self._end(
                    ErrorClass.HEALTH_LOST,
                    f"{api.HEALTH} answered {status or 'nothing'} (within {timeout_s:g} s) while a load "
                    "level ran",
                )
                return

    def _end(self, error_class: ErrorClass, message: str) -> None:
        self._failure = (error_class, message)
        log.warning("ending the load level: %s: %s", error_class, message)
        try:
            self._server.stop(self._stop_s)
        except ServerFailure as err:  # the worker's own stop reports it again
            log.warning("stopping the server after %s: %s", error_class, err.message)
