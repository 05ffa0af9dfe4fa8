"""``python -m workers.sim <the arguments of python -m sglang.launch_server>``: the simulated server's process.

Resolves the launch as SGLang would (``workers.sim.launch``), reads the simulator's knobs from the
environment (``workers.sim.settings``), dies like SGLang where SGLang would, else serves the HTTP app
(``workers.sim.server``) until SIGTERM/SIGINT.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import sys
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import Any

from aiohttp import web

from workers.sglang import ArgvError, multinode
from workers.sim.faults import STARTUP_TRACEBACKS, die_like_sglang, log_line
from workers.sim.launch import LaunchRefused, resolve_launch
from workers.sim.ranks import run_follower, serve_rendezvous
from workers.sim.server import SimServer
from workers.sim.settings import SimSettingsError, settings_from_env

logger = logging.getLogger("workers.sim.server")


def _configure_logging(level: str) -> None:
    logging.basicConfig(
        level=getattr(logging, str(level).upper(), logging.INFO),
        format="%(message)s",
        stream=sys.stderr,
        force=True,
    )
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)


class _BindFailed(Exception):
    """The HTTP port could not be bound (uvicorn logs the OSError and exits 1)."""


async def _serve(server: SimServer, host: str, port: int) -> None:
    runner = web.AppRunner(server.app, access_log=None, handle_signals=False, shutdown_timeout=1.0)
    await runner.setup()
    site = web.TCPSite(runner, host, port, backlog=1024, reuse_port=server.settings.reuse_port or None)
    try:
        await site.start()
    except OSError as err:
        await runner.cleanup()
        logger.error("ERROR:    %s", err)  # uvicorn's line: "[Errno 98] error while attempting to bind ..."
        raise _BindFailed from err
    logger.info("INFO:     Uvicorn running on http://%s:%d (Press CTRL+C to quit)", host, port)
    server.begin_loading()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m workers.sim <sglang launch_server args>``; returns SGLang's exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        config = resolve_launch(argv)
    except ArgvError as err:
        sys.stderr.write(err.usage_text())
        return 2
    except LaunchRefused as refused:
        sys.stderr.write(refused.text)
        return refused.exit_code
    try:
        settings = settings_from_env()
    except SimSettingsError as err:
        sys.stderr.write(f"error: {err}\n")
        return 2
    _configure_logging(config.resolved_args.get("log_level") or "info")
    logger.info(log_line(f"server_args={config.resolved_args}"))
    if config.draft_tokens_rewritten:
        logger.warning(
            log_line(
                "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1 when "
                "speculative_eagle_topk == 1"
            )
        )
    startup_crash = STARTUP_TRACEBACKS.get(settings.fault) or config.load_crash
    if startup_crash is not None:
        time.sleep(settings.load_delay_s)
        die_like_sglang(startup_crash, starting=True)
    nnodes = int(config.resolved_args.get(multinode.NNODES) or 1)
    node_rank = int(config.resolved_args.get(multinode.NODE_RANK) or 0)
    if node_rank > 0:  # runs its schedulers, serves no HTTP
        return run_follower(config.resolved_args, node_rank)
    _links = serve_rendezvous(config.resolved_args, nnodes) if nnodes > 1 else []  # open while serving
    host = str(config.resolved_args.get("host") or "127.0.0.1")
    port = int(config.resolved_args.get("port") or 30000)
    time.sleep(settings.bind_delay_s)  # SGLang loads the weights before its HTTP server binds
    try:
        _event_loop_runner()(_serve(SimServer(config, settings), host, port))
    except _BindFailed:
        return 1
    return 0


def _event_loop_runner() -> Callable[[Coroutine[Any, Any, None]], None]:
    """uvloop's runner when installed (SGLang serves on uvloop too), else asyncio's."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run
    return uvloop.run


if __name__ == "__main__":
    sys.exit(main())
