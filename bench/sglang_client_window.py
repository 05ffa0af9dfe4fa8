"""Run ``python -m sglang.benchmark.serving`` and record its requests' window as bench/loadgen.py defines it.

Runs under SGLang's interpreter (imports nothing of this project). SGLang's client reports throughput
over its whole benchmark (task creation, connects and a ``/server_info`` call included), ours over the
first request's start to the last request's end; to compare like with like, this wraps the client's own
request function (its ``output.start_time`` and ``latency``, the figures its TTFT and TPOT come from) and
appends ``{"first_start_s", "last_end_s", "completed"}`` as one JSON line to the file named by the first
argument. The remaining arguments are the client's.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from sglang.benchmark import serving


def main() -> None:
    window_file, client_args = sys.argv[1], sys.argv[2:]
    spans: list[tuple[float, float]] = []
    send = serving.ASYNC_REQUEST_FUNCS["sglang"]

    async def timed_send(*args: Any, **kwargs: Any) -> Any:
        output = await send(*args, **kwargs)
        if output.success:
            spans.append((output.start_time, output.start_time + output.latency))
        return output

    serving.ASYNC_REQUEST_FUNCS["sglang"] = timed_send
    sys.argv = ["sglang.benchmark.serving", *client_args]
    serving.cli_main()
    window = {
        "first_start_s": min(s for s, _ in spans),
        "last_end_s": max(e for _, e in spans),
        "completed": len(spans),
    }
    with open(window_file, "a") as out:
        out.write(json.dumps(window) + "\n")


if __name__ == "__main__":
    main()
