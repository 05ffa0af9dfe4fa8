"""Generate EAGLE3 draft checkpoints in every input format, for tests (tiny) and the bench (Kimi-like).

A checkpoint is built as data first (``build_checkpoint``: a config dict and named tensors, values
made lazily from a seed), so a test can break one thing (a NaN, a wrong shape, an extra key) before
``write_checkpoint`` puts it on disk as a single safetensors file, shards with an index, or a pickle.
Tensors are written in chunks, so a 2 GiB checkpoint never sits in memory.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from workers.convert.eagle3_format import LAYER_PARTS, MLA_LAYER_PARTS, SourceFormat
from workers.convert.safetensors_stream import DTYPE_SIZES, OutputTensor, encode_header, write_all

_CHUNK_ELEMENTS = 4 << 20
_NUMPY = {"F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32, "BOOL": np.bool_}


@dataclass(frozen=True)
class FixtureDims:
    """Sizes of a generated draft (names as in the reference) and of its target."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    draft_vocab_size: int
    vocab_size: int
    target_hidden_size: int
    target_layers: int
    aux_layer_ids: tuple[int, ...]


@dataclass(frozen=True)
class MlaFixtureDims:
    """MLA sizes of a generated Eagle3DeepseekV2ForCausalLM draft (num_heads from FixtureDims)."""

    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class Variant:
    """Which optional parts a generated draft has (each one a published training option).

    ``full_vocab``: draft vocab = target vocab, no d2t/t2d (speculators writes
    draft_vocab_size = vocab_size; native configs leave draft_vocab_size out); ``head``: the draft
    has its own lm_head (False only for full-vocab native drafts, which then use the target's).
    """

    norm_before_fc: bool = False
    fc_norm: bool = False
    norm_output: bool = False
    full_vocab: bool = False
    head: bool = True


TINY = FixtureDims(64, 4, 2, 16, 128, 96, 256, 64, 8, (1, 3, 6))
TINY_MLA = MlaFixtureDims(
    q_lora_rank=48, kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16
)
PLAIN = Variant()
# Kimi-K2-like draft: hidden 7168, 64 heads x 128, intermediate 18432, draft vocab 32000 of 163840.
# 32 KV heads puts the draft (without its embedding) at 2.0 GiB of bf16, the bench's size.
KIMI_LIKE = FixtureDims(7168, 64, 32, 128, 18432, 32000, 163840, 7168, 61, (1, 29, 57))


@dataclass(frozen=True)
class FixtureTensor:
    """A tensor to write: dtype, shape, and explicit data or (data=None) seeded random values.

    Explicit bf16 data is given as its uint16 bit patterns (numpy has no bf16).
    """

    dtype: str
    shape: tuple[int, ...]
    data: np.ndarray | None = None
    seed: int = 0
    kind: str = "weight"  # "weight" (small normal), "norm" (normal around 1.0) or "bits" (fast, see below)

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * DTYPE_SIZES[self.dtype]


@dataclass
class FixtureCheckpoint:
    """A draft checkpoint as data: its config and tensors by source name (tests edit both)."""

    source_format: SourceFormat
    config: dict[str, Any]
    tensors: dict[str, FixtureTensor] = field(default_factory=dict)


