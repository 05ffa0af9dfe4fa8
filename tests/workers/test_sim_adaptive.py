"""The simulator's --speculative-adaptive: SGLang's own controller decisions, and depth per batch size."""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path
from typing import Any

import pytest

from workers.node.launcher import start_sim
from workers.sim.adaptive import DEFAULT_ADAPTIVE_CONFIG, AdaptiveSchedule

# Feeds a recorded sequence of verify steps to SGLang 0.5.23's own AdaptiveSpeculativeParams (resolver
# venv) and prints, per step, the depth the batch ran with and what on_verify_complete returned.
SGLANG_REPLAY = """
import json, sys, tempfile
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams
case = json.load(sys.stdin)
with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
    json.dump(case["config"], f)
params = AdaptiveSpeculativeParams(case["initial"], f.name if case["config"] is not None else None)
out = []
for bs, drafts in case["events"]:
    out.append([params.get_steps_for_batch(bs), params.on_verify_complete(drafts, batch_size=bs)])
print(json.dumps(out))
"""

# Every knob away from its default, a 0-step candidate, shared defaults and per-slot overrides.
CONFIG = {
    "ema_alpha": 0.3,
    "update_interval": 3,
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25, "warmup_batches": 4},
    "4": {"candidate_steps": [0, 1, 2, 4], "up_hysteresis": 0.2, "down_hysteresis": 0.1, "warmup_batches": 2},
    "16": {"candidate_steps": [0, 3], "ceiling_coeff": 1.5, "warmup_batches": 0},
    "48": {"candidate_steps": [2, 6, 4], "ceiling_coeff": 0.8},
}


def recorded_steps(
    seed: int, count: int, initial: int, config: dict[str, Any] | None
) -> list[tuple[int, list[int]]]:
    """Verify steps over phases of good and bad drafting at batch sizes across every slot, as a server
    records them: no request accepts more drafts than the depth its batch ran (none at depth 0)."""
    rng = random.Random(seed)
    server = AdaptiveSchedule(initial, config if config is not None else DEFAULT_ADAPTIVE_CONFIG)
    events = []
    for i in range(count):
        batch = rng.choice([1, 2, 3, 4, 7, 15, 16, 30, 48, 64])
        depth = server.steps_for_batch(batch)
        accept = 0.9 if (i // 60) % 2 == 0 else 0.3
        drafts = []
        for _ in range(batch):
            n = 0
            while n < depth and rng.random() < accept:
                n += 1
            drafts.append(n)
        server.on_verify_complete(drafts, batch)
        events.append((batch, drafts))
    return events


def ours(
    initial: int, config: dict[str, Any] | None, events: list[tuple[int, list[int]]]
) -> list[list[int | None]]:
    schedule = AdaptiveSchedule(initial, config if config is not None else DEFAULT_ADAPTIVE_CONFIG)
    out: list[list[int | None]] = []
    for batch, drafts in events:
        out.append([schedule.steps_for_batch(batch), schedule.on_verify_complete(drafts, batch)])
    return out


@pytest.mark.parametrize(("initial", "config"), [(3, CONFIG), (5, CONFIG), (3, None)])
def test_adaptive_schedule_decides_as_sglang_when_replaying_recorded_verify_steps(
    sglang_python: str, initial: int, config: dict[str, Any] | None
) -> None:
    """Per verify step, the depth the batch runs with and every switch equal SGLang 0.5.23's own
    AdaptiveSpeculativeParams fed the same sequence (its config file, or its default table)."""
    events = recorded_steps(initial, 600, initial, config)
    done = subprocess.run(
        [sglang_python, "-c", SGLANG_REPLAY],
        input=json.dumps({"config": config, "initial": initial, "events": events}),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    mine = ours(initial, config, events)
    assert mine == theirs
    switches = {step for _, step in mine if step is not None}
    assert len(switches) >= 3  # the sequence moves depths both ways
    if config is not None:
        assert 0 in switches  # and through the no-drafting candidate


def test_adaptive_schedule_routes_below_first_threshold_to_smallest_slot() -> None:
    """A batch smaller than every threshold goes to the smallest slot; others to the largest at or below."""
    schedule = AdaptiveSchedule(3, {"4": {"candidate_steps": [3]}, "16": {"candidate_steps": [0]}})
    assert [schedule.steps_for_batch(b) for b in (1, 4, 15, 16, 500)] == [3, 3, 3, 0, 0]


def _accept_lengths(url: str, concurrency: int, requests: int) -> list[float]:
    """Per request, completion tokens per verify step, from concurrent /generate calls."""
    import asyncio

    import aiohttp

    async def run() -> list[float]:
        async with aiohttp.ClientSession() as session:
            sem = asyncio.Semaphore(concurrency)

            async def one(i: int) -> float:
                async with sem:
                    body = {
                        "text": f"write python code {i}",
                        "sampling_params": {"max_new_tokens": 64, "temperature": 0, "ignore_eos": True},
                    }
                    async with session.post(f"{url}/generate", json=body) as reply:
                        meta: dict[str, int] = (await reply.json())["meta_info"]
                        return meta["completion_tokens"] / meta["spec_verify_ct"]

            return await asyncio.gather(*(one(i) for i in range(requests)))

    return asyncio.run(run())


def test_sim_drafts_each_slots_depth_when_launched_adaptive(
    kimi_target: Path, eagle3_draft: Path, tmp_path: Path
) -> None:
    """An adaptive launch drafts 5 steps for a lone request and none at batch 8 or more: requests run
    alone accept several tokens per verify step, requests run 16 at a time about one."""
    config = tmp_path / "adaptive.json"
    config.write_text(json.dumps({"1": {"candidate_steps": [5]}, "8": {"candidate_steps": [0]}}))
    args = [
        "--model-path", str(kimi_target), "--tp-size", "8", "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(eagle3_draft), "--speculative-eagle-topk", "1",
        "--speculative-num-steps", "5", "--speculative-num-draft-tokens", "6",
        "--speculative-adaptive", "--speculative-adaptive-config", str(config),
    ]  # fmt: skip
    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_SEED": "1"}) as server:
        alone = _accept_lengths(server.url, 1, 4)
        crowded = _accept_lengths(server.url, 16, 32)
    # A static 5-step chain accepts about 4 tokens per verify step whatever the batch. Once the 16
    # clients' requests are in, every decode step runs at batch >= 8 (slot "8": no drafts); only the
    # steps while they still arrive or drain (more of them on a busy machine) draft 5 deep.
    assert min(alone) > 2.5
    assert sum(crowded) / len(crowded) < 1.5
