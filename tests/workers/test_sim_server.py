"""The simulated SGLang server over HTTP: the mission's launches, every endpoint, both client families."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from workers.node.launcher import ServerProcess, start_sim
from workers.node.preflight import pick_free_port
from workers.sglang import api

REPO = Path(__file__).resolve().parents[2]
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
FAST = {"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_SEED": "1"}


def mission_args(kimi_target: Path, eagle3_draft: Path, *extra: str) -> list[str]:
    """The mission's launch, up to the flag that differs between its three variants."""
    return [
        "--model-path",
        str(kimi_target),
        "--tp-size",
        "8",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(eagle3_draft),
        "--speculative-eagle-topk",
        "1",
        *extra,
    ]


def get_json(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(url, timeout=10) as reply:
        return json.loads(reply.read())


def post(url: str, body: dict[str, Any], timeout: float = 30) -> tuple[int, bytes]:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def sse_events(raw: bytes) -> list[bytes]:
    return [line[len(b"data: ") :] for line in raw.split(b"\n\n") if line.startswith(b"data: ")]


def run_cli(args: list[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "workers.sim", *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
    )


@pytest.fixture(scope="module")
def server(kimi_target: Path, eagle3_draft: Path):
    """The mission's third launch (topk 1, 16 draft tokens, 1 step), metrics on, 20x faster than real."""
    args = mission_args(kimi_target, eagle3_draft, "--speculative-num-draft-tokens", "16")
    args += ["--speculative-num-steps", "1", "--enable-metrics"]
    with start_sim(args, env=FAST) as handle:
        yield handle


# --- the mission's three launches ----------------------------------------------------------------------
def test_cli_exits_2_with_usage_when_flag_is_unknown(kimi_target, eagle3_draft):
    """--num-speculative-tokens is not an SGLang flag: argparse's usage and error on stderr, exit 2."""
    done = run_cli(mission_args(kimi_target, eagle3_draft, "--num-speculative-tokens", "16"))
    assert done.returncode == 2
    assert done.stderr.startswith("usage: ")
    assert "error: unrecognized arguments: --num-speculative-tokens" in done.stderr


def test_cli_raises_bare_assertion_error_when_steps_missing(kimi_target, eagle3_draft):
    """Draft tokens and topk without steps: SGLang's resolver dies with a bare AssertionError, exit 1."""
    done = run_cli(mission_args(kimi_target, eagle3_draft, "--speculative-num-draft-tokens", "16"))
    assert done.returncode == 1
    assert done.stderr.startswith("Traceback (most recent call last):")
    assert done.stderr.rstrip().splitlines()[-1] == "AssertionError"


def test_server_info_reports_two_draft_tokens_when_topk_one_rewrites_sixteen(server):
    """topk 1 rewrites 16 draft tokens to steps + 1 = 2; max_running_requests defaults to 48."""
    info = get_json(server.url + api.SERVER_INFO)
    assert info[api.SPEC_NUM_DRAFT_TOKENS] == 2
    assert (info[api.SPEC_NUM_STEPS], info[api.SPEC_EAGLE_TOPK]) == (1, 1)
    assert info[api.MAX_RUNNING_REQUESTS] == 48
    assert info[api.SERVER_INFO_VERSION] == "0.5.23"
    assert info["tp_size"] == 8
    assert get_json(server.url + api.SERVER_INFO_OLD)[api.SPEC_NUM_DRAFT_TOKENS] == 2
    assert "speculative_num_draft_tokens is adjusted to speculative_num_steps + 1" in server.log_text()


# --- native endpoints --------------------------------------------------------------------------------------
def test_generate_streams_cumulative_chunks_with_spec_stats_on_final_chunk_only(server):
    """One chunk per verify step, cumulative text/ids, [DONE]; spec_* fields only when finished."""
    status, raw = post(
        server.url + api.GENERATE,
        {
            "text": "one two three",
            "sampling_params": {"max_new_tokens": 40, "ignore_eos": True},
            "stream": True,
        },
    )
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == api.SSE_DONE
    chunks = [json.loads(e) for e in events[:-1]]
    metas = [c["meta_info"] for c in chunks]
    counts = [m[api.META_COMPLETION_TOKENS] for m in metas]
    assert counts == sorted(counts) and counts[-1] == 40
    assert all(
        len(c["output_ids"]) == m[api.META_COMPLETION_TOKENS] for c, m in zip(chunks, metas, strict=True)
    )
    assert all(chunks[i + 1]["text"].startswith(chunks[i]["text"]) for i in range(len(chunks) - 1))
    assert all(m[api.META_PROMPT_TOKENS] == 3 for m in metas)
    assert all(api.SPEC_VERIFY_CT not in m and m[api.META_FINISH_REASON] is None for m in metas[:-1])
    final = metas[-1]
    assert final[api.META_FINISH_REASON] == {"type": "length", "length": 40}
    verify = final[api.SPEC_VERIFY_CT]
    assert verify == len(chunks) - 1  # the first chunk comes from prefill, each other from one verify step
    assert final[api.SPEC_ACCEPT_LENGTH] == pytest.approx(40 / verify)
    assert final[api.SPEC_NUM_PROPOSED_DRAFTS] == verify * 1
    assert final[api.SPEC_ACCEPT_RATE] == pytest.approx(final[api.SPEC_NUM_CORRECT_DRAFTS] / verify)
    histogram = final[api.SPEC_CORRECT_DRAFTS_HISTOGRAM]
    assert sum(histogram) == verify
    # SGLang counts whole accepted runs: the last step may accept more than max_new_tokens keeps
    assert (
        sum(k * n for k, n in enumerate(histogram)) == final[api.SPEC_NUM_CORRECT_DRAFTS] >= 40 - 1 - verify
    )
    assert all(m[api.SIM_SEND_NS] >= m[api.SIM_SCHEDULED_NS] > 0 for m in metas)


def _shape(events: list[bytes]) -> list[tuple[int, list[str], list[str]]]:
    """Per chunk: tokens it adds, its keys, its meta_info keys (in order; the simulator's stamps left out)."""
    stamps = {api.SIM_SEND_NS, api.SIM_SCHEDULED_NS}
    chunks = [json.loads(e) for e in events if e != api.SSE_DONE]
    counts = [0] + [c["meta_info"][api.META_COMPLETION_TOKENS] for c in chunks]
    return [
        (b - a, list(c), [k for k in c["meta_info"] if k not in stamps])
        for a, b, c in zip(counts[:-1], counts[1:], chunks, strict=True)
    ]


def test_generate_stream_has_sglang_shape_when_compared_with_recorded_fixture(server):
    """The simulator's /generate stream is shaped as SGLang 0.5.23's (fixtures/sglang-0.5.23, traced in
    docs/sim_server.md): the prefill's one token alone, then one chunk per verify step, the same keys in
    the same order, spec_* only on the final chunk, [DONE] last."""
    fixture = sse_events((FIXTURES / "sglang-0.5.23" / "generate_spec_stream.sse").read_bytes())
    status, raw = post(
        server.url + api.GENERATE,
        {
            "text": "one two three",
            "sampling_params": {"max_new_tokens": 24, "ignore_eos": True},
            "stream": True,
        },
    )
    assert status == 200
    events = sse_events(raw)
    assert events[-1] == fixture[-1] == api.SSE_DONE
    ours, theirs = _shape(events), _shape(fixture)
    assert ours[0][0] == theirs[0][0] == 1  # the prefill's token comes alone
    assert [keys for _, keys, _ in ours] == [theirs[0][1]] * len(ours)
    assert {tuple(meta) for _, _, meta in ours[:-1]} == {tuple(theirs[0][2])}  # every chunk before the last
    assert ours[-1][2] == theirs[-1][2]  # the final chunk's meta_info, spec_* fields included, in order
    final = json.loads(events[-2])["meta_info"]
    assert final[api.SPEC_VERIFY_CT] == len(ours) - 1  # one chunk per verify step after the prefill's


def test_generate_replays_identical_acceptance_when_seed_and_prompt_repeat(kimi_target, eagle3_draft):
    """Acceptance is seeded per request: a fresh server with the same seed gives the same histogram."""
    args = mission_args(kimi_target, eagle3_draft, "--speculative-num-draft-tokens", "6")
    args += ["--speculative-num-steps", "5"]
    body = {"input_ids": [5, 6, 7, 8], "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}}
    runs = []
    for _ in range(2):
        with start_sim(args, env=FAST) as handle:
            runs.append([json.loads(post(handle.url + api.GENERATE, body)[1])["meta_info"] for _ in range(2)])
    assert [m[api.SPEC_CORRECT_DRAFTS_HISTOGRAM] for m in runs[0]] == [
        m[api.SPEC_CORRECT_DRAFTS_HISTOGRAM] for m in runs[1]
    ]
    assert runs[0][0][api.SPEC_CORRECT_DRAFTS_HISTOGRAM] != runs[0][1][api.SPEC_CORRECT_DRAFTS_HISTOGRAM]


def test_generate_stops_at_stop_string_when_given(server):
    """A stop string ends generation with finish_reason stop/matched, the text cut before it."""
    _, raw = post(server.url + api.GENERATE, {"text": "x", "sampling_params": {"max_new_tokens": 30}})
    words = json.loads(raw)["text"].split()
    stop = " " + words[3]
    _, raw = post(
        server.url + api.GENERATE, {"text": "x", "sampling_params": {"max_new_tokens": 30, "stop": stop}}
    )
    out = json.loads(raw)
    assert out["meta_info"][api.META_FINISH_REASON] == {"type": "stop", "matched": stop}
    assert out["text"].split() == words[:3]


def test_generate_answers_400_when_body_has_no_prompt(server):
    """Neither text nor input_ids: HTTP 400 with SGLang's message."""
    status, raw = post(server.url + api.GENERATE, {"sampling_params": {}})
    assert status == 400
    assert "Either text or input_ids" in json.loads(raw)["message"]


def test_health_model_info_and_models_describe_the_served_model(server, kimi_target):
    """/health 200 once loaded; /model_info and /v1/models name the target and its architecture."""
    with urllib.request.urlopen(server.url + api.HEALTH, timeout=10) as reply:
        assert reply.status == 200
    with urllib.request.urlopen(server.url + api.READY, timeout=10) as reply:
        assert reply.status == 200
    info = get_json(server.url + api.MODEL_INFO)
    assert info["model_path"] == str(kimi_target)
    assert info["architectures"] == ["DeepseekV3ForCausalLM"]
    assert get_json(server.url + api.MODEL_INFO_OLD) == info
    models = get_json(server.url + api.MODELS)
    assert models["data"][0]["id"] == str(kimi_target)
    assert models["data"][0]["max_model_len"] == 262144


def test_flush_cache_refuses_while_running_and_resets_average_when_idle(server):
    """/flush_cache: 400 with a request in flight; when idle 200 and avg_spec_accept_length is gone."""
    body = {"text": "a b", "sampling_params": {"max_new_tokens": 400, "ignore_eos": True}}
    for _ in range(3):
        post(
            server.url + api.GENERATE,
            {**body, "sampling_params": {"max_new_tokens": 100, "ignore_eos": True}},
        )
    state = get_json(server.url + api.SERVER_INFO)[api.SERVER_INFO_INTERNAL_STATES][0]
    assert 1.0 < state[api.AVG_SPEC_ACCEPT_LENGTH] <= 2.0
    long_request = threading.Thread(target=post, args=(server.url + api.GENERATE, body))
    long_request.start()
    try:
        busy = 0
        for _ in range(50):
            status, _ = post(server.url + api.FLUSH_CACHE, {})
            if status == 400:
                busy += 1
                break
        assert busy
    finally:
        long_request.join()
    status, text = post(server.url + api.FLUSH_CACHE, {})
    assert status == 200 and text.startswith(b"Cache flushed.")
    state = get_json(server.url + api.SERVER_INFO)[api.SERVER_INFO_INTERNAL_STATES][0]
    assert api.AVG_SPEC_ACCEPT_LENGTH not in state


def test_metrics_exposes_sglang_names_when_enabled(server):
    """--enable-metrics serves Prometheus text with SGLang's sglang: names."""
    post(
        server.url + api.GENERATE,
        {"text": "a", "sampling_params": {"max_new_tokens": 50, "ignore_eos": True}},
    )
    with urllib.request.urlopen(server.url + api.METRICS, timeout=10) as reply:
        text = reply.read().decode()
    for name in (
        api.METRIC_SPEC_ACCEPT_LENGTH,
        api.METRIC_SPEC_NUM_DRAFT_TOKENS,
        api.METRIC_SPEC_VERIFY_CALLS,
        api.METRIC_NUM_RUNNING,
        api.METRIC_TTFT + "_bucket",
        api.METRIC_ITL + "_count",
        api.METRIC_E2E + "_sum",
    ):
        assert f"\n{name}{{" in "\n" + text, name
    assert 'sglang:spec_num_draft_tokens{model_name="' in text and "} 2.0" in text


def test_metrics_absent_when_not_enabled(kimi_target):
    """Without --enable-metrics there is no /metrics route (404), as in SGLang."""
    with start_sim(["--model-path", str(kimi_target)], env=FAST) as handle:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(handle.url + api.METRICS, timeout=10)
        assert err.value.code == 404
        info = get_json(handle.url + api.SERVER_INFO)
        assert info[api.SPEC_ALGORITHM] is None
        assert api.AVG_SPEC_ACCEPT_LENGTH not in info[api.SERVER_INFO_INTERNAL_STATES][0]


# --- OpenAI routes with the openai package ---------------------------------------------------------------
def test_openai_chat_stream_carries_spec_details_in_extra_choiceless_chunk(server: ServerProcess):
    """Chat streaming with include_usage and return_spec_tokens_details, read by the openai client."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    stream = client.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": "say something"}],
        max_tokens=24,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True, api.RETURN_SPEC_TOKENS_DETAILS: True},
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert len(text.split()) == 24
    assert chunks[0].choices[0].delta.role == "assistant"
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    extra, usage = chunks[-2], chunks[-1]
    assert extra.choices == [] and usage.choices == []
    details = extra.model_extra[api.SGLEXT][api.SPEC_TOKENS_DETAILS]
    assert details[api.SPEC_ACCEPT_LENGTH] == pytest.approx(24 / details[api.SPEC_VERIFY_CT])
    assert usage.usage.completion_tokens == 24


def test_openai_completions_non_stream_returns_usage_and_sglext_when_asked(server):
    """/v1/completions without streaming: text, usage and sglext.spec_tokens_details."""
    import openai

    client = openai.OpenAI(base_url=server.url + "/v1", api_key="none")
    reply = client.completions.create(
        model="default",
        prompt="count with me",
        max_tokens=12,
        extra_body={"ignore_eos": True, api.RETURN_SPEC_TOKENS_DETAILS: True},
    )
    assert len(reply.choices[0].text.split()) == 12
    assert reply.choices[0].finish_reason == "length"
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (3, 12)
    assert reply.model_extra[api.SGLEXT][api.SPEC_TOKENS_DETAILS][api.SPEC_VERIFY_CT] >= 6


def test_openai_async_client_streams_concurrently_when_many_requests(server):
    """Sixteen concurrent streamed completions through openai's async client all finish."""
    import openai

    async def run() -> list[str]:
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="none")

        async def one(i: int) -> str:
            stream = await client.completions.create(
                model="default", prompt=f"p{i}", max_tokens=20, stream=True, extra_body={"ignore_eos": True}
            )
            return "".join([c.choices[0].text async for c in stream if c.choices])

        try:
            return await asyncio.gather(*(one(i) for i in range(16)))
        finally:
            await client.close()

    assert [len(t.split()) for t in asyncio.run(run())] == [20] * 16


def test_servers_share_one_port_when_reuse_port_is_set(kimi_target: Path):
    """Under SPECSWEEP_SIM_REUSE_PORT=1 two servers bind one port and the kernel spreads connections."""
    port = pick_free_port("127.0.0.1")
    args = ["--model-path", str(kimi_target)]
    env = {**FAST, "SPECSWEEP_SIM_REUSE_PORT": "1"}
    with (
        start_sim(args, env=env, port=port, shared_port=True) as first,
        start_sim(args, env=env, port=port, shared_port=True) as second,
    ):
        started: set[float] = set()
        deadline = time.monotonic() + 30  # the second is "healthy" as soon as the first answers
        while len(started) < 2 and time.monotonic() < deadline:
            started.add(get_json(first.url + api.SERVER_INFO)["startup_time"])  # a new connection each
        status, body = post(
            first.url + api.GENERATE, {"text": "a b c", "sampling_params": {"max_new_tokens": 4}}
        )
        assert first.popen.poll() is None and second.popen.poll() is None
    assert len(started) == 2
    assert status == 200 and json.loads(body)["meta_info"]["completion_tokens"] == 4