def vocab_map(dims: FixtureDims, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """A valid (d2t offsets, t2d mask): sorted random target ids for the draft vocab."""
    rng = np.random.default_rng(seed)
    ids = np.sort(rng.choice(dims.vocab_size, dims.draft_vocab_size, replace=False)).astype(np.int64)
    t2d = np.zeros(dims.vocab_size, dtype=np.bool_)
    t2d[ids] = True
    return ids - np.arange(dims.draft_vocab_size, dtype=np.int64), t2d


def build_checkpoint(
    source_format: SourceFormat,
    dims: FixtureDims = TINY,
    *,
    dtype: str = "BF16",
    seed: int = 0,
    include_embedding: bool = True,
    fast_values: bool = False,
    variant: Variant = PLAIN,
    mla: MlaFixtureDims = TINY_MLA,
) -> FixtureCheckpoint:
    """A valid checkpoint of ``source_format`` (speculators checkpoints carry their embedding).

    ``fast_values`` fills bf16 weights with random bit patterns of magnitude below 2 (every one
    finite) instead of normal samples: several times faster to generate, for the 2 GiB bench.
    ``mla`` sizes the attention of an SGLANG_MLA draft.
    """
    if variant.full_vocab:
        dims = replace(dims, draft_vocab_size=dims.vocab_size)
    prefix = "layers.0." if source_format is SourceFormat.SPECULATORS else "midlayer."
    is_mla = source_format is SourceFormat.SGLANG_MLA
    shapes = _shapes(dims, variant, mla if is_mla else None)
    tensors: dict[str, FixtureTensor] = {}
    for index, (name, shape) in enumerate(shapes.items()):
        key = prefix + name if name in LAYER_PARTS | MLA_LAYER_PARTS else name
        kind = "norm" if name.endswith("norm.weight") else "weight"
        if fast_values and dtype == "BF16":
            kind = "bits"
        tensors[key] = FixtureTensor(dtype, shape, seed=seed * 1000 + index, kind=kind)
    if not variant.full_vocab:
        d2t, t2d = vocab_map(dims, seed)
        tensors["d2t"] = FixtureTensor("I64", d2t.shape, d2t)
        tensors["t2d"] = FixtureTensor("BOOL", t2d.shape, t2d)
    if source_format is SourceFormat.SPECULATORS and include_embedding:
        tensors["embed_tokens.weight"] = FixtureTensor(
            dtype, (dims.vocab_size, dims.hidden_size), seed=seed * 1000 + 999
        )
    config = _config(source_format, dims, dtype, variant, mla)
    return FixtureCheckpoint(source_format, config, tensors)


def _shapes(dims: FixtureDims, variant: Variant, mla: MlaFixtureDims | None) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of an EAGLE3 drafter (layer parts unprefixed).

    Written out here, not taken from ``eagle3_format.expected_shapes``: these fixtures are the
    converter's test oracle, so a wrong shape there must not be copied into them. The MLA shapes
    are those of SGLang 0.5.23's DeepseekV2AttentionMLA with q_a/kv_a widened to 2 x hidden.
    """
    hidden, q_rows, kv_rows = (
        dims.hidden_size,
        dims.num_heads * dims.head_dim,
        dims.num_kv_heads * dims.head_dim,
    )
    inter, aux_width = dims.intermediate_size, len(dims.aux_layer_ids) * dims.target_hidden_size
    if mla is None:
        attention: dict[str, tuple[int, ...]] = {
            "self_attn.q_proj.weight": (q_rows, 2 * hidden),
            "self_attn.k_proj.weight": (kv_rows, 2 * hidden),
            "self_attn.v_proj.weight": (kv_rows, 2 * hidden),
            "self_attn.o_proj.weight": (hidden, q_rows),
        }
    else:
        heads = dims.num_heads
        attention = {
            "self_attn.q_a_proj.weight": (mla.q_lora_rank, 2 * hidden),
            "self_attn.q_a_layernorm.weight": (mla.q_lora_rank,),
            "self_attn.q_b_proj.weight": (
                heads * (mla.qk_nope_head_dim + mla.qk_rope_head_dim),
                mla.q_lora_rank,
            ),
            "self_attn.kv_a_proj_with_mqa.weight": (mla.kv_lora_rank + mla.qk_rope_head_dim, 2 * hidden),
            "self_attn.kv_a_layernorm.weight": (mla.kv_lora_rank,),
            "self_attn.kv_b_proj.weight": (heads * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank),
            "self_attn.o_proj.weight": (hidden, heads * mla.v_head_dim),
        }
    extra: dict[str, tuple[int, ...]] = {}
    if variant.norm_before_fc:
        extra["input_norm.weight"] = (aux_width,)
    if variant.fc_norm:
        extra |= {f"fc_norm.{i}.weight": (dims.target_hidden_size,) for i in range(len(dims.aux_layer_ids))}
    if variant.head:
        extra["lm_head.weight"] = (dims.draft_vocab_size, hidden)
    return {
        **attention,
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "hidden_norm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "fc.weight": (hidden, aux_width),
        "norm.weight": (hidden,),
        **extra,
    }


def _llama_fields(dims: FixtureDims, dtype: str) -> dict[str, Any]:
    return {
        "model_type": "llama",
        "hidden_size": dims.hidden_size,
        "num_attention_heads": dims.num_heads,
        "num_key_value_heads": dims.num_kv_heads,
        "head_dim": dims.head_dim,
        "intermediate_size": dims.intermediate_size,
        "vocab_size": dims.vocab_size,
        "num_hidden_layers": 1,
        "hidden_act": "silu",
        "rms_norm_eps": 1e-5,
        "max_position_embeddings": 4096,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": {"BF16": "bfloat16", "F16": "float16", "F32": "float32"}[dtype],
    }


def _config(
    source_format: SourceFormat, dims: FixtureDims, dtype: str, variant: Variant, mla: MlaFixtureDims
) -> dict[str, Any]:
    """config.json as each format writes it; the variant's flags where that format keeps them."""
    layer = _llama_fields(dims, dtype)
    flags = {flag: True for flag in ("norm_before_fc", "fc_norm", "norm_output") if getattr(variant, flag)}
    if source_format is SourceFormat.SPECULATORS:
        return {
            **flags,
            "architectures": ["Eagle3Speculator"],
            "speculators_model_type": "eagle3",
            "speculators_version": "0.3.0",
            "transformer_layer_config": layer,
            "draft_vocab_size": dims.draft_vocab_size,
            "norm_before_residual": False,
            "target_hidden_size": dims.target_hidden_size,
            "eagle_aux_hidden_state_layer_ids": list(dims.aux_layer_ids),
            "speculators_config": {
                "algorithm": "eagle3",
                "verifier": {"name_or_path": "moonshotai/Kimi-K2-Instruct"},
            },
            "torch_dtype": layer["torch_dtype"],
        }
    architecture = {
        SourceFormat.SGLANG: "LlamaForCausalLMEagle3",
        SourceFormat.EAGLE: "LlamaForCausalLM",
        SourceFormat.SGLANG_MLA: "Eagle3DeepseekV2ForCausalLM",
    }[source_format]
    eagle_config: dict[str, Any] = {"eagle_aux_hidden_state_layer_ids": list(dims.aux_layer_ids)}
    if flags.pop("norm_before_fc", False):
        eagle_config["norm_before_fc"] = True
    config = {
        **layer,
        **flags,
        "architectures": [architecture],
        "target_hidden_size": dims.target_hidden_size,
        "eagle_config": eagle_config,
    }
    if not variant.full_vocab:
        config["draft_vocab_size"] = dims.draft_vocab_size
    if source_format is SourceFormat.SGLANG_MLA:
        del config["head_dim"], config["num_key_value_heads"]
        config |= {"model_type": "deepseek_v3", "hidden_act": "silu", "rope_scaling": None}
        config |= {field: getattr(mla, field) for field in MLA_FIELD_NAMES}
    return config


MLA_FIELD_NAMES = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


def target_config(
    dims: FixtureDims, *, mla: MlaFixtureDims = TINY_MLA, multimodal: bool = False
) -> dict[str, Any]:
    """A target model config (DeepSeek-V3 family, like Kimi K2) matching ``dims``.

    ``multimodal`` wraps it the way Kimi-K2.5 does: KimiK25ForConditionalGeneration with the
    language model's config under ``text_config``.
    """
    text = {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.target_hidden_size,
        "num_hidden_layers": dims.target_layers,
        **{field: getattr(mla, field) for field in MLA_FIELD_NAMES},
    }
    if not multimodal:
        return text
    return {
        "architectures": ["KimiK25ForConditionalGeneration"],
        "model_type": "kimi_k25",
        "text_config": text,
        "vision_config": {"model_type": "kimi_k25_vision", "patch_size": 14, "vt_hidden_size": 1152},
        "media_placeholder_token_id": 163605,
    }


def write_target_config(
    root: Path, dims: FixtureDims, *, mla: MlaFixtureDims = TINY_MLA, multimodal: bool = False
) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    config = target_config(dims, mla=mla, multimodal=multimodal)
    (root / "config.json").write_text(json.dumps(config, indent=2))
    return root


def write_checkpoint(
    checkpoint: FixtureCheckpoint, root: Path, *, shards: int = 1, as_pickle: bool = False
) -> Path:
    """Write config.json and the weights: one safetensors file, ``shards`` files + index, or a pickle."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(checkpoint.config, indent=2))
    if as_pickle:
        _write_pickle(checkpoint, root / "pytorch_model.bin")
        return root
    names = list(checkpoint.tensors)
    if shards == 1:
        _write_safetensors(checkpoint, names, root / "model.safetensors")
        return root
    groups = [names[i::shards] for i in range(shards)]
    weight_map: dict[str, str] = {}
    for number, group in enumerate(groups, 1):
        file_name = f"model-{number:05d}-of-{shards:05d}.safetensors"
        _write_safetensors(checkpoint, group, root / file_name)
        weight_map |= dict.fromkeys(group, file_name)
    index = {"metadata": {}, "weight_map": weight_map}
    (root / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    return root


def _write_safetensors(checkpoint: FixtureCheckpoint, names: list[str], path: Path) -> None:
    tensors = [checkpoint.tensors[name] for name in names]
    header = encode_header(
        [OutputTensor(name, t.dtype, t.shape, t.nbytes) for name, t in zip(names, tensors, strict=True)],
        {"format": "pt"},
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        write_all(fd, memoryview(header))
        for tensor in tensors:
            for chunk in tensor_bytes(tensor):
                write_all(fd, memoryview(chunk).cast("B"))  # type: ignore[arg-type]
    finally:
        os.close(fd)


def tensor_bytes(tensor: FixtureTensor) -> Iterator[np.ndarray]:
    """The tensor's raw little-endian bytes, as arrays of at most ~4M elements."""
    if tensor.data is not None:
        yield np.ascontiguousarray(tensor.data)
        return
    rng = np.random.default_rng(tensor.seed)
    remaining = math.prod(tensor.shape)
    while remaining:
        count = min(remaining, _CHUNK_ELEMENTS)
        if tensor.kind == "bits":
            # Clearing bf16's top exponent bit keeps every value finite with |x| < 2.
            yield rng.integers(0, 1 << 16, count, dtype=np.uint16) & np.uint16(0xBFFF)
            remaining -= count
            continue
        values = rng.standard_normal(count, dtype=np.float32)
        values = 1.0 + 0.1 * values if tensor.kind == "norm" else 0.05 * values
        yield _encode(values.astype(np.float32), tensor.dtype)
        remaining -= count


def _encode(values: np.ndarray, dtype: str) -> np.ndarray:
    if dtype == "BF16":
        return bf16_bits(values)
    return values.astype(_NUMPY[dtype])


def bf16_bits(values: np.ndarray) -> np.ndarray:
    """float32 values as bf16 bit patterns (uint16), rounding to nearest even."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def materialise(tensor: FixtureTensor) -> np.ndarray:
    """The whole tensor as a numpy array (bf16 as uint16 bits); for tests that edit values."""
    flat = np.concatenate([chunk.reshape(-1) for chunk in tensor_bytes(tensor)])
    return flat.reshape(tensor.shape)


def with_data(tensor: FixtureTensor, data: np.ndarray, dtype: str | None = None) -> FixtureTensor:
    """``tensor`` with explicit data (and optionally another dtype), shape taken from ``data``."""
    return replace(tensor, data=data, shape=tuple(data.shape), dtype=dtype or tensor.dtype)


def _write_pickle(checkpoint: FixtureCheckpoint, path: Path) -> None:
    import torch  # only the pickle format needs it

    state = {}
    for name, tensor in checkpoint.tensors.items():
        array = materialise(tensor)
        if tensor.dtype == "BF16":
            state[name] = torch.from_numpy(array.view(np.int16).copy()).view(torch.bfloat16)
        else:
            state[name] = torch.from_numpy(array.copy())
    torch.save(state, path)


# -- the corpus: one generated draft per published shape ----------------------------------------------

_SPECULATORS_0_9_TOP = {
    # What speculators 0.9.0's Eagle3SpeculatorConfig.to_diff_dict writes beside the model fields.
    "embed_requires_grad": False,
    "speculators_version": "0.9.0",
    "transformers_version": "4.55.4",
    "tie_word_embeddings": False,
    "speculators_config": {
        "algorithm": "eagle3",
        "default_proposal_method": "greedy",
        "proposal_methods": [
            {
                "proposal_type": "greedy",
                "speculative_tokens": 3,
                "verifier_accept_k": 1,
                "accept_tolerance": 0.0,
            }
        ],
        "verifier": {
            "architectures": ["LlamaForCausalLM"],
            "name_or_path": "meta-llama/Llama-3.1-8B-Instruct",
        },
    },
}
_SPECFORGE_LLAMA = {
    # LlamaConfig.save_pretrained fields a SpecForge 0.2.0 export carries beside the draft's own.
    "attention_bias": False,
    "attention_dropout": 0.0,
    "bos_token_id": 128000,
    "eos_token_id": 128001,
    "initializer_range": 0.02,
    "mlp_bias": False,
    "pretraining_tp": 1,
    "rope_scaling": None,
    "use_cache": True,
    "transformers_version": "4.55.2",
}


@dataclass(frozen=True)
class PublishedShape:
    """A published draft format, generated tiny: its checkpoint and how it is written to disk."""

    name: str
    description: str
    checkpoint: FixtureCheckpoint
    as_pickle: bool = False


def _speculators(variant: Variant = PLAIN, **top: Any) -> FixtureCheckpoint:
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS, variant=variant)
    checkpoint.config |= _SPECULATORS_0_9_TOP | top
    for flag in ("norm_before_fc", "fc_norm", "norm_output"):
        checkpoint.config.setdefault(flag, False)
    return checkpoint


def _speculators_dtype() -> FixtureCheckpoint:
    """transformers >= 4.56 writes ``dtype`` where older versions wrote ``torch_dtype``."""
    checkpoint = _speculators(Variant(norm_before_fc=True, norm_output=True))
    checkpoint.config["dtype"] = checkpoint.config.pop("torch_dtype")
    checkpoint.config["transformer_layer_config"]["dtype"] = checkpoint.config[
        "transformer_layer_config"
    ].pop("torch_dtype")
    checkpoint.config |= {"target_hidden_size": None, "transformers_version": "4.57.1"}
    return checkpoint


def _speculators_legacy() -> FixtureCheckpoint:
    """An early speculators export: torch_dtype and has_no_defaults_at_init, no EAGLE-3.1 flags."""
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS)
    checkpoint.config |= {"has_no_defaults_at_init": False, "transformers_version": "4.53.0"}
    return checkpoint


def _speculators_qwen3() -> FixtureCheckpoint:
    checkpoint = _speculators()
    checkpoint.config["transformer_layer_config"]["model_type"] = "qwen3"
    for norm in ("q_norm", "k_norm"):
        checkpoint.tensors[f"layers.0.self_attn.{norm}.weight"] = FixtureTensor(
            "BF16", (TINY.head_dim,), seed=77, kind="norm"
        )
    return checkpoint


def _specforge(variant: Variant = PLAIN) -> FixtureCheckpoint:
    """SpecForge 0.2.0's export: a LlamaConfig with draft_vocab_size, midlayer.* and both vocab buffers
    (all-ones t2d and zero d2t when the draft keeps the full vocabulary)."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG, variant=variant)
    checkpoint.config |= _SPECFORGE_LLAMA
    del checkpoint.config["eagle_config"]  # SpecForge's fc is fixed at 3 aux states
    if variant.full_vocab:
        checkpoint.config["draft_vocab_size"] = TINY.vocab_size
        zeros = np.zeros(TINY.vocab_size, dtype=np.int64)
        checkpoint.tensors["d2t"] = FixtureTensor("I64", zeros.shape, zeros)
        ones = np.ones(TINY.vocab_size, dtype=np.bool_)
        checkpoint.tensors["t2d"] = FixtureTensor("BOOL", ones.shape, ones)
    return checkpoint


def _native_legacy_eagle31() -> FixtureCheckpoint:
    """An EAGLE-3.1 draft with the legacy names SGLang still maps: use_aux_norm, aux_norm_low/mid/high."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG, variant=Variant(fc_norm=True, norm_output=True))
    checkpoint.config["use_aux_norm"] = checkpoint.config.pop("fc_norm")
    for index, legacy in enumerate(("aux_norm_low", "aux_norm_mid", "aux_norm_high")):
        checkpoint.tensors[f"{legacy}.weight"] = checkpoint.tensors.pop(f"fc_norm.{index}.weight")
    return checkpoint


# Kimi-K2's YaRN rope (DeepSeek-V3 style): an MLA draft attends over the target's positions.
KIMI_YARN_ROPE = {
    "type": "yarn",
    "factor": 32.0,
    "original_max_position_embeddings": 4096,
    "beta_fast": 1.0,
    "beta_slow": 1.0,
    "mscale": 1.0,
    "mscale_all_dim": 1.0,
}


def _mla(
    variant: Variant = PLAIN, *, layers_prefix: bool = False, rope_scaling: dict[str, Any] | None = None
) -> FixtureCheckpoint:
    checkpoint = build_checkpoint(SourceFormat.SGLANG_MLA, variant=variant)
    checkpoint.config["rope_scaling"] = rope_scaling
    if layers_prefix:
        checkpoint.tensors = {
            ("layers.0." + name.removeprefix("midlayer.") if name.startswith("midlayer.") else name): tensor
            for name, tensor in checkpoint.tensors.items()
        }
    return checkpoint


def published_shapes() -> list[PublishedShape]:
    """One tiny draft per publicly seen format, with that format's exact config fields and key names."""
    eagle31 = Variant(norm_before_fc=True, norm_output=True)
    return [
        PublishedShape("speculators-0.9", "speculators 0.9.0 eagle3 export, llama layer", _speculators()),
        PublishedShape(
            "speculators-dtype",
            "transformers >= 4.56 dtype, norm_before_fc + norm_output",
            _speculators_dtype(),
        ),
        PublishedShape(
            "speculators-legacy",
            "early speculators export (torch_dtype, has_no_defaults_at_init)",
            _speculators_legacy(),
        ),
        PublishedShape(
            "speculators-eagle31",
            "EAGLE-3.1 llama default: norm_before_fc + norm_output",
            _speculators(eagle31),
        ),
        PublishedShape(
            "speculators-fc-norm",
            "EAGLE-3.1 fc_norm + norm_output",
            _speculators(Variant(fc_norm=True, norm_output=True)),
        ),
        PublishedShape(
            "speculators-full-vocab",
            "draft_vocab_size = vocab_size, no d2t/t2d",
            _speculators(Variant(full_vocab=True)),
        ),
        PublishedShape("speculators-qwen3", "qwen3 draft layer (q_norm/k_norm)", _speculators_qwen3()),
        PublishedShape(
            "speculators-norm-before-residual",
            "norm_before_residual: true",
            _speculators(norm_before_residual=True),
        ),
        PublishedShape("specforge-0.2", "SpecForge 0.2.0 export (SGLang-native)", _specforge()),
        PublishedShape(
            "specforge-full-vocab",
            "SpecForge full vocabulary: zero d2t, all-true t2d",
            _specforge(Variant(full_vocab=True)),
        ),
        PublishedShape(
            "eagle-pickle",
            "SafeAILab EAGLE3: LlamaForCausalLM, pytorch_model.bin",
            build_checkpoint(SourceFormat.EAGLE),
            as_pickle=True,
        ),
        PublishedShape(
            "native-full-vocab-head",
            "no draft_vocab_size, own full-vocab lm_head",
            build_checkpoint(SourceFormat.SGLANG, variant=Variant(full_vocab=True)),
        ),
        PublishedShape(
            "native-target-head",
            "no draft_vocab_size, no lm_head",
            build_checkpoint(SourceFormat.SGLANG, variant=Variant(full_vocab=True, head=False)),
        ),
        PublishedShape(
            "native-eagle31-legacy", "use_aux_norm with aux_norm_low/mid/high", _native_legacy_eagle31()
        ),
        PublishedShape(
            "native-norm-before-fc",
            "eagle_config.norm_before_fc with input_norm",
            build_checkpoint(SourceFormat.SGLANG, variant=eagle31),
        ),
        PublishedShape("kimi-k25-eagle3-mla", "Eagle3DeepseekV2ForCausalLM, midlayer.*", _mla()),
        PublishedShape(
            "kimi-k26-eagle31-mla",
            "MLA with fc_norm + norm_output, layers.0.*, YaRN rope",
            _mla(Variant(fc_norm=True, norm_output=True), layers_prefix=True, rope_scaling=KIMI_YARN_ROPE),
        ),
    ]
