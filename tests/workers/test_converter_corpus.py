"""The corpus: one generated draft per published format, converted or refused as SGLang 0.5.23 loads it.

Each shape (``eagle3_fixtures.published_shapes``) carries its format's exact config fields and key
names at a tiny size. What converts is then loaded by SGLang's OWN loader: the llama drafts by
``LlamaForCausalLMEagle3.load_weights`` in the resolver venv (tests/workers/sglang_draft_load.py),
the MLA drafts by replaying ``Eagle3DeepseekV2ForCausalLM.load_weights`` from the installed source
(building that class on a CPU is impossible there: see _replay_mla_load).
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

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


def _llama_outputs(corpus: dict) -> list[Path]:
    return [Path(corpus[name].destination) for name in sorted(CONVERTED) if name not in MLA_SHAPES]


@pytest.fixture(scope="module")
def sglang_loads(corpus: dict, sglang_python: str) -> dict[str, dict[str, Any]]:
    """SGLang 0.5.23's own LlamaForCausalLMEagle3.load_weights run on every converted llama draft."""
    script = Path(__file__).with_name("sglang_draft_load.py")
    proc = subprocess.run(
        [sglang_python, str(script), *map(str, _llama_outputs(corpus))],
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    loads = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
    return {Path(load["draft"]).parent.name: load for load in loads}


@pytest.mark.parametrize("name", sorted(set(CONVERTED) - set(MLA_SHAPES)))
def test_sglang_load_weights_fills_every_parameter_when_loading_converted_llama_draft(
    name: str, corpus: dict, sglang_loads: dict
) -> None:
    """SGLang's own loader fills every parameter it does not take from the target, uses every
    checkpoint element (none skipped), builds the norms the config asks for, and maps d2t to the
    same target ids the converter checked."""
    load, report = sglang_loads[name], corpus[name]
    assert load["class"] == "LlamaForCausalLMEagle3"
    assert load["unfilled"] == []
    assert load["filled_elements"] == load["checkpoint_elements"]
    assert load["lm_head_from_target"] == (report.lm_head == "target")
    config = json.loads((Path(report.destination) / "config.json").read_text())
    assert load["has_input_norm"] == bool((config.get("eagle_config") or {}).get("norm_before_fc"))
    assert load["has_fc_norm"] == bool(config.get("fc_norm"))
    assert load["norm_output"] == bool(config.get("norm_output"))
    weights = load_file(Path(report.destination) / "model.safetensors")
    if "d2t" in weights:
        d2t = weights["d2t"]
        assert load["hot_token_id"] == (d2t + torch.arange(d2t.shape[0])).tolist()
    else:
        assert load["hot_token_id"] is None


def _installed_mla_load_weights(sglang_python: str) -> Any:
    """``Eagle3DeepseekV2ForCausalLM.load_weights`` compiled from the installed SGLang source.

    Importing kimi_k25_eagle3 in the resolver venv fails (deepseek_v2 -> schedule_batch -> the
    OpenAI protocol needs the ``openai`` package, which that venv lacks), so the class cannot be
    built on a CPU there; its load_weights is taken verbatim from the file and run against the
    parameter table Eagle3MLAModel + DeepseekV2AttentionMLA build (see _mla_params).
    """
    where = subprocess.run(
        [sglang_python, "-c", "import sglang, os; print(os.path.dirname(sglang.__file__))"],
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    ).stdout.strip()
    source = Path(where, "srt", "models", "kimi_k25_eagle3.py").read_text()
    tree = ast.parse(source)
    cls = next(
        n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Eagle3DeepseekV2ForCausalLM"
    )
    method = next(n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "load_weights")
    method.decorator_list = []
    module = ast.Module(body=[method], type_ignores=[])
    namespace: dict[str, Any] = {
        "re": re,
        "torch": torch,
        "Iterable": Any,
        "Tuple": tuple,
        "logger": SimpleNamespace(warning=lambda *args: namespace["skipped"].append(args[1])),
        "default_weight_loader": lambda param, weight: param.data.copy_(weight),
        "skipped": [],
    }
    exec(compile(module, "kimi_k25_eagle3.py", "exec"), namespace)  # SGLang's own code, verbatim
    return namespace


def _mla_params(config: dict[str, Any]) -> dict[str, torch.nn.Parameter]:
    """The parameters Eagle3DeepseekV2ForCausalLM registers (kimi_k25_eagle3.py, deepseek_v2.py)."""
    hidden, heads, inter = config["hidden_size"], config["num_attention_heads"], config["intermediate_size"]
    q, kv, nope, rope, v = (
        config[f]
        for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
    )
    aux = len(config["eagle_config"]["eagle_aux_hidden_state_layer_ids"])
    target = config.get("target_hidden_size") or hidden
    layer = "model.midlayer."
    shapes = {
        "model.embed_tokens.weight": (config["vocab_size"], hidden),
        "model.fc.weight": (hidden, aux * target),
        layer + "self_attn.fused_qkv_a_proj_with_mqa.weight": (q + kv + rope, 2 * hidden),
        layer + "self_attn.q_a_layernorm.weight": (q,),
        layer + "self_attn.q_b_proj.weight": (heads * (nope + rope), q),
        layer + "self_attn.kv_a_layernorm.weight": (kv,),
        layer + "self_attn.kv_b_proj.weight": (heads * (nope + v), kv),
        layer + "self_attn.o_proj.weight": (hidden, heads * v),
        layer + "mlp.gate_up_proj.weight": (2 * inter, hidden),
        layer + "mlp.down_proj.weight": (hidden, inter),
        layer + "input_layernorm.weight": (hidden,),
        layer + "hidden_norm.weight": (hidden,),
        layer + "post_attention_layernorm.weight": (hidden,),
        "model.norm.weight": (hidden,),
        "lm_head.weight": (config.get("draft_vocab_size") or config["vocab_size"], hidden),
    }
    if config.get("fc_norm") or config.get("use_aux_norm"):
        shapes |= {f"model.fc_norm.{i}.weight": (target,) for i in range(aux)}
    params = {}
    for name, shape in shapes.items():
        param = torch.nn.Parameter(torch.full(shape, float("nan")), requires_grad=False)
        if name.endswith("gate_up_proj.weight"):
            param.weight_loader = lambda p, w, shard: p.data[shard * inter : (shard + 1) * inter].copy_(w)  # type: ignore[attr-defined]
        params[name] = param
    return params


@pytest.mark.parametrize("name", MLA_SHAPES)
def test_sglang_mla_load_weights_maps_every_weight_when_replayed_on_converted_mla_draft(
    name: str, corpus: dict, sglang_python: str
) -> None:
    """SGLang's MLA load_weights (the installed source, replayed) skips no weight and fills every
    parameter but the embedding (the target's), including the fused q_a/kv_a projection."""
    report = corpus[name]
    out = Path(report.destination)
    config = json.loads((out / "config.json").read_text())
    weights = load_file(out / "model.safetensors")
    namespace = _installed_mla_load_weights(sglang_python)
    params = _mla_params(config)
    model = SimpleNamespace(
        named_parameters=lambda: params.items(), post_load_weights=lambda: None, hot_token_id=None
    )
    namespace["load_weights"](model, iter(weights.items()))
    assert namespace["skipped"] == []
    unfilled = [
        n for n, p in params.items() if n != "model.embed_tokens.weight" and not torch.isfinite(p).all()
    ]
    assert unfilled == []
    a_proj = params["model.midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight"]
    prefix = "layers.0." if name == "kimi-k26-eagle31-mla" else "midlayer."
    assert torch.equal(a_proj[: TINY_MLA.q_lora_rank], weights[prefix + "self_attn.q_a_proj.weight"].float())
    d2t = weights["d2t"]
    assert torch.equal(model.hot_token_id, d2t + torch.arange(d2t.shape[0]))


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
