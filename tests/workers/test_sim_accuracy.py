"""Measured behaviour of the simulated server against its ground truth, and SGLang's own client on it."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import orjson
import pytest

from tests.launch_args import chain_launch_args
from workers.node.launcher import start_sim
from workers.sglang import SpecParams, api
from workers.sim.model import (
    DEFAULT_PROFILE,
    DraftShape,
    Load,
    depth_accept_probs,
    expected_accept_length,
    ground_truth,
)
from workers.sim.tokenizer import write_word_tokenizer

SCALE = 0.5  # slow enough that a few ms of scheduling noise on a busy 2-core box stays well under 3%
STEPS = 7  # a deep chain: topk 1, 8 draft tokens


@dataclass(frozen=True)
class Measured:
    tpot_s: float  # client-side, mean over requests, in simulated seconds
    reported_accept_length: float  # mean of meta_info spec_accept_length


async def closed_loop(url: str, load: Load, scale: float) -> Measured:
    """``load.concurrency`` clients send streamed /generate requests back to back, timing each chunk."""
    tpots: list[float] = []
    accepts: list[float] = []
    remaining = [load.num_requests]
    prompt = " ".join(["word"] * load.input_len)
    body = {
        "text": prompt,
        "sampling_params": {
            "max_new_tokens": load.output_len,
            "ignore_eos": True,
            "temperature": load.temperature,
        },
        "stream": True,
    }

    async def client(session: aiohttp.ClientSession) -> None:
        while remaining[0] > 0:
            remaining[0] -= 1
            arrivals: list[int] = []
            async with session.post(url + api.GENERATE, json=body) as reply:
                async for line in reply.content:
                    if line.startswith(b"data: {"):
                        arrivals.append(time.perf_counter_ns())
                        meta = orjson.loads(line[6:])["meta_info"]
            tpots.append((arrivals[-1] - arrivals[0]) / 1e9 / scale / (load.output_len - 1))
            accepts.append(meta[api.SPEC_ACCEPT_LENGTH])

    async with aiohttp.ClientSession() as session:
        await asyncio.gather(*(client(session) for _ in range(load.concurrency)))
    return Measured(sum(tpots) / len(tpots), sum(accepts) / len(accepts))


@pytest.mark.parametrize("load", [Load(1, 64, 128, 14), Load(8, 64, 128, 48)], ids=["c1", "c8"])
def test_measured_tpot_and_accept_length_match_ground_truth_when_run_is_seeded(
    kimi_target, eagle3_draft, load
):
    """A seeded run's client-measured TPOT and accept length are within 3% of ground_truth()."""
    env = {"SPECSWEEP_SIM_TIME_SCALE": str(SCALE), "SPECSWEEP_SIM_SEED": "11"}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, STEPS), env=env) as handle:
        measured = asyncio.run(closed_loop(handle.url, load, SCALE))
        info = json.loads(urllib.request.urlopen(handle.url + api.SERVER_INFO, timeout=10).read())
    truth = ground_truth(DEFAULT_PROFILE, SpecParams("EAGLE3", STEPS, 1, STEPS + 1, 48), load)
    assert measured.tpot_s == pytest.approx(truth.tpot_s, rel=0.03)
    assert measured.reported_accept_length == pytest.approx(truth.reported_accept_length, rel=0.03)
    server_average = info[api.SERVER_INFO_INTERNAL_STATES][0][api.AVG_SPEC_ACCEPT_LENGTH]
    assert server_average == pytest.approx(truth.accept_length, rel=0.03)


def test_measured_best_config_flips_between_concurrency_one_and_forty_eight(kimi_target, eagle3_draft):
    """The crossover is real, not only in the formula: deep beats shallow alone, loses at 48 clients."""
    scale = 0.5  # slow enough that 48 streams stay far below the server's chunk rate on a busy machine
    env = {"SPECSWEEP_SIM_TIME_SCALE": str(scale), "SPECSWEEP_SIM_SEED": "5"}
    results = {}
    for steps in (1, STEPS):
        with start_sim(chain_launch_args(kimi_target, eagle3_draft, steps), env=env) as handle:
            for load in (Load(1, 64, 96, 4), Load(48, 64, 96, 48)):
                results[steps, load.concurrency] = asyncio.run(closed_loop(handle.url, load, scale)).tpot_s
    assert results[STEPS, 1] < 0.8 * results[1, 1]
    assert results[1, 48] < 0.8 * results[STEPS, 48]


@pytest.fixture(scope="module")
def word_tokenizer(tmp_path_factory) -> Path:
    return write_word_tokenizer(tmp_path_factory.mktemp("tokenizer"))


def test_sglang_benchmark_client_runs_clean_and_reports_intended_accept_length(
    kimi_target, eagle3_draft, sglang_python, word_tokenizer, tmp_path
):
    """`python -m sglang.benchmark.serving --backend sglang` (SGLang 0.5.23's own client) runs unchanged:
    every request succeeds and the accept length it prints is the one the profile intends."""
    steps = 5
    env = {"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_SEED": "3"}
    with start_sim(chain_launch_args(kimi_target, eagle3_draft, steps), env=env) as handle:
        done = subprocess.run(
            [
                sglang_python,
                "-m",
                "sglang.benchmark.serving",
                "--backend",
                "sglang",
                "--base-url",
                handle.url,
                "--dataset-name",
                "random-ids",
                "--tokenizer",
                str(word_tokenizer),
                "--random-input-len",
                "64",
                "--random-output-len",
                "256",
                "--random-range-ratio",
                "1.0",
                "--num-prompts",
                "48",
                "--max-concurrency",
                "8",
                "--flush-cache",
                "--disable-tqdm",
                "--output-file",
                str(tmp_path / "result.jsonl"),
            ],
            capture_output=True,
            text=True,
            timeout=240,
            env={"PATH": os.environ.get("PATH", ""), "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"},
            cwd=tmp_path,
        )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = done.stdout
    assert re.search(r"^Successful requests:\s+48\s*$", report, re.MULTILINE), report[-3000:]
    assert re.search(r"^Total generated tokens:\s+12288\s*$", report, re.MULTILINE)
    assert re.search(r"^Total generated tokens \(retokenized\):\s+12288\s*$", report, re.MULTILINE)
    printed = float(re.search(r"^Accept length:\s+([0-9.]+)", report, re.MULTILINE).group(1))
    intended = expected_accept_length(
        depth_accept_probs(DEFAULT_PROFILE, DraftShape(steps, 1, steps + 1), 0.0)
    )
    assert printed == pytest.approx(intended, rel=0.03)
