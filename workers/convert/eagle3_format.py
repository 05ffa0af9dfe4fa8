"""EAGLE3 draft checkpoint rules: formats, the key mapping to SGLang, config, shapes, dtypes, vocab map.

Pure rules, no I/O: the converter feeds in a config dict, tensor names/dtypes/shapes and the small
vocab tensors, and gets back decisions and ``Problem``s. Internally every kept tensor has its
SGLang-native ("canonical") name, ``midlayer.*`` for the first layer; the output layout decides the
prefix actually written. Facts from shared/reference/eagle3-checkpoints.md and SGLang 0.5.23's
``llama_eagle3.py``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from workers.convert.tensor_values import FLOAT_DTYPES, ValueSummary

SGLANG_ARCHITECTURE = "LlamaForCausalLMEagle3"
EAGLE_ARCHITECTURE = "LlamaForCausalLM"
DEFAULT_NUM_AUX = 3
MIDLAYER = "midlayer."
LAYER_PARTS = frozenset(
    {
        "self_attn.q_proj.weight",
        "self_attn.k_proj.weight",
        "self_attn.v_proj.weight",
        "self_attn.o_proj.weight",
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "hidden_norm.weight",
        "post_attention_layernorm.weight",
    }
)
GLOBAL_KEYS = frozenset({"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"})
EMBEDDING_KEY = "embed_tokens.weight"
# SGLang's load_weights still maps these legacy EAGLE-3.1 names; the output uses the current ones.
LEGACY_FC_NORM = {"aux_norm_low": "fc_norm.0", "aux_norm_mid": "fc_norm.1", "aux_norm_high": "fc_norm.2"}
_FC_NORM = re.compile(r"fc_norm\.(\d+)\.weight")
_LAYER = re.compile(r"(?:layers\.(\d+)|midlayer)\.(.+)")

# Top-level speculators config fields, by what the conversion does with them.
SPECULATORS_HANDLED = frozenset(
    {
        "architectures",
        "speculators_model_type",
        "transformer_layer_config",
        "draft_vocab_size",
        "target_hidden_size",
        "eagle_aux_hidden_state_layer_ids",
        "norm_before_residual",
        "norm_before_fc",
        "fc_norm",
        "norm_output",
        "torch_dtype",
        "dtype",
    }
)
# Fields that describe training or provenance, never the forward pass: dropped from config.json.
SPECULATORS_PROVENANCE = frozenset(
    {
        "speculators_version",
        "speculators_config",
        "transformers_version",
        "embed_requires_grad",
        "has_no_defaults_at_init",
        "_name_or_path",
        "auto_map",
    }
)


class SourceFormat(StrEnum):
    """The input layouts the converter reads."""

    SPECULATORS = "speculators"
    SGLANG = "sglang"
    EAGLE = "eagle"


class LayerNaming(StrEnum):
    """How the draft layer's keys are named: ``midlayer.*`` (loads in old and new SGLang) or ``layers.0.*``."""

    MIDLAYER = "midlayer"
    LAYERS = "layers"


@dataclass(frozen=True)
class Problem:
    """One reason to refuse a checkpoint: where (key or config field), what, and how to fix it."""

    where: str
    problem: str
    fix: str

    def __str__(self) -> str:
        return f"{self.where}: {self.problem} (fix: {self.fix})"


@dataclass(frozen=True)
class Detection:
    """The detected source format and the evidence, for the report and the CLI."""

    format: SourceFormat
    reason: str


def detect_format(config: Mapping[str, Any], names: Iterable[str]) -> Detection | Problem:
    """Tell the source format from the config first and the key names second."""
    architectures = list(config.get("architectures") or [])
    if "speculators_model_type" in config:
        return Detection(
            SourceFormat.SPECULATORS,
            f"config has speculators_model_type={config['speculators_model_type']!r}",
        )
    if SGLANG_ARCHITECTURE in architectures:
        return Detection(SourceFormat.SGLANG, f"config architectures {architectures}")
    has_midlayer = any(name.startswith(MIDLAYER) for name in names)
    if EAGLE_ARCHITECTURE in architectures and (has_midlayer or "draft_vocab_size" in config):
        return Detection(
            SourceFormat.EAGLE,
            f"flat config with architectures {architectures} and EAGLE3 keys (midlayer.*/draft_vocab_size)",
        )
    return Problem(
        "config.json",
        f"cannot tell the EAGLE3 format (architectures {architectures}, no speculators_model_type)",
        "pass --from speculators|sglang|eagle, or check that SRC is an EAGLE3 draft checkpoint",
    )


