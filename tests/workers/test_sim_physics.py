"""The simulator's physics (``workers.sim.physics``): one test per behaviour of a real SGLang server.

Expected values are worked by hand on a toy preset whose numbers make the arithmetic short: one dense
layer of 400 parameters (q, k, v, o of a 10-wide model with one head of 10), 2 bytes each, read at
800 B/s (1 s per forward) and 800 x 4 FLOP/s peak (a forward over T tokens does 800 T FLOPs, T/4 s), so
the roofline knee sits at T = 4 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from workers.node.launcher import start_sim
from workers.sglang import capacity
from workers.sim.model import DraftShape
from workers.sim.physics import Acceptance, Gpu, ModelShape, Preset, launch_factor
from workers.sim.presets import DEFAULT_PRESET, PRESETS
from workers.sim.settings import SimSettingsError, settings_from_env

TOY_GPU = Gpu("toy", peak_flops=800 * 4, hbm_bytes_per_s=800, memory_bytes=10_000)
TOY_LAYER = ModelShape(
    hidden=10, layers=1, heads=1, kv_heads=1, head_dim=10, vocab=0, dense_intermediate=0, dense_layers=1
)


def toy(**changes: Any) -> Preset:
    """The toy preset: no fixed costs, full efficiency, a draft as big as the target."""
    fields: dict[str, Any] = {
        "name": "toy",
        "gpu": TOY_GPU,
        "tp_size": 1,
        "target": TOY_LAYER,
        "draft": TOY_LAYER,
        "acceptance": {"chat": Acceptance((0.9, 0.9, 0.2))},
        "sibling_recall": (0.5,),
        "mem_eff": 1.0,
        "flop_eff": 1.0,
        "forward_fixed_s": 0.0,
        "draft_fixed_s": 0.0,
        "overhead_s": 0.0,
        "graph_max_bs": 64,
    }
    fields.update(changes)
    return Preset(**fields)


def test_forward_seconds_is_flat_below_the_knee_when_memory_bound_then_linear():
    """Memory-bound until the tokens cross the roofline knee: 800 bytes at 800 B/s is 1 s for 1..4
    tokens (compute T/4 s <= 1 s), then compute-bound: 8 tokens 2 s, 16 tokens 4 s."""
    preset = toy()
    seconds = {
        t: preset.forward_seconds(TOY_LAYER, t, 1, 0, fixed_s=0.0, eager=False) for t in (1, 2, 4, 8, 16)
    }
    assert seconds == pytest.approx({1: 1.0, 2: 1.0, 4: 1.0, 8: 2.0, 16: 4.0})


def test_experts_touched_grow_with_tokens_when_target_is_moe():
    """8 experts, 2 per token, uniform routing: one token reads 2; two tokens 8 x (1 - 0.75^2) = 3.5;
    1,000 tokens all 8. A forward's weight bytes follow: one MoE layer of 8 experts of 3 x 10 x 10 =
    300 parameters (2 bytes) plus 400 attention parameters reads 800 + 2 x 600 = 2,000 bytes for one
    token (2.5 s at 800 B/s) and 800 + 3.5 x 600 = 2,900 bytes for two (3.625 s). A request's draft
    tokens share experts: with expert_novelty 0.5, one request verifying 3 tokens routes like
    1 + 2 x 0.5 = 2 independent tokens, so it too reads 3.5 experts (3.625 s)."""
    moe = ModelShape(
        hidden=10,
        layers=1,
        heads=1,
        kv_heads=1,
        head_dim=10,
        vocab=0,
        dense_intermediate=0,
        dense_layers=0,
        experts=8,
        experts_per_token=2,
        expert_intermediate=10,
    )
    assert [moe.experts_touched(t) for t in (1, 2, 1000)] == pytest.approx([2.0, 3.5, 8.0])
    preset = toy(target=moe)
    assert preset.forward_seconds(moe, 1, 1, 0, fixed_s=0.0, eager=False) == pytest.approx(2.5)
    assert preset.forward_seconds(moe, 2, 2, 0, fixed_s=0.0, eager=False) == pytest.approx(3.625)
    local = toy(target=moe, expert_novelty=0.5)
    assert local.forward_seconds(moe, 3, 1, 0, fixed_s=0.0, eager=False) == pytest.approx(3.625)


def test_decode_step_costs_the_larger_captured_size_when_batch_falls_between_two():
    """SGLang 0.5.23's speculative capture list jumps from 32 to 40 (range(10, 33, 2) then
    range(40, 65, 4)), so a batch of 35 replays the graph of 40 and costs what 40 requests cost; 41
    pads to 44. Without speculation the list runs 12, 16, 24: 13 requests cost what 16 cost."""
    spec = capacity.decode_graph_batch_sizes(64, speculative=True)
    plain = capacity.decode_graph_batch_sizes(64, speculative=False)
    assert spec[spec.index(32) + 1] == 40 and plain[:7] == (1, 2, 4, 8, 12, 16, 24)
    preset = toy(forward_fixed_s=0.001)
    chain = DraftShape(3, 1, 4)
    step = {b: preset.decode_step_seconds(chain, b, 100, max_running=64) for b in (35, 40, 41, 44)}
    assert step[35] == step[40] and step[41] == step[44] and step[44] > step[40]
    assert preset.decode_step_seconds(None, 13, 100, max_running=64) == preset.decode_step_seconds(
        None, 16, 100, max_running=64
    )


def test_decode_step_runs_eagerly_when_batch_exceeds_the_largest_graph():
    """With --cuda-graph-max-bs-decode 16 and 32 requests allowed, 17 requests have no graph: the one
    forward of a plain decode step pays eager_s (0.5 s) on top of its roofline cost. Toy costs at
    context 0: 16 padded tokens take 4 s, 17 eager tokens 17/4 + 0.5 = 4.75 s."""
    preset = toy(graph_max_bs=16, eager_s=0.5)
    assert preset.captured_batches(None, 32)[-1] == 16
    assert preset.decode_step_seconds(None, 16, 0, max_running=32) == pytest.approx(4.0)
    assert preset.decode_step_seconds(None, 17, 0, max_running=32) == pytest.approx(4.75)


def test_running_cap_takes_whichever_binds_when_kv_memory_or_speculative_default_is_smaller():
    """SGLang sets 48 running requests under speculation; resolve_max_num_reqs caps it at half the KV
    pool's tokens. Toy memory: 10,000 B x 0.85 - 1,600 B of weights (target + draft, 800 each) = 6,900 B,
    at 2 x 2 layers x 10 x 2 B = 80 B per token (target + draft KV) is 86 tokens: 86 // 2 = 43 < 48.
    With 100x the memory (1,000,000 B: 848,400 B free, 10,605 tokens) 48 binds; and requests of
    100 tokens plus the 4 draft tokens a verify reserves fit 10,605 // 104 = 101 at once, so 48 still
    binds, while 300-token requests fit only 10,605 // 304 = 34."""
    chain = DraftShape(3, 1, 4)
    small = toy()
    assert small.kv_token_capacity() == 86
    assert small.running_cap(chain, None) == 43
    big = toy(gpu=Gpu("toy-big", 800 * 4, 800, 1_000_000))
    assert big.kv_token_capacity() == 10_605
    assert big.running_cap(chain, None) == 48
    assert big.running_cap(chain, None, tokens_per_request=100) == 48
    assert big.running_cap(chain, None, tokens_per_request=300) == 34


