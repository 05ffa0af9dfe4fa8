"""EAGLE3 draft checkpoint rules: formats, the key mapping to SGLang, config, shapes, dtypes, vocab map.

Pure rules, no I/O: the converter feeds in a config dict, tensor names/dtypes/shapes and the small
vocab tensors, and gets back decisions and ``Problem``s. Internally every kept tensor has its
SGLang-native ("canonical") name, ``midlayer.*`` for the first layer; the output layout decides the
prefix actually written. Every field rule cites the code it comes from: speculators 0.9.0's
``Eagle3SpeculatorConfig`` / ``SpeculatorModel``, SpecForge 0.2.0's ``LlamaForCausalLMEagle3``, and
SGLang 0.5.23's ``llama_eagle3.py`` / ``kimi_k25_eagle3.py`` (docs/conversion.md has the table).
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from workers.convert.tensor_values import FLOAT_DTYPES, ValueSummary
from workers.sglang.drafts import (
    LLAMA_DRAFT_ARCHITECTURE,
    LLAMA_LEGACY_NAMES,
    MLA_DRAFT_ARCHITECTURE,
    MLA_MODEL_TYPES,
    DraftFeature,
)

SGLANG_ARCHITECTURE = LLAMA_DRAFT_ARCHITECTURE
EAGLE_ARCHITECTURE = "LlamaForCausalLM"
DEFAULT_NUM_AUX = 3
MIDLAYER = "midlayer."
MHA_ATTENTION = frozenset({"q_proj", "k_proj", "v_proj", "o_proj"})
MLA_ATTENTION = frozenset(
    {"q_a_proj", "q_a_layernorm", "q_b_proj", "kv_a_proj_with_mqa", "kv_a_layernorm", "kv_b_proj", "o_proj"}
)
LAYER_COMMON = frozenset(
    {
        "mlp.gate_proj.weight",
        "mlp.up_proj.weight",
        "mlp.down_proj.weight",
        "input_layernorm.weight",
        "hidden_norm.weight",
        "post_attention_layernorm.weight",
    }
)
LAYER_PARTS = LAYER_COMMON | {f"self_attn.{name}.weight" for name in MHA_ATTENTION}
MLA_LAYER_PARTS = LAYER_COMMON | {f"self_attn.{name}.weight" for name in MLA_ATTENTION}
GLOBAL_KEYS = frozenset({"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"})
EMBEDDING_KEY = "embed_tokens.weight"
INPUT_NORM_KEY = "input_norm.weight"
# SGLang's llama load_weights maps these legacy EAGLE-3.1 names (the MLA loader does not); the output
# uses the current ones.
LEGACY_FC_NORM = {legacy: new for legacy, new in LLAMA_LEGACY_NAMES.items() if new.startswith("fc_norm")}
_FC_NORM = re.compile(r"fc_norm\.(\d+)\.weight")
_LAYER = re.compile(r"(?:layers\.(\d+)|midlayer)\.(.+)")


class SourceFormat(StrEnum):
    """The input layouts the converter reads."""

    SPECULATORS = "speculators"
    SGLANG = "sglang"
    EAGLE = "eagle"
    SGLANG_MLA = "sglang-mla"


class LayerNaming(StrEnum):
    """How the draft layer's keys are named: ``midlayer.*`` (loads in old and new SGLang) or ``layers.0.*``."""

    MIDLAYER = "midlayer"
    LAYERS = "layers"


class FieldAction(StrEnum):
    """What conversion does with one top-level speculators config field."""

    MAPS = "maps"
    PROVENANCE = "dropped as provenance"
    REFUSED = "refused when true"


@dataclass(frozen=True)
class FieldRule:
    """One speculators config field: the action, and why (its meaning in the source's own code)."""

    action: FieldAction
    why: str


