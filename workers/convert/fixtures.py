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

from workers.convert.eagle3_format import LAYER_PARTS, SourceFormat
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


TINY = FixtureDims(64, 4, 2, 16, 128, 96, 256, 64, 8, (1, 3, 6))
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
) -> FixtureCheckpoint:
    """A valid checkpoint of ``source_format`` (speculators checkpoints carry their embedding).

    ``fast_values`` fills bf16 weights with random bit patterns of magnitude below 2 (every one
    finite) instead of normal samples: several times faster to generate, for the 2 GiB bench.
    """
    prefix = "layers.0." if source_format is SourceFormat.SPECULATORS else "midlayer."
    shapes = _shapes(dims)
    tensors: dict[str, FixtureTensor] = {}
    for index, (name, shape) in enumerate(shapes.items()):
        key = prefix + name if name in LAYER_PARTS else name
        kind = "norm" if name.endswith("norm.weight") else "weight"
        if fast_values and dtype == "BF16":
            kind = "bits"
        tensors[key] = FixtureTensor(dtype, shape, seed=seed * 1000 + index, kind=kind)
    d2t, t2d = vocab_map(dims, seed)
    tensors["d2t"] = FixtureTensor("I64", d2t.shape, d2t)
    tensors["t2d"] = FixtureTensor("BOOL", t2d.shape, t2d)
    if source_format is SourceFormat.SPECULATORS and include_embedding:
        tensors["embed_tokens.weight"] = FixtureTensor(
            dtype, (dims.vocab_size, dims.hidden_size), seed=seed * 1000 + 999
        )
    return FixtureCheckpoint(source_format, _config(source_format, dims, dtype), tensors)


def _shapes(dims: FixtureDims) -> dict[str, tuple[int, ...]]:
    """Tensor shapes of an EAGLE3 drafter (layer parts unprefixed).

    Written out here, not taken from ``eagle3_format.expected_shapes``: these fixtures are the
    converter's test oracle, so a wrong shape there must not be copied into them.
    """
    hidden, q_rows, kv_rows = (
        dims.hidden_size,
        dims.num_heads * dims.head_dim,
        dims.num_kv_heads * dims.head_dim,
    )
    inter = dims.intermediate_size
    return {
        "self_attn.q_proj.weight": (q_rows, 2 * hidden),
        "self_attn.k_proj.weight": (kv_rows, 2 * hidden),
        "self_attn.v_proj.weight": (kv_rows, 2 * hidden),
        "self_attn.o_proj.weight": (hidden, q_rows),
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "hidden_norm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
        "fc.weight": (hidden, len(dims.aux_layer_ids) * dims.target_hidden_size),
        "norm.weight": (hidden,),
        "lm_head.weight": (dims.draft_vocab_size, hidden),
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


def _config(source_format: SourceFormat, dims: FixtureDims, dtype: str) -> dict[str, Any]:
    layer = _llama_fields(dims, dtype)
    if source_format is SourceFormat.SPECULATORS:
        return {
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
    architecture = "LlamaForCausalLMEagle3" if source_format is SourceFormat.SGLANG else "LlamaForCausalLM"
    return {
        **layer,
        "architectures": [architecture],
        "draft_vocab_size": dims.draft_vocab_size,
        "target_hidden_size": dims.target_hidden_size,
        "eagle_config": {"eagle_aux_hidden_state_layer_ids": list(dims.aux_layer_ids)},
    }


def target_config(dims: FixtureDims) -> dict[str, Any]:
    """A target model config (DeepSeek-V3 family, like Kimi K2) matching ``dims``."""
    return {
        "architectures": ["DeepseekV3ForCausalLM"],
        "model_type": "deepseek_v3",
        "vocab_size": dims.vocab_size,
        "hidden_size": dims.target_hidden_size,
        "num_hidden_layers": dims.target_layers,
    }


def write_target_config(root: Path, dims: FixtureDims) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "config.json").write_text(json.dumps(target_config(dims), indent=2))
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