@dataclass(frozen=True)
class DraftDims:
    """The numbers every expected shape derives from (names as in the reference)."""

    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    num_aux: int
    aux_layer_ids: tuple[int, ...] | None
    fc_norm: bool

    @property
    def needs_vocab_map(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    @property
    def keeps_embedding(self) -> bool:
        """SGLang uses the target's embedding unless the hidden sizes differ."""
        return self.target_hidden_size != self.hidden_size


@dataclass(frozen=True)
class NormalisedConfig:
    """The output ``config.json``, its dims, and every change made to the source config."""

    config: dict[str, Any]
    dims: DraftDims
    changes: tuple[str, ...]


def normalise_config(
    config: Mapping[str, Any], source_format: SourceFormat
) -> NormalisedConfig | list[Problem]:
    """The flat SGLang config for ``config``, or the problems that make it impossible."""
    if source_format is SourceFormat.SPECULATORS:
        flat, changes, problems = _flatten_speculators(config)
    else:
        flat, changes, problems = _flat_native(config, source_format)
    problems += _check_layer_config(flat)
    dims = _dims(flat, problems)
    if problems or dims is None:
        return problems
    return NormalisedConfig(flat, dims, tuple(changes))


def _flatten_speculators(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[Problem]]:
    problems: list[Problem] = []
    changes: list[str] = []
    for field in sorted(set(config) - SPECULATORS_HANDLED - SPECULATORS_PROVENANCE):
        problems.append(
            Problem(
                f"config.json:{field}",
                "unknown speculators config field; converting without it could change the draft",
                "remove it if it does not affect the draft's forward pass, or convert by hand",
            )
        )
    for field in sorted(set(config) & SPECULATORS_PROVENANCE):
        changes.append(f"dropped provenance field {field} (training metadata, not read by SGLang)")
    layer = config.get("transformer_layer_config")
    if not isinstance(layer, dict):
        problems.append(
            Problem(
                "config.json:transformer_layer_config",
                "missing or not an object",
                "a speculators config nests the decoder layer's config here; re-export the checkpoint",
            )
        )
        layer = {}
    problems += _refuse_true(config, "norm_before_residual", "norm_before_fc")
    flat = {key: value for key, value in layer.items() if key != "architectures"}
    flat["architectures"] = [SGLANG_ARCHITECTURE]
    changes.append(f"flattened transformer_layer_config; architectures -> [{SGLANG_ARCHITECTURE}]")
    flat["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = config["target_hidden_size"]
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        flat["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": list(ids)}
        changes.append(
            "moved eagle_aux_hidden_state_layer_ids under eagle_config, ids unchanged: SGLang captures the "
            "OUTPUT of layer id, vLLM the INPUT, so check they match what the draft was trained on"
        )
    for flag in ("fc_norm", "norm_output"):
        if config.get(flag):
            flat[flag] = True
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype and "torch_dtype" not in flat:
        flat["torch_dtype"] = dtype
    return flat, changes, problems


def _flat_native(
    config: Mapping[str, Any], source_format: SourceFormat
) -> tuple[dict[str, Any], list[str], list[Problem]]:
    problems: list[Problem] = []
    changes: list[str] = []
    flat = dict(config)
    architectures = list(config.get("architectures") or [])
    if source_format is SourceFormat.SGLANG and architectures != [SGLANG_ARCHITECTURE]:
        problems.append(
            Problem(
                "config.json:architectures",
                f"is {architectures}; SGLang builds the wrong class from that and crashes at load",
                f"use --from eagle (or auto) to rewrite it to [{SGLANG_ARCHITECTURE}]",
            )
        )
    elif architectures != [SGLANG_ARCHITECTURE]:
        flat["architectures"] = [SGLANG_ARCHITECTURE]
        changes.append(f"architectures {architectures} -> [{SGLANG_ARCHITECTURE}]")
    eagle_config = dict(flat.get("eagle_config") or {})
    problems += _refuse_true(flat, "norm_before_residual", "norm_before_fc")
    problems += _refuse_true(eagle_config, "norm_before_residual", "norm_before_fc")
    if "eagle_aux_hidden_state_layer_ids" in flat:
        eagle_config["eagle_aux_hidden_state_layer_ids"] = flat.pop("eagle_aux_hidden_state_layer_ids")
        changes.append("moved top-level eagle_aux_hidden_state_layer_ids under eagle_config")
    if eagle_config:
        flat["eagle_config"] = eagle_config
    if flat.pop("use_aux_norm", False):
        flat["fc_norm"] = True
        changes.append("use_aux_norm -> fc_norm (the current SGLang name)")
    return flat, changes, problems


def _refuse_true(config: Mapping[str, Any], *flags: str) -> list[Problem]:
    reasons = {
        "norm_before_residual": "SGLang's EAGLE3 layer has no such option and would run a different forward",
        "norm_before_fc": "its input_norm is unknown to SGLang versions that load midlayer.* checkpoints",
    }
    return [
        Problem(
            f"config.json:{flag}", f"is true: {reasons[flag]}", "retrain with it false; it cannot be mapped"
        )
        for flag in flags
        if config.get(flag)
    ]


def _check_layer_config(flat: Mapping[str, Any]) -> list[Problem]:
    problems: list[Problem] = []
    model_type = flat.get("model_type", "llama")
    if model_type != "llama":
        reason = "its q/k norms have no SGLang EAGLE3 equivalent" if model_type == "qwen3" else "unsupported"
        problems.append(
            Problem(
                "config.json:model_type",
                f"draft layer is {model_type!r}: {reason}",
                "only llama draft layers convert; retrain with a llama layer",
            )
        )
    if flat.get("tie_word_embeddings"):
        problems.append(
            Problem(
                "config.json:tie_word_embeddings",
                "is true: SGLang would replace the draft lm_head with the (target-vocab) embedding",
                "set tie_word_embeddings to false; the draft has its own lm_head",
            )
        )
    for bias in ("attention_bias", "mlp_bias"):
        if flat.get(bias):
            problems.append(
                Problem(
                    f"config.json:{bias}",
                    "is true: SGLang's EAGLE3 layer has no biases",
                    "retrain without biases",
                )
            )
    layers = flat.get("num_hidden_layers", 1)
    if layers != 1:
        problems.append(
            Problem(
                "config.json:num_hidden_layers",
                f"is {layers}: extra draft layers have no equivalent in the single-layer SGLang format",
                "convert a one-layer draft",
            )
        )
    return problems


def _dims(flat: dict[str, Any], problems: list[Problem]) -> DraftDims | None:
    def need(field: str) -> int:
        value = flat.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(
                Problem(f"config.json:{field}", f"missing or not a positive integer ({value!r})", "set it")
            )
            return 0
        return value

    hidden, heads, inter = need("hidden_size"), need("num_attention_heads"), need("intermediate_size")
    vocab, draft_vocab = need("vocab_size"), need("draft_vocab_size")
    kv_heads = flat.get("num_key_value_heads") or heads
    head_dim = flat.get("head_dim") or (hidden // heads if heads else 0)
    ids = (flat.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    num_aux = flat.get("num_aux_hidden_states") or (len(ids) if ids else DEFAULT_NUM_AUX)
    if draft_vocab > vocab > 0:
        problems.append(
            Problem(
                "config.json:draft_vocab_size",
                f"{draft_vocab} is larger than the target vocab_size {vocab}",
                "vocab_size must be the TARGET model's vocab; draft_vocab_size the lm_head rows",
            )
        )
    if problems:
        return None
    return DraftDims(
        hidden_size=hidden,
        num_heads=heads,
        num_kv_heads=kv_heads,
        head_dim=head_dim,
        intermediate_size=inter,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=flat.get("target_hidden_size") or hidden,
        num_aux=num_aux,
        aux_layer_ids=tuple(ids) if ids else None,
        fc_norm=bool(flat.get("fc_norm")),
    )


@dataclass(frozen=True)
class KeyDecision:
    """What happens to one source key: kept under ``canonical``, dropped with a reason, or refused."""

    source: str
    canonical: str | None = None
    drop_reason: str | None = None
    refusal: Problem | None = None


def decide_key(name: str, source_format: SourceFormat, dims: DraftDims) -> KeyDecision:
    """Map one source key to its SGLang-native name, or say why it is dropped or refused."""
    layer = _LAYER.fullmatch(name)
    if layer:
        return _decide_layer_key(name, layer, source_format)
    if name in GLOBAL_KEYS or _FC_NORM.fullmatch(name):
        return KeyDecision(name, canonical=name)
    legacy = name.removesuffix(".weight")
    if (
        source_format is not SourceFormat.SPECULATORS
        and legacy in LEGACY_FC_NORM
        and name.endswith(".weight")
    ):
        return KeyDecision(name, canonical=f"{LEGACY_FC_NORM[legacy]}.weight")
    if name == EMBEDDING_KEY:
        if dims.keeps_embedding:
            return KeyDecision(name, canonical=name)
        return KeyDecision(
            name, drop_reason="SGLang uses the target's embedding (target_hidden_size == hidden_size)"
        )
    if source_format is SourceFormat.SPECULATORS and name.startswith("verifier_"):
        return KeyDecision(
            name, drop_reason="copy of a verifier tensor kept for training, not a draft weight"
        )
    if name == "input_norm.weight":
        return _refuse(name, "norm_before_fc's input_norm has no equivalent in the midlayer format")
    return _refuse(name, "unknown key; converting without it could serve a different draft")


def _decide_layer_key(name: str, layer: re.Match[str], source_format: SourceFormat) -> KeyDecision:
    index, part = layer.group(1), layer.group(2)
    if index is not None and int(index) >= 1:
        return _refuse(name, "extra draft layer: the single-layer SGLang format cannot hold it")
    if index is None and source_format is SourceFormat.SPECULATORS:
        return _refuse(name, "midlayer.* key in a speculators checkpoint (expected layers.0.*)")
    if part in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
        return _refuse(name, "qwen3-style q/k norm: SGLang's EAGLE3 (llama) layer has none")
    if part not in LAYER_PARTS:
        return _refuse(name, "unknown key in the draft layer")
    return KeyDecision(name, canonical=MIDLAYER + part)


def _refuse(name: str, why: str) -> KeyDecision:
    return KeyDecision(
        name,
        refusal=Problem(name, why, "retrain or export without it; it cannot be dropped safely"),
    )


def output_name(canonical: str, layout: LayerNaming) -> str:
    """The key written for ``canonical`` in ``layout``."""
    if layout is LayerNaming.LAYERS and canonical.startswith(MIDLAYER):
        return "layers.0." + canonical.removeprefix(MIDLAYER)
    return canonical


def expected_shapes(dims: DraftDims) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
    """(canonical key -> shape for every allowed key, the keys that must be present)."""
    hidden, q_rows = dims.hidden_size, dims.num_heads * dims.head_dim
    kv_rows, inter = dims.num_kv_heads * dims.head_dim, dims.intermediate_size
    layer = {
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
    }
    shapes = {MIDLAYER + part: shape for part, shape in layer.items()}
    shapes |= {
        "fc.weight": (hidden, dims.num_aux * dims.target_hidden_size),
        "norm.weight": (hidden,),
        "lm_head.weight": (dims.draft_vocab_size, hidden),
        "d2t": (dims.draft_vocab_size,),
        "t2d": (dims.vocab_size,),
    }
    fc_norms = {f"fc_norm.{i}.weight": (dims.target_hidden_size,) for i in range(dims.num_aux)}
    shapes |= fc_norms
    required = set(shapes) - {"d2t", "t2d"} - set(fc_norms)
    if dims.needs_vocab_map:
        required |= {"d2t", "t2d"}
    if dims.fc_norm:
        required |= set(fc_norms)
    if dims.keeps_embedding:
        shapes[EMBEDDING_KEY] = (dims.vocab_size, hidden)
        required.add(EMBEDDING_KEY)
    return shapes, frozenset(required)


@dataclass(frozen=True)
class TensorFacts:
    """Name (canonical), dtype and shape of a kept tensor, with its source name for messages."""

    canonical: str
    source: str
    dtype: str
    shape: tuple[int, ...]


def check_tensors(tensors: list[TensorFacts], dims: DraftDims) -> list[Problem]:
    """Checks 2-4: exact key set, shapes from the config, one float dtype, d2t int64, t2d bool."""
    shapes, required = expected_shapes(dims)
    problems: list[Problem] = []
    present = {t.canonical for t in tensors}
    for missing in sorted(required - present):
        problems.append(_missing(missing, dims))
    fc_norms = {name for name in present if _FC_NORM.fullmatch(name)}
    if fc_norms and not dims.fc_norm:
        problems.append(
            Problem(
                "config.json:fc_norm",
                f"checkpoint has {sorted(fc_norms)} but the config does not enable fc_norm",
                "set fc_norm: true in the config (SGLang skips these weights otherwise)",
            )
        )
    float_dtypes: dict[str, list[str]] = {}
    for tensor in tensors:
        expected = shapes.get(tensor.canonical)
        if expected is None:
            problems.append(
                Problem(tensor.source, "not expected for this config", "remove it or fix the config")
            )
            continue
        if tensor.shape != expected:
            problems.append(_wrong_shape(tensor, expected, dims))
        if tensor.canonical == "d2t":
            problems += _check_d2t_dtype(tensor)
        elif tensor.canonical == "t2d":
            if tensor.dtype != "BOOL":
                problems.append(
                    Problem("t2d", f"dtype is {tensor.dtype}, must be BOOL", "store t2d as a bool mask")
                )
        elif tensor.dtype not in FLOAT_DTYPES:
            problems.append(
                Problem(tensor.source, f"dtype {tensor.dtype} is not BF16/F16/F32", "export floats as bf16")
            )
        else:
            float_dtypes.setdefault(tensor.dtype, []).append(tensor.source)
    if len(float_dtypes) > 1:
        summary = ", ".join(
            f"{dtype}: {names[0]} (+{len(names) - 1})" for dtype, names in float_dtypes.items()
        )
        problems.append(
            Problem("weights", f"mixed float dtypes ({summary})", "export all weights in one dtype (bf16)")
        )
    return problems


def _missing(key: str, dims: DraftDims) -> Problem:
    if key == "d2t":
        return Problem(
            "d2t",
            f"missing while draft vocab {dims.draft_vocab_size} < target vocab {dims.vocab_size}: "
            "draft ids would be read as target ids and acceptance silently collapses",
            "add d2t (int64 offsets: target_id = draft_id + d2t[draft_id]) from the training vocab map",
        )
    return Problem(key, "required key missing", "re-export the full trained draft checkpoint")


def _wrong_shape(tensor: TensorFacts, expected: tuple[int, ...], dims: DraftDims) -> Problem:
    if tensor.canonical == "fc.weight" and len(tensor.shape) == 2 and tensor.shape[0] == expected[0]:
        width = tensor.shape[1]
        return Problem(
            tensor.source,
            f"shape {list(tensor.shape)}: width {width} = {width / dims.target_hidden_size:g} aux hidden "
            f"states of {dims.target_hidden_size}, but the config implies {dims.num_aux}",
            "make eagle_config.eagle_aux_hidden_state_layer_ids list as many layers as fc was trained with",
        )
    return Problem(
        tensor.source,
        f"shape {list(tensor.shape)}, expected {list(expected)} from the config",
        "check hidden_size/heads/head_dim/intermediate_size/vocab sizes in config.json against the weights",
    )


def _check_d2t_dtype(tensor: TensorFacts) -> list[Problem]:
    if tensor.dtype == "I64":
        return []
    exact_up_to = {"BF16": 256, "F16": 2048, "F32": 1 << 24}
    if tensor.dtype in exact_up_to:
        return [
            Problem(
                "d2t",
                f"stored as {tensor.dtype}, which holds integers exactly only up to "
                f"{exact_up_to[tensor.dtype]}; larger offsets are rounded and map to wrong target ids",
                "re-export d2t as int64 from the training vocab map (do not cast the damaged one back)",
            )
        ]
    return [Problem("d2t", f"dtype is {tensor.dtype}, must be I64", "store d2t as int64 offsets")]


def check_vocab_mapping(d2t: np.ndarray | None, t2d: np.ndarray | None, dims: DraftDims) -> list[Problem]:
    """Check 5: ids = arange(Vd) + d2t are sorted target ids in range and equal nonzero(t2d)."""
    if d2t is None or t2d is None:
        return []
    ids = np.arange(d2t.shape[0], dtype=np.int64) + d2t
    marked = np.flatnonzero(t2d)
    problems: list[Problem] = []
    if marked.size != dims.draft_vocab_size:
        problems.append(
            Problem(
                "t2d",
                f"marks {marked.size} target ids, the draft vocab has {dims.draft_vocab_size}",
                "rebuild t2d from the same vocab map as d2t (t2d[ids] = True)",
            )
        )
    if dims.needs_vocab_map and not d2t.any():
        problems.append(
            Problem(
                "d2t",
                f"all zero with draft vocab {dims.draft_vocab_size} < target vocab {dims.vocab_size}: "
                "every draft id would map to the same-numbered target id",
                "export the real d2t offsets from the training vocab map",
            )
        )
    elif _looks_absolute(d2t, marked, ids, dims.vocab_size):
        problems.append(
            Problem(
                "d2t",
                "holds absolute target ids, not offsets (SGLang adds arange(draft_vocab) to it)",
                "store d2t = ids - arange(draft_vocab_size)",
            )
        )
    elif not _is_valid_map(ids, dims.vocab_size) or not np.array_equal(ids, marked):
        problems.append(
            Problem(
                "d2t",
                "arange(draft_vocab) + d2t is not the sorted list of target ids t2d marks",
                "export d2t and t2d together from one vocab map",
            )
        )
    return problems


def _is_valid_map(ids: np.ndarray, vocab: int) -> bool:
    return bool(ids.size == 0 or (ids[0] >= 0 and ids[-1] < vocab and np.all(np.diff(ids) > 0)))


def _looks_absolute(d2t: np.ndarray, marked: np.ndarray, ids: np.ndarray, vocab: int) -> bool:
    """d2t is itself the id list (matches t2d, or is a valid id list while d2t-as-offsets is not)."""
    if np.array_equal(ids, marked) and _is_valid_map(ids, vocab):
        return False
    return bool(np.array_equal(d2t, marked) or (_is_valid_map(d2t, vocab) and not _is_valid_map(ids, vocab)))


def check_target(dims: DraftDims, target: Mapping[str, Any]) -> list[Problem]:
    """The draft against the target model's config: vocab, hidden size, aux layer ids."""
    text = target.get("text_config") or target
    problems: list[Problem] = []
    target_vocab = text.get("vocab_size")
    if target_vocab != dims.vocab_size:
        problems.append(
            Problem(
                "config.json:vocab_size",
                f"draft says target vocab {dims.vocab_size}, the target config says {target_vocab}",
                "the draft was trained for another target: use the matching draft (or target config)",
            )
        )
    target_hidden = text.get("hidden_size")
    if target_hidden != dims.target_hidden_size:
        problems.append(
            Problem(
                "config.json:target_hidden_size",
                f"draft expects target hidden states of {dims.target_hidden_size}, target has {target_hidden}",
                "set target_hidden_size to the target's hidden_size, or use the draft trained for it",
            )
        )
    layers = text.get("num_hidden_layers")
    if dims.aux_layer_ids and isinstance(layers, int) and max(dims.aux_layer_ids) >= layers:
        problems.append(
            Problem(
                "config.json:eagle_config.eagle_aux_hidden_state_layer_ids",
                f"{list(dims.aux_layer_ids)} reaches past the target's {layers} layers",
                "use layer ids of the target this draft was trained on",
            )
        )
    return problems


def judge_values(source: str, canonical: str, dtype: str, summary: ValueSummary) -> Problem | str | None:
    """Check 6 for one float tensor: a Problem (refuse), a warning string, or None when fine."""
    if summary.non_finite:
        return Problem(
            source,
            f"{summary.non_finite} of {summary.elements} values are NaN or inf",
            "export the trained weights (an uninitialised head is saved as NaN)",
        )
    if summary.all_zero:
        return Problem(source, "all zeros: never trained or never loaded", "export the trained weights")
    value = summary.constant_value(dtype)
    if value is None:
        return None
    if canonical.endswith("norm.weight") and value == 1.0:
        return f"{source}: every value is exactly 1.0, the initial value: this norm looks untrained"
    return Problem(
        source,
        f"every value is exactly {value!r}: not trained weights",
        "export the trained weights",
    )
