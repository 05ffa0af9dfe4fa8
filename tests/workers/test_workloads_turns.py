"""Multi-turn conversations replayed turn by turn with the server's own replies, as MT-Bench is run: turn
k's request carries every earlier user turn and the exact text the server streamed for each, in order, on
one stream (closed loop) or right after its reply (open loop); rows carry their turn."""

from __future__ import annotations

import asyncio
import itertools
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from tests.launch_args import chain_launch_args
from workers.job import LoadLevel
from workers.load.generator import run_load
from workers.load.workloads import PromptSetWorkload, request_stream
from workers.node.launcher import start_sim

FIXTURES = Path(__file__).parents[1] / "fixtures"
CONVERSATIONS = [
    {"question_id": i, "category": "coding", "turns": [f"Write function {i}.", f"Test function {i}.", "Shorter."]}
    for i in range(8)
]  # fmt: skip


def mt_bench_file(tmp_path: Path, rows: list[dict[str, Any]] = CONVERSATIONS) -> Path:
    path = tmp_path / "question.jsonl"
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


class RecordingChatServer:
    """A chat endpoint on 127.0.0.1 that records every request body and streams a reply unique to it,
    split over several SSE chunks in SGLang's chat shape (usage on every chunk, then [DONE]). Request
    number ``fail_at`` (0-based) is answered with HTTP 500."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.bodies: list[dict[str, Any]] = []
        self.replies: list[str] = []
        self.fail_at = fail_at
        self.url = ""
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)

    async def _chat(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        n = len(self.bodies)
        self.bodies.append(body)
        if n == self.fail_at:
            self.replies.append("")
            return web.json_response({"object": "error", "message": "boom", "code": 500}, status=500)
        words = [f"reply{n}", "with", "words", f"n{n}", "and", "a\nnewline", "\u00e9t\u00e9"]
        self.replies.append("".join(" " + w for w in words))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)

        async def event(obj: dict[str, Any]) -> None:
            await response.write(b"data: " + orjson.dumps(obj) + b"\n\n")

        await event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]})
        for k, word in enumerate(words, 1):
            usage = {"prompt_tokens": 5, "completion_tokens": k, "total_tokens": 5 + k}
            await event({"choices": [{"index": 0, "delta": {"content": " " + word}}], "usage": usage})
        await event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
        await event({"choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": len(words)}})
        await response.write(b"data: [DONE]\n\n")
        return response

    async def _start(self) -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/v1/chat/completions", self._chat)
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        self.url = f"http://127.0.0.1:{runner.addresses[0][1]}"
        return runner

    @contextmanager
    def running(self) -> Iterator[RecordingChatServer]:
        self._thread.start()
        runner = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        try:
            yield self
        finally:
            asyncio.run_coroutine_threadsafe(runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)
            self._loop.close()


def check_replayed(server: RecordingChatServer) -> dict[str, list[int]]:
    """Every later turn's messages are its conversation's previous request's messages, then the exact
    reply the server streamed to it, then the next user turn; returns the turns seen per conversation."""
    turns: dict[str, list[int]] = {}
    last: dict[str, int] = {}  # conversation (its first user turn) -> index of its latest request
    for n, body in enumerate(server.bodies):
        messages = body["messages"]
        conversation = messages[0]["content"]
        turn = (len(messages) - 1) // 2
        row = next(r for r in CONVERSATIONS if r["turns"][0] == conversation)
        if turn:
            before = last[conversation]
            assert messages[:-2] == server.bodies[before]["messages"]
            assert messages[-2] == {"role": "assistant", "content": server.replies[before]}
        assert messages[-1] == {"role": "user", "content": row["turns"][turn]}
        turns.setdefault(conversation, []).append(turn)
        last[conversation] = n
    return turns


@pytest.mark.parametrize("processes", [1, 2])
def test_closed_loop_replays_each_turn_with_the_servers_reply_when_conversations_have_turns(
    processes: int, tmp_path: Path
) -> None:
    """Closed loop, 2 streams, 7 requests of 3-turn conversations: turn k carries the exact streamed text
    of turn k-1 (chunks joined, newline and accents intact); a conversation's turns go in order on one
    stream, each after the one before ended; the last conversation is cut at the level's count; rows
    have turn numbers and distinct request ids. Alike when two client processes share the level (each
    cuts its own share)."""
    workload = PromptSetWorkload(path=str(mt_bench_file(tmp_path)), format="mt_bench", max_tokens=16)
    with RecordingChatServer().running() as server:
        level = LoadLevel(concurrency=2, requests=7, processes=processes)
        result = run_load(server.url, level, workload, calibration_streams=2)
    assert result.num_errors == 0 and len(result.records) == 7 == len(server.bodies)
    turns = check_replayed(server)
    assert sorted(turns.values()) == [[0], [0, 1, 2], [0, 1, 2]]
    assert sorted(r.turn for r in result.records) == [0, 0, 0, 1, 1, 2, 2]
    assert len({r.request_id for r in result.records}) == 7
    by_conversation: dict[str, list[Any]] = {}
    for record in result.records:
        by_conversation.setdefault(record.request_id.split(".")[0], []).append(record)
    for records in by_conversation.values():
        records.sort(key=lambda r: r.turn)
        assert all(a.end_ns <= b.start_ns for a, b in itertools.pairwise(records))


def test_open_loop_starts_a_conversation_per_arrival_when_turns_follow_replies(tmp_path: Path) -> None:
    """Open loop: each arrival starts a conversation and its later turns follow their replies at once, so
    6 requests are 2 full conversations of 3 turns, each turn carrying the reply before it."""
    workload = PromptSetWorkload(path=str(mt_bench_file(tmp_path)), format="mt_bench", max_tokens=16)
    with RecordingChatServer().running() as server:
        result = run_load(server.url, LoadLevel(rate_rps=50, requests=6), workload, calibration_streams=2)
    assert result.num_errors == 0 and len(server.bodies) == 6
    assert sorted(check_replayed(server).values()) == [[0, 1, 2], [0, 1, 2]]


def test_failed_turn_ends_its_conversation_when_the_server_errs(tmp_path: Path) -> None:
    """One stream: the server fails turn 1 of the first conversation; its turn 2 is never sent (there is
    no reply to carry) and is not replaced (the level's turns are fixed in advance, the same for every
    config), and the stream goes on with the next conversation's turns."""
    workload = PromptSetWorkload(path=str(mt_bench_file(tmp_path)), format="mt_bench", max_tokens=16)
    with RecordingChatServer(fail_at=1).running() as server:
        result = run_load(server.url, LoadLevel(concurrency=1, requests=5), workload, calibration_streams=2)
    assert [r.error_type for r in sorted(result.records, key=lambda r: r.start_ns)][:2] == [
        None,
        "http_error",
    ]
    assert [(len(b["messages"]) - 1) // 2 for b in server.bodies] == [0, 1, 0, 1]
    assert len(result.records) == 4


def test_conversation_turns_follow_limits_when_max_turns_or_count_is_set(tmp_path: Path) -> None:
    """max_turns: 1 sends first turns only; a count of 4 requests over 3-turn conversations takes one whole
    conversation and the first turn of the next; ShareGPT keeps every human turn after its system one."""
    path = str(mt_bench_file(tmp_path))
    firsts = list(request_stream(PromptSetWorkload(path=path, max_turns=1, max_tokens=8), iter(range(3))))
    assert all(r.next_turn is None for r in firsts)
    counted = list(request_stream(PromptSetWorkload(path=path, max_tokens=8), iter(range(4)), limit=4))
    assert [r.next_turn.last if r.next_turn else 0 for r in counted] == [2, 0]
    share = tmp_path / "sharegpt.json"
    conversation = [
        {"from": "system", "value": "Be kind."},
        {"from": "human", "value": "First?"},
        {"from": "gpt", "value": "Recorded answer."},
        {"from": "human", "value": "Second?"},
        {"from": "gpt", "value": "Another."},
        {"from": "human", "value": "Third?"},
    ]
    share.write_text(json.dumps([{"id": "a", "conversations": conversation}]))
    first = next(
        request_stream(PromptSetWorkload(path=str(share), format="sharegpt", max_tokens=8), iter([0]))
    )
    assert orjson.loads(first.body)["messages"] == [
        {"role": "system", "content": "Be kind."},
        {"role": "user", "content": "First?"},
    ]
    assert first.next_turn is not None and first.next_turn.prompt.later_turns == ("Second?", "Third?")
    second = first.next_turn.request(first.index, "Mine.")
    assert [m["content"] for m in orjson.loads(second.body)["messages"]] == [
        "Be kind.",
        "First?",
        "Mine.",
        "Second?",
    ]
    assert (second.turn, second.category, second.dataset) == (1, "chat", "sharegpt")


def test_simulator_counts_each_turns_prompt_as_the_conversation_so_far_when_replayed(tmp_path: Path) -> None:
    """On the simulated server (prompt tokens: words plus 4 per message; one word per generated token),
    turn k's prompt is turn k-1's prompt, its generated reply and the next user turn, to the token."""
    workload = PromptSetWorkload(path=str(mt_bench_file(tmp_path)), format="mt_bench", max_tokens=12)
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 2)
    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "0.02"}) as server:
        result = run_load(server.url, LoadLevel(concurrency=2, requests=9), workload, calibration_streams=2)
    assert result.num_errors == 0 and len(result.records) == 9
    by_id = {r.request_id: r for r in result.records}
    later = [r for r in result.records if r.turn]
    assert later
    for record in later:
        base = record.request_id.split(".")[0]
        before = by_id[base if record.turn == 1 else f"{base}.{record.turn - 1}"]
        words = len(CONVERSATIONS[0]["turns"][record.turn].split())  # type: ignore[index]
        reply_words = before.completion_tokens - (before.finish_reason == "stop")  # EOS prints no word
        assert record.prompt_tokens == before.prompt_tokens + reply_words + words + 8


def test_warmup_sends_exactly_its_count_when_conversations_have_turns(tmp_path: Path) -> None:
    """4 warmup requests of 3-turn conversations are 4 requests (a whole conversation and the first turn of
    the next), not every turn of each conversation started: warmup is the level's count, kept out of the
    measured rows, and the measured requests follow it."""
    workload = PromptSetWorkload(path=str(mt_bench_file(tmp_path)), format="mt_bench", max_tokens=16)
    with RecordingChatServer().running() as server:
        level = LoadLevel(concurrency=1, requests=3, warmup_requests=4)
        result = run_load(server.url, level, workload, calibration_streams=2)
    assert len(server.bodies) == 7
    assert sorted(r.turn for r in result.warmup_records) == [0, 0, 1, 2]
    assert all(r.warmup for r in result.warmup_records) and not any(r.warmup for r in result.records)
    assert len(result.records) == 3
