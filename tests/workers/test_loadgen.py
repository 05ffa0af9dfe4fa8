"""The load generator against the simulated SGLang server: exact tokens and acceptance, timing, loops."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from tests.launch_args import chain_launch_args
from workers.job import LoadLevel
from workers.load.generator import LoadResult, auto_processes, run_load
from workers.load.workloads import PromptSetWorkload, RandomIdsWorkload
from workers.node.launcher import ServerProcess, start_sim

FIXTURES = Path(__file__).parents[1] / "fixtures"
SPEC_ARGS = chain_launch_args(
    FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 3, "--max-running-requests", "256"
)


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerProcess]:
    """The default preset (acceptance varies per step) at 1/4 of real time: steps of about 2-3 ms."""
    with start_sim(SPEC_ARGS, env={"SPECSWEEP_SIM_TIME_SCALE": "0.25"}) as server:
        yield server


@pytest.fixture(scope="module")
def fast_sim() -> Iterator[ServerProcess]:
    """The same server at 1/50 of real time, for request-rate tests."""
    with start_sim(SPEC_ARGS, env={"SPECSWEEP_SIM_TIME_SCALE": "0.02"}) as server:
        yield server


@pytest.fixture(scope="module")
def random_ids_run(sim: ServerProcess) -> LoadResult:
    workload = RandomIdsWorkload(input_tokens=16, output_tokens=24, output_tokens_max=64, seed=3)
    level = LoadLevel(concurrency=8, requests=32, warmup_requests=4, flush_cache=True)
    return run_load(sim.url, level, workload, calibration_streams=4)


def _check_tokens_and_acceptance(result: LoadResult) -> None:
    """Per request: chunk token deltas add up to the server's count and rebuild its acceptance stats.

    Each chunk after the prefill's is one verify step that accepted ``tokens - 1`` drafts; only the last
    step may have accepted more than it kept (SGLang counts the whole accepted run when max_new_tokens
    cuts the output), so the server's histogram is the chunks' plus one step at ``last_k >= tokens - 1``.
    """
    for r in result.records:
        assert r.error_type is None, r.error_message
        tokens = r.chunk_tokens or []
        assert sum(tokens) == r.completion_tokens
        assert tokens[0] == 1  # the prefill's token; then one chunk per verify step
        assert r.spec_verify_ct == len(tokens) - 1
        assert r.spec_accept_length == r.completion_tokens / r.spec_verify_ct
        kept = [t - 1 for t in tokens[1:]]
        server = np.asarray(r.spec_correct_drafts_histogram)
        from_chunks = np.bincount(kept[:-1], minlength=len(server))
        assert len(from_chunks) == len(server)
        rest = server - from_chunks
        assert rest.min() == 0 and rest.sum() == 1  # exactly one step left: the last one
        last_k = int(np.argmax(rest))
        assert last_k >= kept[-1]
        assert r.spec_num_correct_drafts == sum(kept[:-1]) + last_k
        assert r.spec_num_proposed_drafts == r.spec_verify_ct * 3
        assert r.spec_accept_rate == r.spec_num_correct_drafts / r.spec_num_proposed_drafts


def test_run_load_matches_server_meta_info_when_sending_random_ids(random_ids_run: LoadResult) -> None:
    """Completion tokens equal max_new_tokens and the final meta_info; acceptance per step is exact."""
    workload = RandomIdsWorkload(input_tokens=16, output_tokens=24, output_tokens_max=64, seed=3)
    assert len(random_ids_run.records) == 32
    assert random_ids_run.cache_flushed is True
    assert len(random_ids_run.warmup_records) == 4
    assert all(r.warmup for r in random_ids_run.warmup_records)
    for r in random_ids_run.records:
        index = int(r.request_id[1:])
        assert r.completion_tokens == workload.request(index).expected_output_tokens
        assert (r.prompt_tokens, r.finish_reason, r.endpoint) == (16, "length", "/generate")
        assert (r.cached_tokens, r.category, r.dataset) == (0, "random_ids", None)  # meta_info's count
    _check_tokens_and_acceptance(random_ids_run)
    accept_lengths = {r.spec_accept_length for r in random_ids_run.records}
    assert len(accept_lengths) > 5  # acceptance really varies per request: nothing is assumed


def test_run_load_itl_agrees_with_server_chunk_stamps_when_streaming(random_ids_run: LoadResult) -> None:
    """Client gaps per step and per token match the gaps between the server's send stamps."""
    step_errors = []
    for r in random_ids_run.records:
        server = np.diff(np.asarray(r.server_chunk_ns)) / 1e6
        client = np.asarray(r.itl_per_step_ms)
        assert len(client) == len(server) == len(r.chunk_tokens or []) - 1
        step_errors.extend(np.abs(client - server).tolist())
        per_token = np.repeat(server / np.asarray(r.chunk_tokens[1:]), r.chunk_tokens[1:])
        assert len(r.itl_per_token_ms or []) == len(per_token) == r.completion_tokens - 1
        assert np.median(np.abs(np.asarray(r.itl_per_token_ms) - per_token)) < 1.0
        assert r.ttft_ms >= r.server_chunk_ns[0] / 1e6  # arrival after the server sent it
    # Margins for a loaded 2-core box: typical error well under a millisecond, tail under 10 ms.
    assert np.median(step_errors) < 1.0
    assert np.percentile(step_errors, 90) < 10.0


