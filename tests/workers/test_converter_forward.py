"""The numerical check: two draft steps in torch, run from the source checkpoint as its trainer defines
the forward and from the converted one as SGLang 0.5.23 reads its config, give identical logits.

The forward follows ``llama_eagle3.LlamaModel.forward``: optional input_norm (norm_before_fc) or
per-aux fc_norm before fc, the [embeds, hidden] layer, the final norm; the next step is fed the
pre-norm state, or the post-norm one with norm_output; the head is the draft's lm_head, or the
target's when draft_vocab_size is unset (load_lm_head_from_target). Step two makes norm_output count.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from workers.convert.converter import ConvertOptions, convert
from workers.convert.fixtures import TINY, published_shapes, write_checkpoint

SHAPES = {shape.name: shape for shape in published_shapes()}
LEGACY = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}


@dataclass(frozen=True)
class Forward:
    """The config switches that change the draft forward, and the key prefix of its layer."""

    layer: str
    input_norm: bool
    fc_norm: bool
    norm_output: bool
    own_head: bool


def trainer_forward(config: dict[str, Any], names: set[str]) -> Forward:
    """The forward the source's trainer ran: speculators' top-level flags (Eagle3Speculator), or the
    native config; a draft with an lm_head was trained with it."""
    if "speculators_model_type" in config:
        return Forward(
            "layers.0.",
            bool(config.get("norm_before_fc")),
            bool(config.get("fc_norm")),
            bool(config.get("norm_output")),
            own_head=True,
        )
    eagle = config.get("eagle_config") or {}
    return Forward(
        "midlayer.",
        bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
        bool(config.get("fc_norm") or config.get("use_aux_norm")),
        bool(config.get("norm_output")),
        own_head="lm_head.weight" in names,
    )


def sglang_forward(config: dict[str, Any]) -> Forward:
    """The forward SGLang 0.5.23 builds from a converted config.json (llama_eagle3.py)."""
    eagle = config.get("eagle_config") or {}
    return Forward(
        "midlayer.",
        bool(eagle.get("norm_before_fc", config.get("norm_before_fc", False))),
        bool(config.get("fc_norm") or config.get("use_aux_norm")),
        bool(config.get("norm_output", False)),
        own_head=config["draft_vocab_size"] is not None,
    )


def _current_name(name: str) -> str:
    """The name SGLang's load_weights gives a legacy EAGLE-3.1 norm (aux_norm_mid -> fc_norm.1)."""
    stem = name.removesuffix(".weight")
    return f"{LEGACY[stem]}.weight" if stem in LEGACY else name


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _layer(w: dict[str, torch.Tensor], p: str, embeds: torch.Tensor, hidden: torch.Tensor) -> torch.Tensor:
    residual, tokens = hidden, hidden.shape[0]
    x = torch.cat(
        [_rms(embeds, w[p + "input_layernorm.weight"]), _rms(hidden, w[p + "hidden_norm.weight"])], -1
    )

    def heads(name: str, count: int) -> torch.Tensor:
        return (x @ w[p + f"self_attn.{name}.weight"].T).view(tokens, count, TINY.head_dim).transpose(0, 1)

    groups = TINY.num_heads // TINY.num_kv_heads
    q = heads("q_proj", TINY.num_heads)
    k = heads("k_proj", TINY.num_kv_heads).repeat_interleave(groups, 0)
    v = heads("v_proj", TINY.num_kv_heads).repeat_interleave(groups, 0)
    attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    hidden = attn.transpose(0, 1).reshape(tokens, -1) @ w[p + "self_attn.o_proj.weight"].T + residual
    h = _rms(hidden, w[p + "post_attention_layernorm.weight"])
    mlp = torch.nn.functional.silu(h @ w[p + "mlp.gate_proj.weight"].T) * (h @ w[p + "mlp.up_proj.weight"].T)
    return mlp @ w[p + "mlp.down_proj.weight"].T + hidden


def draft_steps(
    weights: dict[str, torch.Tensor], forward: Forward, target_head: torch.Tensor, steps: int = 2
) -> list[torch.Tensor]:
    """Logits of ``steps`` draft steps (the first from the target's aux states, then fed back)."""
    w = {_current_name(k): v.float() if v.is_floating_point() else v for k, v in weights.items()}
    generator = torch.Generator().manual_seed(0)
    embeds = torch.randn(5, TINY.hidden_size, generator=generator)
    hidden = torch.randn(5, len(TINY.aux_layer_ids) * TINY.target_hidden_size, generator=generator)
    head = w["lm_head.weight"] if forward.own_head else target_head
    logits = []
    for _ in range(steps):
        if hidden.shape[-1] != embeds.shape[-1]:
            if forward.input_norm:
                hidden = _rms(hidden, w["input_norm.weight"])
            if forward.fc_norm:
                chunks = hidden.chunk(len(TINY.aux_layer_ids), -1)
                hidden = torch.cat([_rms(c, w[f"fc_norm.{i}.weight"]) for i, c in enumerate(chunks)], -1)
            hidden = hidden @ w["fc.weight"].T
        out = _layer(w, forward.layer, embeds, hidden)
        normed = _rms(out, w["norm.weight"])
        logits.append(normed @ head.T)
        hidden = normed if forward.norm_output else out
    return logits


CASES = [
    "speculators-0.9",
    "specforge-0.2",
    "speculators-eagle31",
    "speculators-dtype",
    "speculators-fc-norm",
    "speculators-full-vocab",
    "specforge-full-vocab",
    "native-full-vocab-head",
    "native-target-head",
    "native-eagle31-legacy",
    "native-norm-before-fc",
]


@pytest.mark.parametrize("name", CASES)
def test_draft_forward_gives_identical_logits_when_run_from_source_and_converted_variant(
    name: str, tmp_path: Path
) -> None:
    """Each variant's two draft steps match bit for bit between the source (as trained) and the
    output (as SGLang reads it); swapping two norms, or switching off the variant's feature in the
    output config, does not."""
    shape = SHAPES[name]
    src = write_checkpoint(shape.checkpoint, tmp_path / "src")
    report = convert(src, tmp_path / "out", ConvertOptions())
    source = load_file(src / "model.safetensors")
    converted = load_file(tmp_path / "out" / "model.safetensors")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    target_head = torch.randn(TINY.vocab_size, TINY.hidden_size, generator=torch.Generator().manual_seed(1))

    trained = trainer_forward(shape.checkpoint.config, set(source))
    served = sglang_forward(config)
    want = draft_steps(source, trained, target_head)
    got = draft_steps(converted, served, target_head)
    assert all(torch.equal(a, b) for a, b in zip(want, got, strict=True))
    assert served.own_head == (report.lm_head == "draft")

    swapped = dict(converted)
    swapped["midlayer.input_layernorm.weight"], swapped["midlayer.hidden_norm.weight"] = (
        converted["midlayer.hidden_norm.weight"],
        converted["midlayer.input_layernorm.weight"],
    )
    assert not torch.equal(want[0], draft_steps(swapped, served, target_head)[0])
    for flag in ("input_norm", "fc_norm", "norm_output", "own_head"):
        if getattr(served, flag):
            broken = draft_steps(converted, replace(served, **{flag: False}), target_head)
            assert not all(torch.equal(a, b) for a, b in zip(want, broken, strict=True)), flag
