"""The corpus: one generated draft per published format, converted or refused as SGLang 0.5.23 loads it.

Each shape (``eagle3_fixtures.published_shapes``) carries its format's exact config fields and key
names at a tiny size. What converts is then loaded by SGLang's OWN loader in the resolver venv
(tests/workers/sglang_draft_load.py): ``LlamaForCausalLMEagle3`` or ``Eagle3DeepseekV2ForCausalLM``,
built on the CPU in a single-rank gloo group, runs its ``load_weights`` on the output.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specsweep.errors import ConversionError
from workers.convert.converter import ConvertOptions, convert
from workers.convert.fixtures import (
    TINY,
    TINY_MLA,
    PublishedShape,
    published_shapes,
    write_checkpoint,
    write_target_config,
)
from workers.convert.report import ConversionReport

SHAPES = {shape.name: shape for shape in published_shapes()}
# shape -> words of the refusal (field, why); every other shape converts.
REFUSED = {
    "speculators-qwen3": ("model_type", "qwen3", "q/k norms"),
    "speculators-norm-before-residual": ("norm_before_residual", "residual", "different forward"),
}
# shape -> (lm_head served, the SGLang features the output needs)
CONVERTED = {
    "speculators-0.9": ("draft", set()),
    "speculators-dtype": (
        "draft",
        {"norm_before_fc (input_norm)", "norm_output (EAGLE-3.1 post-norm feedback)"},
    ),
    "speculators-legacy": ("draft", set()),
    "speculators-eagle31": (
        "draft",
        {"norm_before_fc (input_norm)", "norm_output (EAGLE-3.1 post-norm feedback)"},
    ),
    "speculators-fc-norm": (
        "draft",
        {"fc_norm (EAGLE-3.1 per-feature norms)", "norm_output (EAGLE-3.1 post-norm feedback)"},
    ),
    "speculators-full-vocab": ("draft", set()),
    "specforge-0.2": ("draft", set()),
    "specforge-full-vocab": ("draft", set()),
    "eagle-pickle": ("draft", set()),
    "native-full-vocab-head": ("draft", set()),
    "native-target-head": ("target", {"no draft lm_head (the target's is served)"}),
    "native-eagle31-legacy": (
        "draft",
        {"fc_norm (EAGLE-3.1 per-feature norms)", "norm_output (EAGLE-3.1 post-norm feedback)"},
    ),
    "native-norm-before-fc": (
        "draft",
        {"norm_before_fc (input_norm)", "norm_output (EAGLE-3.1 post-norm feedback)"},
    ),
    "kimi-k25-eagle3-mla": ("draft", {"Eagle3DeepseekV2ForCausalLM (MLA draft)"}),
    "kimi-k26-eagle31-mla": (
        "draft",
        {
            "Eagle3DeepseekV2ForCausalLM (MLA draft)",
            "fc_norm (EAGLE-3.1 per-feature norms)",
            "norm_output (EAGLE-3.1 post-norm feedback)",
        },
    ),
}
MLA_SHAPES = ("kimi-k25-eagle3-mla", "kimi-k26-eagle31-mla")


def test_corpus_names_every_published_shape_once_when_generated() -> None:
    """Every generated shape has an expected outcome, and every expectation a shape."""
    assert set(SHAPES) == set(REFUSED) | set(CONVERTED)
    assert not set(REFUSED) & set(CONVERTED)


def _convert(shape: PublishedShape, root: Path, target: Path) -> ConversionReport:
    src = write_checkpoint(shape.checkpoint, root / shape.name / "src", as_pickle=shape.as_pickle)
    options = ConvertOptions(target_config=target, allow_pickle=shape.as_pickle)
    return convert(src, root / shape.name / "out", options)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ConversionReport | ConversionError]:
    """Every shape converted against a Kimi-K2.5-shaped (multimodal) target config."""
    root = tmp_path_factory.mktemp("corpus")
    target = write_target_config(root / "target", TINY, multimodal=True)
    outcomes: dict[str, ConversionReport | ConversionError] = {}
    for shape in SHAPES.values():
        try:
            outcomes[shape.name] = _convert(shape, root, target)
        except ConversionError as err:
            outcomes[shape.name] = err
    return outcomes


@pytest.mark.parametrize("name", sorted(REFUSED))
def test_corpus_refuses_shape_when_sglang_would_run_another_forward(name: str, corpus: dict) -> None:
    """A refused shape names the field, why SGLang would differ, and a fix."""
    outcome = corpus[name]
    assert isinstance(outcome, ConversionError), f"{name} converted"
    for word in (*REFUSED[name], "fix:"):
        assert word in str(outcome), f"{word!r} not in {outcome}"


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_corpus_converts_shape_with_head_and_version_needs_when_sglang_loads_it(
    name: str, corpus: dict
) -> None:
    """Each loadable shape converts; the report says whose lm_head is served and what SGLang it needs."""
    report = corpus[name]
    assert isinstance(report, ConversionReport), f"{name} refused: {report}"
    head, needs = CONVERTED[name]
    assert report.lm_head == head
    assert {need.feature.value for need in report.needs} == needs
    assert report.sglang_version == "0.5.23"
    target = next(check for check in report.checks if check.name == "target config")
    assert target.status == "pass" and "text_config" in target.detail


MLA_A_PROJ = "midlayer.self_attn.{}.weight"


def _write_mla_drafts_past_the_converter(corpus: dict, root: Path) -> list[Path]:
    """Two MLA drafts the converter refuses, written from the K2.5 output without it, so SGLang's
    loader shows what a refusal prevents: a pre-fused q_a/kv_a projection and an unknown key."""
    source = Path(corpus["kimi-k25-eagle3-mla"].destination)
    weights = load_file(source / "model.safetensors")
    a_proj = [MLA_A_PROJ.format(part) for part in ("q_a_proj", "kv_a_proj_with_mqa")]
    fused = torch.cat([weights[key] for key in a_proj])
    unfused = {key: tensor for key, tensor in weights.items() if key not in a_proj}
    drafts = {
        "prefused-a-proj": unfused | {MLA_A_PROJ.format("fused_qkv_a_proj_with_mqa"): fused},
        "unknown-key": weights | {MLA_A_PROJ.format("q_norm"): torch.ones(TINY_MLA.qk_nope_head_dim)},
    }
    outs = []
    for name, tensors in drafts.items():
        out = root / name / "out"
        out.mkdir(parents=True)
        shutil.copy(source / "config.json", out / "config.json")
        save_file(tensors, str(out / "model.safetensors"))
        outs.append(out)
    return outs


@pytest.fixture(scope="module")
def sglang_loads(
    corpus: dict, sglang_python: str, tmp_path_factory: pytest.TempPathFactory
) -> dict[str, dict[str, Any]]:
    """SGLang 0.5.23's own LlamaForCausalLMEagle3 / Eagle3DeepseekV2ForCausalLM, built on the CPU,
    run through load_weights on every converted draft and on the two written past the converter."""
    root = tmp_path_factory.mktemp("sglang-loads")
    drafts = [Path(corpus[name].destination) for name in sorted(CONVERTED)]
    drafts += _write_mla_drafts_past_the_converter(corpus, root / "drafts")
    (root / "params").mkdir()
    script = Path(__file__).with_name("sglang_draft_load.py")
    proc = subprocess.run(
        [sglang_python, str(script), str(root / "params"), *map(str, drafts)],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loads = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {Path(load["draft"]).parent.name: load for load in loads}


@pytest.mark.parametrize("name", sorted(CONVERTED))
def test_sglang_load_weights_fills_every_parameter_when_loading_converted_draft(
    name: str, corpus: dict, sglang_loads: dict
) -> None:
    """SGLang's own loader, of the class the output's config names, fills every parameter it does
    not take from the target, uses every checkpoint element (none skipped, no warning), builds the
    norms the config asks for, and maps d2t to the same target ids the converter checked."""
    load, report = sglang_loads[name], corpus[name]
    config = json.loads((Path(report.destination) / "config.json").read_text())
    assert load["class"] == config["architectures"][0]
    assert load["unfilled"] == []
    assert load["warnings"] == []
    assert load["filled_elements"] == load["checkpoint_elements"]
    assert load["lm_head_from_target"] == (report.lm_head == "target")
    assert load["has_input_norm"] == bool((config.get("eagle_config") or {}).get("norm_before_fc"))
    assert load["has_fc_norm"] == bool(config.get("fc_norm"))
    assert load["norm_output"] == bool(config.get("norm_output"))
    weights = load_file(Path(report.destination) / "model.safetensors")
    if "d2t" in weights:
        d2t = weights["d2t"]
        assert load["hot_token_id"] == (d2t + torch.arange(d2t.shape[0])).tolist()
    else:
        assert load["hot_token_id"] is None


def _mla_param_name(key: str) -> str:
    """Where Eagle3DeepseekV2ForCausalLM keeps a checkpoint key (the mapping its docstring states)."""
    key = re.sub(r"^layers\.0\.", "midlayer.", key)
    return key if key.startswith("lm_head.") else "model." + key


@pytest.mark.parametrize("name", MLA_SHAPES)
def test_sglang_mla_load_weights_places_every_value_when_loading_converted_mla_draft(
    name: str, corpus: dict, sglang_loads: dict
) -> None:
    """In the MLA model SGLang built (a YaRN rope when the config scales it) and loaded, q_a and
    kv_a sit in the fused projection in that order, gate and up in gate_up_proj, and every other
    float tensor in its parameter, value for value."""
    out = Path(corpus[name].destination)
    scaled = json.loads((out / "config.json").read_text())["rope_scaling"] is not None
    rope = "DeepseekScalingRotaryEmbedding" if scaled else "RotaryEmbedding"
    assert sglang_loads[name]["rotary_embedding"] == rope
    weights = load_file(out / "model.safetensors")
    params = load_file(sglang_loads[name]["params_file"])
    layer = "layers.0." if name == "kimi-k26-eagle31-mla" else "midlayer."
    fused = {
        "self_attn.fused_qkv_a_proj_with_mqa": ("self_attn.q_a_proj", "self_attn.kv_a_proj_with_mqa"),
        "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj"),
    }
    parts = set()
    for param, pair in fused.items():
        keys = [f"{layer}{part}.weight" for part in pair]
        expected = torch.cat([weights[key] for key in keys]).float()
        assert torch.equal(params[f"model.midlayer.{param}.weight"], expected), param
        parts |= set(keys)
    rest = [key for key, t in weights.items() if t.is_floating_point() and key not in parts]
    assert rest, "no unfused tensors to compare"
    for key in rest:
        assert torch.equal(params[_mla_param_name(key)], weights[key].float()), key


def test_sglang_mla_load_weights_never_loads_prefused_a_proj_when_checkpoint_has_one(
    sglang_loads: dict,
) -> None:
    """Why the converter refuses a pre-fused fused_qkv_a_proj_with_mqa: SGLang's loader caches it
    as half of a q_a/kv_a pair that never completes, so the projection stays unfilled."""
    load = sglang_loads["prefused-a-proj"]
    assert load["unfilled"] == ["model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"]
    assert load["filled_elements"] < load["checkpoint_elements"]


def test_sglang_mla_load_weights_skips_unknown_key_when_checkpoint_has_one(sglang_loads: dict) -> None:
    """Why the converter refuses an unknown key: SGLang's MLA loader only logs it and serves the
    draft without it."""
    load = sglang_loads["unknown-key"]
    assert load["warnings"] == [f"Eagle3 MLA: skipping unexpected weight {MLA_A_PROJ.format('q_norm')}"]
    assert load["unfilled"] == []
    assert load["checkpoint_elements"] - load["filled_elements"] == TINY_MLA.qk_nope_head_dim


def test_mla_conversion_passes_through_names_and_config_when_source_is_kimi_mla(corpus: dict) -> None:
    """An MLA draft is checked, not rewritten: the same keys and the same config come out."""
    shape = SHAPES["kimi-k26-eagle31-mla"]
    report = corpus[shape.name]
    out = Path(report.destination)
    assert set(load_file(out / "model.safetensors")) == set(shape.checkpoint.tensors)
    assert json.loads((out / "config.json").read_text()) == shape.checkpoint.config
    assert report.config_changes == []
    assert np.array_equal(
        load_file(out / "model.safetensors")["t2d"].numpy(), shape.checkpoint.tensors["t2d"].data
    )


def test_corpus_shapes_exist_for_every_source_format_when_generated() -> None:
    """The corpus covers each input format the converter reads."""
    formats = {shape.checkpoint.source_format for shape in SHAPES.values()}
    assert {f.value for f in formats} == {"speculators", "sglang", "eagle", "sglang-mla"}