def test_run_load_tpot_agrees_with_server_chunk_stamps_when_streaming(random_ids_run: LoadResult) -> None:
    """A request's TPOT is its decode time over its tokens after the first, as the server's stamps give it.

    Every ``best`` TPOT figure comes from this field: a scaled or shifted formula must fail here. The
    server's own send stamps give the same quantity, (last - first) / (completion - 1), independently of
    the client's clock; the client's figure also equals its own step gaps summed over the same tokens.
    """
    ratios = []
    for r in random_ids_run.records:
        assert r.tpot_ms is not None and r.completion_tokens is not None and r.completion_tokens > 1
        decode_tokens = r.completion_tokens - 1
        assert r.tpot_ms * decode_tokens == pytest.approx(sum(r.itl_per_step_ms or []), rel=1e-9)
        stamps = r.server_chunk_ns or []
        server_tpot_ms = (stamps[-1] - stamps[0]) / 1e6 / decode_tokens
        ratios.append(r.tpot_ms / server_tpot_ms)
    # Steps are about 4 ms and the client's error is well under a millisecond per request (a loaded box
    # may add a few): the median ratio is within 5% of 1, and no request is off by a factor.
    assert abs(np.median(ratios) - 1.0) < 0.05
    assert min(ratios) > 0.5 and max(ratios) < 2.0


def test_run_load_reads_chat_stream_when_prompts_come_from_jsonl(sim: ServerProcess, tmp_path: Path) -> None:
    """ShareGPT and prompt lines go to the chat route; usage deltas and sglext give the same exactness."""
    prompts = tmp_path / "prompts.jsonl"
    lines = [{"prompt": f"Question {i}: explain speculative decoding."} for i in range(3)]
    lines.append(
        {"conversations": [{"from": "human", "value": "Hi there"}, {"from": "gpt", "value": "Hello"}]}
    )
    prompts.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    workload = PromptSetWorkload(path=str(prompts), max_tokens=40)
    result = run_load(sim.url, LoadLevel(concurrency=4, requests=8), workload, calibration_streams=4)
    assert len(result.records) == 8
    for r in result.records:
        assert r.endpoint == "/v1/chat/completions"
        assert r.finish_reason in ("length", "stop")
        assert r.prompt_tokens and r.prompt_tokens > 0
        assert r.completion_tokens <= 40
    _check_tokens_and_acceptance(result)


def _in_flight(result: LoadResult, times_ns: np.ndarray) -> np.ndarray:
    starts = np.asarray([r.start_ns for r in result.records])
    ends = np.asarray([r.end_ns for r in result.records])
    return ((starts[None, :] <= times_ns[:, None]) & (times_ns[:, None] < ends[None, :])).sum(axis=1)


def test_run_load_holds_n_in_flight_when_closed_loop(sim: ServerProcess) -> None:
    """Closed loop: between the first request's end and the last request's start, N are in flight."""
    workload = RandomIdsWorkload(input_tokens=8, output_tokens=64)
    result = run_load(sim.url, LoadLevel(concurrency=12, requests=96), workload, calibration_streams=4)
    assert result.num_errors == 0 and len(result.records) == 96
    first_end = min(r.end_ns for r in result.records)
    last_start = max(r.start_ns for r in result.records)
    samples = np.linspace(first_end, last_start, 2000)
    counts = _in_flight(result, samples)
    assert counts.max() == 12  # never more than N
    # N except for the instants between one end and the next send (margins for a loaded 2-core box).
    assert np.median(counts) == 12
    assert np.mean(counts >= 11) > 0.9