# Every top-level field speculators 0.9.0 writes (Eagle3SpeculatorConfig, SpeculatorModelConfig and
# transformers' PretrainedConfig.to_diff_dict) plus those older exports carry; anything else refuses.
SPECULATORS_FIELDS: dict[str, FieldRule] = {
    "architectures": FieldRule(FieldAction.MAPS, f"always written as [{SGLANG_ARCHITECTURE}]"),
    "speculators_model_type": FieldRule(
        FieldAction.MAPS, "must be 'eagle3'; other algorithms (peagle, mtp, dflash) run another forward"
    ),
    "transformer_layer_config": FieldRule(
        FieldAction.MAPS, "the draft layer's llama config, flattened to the top level SGLang reads"
    ),
    "draft_vocab_size": FieldRule(FieldAction.MAPS, "kept: lm_head rows (SGLang's ParallelLMHead size)"),
    "target_hidden_size": FieldRule(FieldAction.MAPS, "kept: width of each aux hidden state fed to fc"),
    "eagle_aux_hidden_state_layer_ids": FieldRule(
        FieldAction.MAPS, "moved to eagle_config.eagle_aux_hidden_state_layer_ids (sets fc's input width)"
    ),
    "norm_before_fc": FieldRule(
        FieldAction.MAPS,
        "one RMSNorm over the concatenated aux states before fc (weight input_norm): carried as "
        "eagle_config.norm_before_fc, from which SGLang builds input_norm",
    ),
    "fc_norm": FieldRule(FieldAction.MAPS, "per-aux-state RMSNorms before fc (EAGLE-3.1): kept"),
    "norm_output": FieldRule(
        FieldAction.MAPS, "feed post-norm hidden states to the next draft step (EAGLE-3.1): kept"
    ),
    "torch_dtype": FieldRule(FieldAction.MAPS, "kept as torch_dtype"),
    "dtype": FieldRule(
        FieldAction.MAPS, "transformers >= 4.56 writes dtype for torch_dtype: written as torch_dtype"
    ),
    "tie_word_embeddings": FieldRule(
        FieldAction.MAPS,
        "SpeculatorModel.__init__ forces it false (the draft always has its own lm_head): the output "
        "says tie_word_embeddings: false whatever the source says",
    ),
    "norm_before_residual": FieldRule(
        FieldAction.REFUSED,
        "the first layer's residual becomes hidden_norm(hidden); SGLang's layer keeps the raw hidden "
        "state as residual, so it would run a different forward",
    ),
    "embed_requires_grad": FieldRule(
        FieldAction.REFUSED,
        "true means the embedding was trained; SGLang replaces the draft's embedding with the "
        "target's (set_embed) unless target_hidden_size differs, so the trained one would be ignored",
    ),
    "speculators_version": FieldRule(FieldAction.PROVENANCE, "the library version that wrote it"),
    "speculators_config": FieldRule(
        FieldAction.PROVENANCE,
        "algorithm, proposal methods and verifier name: vLLM's runtime settings and provenance",
    ),
    "default_proposal_method": FieldRule(
        FieldAction.PROVENANCE,
        "vLLM's token proposal choice; SGLang takes --speculative-num-steps/-eagle-topk/-num-draft-tokens",
    ),
    "proposal_methods": FieldRule(
        FieldAction.PROVENANCE, "vLLM's proposal settings (greedy, speculative_tokens); not a weight"
    ),
    "transformers_version": FieldRule(FieldAction.PROVENANCE, "the transformers version that wrote it"),
    "has_no_defaults_at_init": FieldRule(
        FieldAction.PROVENANCE, "a transformers class attribute older speculators versions serialised"
    ),
    "_name_or_path": FieldRule(FieldAction.PROVENANCE, "where the config was loaded from"),
    "auto_map": FieldRule(FieldAction.PROVENANCE, "remote-code class names for transformers' Auto*"),
}


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
    if MLA_DRAFT_ARCHITECTURE in architectures:
        return Detection(
            SourceFormat.SGLANG_MLA,
            f"config architectures {architectures}: checked, passed through unchanged",
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
        "pass --from speculators|sglang|eagle|sglang-mla, or check that SRC is an EAGLE3 draft checkpoint",
    )


