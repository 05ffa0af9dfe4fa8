"""The simulator's speculative algorithms (workers/sim/algorithms.py): NEXTN drafts with the target's MTP
head, NGRAM accepts what the prompt repeats and runs no draft forward, STANDALONE pays for its size."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp

from workers.node.launcher import start_sim
from workers.sim.algorithms import (
    Drafting,
    drafting_of,
    ngram_depth_candidates,
    prompt_repetition,
    standalone_cost_scale,
)
from workers.sim.launch import resolve_launch
from workers.sim.model import DEFAULT_PROFILE, DraftShape, decode_step_seconds

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
SIM_ENV = {"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_SEED": "1"}
CHAIN = [
    "--speculative-num-steps",
    "3",
    "--speculative-eagle-topk",
    "1",
    "--speculative-num-draft-tokens",
    "4",
]


def _accept_lengths(url: str, prompts: list[str]) -> list[float]:
    """Per prompt, completion tokens per verify step of one /generate call."""

    async def run() -> list[float]:
        async with aiohttp.ClientSession() as session:
            out = []
            for prompt in prompts:
                body = {
                    "text": prompt,
                    "sampling_params": {"max_new_tokens": 96, "temperature": 0, "ignore_eos": True},
                }
                async with session.post(f"{url}/generate", json=body) as reply:
                    meta = (await reply.json())["meta_info"]
                    out.append(meta["completion_tokens"] / meta["spec_verify_ct"])
            return out

    return asyncio.run(run())


def test_prompt_repetition_counts_suffix_predictions_when_text_repeats() -> None:
    """A prompt that repeats a phrase is predicted by its own suffix; one of distinct tokens never is."""
    assert prompt_repetition(["a", "b", "c", "d", "e", "f", "g", "h"]) == 0.0
    repeated = "the cat sat on the mat " * 6
    assert prompt_repetition(repeated.split()) > 0.8
    assert prompt_repetition([1, 2]) == 0.0


def test_ngram_tree_fills_breadth_per_depth_when_sized() -> None:
    """SGLang's n-gram BFS tree: num_draft_tokens - 1 nodes, at most the breadth per depth."""
    assert ngram_depth_candidates(12, 10) == (10, 1)
    assert ngram_depth_candidates(6, 1) == (1, 1, 1, 1, 1)
    assert ngram_depth_candidates(1, 4) == ()


def test_drafting_of_tells_mtp_from_a_drafter_when_the_draft_is_the_target() -> None:
    """EAGLE with the target as its draft is the target's MTP head (what NEXTN resolves to); NGRAM has no
    draft forward; STANDALONE's forward costs layers x hidden^2 over a one-layer drafter at the target's width."""
    common = {"draft_config": None, "target_config": None}
    assert drafting_of("EAGLE", draft_path="/m", model_path="/m", **common) == Drafting("MTP")
    assert drafting_of("EAGLE", draft_path="/d", model_path="/m", **common) == Drafting("EAGLE")
    assert drafting_of("NGRAM", draft_path=None, model_path="/m", **common) == Drafting("NGRAM", 0.0)
    assert drafting_of(None, draft_path=None, model_path="/m", **common) is None
    small = {"num_hidden_layers": 16, "hidden_size": 2048}
    assert standalone_cost_scale(small, {"hidden_size": 4096}) == 16 * 2048**2 / 4096**2
    assert standalone_cost_scale({"text_config": small}, {"text_config": {"hidden_size": 2048}}) == 16


def test_sim_resolves_nextn_to_the_targets_mtp_head_when_launched_on_an_mtp_target() -> None:
    """--speculative-algorithm NEXTN on a DeepSeek-V3 target serves EAGLE with the target as its draft,
    and the simulator drafts with the MTP head's acceptance (first depth above the drafter's, deeper below)."""
    served = resolve_launch(
        ["--model-path", str(FIXTURES / "deepseek-v3"), "--speculative-algorithm", "NEXTN", *CHAIN]
    )
    assert served.spec.speculative_algorithm == "EAGLE"
    assert served.drafting == Drafting("MTP")
    drafter = (0.8, 0.8, 0.8)
    mtp = served.drafting.depth_probs(drafter)
    assert mtp[0] > drafter[0] and mtp[2] < drafter[2]


def test_ngram_step_runs_no_draft_forward_when_priced() -> None:
    """An n-gram decode step costs the verify pass and a CPU lookup only: less than a drafter's step of
    the same shape; a standalone model 16 layers deep costs more than a one-layer drafter."""
    shape = DraftShape(3, 1, 4)
    drafter = decode_step_seconds(DEFAULT_PROFILE, shape, 8)
    ngram = Drafting("NGRAM", 0.0)
    assert decode_step_seconds(DEFAULT_PROFILE, shape, 8, draft_scale=0.0) + ngram.lookup_seconds(8) < drafter
    assert decode_step_seconds(DEFAULT_PROFILE, shape, 8, draft_scale=4.0) > drafter


def test_sim_ngram_accepts_more_when_the_prompt_repeats() -> None:
    """On a simulated NGRAM server a repetitive prompt accepts several tokens per verify step and a
    prompt of distinct words about one (the bonus token): acceptance comes from the prompt itself."""
    args = [
        "--model-path", str(FIXTURES / "deepseek-v3"), "--tp-size", "8", "--speculative-algorithm", "NGRAM",
        "--speculative-ngram-max-bfs-breadth", "1", "--speculative-num-draft-tokens", "6",
    ]  # fmt: skip
    repetitive = "def f(x): return x + 1 " * 20
    distinct = " ".join(f"word{i}" for i in range(120))
    with start_sim(args, env=SIM_ENV) as server:
        repeated, plain = _accept_lengths(server.url, [repetitive, distinct])
    assert repeated > 2.5
    assert plain < 1.2