def test_run_load_starts_streams_evenly_when_ramp_up_is_given(sim: ServerProcess) -> None:
    """Stream g of 8 starts at g/8 of a 0.8 s ramp, across two client processes: while the ramp runs,
    k + 1 requests are in flight in its (k+1)-th eighth, never all 8 at once; the window opens at the
    ramp's end and closes when the first stream stops, and only requests sent inside it are in_window."""
    # outlasts the ramp even alone: on the default preset 700 tokens take 0.87 s at batch 1, 1.6 s at 8
    # (400 took 0.9 s on the old linear profile, but 0.5 s alone on the preset: a second request then
    # started before the last stream's first)
    workload = RandomIdsWorkload(input_tokens=8, output_tokens=700)
    level = LoadLevel(concurrency=8, duration_s=2.0, ramp_up_s=0.8, processes=2)
    result = run_load(sim.url, level, workload, calibration_streams=4)
    assert result.num_errors == 0
    firsts = sorted(r.start_ns for r in result.records)[:8]  # each stream's first request
    for k, start_ns in enumerate(firsts):  # never early; late by less than the spacing (a loaded box)
        assert k * 0.1e9 <= start_ns < (k + 0.9) * 0.1e9, (k, start_ns)
    assert result.window_start_s == 0.8
    last_send = max(r.start_ns for r in result.records)
    first_stop = min(r.end_ns for r in result.records if r.end_ns >= last_send)
    assert result.window_end_s == first_stop / 1e9 and result.window_end_s >= 2.0
    assert {r.in_window for r in result.records} == {True, False}
    for r in result.records:
        assert r.in_window == (r.start_ns >= 0.8e9)
        arrived = [r.start_ns + t for t in r.chunk_arrival_ns or []]
        inside = [n for t, n in zip(arrived, r.chunk_tokens or [], strict=True) if 0.8e9 <= t <= first_stop]
        assert r.window_tokens == sum(inside)


@pytest.mark.parametrize("arrival", ["constant", "poisson"])
def test_run_load_hits_target_rate_when_open_loop(fast_sim: ServerProcess, arrival: str) -> None:
    """Open loop: 2,000 requests at 400/s are sent at their schedule's rate within 2%, each with its
    scheduled time (the schedule's own statistics are checked in test_arrivals)."""
    workload = RandomIdsWorkload(input_tokens=8, output_tokens=2)
    level = LoadLevel(rate_rps=400, arrival=arrival, requests=2000, seed=7)
    result = run_load(fast_sim.url, level, workload, calibration_streams=4)
    assert len(result.records) == 2000 and result.num_errors == 0
    offered = 2000 / (max(r.scheduled_ns for r in result.records) / 1e9)  # the schedule's own draw
    assert result.achieved_rate_rps == pytest.approx(offered, rel=0.02)
    assert offered == pytest.approx(400, rel=0.02 if arrival == "constant" else 0.1)
    lateness_ms = np.asarray([(r.start_ns - r.scheduled_ns) / 1e6 for r in result.records])
    assert lateness_ms.min() >= 0
    assert np.median(lateness_ms) < 5.0


def test_run_load_merges_shards_when_several_processes(sim: ServerProcess) -> None:
    """Two client processes start together and their records merge: every request once, N in flight."""
    workload = RandomIdsWorkload(input_tokens=8, output_tokens=48)
    level = LoadLevel(concurrency=8, requests=64, processes=2)
    result = run_load(sim.url, level, workload, calibration_streams=4)
    assert result.processes == 2
    assert sorted(r.request_id for r in result.records) == [f"r{i:07d}" for i in range(64)]
    assert result.num_errors == 0
    first_end = min(r.end_ns for r in result.records)
    last_start = max(r.start_ns for r in result.records)
    counts = _in_flight(result, np.linspace(first_end, last_start, 500))
    assert counts.max() == 8 and np.median(counts) == 8


def test_shards_split_a_closed_loop_count_by_their_streams(sim: ServerProcess) -> None:
    """6 streams x 3 requests over 4 processes (2, 2, 1, 1 streams) lasts three request times, not four.

    Splitting the 18 requests evenly (5, 5, 4, 4) would leave each one-stream process a fourth request
    to run alone after the others finish.
    """
    workload = RandomIdsWorkload(input_tokens=8, output_tokens=48)
    level = LoadLevel(concurrency=6, requests=18, processes=4)
    result = run_load(sim.url, level, workload, calibration_streams=4)
    assert sorted(r.request_id for r in result.records) == [f"r{i:07d}" for i in range(18)]
    assert result.num_errors == 0
    span_ms = (max(r.end_ns for r in result.records) - min(r.start_ns for r in result.records)) / 1e6
    assert span_ms < 3.5 * float(np.median([r.e2e_ms for r in result.records]))


@pytest.mark.parametrize(
    ("cores", "concurrency", "expected"),
    [(2, 1024, 1), (16, 64, 1), (16, 65, 2), (16, 256, 4), (16, 1024, 8), (64, 1024, 16), (1, 4096, 1)],
)
def test_auto_processes_uses_at_most_half_the_cores_when_concurrency_is_high(
    monkeypatch: pytest.MonkeyPatch, cores: int, concurrency: int, expected: int
) -> None:
    """One client process per 64 streams, never more than half the cores (the server needs the rest); a
    count of processes, which ``run_load`` starts one by one (a float would not start any)."""
    monkeypatch.setattr("os.cpu_count", lambda: cores)
    processes = auto_processes(LoadLevel(concurrency=concurrency, requests=1))
    assert (processes, type(processes)) == (expected, int)
    assert auto_processes(LoadLevel(concurrency=concurrency, requests=1, processes=3)) == 3
