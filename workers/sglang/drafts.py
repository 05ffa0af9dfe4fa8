"""What SGLang's EAGLE3 draft loaders read, and from which SGLang version each feature loads.

Facts from the installed 0.5.23 source (``sglang/srt/models/llama_eagle3.py``,
``sglang/srt/models/kimi_k25_eagle3.py``) and, for the minimum versions, from the same two files in
the published sglang wheels 0.4.10, 0.5.1, 0.5.2, 0.5.5, 0.5.8, 0.5.10, 0.5.10.post1, 0.5.11, 0.5.12,
0.5.14, 0.5.15, 0.5.16, 0.5.17, 0.5.20 and 0.5.22: each minimum is the first of those whose file has
the feature, and the release before it (also probed) lacks it. The converter refuses a feature the
nodes' SGLang (``--sglang-version``) cannot load.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from enum import StrEnum

from workers.sglang.api import SGLANG_VERSION

LLAMA_DRAFT_ARCHITECTURE = "LlamaForCausalLMEagle3"
MLA_DRAFT_ARCHITECTURE = "Eagle3DeepseekV2ForCausalLM"
# llama_eagle3.load_weights renames these substrings before looking a weight up.
LLAMA_LEGACY_NAMES = {
    "midlayer": "layers.0",
    "aux_norm_low": "fc_norm.0",
    "aux_norm_mid": "fc_norm.1",
    "aux_norm_high": "fc_norm.2",
}
# Model types transformers (5.19 in SGLang 0.5.23's venv) can build the MLA draft's config from.
MLA_MODEL_TYPES = frozenset({"deepseek_v3", "deepseek_v2"})
# Fields the MLA draft layer reads (DeepseekV2AttentionMLA and the EAGLE3 layer around it).
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")


class DraftFeature(StrEnum):
    """A draft-checkpoint feature that only some SGLang versions load."""

    LAYERS_PREFIX = "layers.0.* weight names"
    INPUT_NORM = "norm_before_fc (input_norm)"
    FC_NORM = "fc_norm (EAGLE-3.1 per-feature norms)"
    NORM_OUTPUT = "norm_output (EAGLE-3.1 post-norm feedback)"
    MLA = f"{MLA_DRAFT_ARCHITECTURE} (MLA draft)"
    TARGET_HEAD = "no draft lm_head (the target's is served)"


@dataclass(frozen=True)
class FeatureSupport:
    """The first probed SGLang version that loads ``feature``, and what an older one does instead."""

    feature: DraftFeature
    minimum: str
    older: str


FEATURE_SUPPORT = {
    support.feature: support
    for support in (
        FeatureSupport(
            DraftFeature.LAYERS_PREFIX,
            "0.5.12",
            "0.5.11 names the layer `midlayer` and skips layers.0.* keys: an untrained draft layer",
        ),
        FeatureSupport(
            DraftFeature.INPUT_NORM,
            "0.5.17",
            "0.5.16 has no input_norm: it skips the weight and runs fc on un-normalised features",
        ),
        FeatureSupport(
            DraftFeature.FC_NORM,
            "0.5.12",
            "0.5.11 has no fc_norm: it skips the weights and runs fc on un-normalised features",
        ),
        FeatureSupport(
            DraftFeature.NORM_OUTPUT,
            "0.5.12",
            "0.5.11 ignores norm_output and feeds pre-norm hidden states to the next draft step",
        ),
        FeatureSupport(
            DraftFeature.TARGET_HEAD,
            "0.5.2",
            "0.5.1 sizes lm_head from draft_vocab_size and fails to load when it is null",
        ),
        FeatureSupport(
            DraftFeature.MLA,
            "0.5.12",
            f"0.5.11 has no {MLA_DRAFT_ARCHITECTURE} and fails at load",
        ),
    )
}

# The oldest probed version with llama_eagle3.py: a plain midlayer.* draft loads from here on.
BASE_MINIMUM = "0.4.10"
_VERSION = re.compile(r"(\d+)\.(\d+)\.(\d+)(?:\.post(\d+))?")


def parse_version(text: str) -> tuple[int, int, int, int] | None:
    """``0.5.23`` or ``0.5.15.post1`` as a comparable tuple; None when it is not such a version."""
    match = _VERSION.fullmatch(text.strip())
    if match is None:
        return None
    major, minor, patch, post = match.groups()
    return int(major), int(minor), int(patch), int(post or 0)


def supports(version: tuple[int, int, int, int], feature: DraftFeature) -> bool:
    """Whether SGLang ``version`` (as ``parse_version`` gives it) loads ``feature``."""
    minimum = parse_version(FEATURE_SUPPORT[feature].minimum)
    return minimum is not None and version >= minimum


__all__ = [
    "BASE_MINIMUM",
    "FEATURE_SUPPORT",
    "LLAMA_DRAFT_ARCHITECTURE",
    "LLAMA_LEGACY_NAMES",
    "MLA_DRAFT_ARCHITECTURE",
    "MLA_FIELDS",
    "MLA_MODEL_TYPES",
    "SGLANG_VERSION",
    "DraftFeature",
    "FeatureSupport",
    "parse_version",
    "supports",
]