def test_accept_length_follows_the_profile_when_acceptance_is_not_geometric():
    """Two easy tokens then a cliff, (0.9, 0.9, 0.2): a 3-step chain accepts 1 + 0.9 + 0.81 + 0.162 =
    2.872 tokens per step; 5 steps add 0.0324 + 0.00648 (the last value repeats) = 2.91088, where a
    geometric law through the first two (0.9 every depth) would give 1 + 0.9 + ... + 0.9^5 = 4.69. A
    fourth node with topk 2 goes where it adds most: a sibling at the cliff (recall 0.5) turns 0.2 into
    0.6, 1 + 0.9 + 0.81 + 0.486 = 3.196, more than at depth 0 (0.95: 2.976), the shallowest."""
    preset = toy()
    assert preset.accept_length(DraftShape(3, 1, 4)) == pytest.approx(2.872)
    assert preset.accept_length(DraftShape(5, 1, 6)) == pytest.approx(2.91088)
    assert preset.depth_accept_probs(DraftShape(3, 2, 5), 0.0, "chat") == pytest.approx((0.9, 0.9, 0.6))
    assert preset.accept_length(DraftShape(3, 2, 5)) == pytest.approx(3.196)


def test_launch_factor_is_shared_by_every_level_when_drawn_from_one_launch_seed():
    """One factor per launch: the same seed gives the same factor whatever batch (level) it prices, so
    a launch's levels are all fast or all slow together; other launches draw other factors, within a
    few sigma of 1; sigma 0 means no variation."""
    factors = {seed: launch_factor(seed, 0.03) for seed in range(20)}
    assert launch_factor(7, 0.03) == factors[7]
    assert len(set(factors.values())) == 20
    assert all(0.85 < f < 1.15 for f in factors.values())
    assert launch_factor(7, 0.0) == 1.0
    preset = toy(forward_fixed_s=0.001)
    for batch in (1, 8, 32):
        plain = preset.decode_step_seconds(None, batch, 50, max_running=48)
        scaled = preset.decode_step_seconds(None, batch, 50, max_running=48, factor=factors[7])
        assert scaled == pytest.approx(plain * factors[7])