@dataclass(frozen=True)
class MhaDims:
    """Grouped-query attention of a llama draft layer."""

    num_heads: int
    num_kv_heads: int
    head_dim: int


@dataclass(frozen=True)
class MlaDims:
    """DeepSeek-V2 multi-latent attention of an MLA draft layer (fields as DeepseekV2AttentionMLA reads)."""

    num_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int


@dataclass(frozen=True)
class DraftDims:
    """The numbers every expected shape derives from (names as in the reference)."""

    hidden_size: int
    attention: MhaDims | MlaDims
    intermediate_size: int
    vocab_size: int
    draft_vocab_size: int
    target_hidden_size: int
    num_aux: int
    aux_layer_ids: tuple[int, ...] | None
    fc_norm: bool
    norm_before_fc: bool
    norm_output: bool
    own_head: bool

    @property
    def needs_vocab_map(self) -> bool:
        return self.draft_vocab_size < self.vocab_size

    @property
    def keeps_embedding(self) -> bool:
        """SGLang uses the target's embedding unless the hidden sizes differ."""
        return self.target_hidden_size != self.hidden_size

    @property
    def features(self) -> tuple[DraftFeature, ...]:
        """The version-dependent SGLang features this draft needs (the output layout adds its own)."""
        wanted = {
            DraftFeature.MLA: isinstance(self.attention, MlaDims),
            DraftFeature.INPUT_NORM: self.norm_before_fc,
            DraftFeature.FC_NORM: self.fc_norm,
            DraftFeature.NORM_OUTPUT: self.norm_output,
        }
        return tuple(feature for feature, used in wanted.items() if used)


@dataclass(frozen=True)
class NormalisedConfig:
    """The output ``config.json``, its dims, and every change made to the source config."""

    config: dict[str, Any]
    dims: DraftDims
    changes: tuple[str, ...]


def normalise_config(
    config: Mapping[str, Any], source_format: SourceFormat, names: Iterable[str] = ()
) -> NormalisedConfig | list[Problem]:
    """The flat SGLang config for ``config`` (whose tensors are ``names``), or why it is impossible."""
    names = frozenset(names)
    if source_format is SourceFormat.SPECULATORS:
        flat, changes, problems = _flatten_speculators(config)
    elif source_format is SourceFormat.SGLANG_MLA:
        flat, changes, problems = dict(config), [], _check_mla_config(config)
    else:
        flat, changes, problems = _flat_native(config, source_format)
    if source_format is not SourceFormat.SGLANG_MLA:
        problems += _check_layer_config(flat)
    problems += _check_common(flat)
    own_head = _head_choice(flat, names, changes)
    dims = _dims(flat, problems, own_head)
    if dims is not None and config.get("embed_requires_grad") and not dims.keeps_embedding:
        problems.append(_field_problem("embed_requires_grad", "set it false and retrain the draft"))
    if problems or dims is None:
        return problems
    if dims.norm_output and source_format in (SourceFormat.SGLANG, SourceFormat.EAGLE):
        changes.append(
            "norm_output: true kept: SGLang feeds the POST-norm hidden state to the next draft step "
            "(EAGLE-3.1); SpecForge 0.2.0 uses the same name for 'norm before lm_head' and always feeds "
            "the pre-norm state back, so for a SpecForge export remove norm_output"
        )
    return NormalisedConfig(flat, dims, tuple(changes))


def _field_problem(field: str, fix: str) -> Problem:
    return Problem(f"config.json:{field}", f"is true: {SPECULATORS_FIELDS[field].why}", fix)


