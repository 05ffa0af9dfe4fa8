"""A hostile (or buggy) server cannot cost `specsweep load` its measurements: every field the load
generator stores is checked, one bad response becomes one `invalid_response` row, and the rows measured
before it are written. The server here is a small aiohttp app speaking SGLang's /generate stream."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest
from aiohttp import web

from harness.cli import main
from workers.load.stream import INVALID_RESPONSE
from workers.node.preflight import pick_free_port

REQUESTS = 5
BAD_REQUEST = 3  # the third request gets the malformed response
TOKENS = 4
SPEC_OK = {"spec_verify_ct": 2, "spec_accept_length": 2.0, "spec_accept_rate": 0.5}

# name -> (meta_info fields of the bad request's final chunk, completion_tokens of its middle chunk,
#          the field the error message must name)
MALFORMED: dict[str, tuple[dict[str, Any], int, str]] = {
    "prompt_tokens is text": ({"prompt_tokens": "abc"}, 2, "prompt_tokens"),
    "completion_tokens is 3e9": ({"completion_tokens": 3e9}, 2, "completion_tokens"),
    "completion_tokens is negative": ({"completion_tokens": -5}, 2, "completion_tokens"),
    "completion_tokens below those streamed": ({"completion_tokens": 1}, 2, "completion_tokens"),
    "completion_tokens jumps to 2e7": ({}, 20_000_000, "completion_tokens"),
    "accept rate above 1": ({**SPEC_OK, "spec_accept_rate": 7.5}, 2, "spec_accept_rate"),
    "accept length is text": ({**SPEC_OK, "spec_accept_length": "long"}, 2, "spec_accept_length"),
    "histogram too long": (
        {**SPEC_OK, "spec_correct_drafts_histogram": [1] * 100_000},
        2,
        "spec_correct_drafts_histogram",
    ),
    "histogram of text": (
        {**SPEC_OK, "spec_correct_drafts_histogram": ["a", "b"]},
        2,
        "spec_correct_drafts_histogram",
    ),
    "verify count negative": ({"spec_verify_ct": -3}, 2, "spec_verify_ct"),
    "finish reason not a string": ({"finish_reason": {"type": 12345}}, 2, "finish reason"),
}


def chunk(meta: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps({"text": "x", "meta_info": meta}).encode() + b"\n\n"


class HostileServer:
    """Answers /generate with a well-formed stream, except request BAD_REQUEST: ``bad`` fields in its final
    chunk and ``middle`` as the completion count of its middle chunk."""

    def __init__(self, bad: dict[str, Any], middle: int) -> None:
        self.bad, self.middle, self.count = bad, middle, 0

    async def generate(self, request: web.Request) -> web.StreamResponse:
        await request.read()
        self.count += 1
        hostile = self.count == BAD_REQUEST
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        base = {"prompt_tokens": 8, "finish_reason": None}
        await response.write(chunk({**base, "completion_tokens": 1}))
        await response.write(chunk({**base, "completion_tokens": self.middle if hostile else 2}))
        final = {**base, "completion_tokens": TOKENS, "finish_reason": {"type": "length"}}
        await response.write(chunk({**final, **(self.bad if hostile else {})}))
        await response.write(b"data: [DONE]\n\n")
        return response


@pytest.fixture
def serve() -> Iterator[Any]:
    """Start a HostileServer on 127.0.0.1 in a thread; yields a function that returns its URL."""
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    runners: list[web.AppRunner] = []

    def start(server: HostileServer) -> str:
        app = web.Application()
        app.router.add_post("/generate", server.generate)
        runner = web.AppRunner(app)
        port = pick_free_port("127.0.0.1")

        async def up() -> None:
            await runner.setup()
            await web.TCPSite(runner, "127.0.0.1", port).start()

        asyncio.run_coroutine_threadsafe(up(), loop).result(timeout=30)
        runners.append(runner)
        return f"http://127.0.0.1:{port}"

    yield start
    for runner in runners:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(timeout=30)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(timeout=10)


@pytest.mark.parametrize("name", list(MALFORMED))
def test_load_keeps_every_row_and_classifies_the_bad_one_when_a_response_is_malformed(
    name: str, serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Five requests, the third malformed: exit 0, five rows on disk, four ok with their counts, the
    third an invalid_response row whose message names the field (nothing of the bad value is stored)."""
    bad, middle, field = MALFORMED[name]
    url = serve(HostileServer(bad, middle))
    out = tmp_path / "records.parquet"
    argv = ["load", "--url", url, "--concurrency", "1", "--requests", str(REQUESTS), "--out", str(out)]
    assert main([*argv, "--input-tokens", "8", "--output-tokens", str(TOKENS)]) == 0, capsys.readouterr().err
    rows = pq.read_table(out).to_pylist()
    assert len(rows) == REQUESTS
    ok = [r for r in rows if r["error_type"] is None]
    (invalid,) = [r for r in rows if r["error_type"] is not None]
    assert len(ok) == REQUESTS - 1 and all(r["completion_tokens"] == TOKENS for r in ok)
    assert invalid["error_type"] == INVALID_RESPONSE and invalid["request_id"] == f"r{BAD_REQUEST - 1:07d}"
    assert field in invalid["error_message"]
    assert invalid["spec_correct_drafts_histogram"] is None and len(invalid["itl_per_token_ms"]) < 100


def test_load_refuses_out_before_sending_when_out_is_a_directory(
    serve: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--out DIR is refused at once: not one request reaches the server."""
    server = HostileServer({}, 2)
    url = serve(server)
    argv = ["load", "--url", url, "--concurrency", "1", "--requests", "3", "--out", str(tmp_path)]
    assert main(argv) == 2
    assert "--out is a directory" in capsys.readouterr().err
    assert server.count == 0