def test_settings_from_env_rejects_preset_when_name_is_unknown():
    """SPECSWEEP_SIM_PRESET must name a preset: a misspelt one is a SpecsweepError listing them."""
    assert settings_from_env({"SPECSWEEP_SIM_PRESET": "llama-3.1-8b-h100"}).preset == "llama-3.1-8b-h100"
    with pytest.raises(SimSettingsError, match=r"llama-3\.1-8b-h100"):
        settings_from_env({"SPECSWEEP_SIM_PRESET": "llama-8b"})


def test_server_runs_preset_when_sim_preset_is_set(tmp_path: Path, kimi_target: Path, eagle3_draft: Path):
    """A server started with SPECSWEEP_SIM_PRESET reports it in /server_info and serves with the
    preset's acceptance: a 3-step chain on the Qwen3-235B preset accepts about 1.9 tokens per step (the
    default Kimi-K2 preset's chat vector would give 2.6, the old linear profile about 3.4); the draws are
    seeded, so one request of 64 tokens lands between 1.3 and 2.5."""
    import urllib.request

    args = ["--model-path", str(kimi_target), "--tp-size", "8", "--speculative-algorithm", "EAGLE3"]
    args += ["--speculative-draft-model-path", str(eagle3_draft), "--speculative-eagle-topk", "1"]
    args += ["--speculative-num-steps", "3", "--speculative-num-draft-tokens", "4"]
    env = {"SPECSWEEP_SIM_PRESET": "qwen3-235b-a22b-tp8", "SPECSWEEP_SIM_TIME_SCALE": "0.05"}
    with start_sim(args, env=env) as server:
        with urllib.request.urlopen(f"{server.url}/server_info", timeout=10) as reply:
            assert json.loads(reply.read())["simulator"]["preset"] == "qwen3-235b-a22b-tp8"
        body = json.dumps({"text": "hello", "sampling_params": {"max_new_tokens": 64, "ignore_eos": True}})
        request = urllib.request.Request(
            f"{server.url}/generate", data=body.encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as reply:
            meta = json.loads(reply.read())["meta_info"]
        assert meta["completion_tokens"] == 64
        assert 1.3 < meta["spec_accept_length"] < 2.5


def _launch_factor(args: list[str]) -> tuple[str, float, float]:
    """One simulated launch's tag (the launcher's per-launch --weight-version) and /server_info's launch
    factor, read before and after it served a request (two levels' worth of the launch's life)."""
    import urllib.request

    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "0.01"}) as server:
        infos = []
        for _ in range(2):
            with urllib.request.urlopen(f"{server.url}/server_info", timeout=10) as reply:
                infos.append(json.loads(reply.read()))
            body = json.dumps({"text": "hi", "sampling_params": {"max_new_tokens": 8, "ignore_eos": True}})
            request = urllib.request.Request(
                f"{server.url}/generate", data=body.encode(), headers={"Content-Type": "application/json"}
            )
            urllib.request.urlopen(request, timeout=30).close()
    assert infos[0]["weight_version"] == server.launch_tag
    return server.launch_tag, infos[0]["simulator"]["launch_factor"], infos[1]["simulator"]["launch_factor"]