def _flatten_speculators(config: Mapping[str, Any]) -> tuple[dict[str, Any], list[str], list[Problem]]:
    problems: list[Problem] = []
    changes: list[str] = []
    for field in sorted(set(config) - set(SPECULATORS_FIELDS)):
        problems.append(
            Problem(
                f"config.json:{field}",
                "unknown speculators config field (not written by speculators 0.9.0); converting "
                "without it could change the draft",
                "remove it if it does not affect the draft's forward pass, or convert by hand",
            )
        )
    for field in sorted(config):
        rule = SPECULATORS_FIELDS.get(field)
        if rule is not None and rule.action is FieldAction.PROVENANCE:
            changes.append(f"dropped provenance field {field}: {rule.why}")
        elif rule is not None and rule.action is FieldAction.REFUSED and not config[field]:
            changes.append(f"dropped field {field}: false is the forward SGLang runs (true is refused)")
    if config.get("speculators_model_type") != "eagle3":
        problems.append(
            Problem(
                "config.json:speculators_model_type",
                f"is {config.get('speculators_model_type')!r}: {SPECULATORS_FIELDS['speculators_model_type'].why}",
                "convert an eagle3 speculator; other algorithms have no SGLang EAGLE3 equivalent",
            )
        )
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
    if config.get("norm_before_residual"):
        problems.append(_field_problem("norm_before_residual", "retrain with it false; it cannot be mapped"))
    flat = {key: value for key, value in layer.items() if key != "architectures"}
    flat["architectures"] = [SGLANG_ARCHITECTURE]
    changes.append(f"flattened transformer_layer_config; architectures -> [{SGLANG_ARCHITECTURE}]")
    if layer.get("tie_word_embeddings") or config.get("tie_word_embeddings"):
        changes.append(
            "tie_word_embeddings -> false: speculators never ties (SpeculatorModel.__init__ forces "
            "false; lm_head is its own draft_vocab_size x hidden matrix)"
        )
    flat["tie_word_embeddings"] = False
    flat["draft_vocab_size"] = config.get("draft_vocab_size")
    if config.get("target_hidden_size") is not None:
        flat["target_hidden_size"] = config["target_hidden_size"]
    eagle_config: dict[str, Any] = {}
    ids = config.get("eagle_aux_hidden_state_layer_ids")
    if ids:
        eagle_config["eagle_aux_hidden_state_layer_ids"] = list(ids)
        changes.append(
            "moved eagle_aux_hidden_state_layer_ids under eagle_config, ids unchanged: SGLang captures the "
            "OUTPUT of layer id, vLLM the INPUT, so check they match what the draft was trained on"
        )
    if config.get("norm_before_fc"):
        eagle_config["norm_before_fc"] = True
        changes.append("norm_before_fc -> eagle_config.norm_before_fc: SGLang builds input_norm from it")
    if eagle_config:
        flat["eagle_config"] = eagle_config
    for flag in ("fc_norm", "norm_output"):
        if config.get(flag):
            flat[flag] = True
    dtype = config.get("torch_dtype") or config.get("dtype")
    if dtype and "torch_dtype" not in flat:
        flat["torch_dtype"] = dtype
    flat.pop("dtype", None)
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
    if flat.get("norm_before_residual") or eagle_config.get("norm_before_residual"):
        problems.append(_field_problem("norm_before_residual", "retrain with it false; it cannot be mapped"))
    if "eagle_aux_hidden_state_layer_ids" in flat:
        eagle_config["eagle_aux_hidden_state_layer_ids"] = flat.pop("eagle_aux_hidden_state_layer_ids")
        changes.append("moved top-level eagle_aux_hidden_state_layer_ids under eagle_config")
    if "norm_before_fc" in flat:
        # SGLang reads eagle_config.norm_before_fc first, the top-level field only as its default.
        top = bool(flat.pop("norm_before_fc"))
        eagle_config["norm_before_fc"] = bool(eagle_config.get("norm_before_fc", top))
        changes.append("moved top-level norm_before_fc under eagle_config (where SGLang looks first)")
    if eagle_config:
        flat["eagle_config"] = eagle_config
    if flat.pop("use_aux_norm", False):
        flat["fc_norm"] = True
        changes.append("use_aux_norm -> fc_norm (the current SGLang name)")
    return flat, changes, problems


def _check_common(flat: Mapping[str, Any]) -> list[Problem]:
    if flat.get("fc_norm") and (flat.get("eagle_config") or {}).get("norm_before_fc"):
        return [
            Problem(
                "config.json:fc_norm",
                "and norm_before_fc are both on: speculators refuses the pair (double norming) and no "
                "trainer writes it, so this config does not describe how the weights were trained",
                "keep the one the draft was trained with",
            )
        ]
    return []


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
    problems += _check_one_layer(flat)
    return problems


def _check_one_layer(flat: Mapping[str, Any]) -> list[Problem]:
    layers = flat.get("num_hidden_layers", 1)
    if layers == 1:
        return []
    return [
        Problem(
            "config.json:num_hidden_layers",
            f"is {layers}: the converter maps one-layer drafts only (speculators' extra layers are plain "
            "decoder layers; SGLang's layers >= 1 read hidden_norm instead, and its MLA draft refuses them)",
            "convert a one-layer draft",
        )
    ]


def _check_mla_config(config: Mapping[str, Any]) -> list[Problem]:
    """The MLA draft's config as Eagle3DeepseekV2ForCausalLM reads it; nothing is rewritten."""
    problems: list[Problem] = []
    model_type = config.get("model_type")
    if model_type not in MLA_MODEL_TYPES:
        problems.append(
            Problem(
                "config.json:model_type",
                f"is {model_type!r}: SGLang builds the MLA draft's config with transformers, which knows "
                f"{sorted(MLA_MODEL_TYPES)} for this layout",
                "set model_type to deepseek_v3",
            )
        )
    if config.get("q_lora_rank") is None:
        problems.append(
            Problem(
                "config.json:q_lora_rank",
                "missing: SGLang's Eagle3 MLA layer requires q_lora_rank (it raises otherwise)",
                "set it to the draft's q_a_proj rows",
            )
        )
    eagle_config = config.get("eagle_config") or {}
    for flag in ("norm_before_fc", "norm_before_residual"):
        if config.get(flag) or eagle_config.get(flag):
            problems.append(
                Problem(
                    f"config.json:{flag}",
                    f"is true: SGLang's {MLA_DRAFT_ARCHITECTURE} has no such option and would run a "
                    "different forward",
                    "retrain with it false",
                )
            )
    for bias in ("attention_bias", "mlp_bias"):
        if config.get(bias):
            problems.append(
                Problem(f"config.json:{bias}", "is true: SGLang's MLA draft has no biases", "retrain without")
            )
    problems += _check_one_layer(config)
    return problems


def _head_choice(flat: dict[str, Any], names: frozenset[str], changes: list[str]) -> bool:
    """Whether the draft serves its own lm_head; writes draft_vocab_size when SGLang needs it to.

    With ``draft_vocab_size`` unset and untied embeddings SGLang 0.5.23 sets
    ``load_lm_head_from_target`` and serves the TARGET's lm_head, ignoring a trained draft head.
    """
    if flat.get("draft_vocab_size") is not None or flat.get("tie_word_embeddings"):
        return True
    vocab = flat.get("vocab_size")
    if "lm_head.weight" in names:
        flat["draft_vocab_size"] = vocab
        changes.append(
            f"draft_vocab_size unset: wrote draft_vocab_size = vocab_size ({vocab}) so SGLang serves this "
            "draft's own full-vocabulary lm_head (unset, it would load the TARGET's head instead)"
        )
        return True
    if "draft_vocab_size" not in flat:
        flat["draft_vocab_size"] = None
        changes.append(
            "draft_vocab_size written as null: SGLang 0.5.23 reads config.draft_vocab_size directly, and "
            "a config without the key fails to load (AttributeError under its transformers 5.19)"
        )
    changes.append(
        "no lm_head and draft_vocab_size unset: SGLang serves the TARGET's lm_head (load_lm_head_from_target)"
    )
    return False