def test_launch_factor_differs_between_launches_when_tags_differ(kimi_target: Path):
    """The default preset's launch factor is keyed by the seed and the launch's --weight-version tag (the
    launcher's per-launch nonce): two launches of one config get different factors, each the preset's
    launch_factor("<seed>:<tag>"), and a launch keeps its factor for its whole life (every level). Before,
    the factor came from the seed alone, so every launch of a config ran at the same speed."""
    args = ["--model-path", str(kimi_target), "--tp-size", "8"]
    (tag_a, a_before, a_after), (tag_b, b_before, b_after) = _launch_factor(args), _launch_factor(args)
    assert a_before == a_after == DEFAULT_PRESET.launch_factor(f"0:{tag_a}")
    assert b_before == b_after == DEFAULT_PRESET.launch_factor(f"0:{tag_b}")
    assert tag_a != tag_b and a_before != b_before
    assert DEFAULT_PRESET.launch_sigma >= 0.015


def test_presets_cover_four_targets_when_listed():
    """The issue's four targets: an 8B dense on one GPU, a 70B dense on TP8, a large MoE on TP8 and
    one with an MTP head."""
    assert set(PRESETS) >= {
        "llama-3.1-8b-h100",
        "llama-3.3-70b-h100x8",
        "qwen3-235b-a22b-tp8",
        "glm-4.7-fp8-mtp-tp8",
    }
    assert PRESETS["llama-3.3-70b-h100x8"].tp_size == 8 and PRESETS["qwen3-235b-a22b-tp8"].target.experts


SGLANG_GRAPH_LISTS = """
import json, sys
from types import SimpleNamespace
from sglang.srt.arg_groups.cuda_graph_hook import generate_decode_cuda_graph_batch_sizes as gen
out = {}
for max_bs in json.loads(sys.stdin.read()):
    for algorithm in (None, "EAGLE3"):
        args = SimpleNamespace(disable_cuda_graph_padding=False, speculative_algorithm=algorithm)
        out[f"{max_bs}:{algorithm is not None}"] = gen(args, max_bs)
print(json.dumps(out))
"""


def test_decode_graph_batch_sizes_equal_sglangs_when_generated_for_each_max_bs(sglang_python: str):
    """The captured lists the physics pads to are SGLang 0.5.23's own
    (generate_decode_cuda_graph_batch_sizes), with and without speculation, for the memory hook's
    defaults (8, 32, 48, 160, 256, 512) and sizes off its grid (50, 300, 1000)."""
    import subprocess

    sizes = [8, 32, 48, 50, 160, 256, 300, 512, 1000]
    done = subprocess.run(
        [sglang_python, "-c", SGLANG_GRAPH_LISTS],
        input=json.dumps(sizes),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    theirs = json.loads(done.stdout.strip().splitlines()[-1])
    for max_bs in sizes:
        for speculative in (False, True):
            mine = list(capacity.decode_graph_batch_sizes(max_bs, speculative=speculative))
            assert mine == theirs[f"{max_bs}:{speculative}"], (max_bs, speculative)


def test_settings_launch_sigma_overrides_preset_when_set():
    """SPECSWEEP_SIM_LAUNCH_SIGMA replaces the preset's launch-to-launch sigma (0: every launch at factor 1);
    unset, the default preset varies launches."""
    assert settings_from_env({}).costs.launch_factor("0:specsweep-aaaa") != 1.0
    assert (
        settings_from_env({"SPECSWEEP_SIM_LAUNCH_SIGMA": "0"}).costs.launch_factor("0:specsweep-aaaa") == 1.0
    )
    with pytest.raises(SimSettingsError, match="SPECSWEEP_SIM_LAUNCH_SIGMA"):
        settings_from_env({"SPECSWEEP_SIM_LAUNCH_SIGMA": "fast"})