def _dims(flat: dict[str, Any], problems: list[Problem], own_head: bool) -> DraftDims | None:
    def need(field: str) -> int:
        value = flat.get(field)
        if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
            problems.append(
                Problem(f"config.json:{field}", f"missing or not a positive integer ({value!r})", "set it")
            )
            return 0
        return value

    hidden, heads, inter = need("hidden_size"), need("num_attention_heads"), need("intermediate_size")
    vocab = need("vocab_size")
    draft_vocab = need("draft_vocab_size") if own_head else vocab
    attention: MhaDims | MlaDims
    if flat.get("architectures") == [MLA_DRAFT_ARCHITECTURE]:
        attention = MlaDims(
            heads,
            need("q_lora_rank"),
            need("kv_lora_rank"),
            need("qk_nope_head_dim"),
            need("qk_rope_head_dim"),
            need("v_head_dim"),
        )
    else:
        head_dim = flat.get("head_dim") or (hidden // heads if heads else 0)
        attention = MhaDims(heads, flat.get("num_key_value_heads") or heads, head_dim)
    eagle_config = flat.get("eagle_config") or {}
    ids = eagle_config.get("eagle_aux_hidden_state_layer_ids") or flat.get("eagle_aux_hidden_state_layer_ids")
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
        attention=attention,
        intermediate_size=inter,
        vocab_size=vocab,
        draft_vocab_size=draft_vocab,
        target_hidden_size=flat.get("target_hidden_size") or hidden,
        num_aux=num_aux,
        aux_layer_ids=tuple(ids) if ids else None,
        fc_norm=bool(flat.get("fc_norm") or flat.get("use_aux_norm")),
        norm_before_fc=bool(eagle_config.get("norm_before_fc")),
        norm_output=bool(flat.get("norm_output")),
        own_head=own_head,
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
    if name in GLOBAL_KEYS or _FC_NORM.fullmatch(name) or name == INPUT_NORM_KEY:
        return KeyDecision(name, canonical=name)
    legacy = name.removesuffix(".weight")
    if (
        source_format is not SourceFormat.SPECULATORS
        and legacy in LEGACY_FC_NORM
        and name.endswith(".weight")
    ):
        return KeyDecision(name, canonical=f"{LEGACY_FC_NORM[legacy]}.weight")
    if name == EMBEDDING_KEY:
        if dims.keeps_embedding or source_format is SourceFormat.SGLANG_MLA:
            return KeyDecision(name, canonical=name)
        return KeyDecision(
            name, drop_reason="SGLang uses the target's embedding (target_hidden_size == hidden_size)"
        )
    if source_format is SourceFormat.SPECULATORS and name.startswith("verifier_"):
        return KeyDecision(
            name, drop_reason="copy of a verifier tensor kept for training, not a draft weight"
        )
    return _refuse(name, "unknown key; converting without it could serve a different draft")


def _decide_layer_key(name: str, layer: re.Match[str], source_format: SourceFormat) -> KeyDecision:
    index, part = layer.group(1), layer.group(2)
    if index is not None and int(index) >= 1:
        return _refuse(name, "extra draft layer: the converter maps one-layer drafts only")
    if index is None and source_format is SourceFormat.SPECULATORS:
        return _refuse(name, "midlayer.* key in a speculators checkpoint (expected layers.0.*)")
    if part in ("self_attn.q_norm.weight", "self_attn.k_norm.weight"):
        return _refuse(name, "qwen3-style q/k norm: SGLang's EAGLE3 (llama) layer has none")
    if source_format is SourceFormat.SGLANG_MLA:
        if part == "self_attn.fused_qkv_a_proj_with_mqa.weight":
            return _refuse(
                name,
                "pre-fused weight: SGLang's MLA loader caches it as a kv_a_proj half and never loads it",
            )
        if part not in MLA_LAYER_PARTS:
            return _refuse(name, "unknown key in the MLA draft layer (SGLang would skip it)")
    elif part not in LAYER_PARTS:
        return _refuse(name, "unknown key in the draft layer")
    return KeyDecision(name, canonical=MIDLAYER + part)


def _refuse(name: str, why: str) -> KeyDecision:
    return KeyDecision(
        name,
        refusal=Problem(name, why, "retrain or export without it; it cannot be dropped safely"),
    )


def output_name(canonical: str, source: str, source_format: SourceFormat, layout: LayerNaming) -> str:
    """The key written for ``canonical``: MLA drafts keep their source layer prefix (their loader
    reads both); others get ``layout``'s."""
    if source_format is SourceFormat.SGLANG_MLA:
        return source if canonical.startswith(MIDLAYER) else canonical
    if layout is LayerNaming.LAYERS and canonical.startswith(MIDLAYER):
        return "layers.0." + canonical.removeprefix(MIDLAYER)
    return canonical


def _layer_shapes(dims: DraftDims) -> dict[str, tuple[int, ...]]:
    hidden, inter = dims.hidden_size, dims.intermediate_size
    shapes: dict[str, tuple[int, ...]] = {
        "mlp.gate_proj.weight": (inter, hidden),
        "mlp.up_proj.weight": (inter, hidden),
        "mlp.down_proj.weight": (hidden, inter),
        "input_layernorm.weight": (hidden,),
        "hidden_norm.weight": (hidden,),
        "post_attention_layernorm.weight": (hidden,),
    }
    attn = dims.attention
    if isinstance(attn, MlaDims):
        # DeepseekV2AttentionMLA, with q_a/kv_a widened to the 2H [embeds, hidden] input.
        return shapes | {
            "self_attn.q_a_proj.weight": (attn.q_lora_rank, 2 * hidden),
            "self_attn.q_a_layernorm.weight": (attn.q_lora_rank,),
            "self_attn.q_b_proj.weight": (
                attn.num_heads * (attn.qk_nope_head_dim + attn.qk_rope_head_dim),
                attn.q_lora_rank,
            ),
            "self_attn.kv_a_proj_with_mqa.weight": (attn.kv_lora_rank + attn.qk_rope_head_dim, 2 * hidden),
            "self_attn.kv_a_layernorm.weight": (attn.kv_lora_rank,),
            "self_attn.kv_b_proj.weight": (
                attn.num_heads * (attn.qk_nope_head_dim + attn.v_head_dim),
                attn.kv_lora_rank,
            ),
            "self_attn.o_proj.weight": (hidden, attn.num_heads * attn.v_head_dim),
        }
    q_rows, kv_rows = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    return shapes | {
        "self_attn.q_proj.weight": (q_rows, 2 * hidden),
        "self_attn.k_proj.weight": (kv_rows, 2 * hidden),
        "self_attn.v_proj.weight": (kv_rows, 2 * hidden),
        "self_attn.o_proj.weight": (hidden, q_rows),
    }


def expected_shapes(dims: DraftDims) -> tuple[dict[str, tuple[int, ...]], frozenset[str]]:
    """(canonical key -> shape for every allowed key, the keys that must be present)."""
    hidden = dims.hidden_size
    shapes = {MIDLAYER + part: shape for part, shape in _layer_shapes(dims).items()}
    shapes |= {
        "fc.weight": (hidden, dims.num_aux * dims.target_hidden_size),
        "norm.weight": (hidden,),
        "lm_head.weight": (dims.draft_vocab_size, hidden),
        "d2t": (dims.draft_vocab_size,),
        "t2d": (dims.vocab_size,),
        INPUT_NORM_KEY: (dims.num_aux * dims.target_hidden_size,),
    }
    fc_norms = {f"fc_norm.{i}.weight": (dims.target_hidden_size,) for i in range(dims.num_aux)}
    shapes |= fc_norms
    required = set(shapes) - {"d2t", "t2d", INPUT_NORM_KEY} - set(fc_norms)
    if not dims.own_head:
        required.discard("lm_head.weight")
        shapes.pop("lm_head.weight")
    if dims.needs_vocab_map:
        required |= {"d2t", "t2d"}
    if dims.fc_norm:
        required |= set(fc_norms)
    if dims.norm_before_fc:
        required.add(INPUT_NORM_KEY)
    shapes[EMBEDDING_KEY] = (dims.vocab_size, hidden)
    if dims.keeps_embedding:
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
    problems += _unflagged_norms(present, dims)
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


def _unflagged_norms(present: set[str], dims: DraftDims) -> list[Problem]:
    """Norm weights the config does not switch on: SGLang would skip them and run without the norm."""
    problems = []
    fc_norms = {name for name in present if _FC_NORM.fullmatch(name)}
    if fc_norms and not dims.fc_norm:
        problems.append(
            Problem(
                "config.json:fc_norm",
                f"checkpoint has {sorted(fc_norms)} but the config does not enable fc_norm",
                "set fc_norm: true in the config (SGLang skips these weights otherwise)",
            )
        )
    if INPUT_NORM_KEY in present and not dims.norm_before_fc:
        problems.append(
            Problem(
                "config.json:norm_before_fc",
                f"checkpoint has {INPUT_NORM_KEY} but the config does not enable norm_before_fc",
                "set norm_before_fc: true (SGLang skips input_norm otherwise and runs fc un-normalised)",
            )
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
    if key == INPUT_NORM_KEY:
        return Problem(
            key,
            "missing while norm_before_fc is on: SGLang would normalise with an untrained (all-ones) norm",
            "export input_norm.weight with the draft, or set norm_before_fc false if it was not trained",
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
    fields = (
        "q_lora_rank/kv_lora_rank/qk_*_head_dim/v_head_dim"
        if isinstance(dims.attention, MlaDims)
        else "heads/head_dim"
    )
    return Problem(
        tensor.source,
        f"shape {list(tensor.shape)}, expected {list(expected)} from the config",
        f"check hidden_size/{fields}/intermediate_size/vocab sizes in config.json against the weights",
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


def text_config(target: Mapping[str, Any]) -> Mapping[str, Any]:
    """The language model's config: a multimodal wrapper's ``text_config`` (Kimi-K2.5), else itself."""
    text = target.get("text_config")
    return text if isinstance(text, Mapping) else target


@dataclass(frozen=True)
class TargetCheck:
    """The draft against the target: problems refuse, notes are reported with the check."""

    problems: list[Problem]
    notes: list[str]


def check_target(dims: DraftDims, target: Mapping[str, Any]) -> TargetCheck:
    """The draft against the target model's (text) config: vocab, hidden size, aux layer ids, MLA."""
    text = text_config(target)
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
    notes = []
    if text is not target:
        notes.append(f"read the target's text_config ({list(target.get('architectures') or [])} wrapper)")
    if isinstance(dims.attention, MlaDims):
        notes += _mla_against_target(dims.attention, text)
    return TargetCheck(problems, notes)


def _mla_against_target(attn: MlaDims, text: Mapping[str, Any]) -> list[str]:
    """Published Kimi MLA drafts copy the target's MLA layout; a difference is worth a look, not fatal
    (the draft runner sizes its own KV cache from the draft config)."""
    differ = [
        f"{field} {getattr(attn, field)} vs target {text.get(field)}"
        for field in ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        if text.get(field) is not None and text.get(field) != getattr(attn, field)
    ]
    if differ:
        return ["MLA layout differs from the target's (" + "; ".join(differ) + "): check the draft"]
    return ["MLA layout (kv_lora_rank, qk_*_head_dim, v_head_dim) matches the target's"]


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
