"""Config fields: each published speculators field is mapped or dropped as speculators' code defines it;
the SGLang version the nodes run decides which features may be written; the head SGLang serves is said.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from specsweep.errors import ConversionError
from workers.convert.converter import ConvertOptions, convert, convert_cached
from workers.convert.eagle3_format import SPECULATORS_FIELDS, FieldAction, LayerNaming, SourceFormat
from workers.convert.fixtures import (
    TINY,
    FixtureTensor,
    Variant,
    build_checkpoint,
    published_shapes,
    write_checkpoint,
    write_target_config,
)

REPO = Path(__file__).resolve().parents[2]
SHAPES = {shape.name: shape for shape in published_shapes()}


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_convert_drops_provenance_and_maps_dtype_when_speculators_export_has_published_fields(
    tmp_path: Path,
) -> None:
    """A speculators 0.9.0 export with dtype (transformers >= 4.56), tie_word_embeddings, the proposal
    settings and every provenance field converts: each dropped field is reported with its reason,
    dtype becomes torch_dtype, and no speculators field reaches config.json."""
    checkpoint = SHAPES["speculators-dtype"].checkpoint
    checkpoint.config |= {
        "default_proposal_method": "greedy",
        "proposal_methods": [],
        "has_no_defaults_at_init": False,
    }
    report = convert(write_checkpoint(checkpoint, tmp_path / "src"), tmp_path / "out")

    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["torch_dtype"] == "bfloat16" and "dtype" not in config
    assert config["tie_word_embeddings"] is False
    assert not set(config) & {
        name for name, rule in SPECULATORS_FIELDS.items() if rule.action is FieldAction.PROVENANCE
    }
    assert config["eagle_config"] == {
        "eagle_aux_hidden_state_layer_ids": list(TINY.aux_layer_ids),
        "norm_before_fc": True,
    }
    dropped = [change for change in report.config_changes if change.startswith("dropped")]
    for field in (
        "speculators_config",
        "speculators_version",
        "transformers_version",
        "embed_requires_grad",
        "default_proposal_method",
        "proposal_methods",
        "has_no_defaults_at_init",
    ):
        assert any(f"field {field}: " in change for change in dropped), field


def test_convert_writes_untied_head_when_speculators_layer_config_says_tied(tmp_path: Path) -> None:
    """speculators never ties (SpeculatorModel forces tie_word_embeddings false), so a tied layer config
    converts to tie_word_embeddings: false, with the reason in the report."""
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS)
    checkpoint.config["transformer_layer_config"]["tie_word_embeddings"] = True
    report = convert(write_checkpoint(checkpoint, tmp_path / "src"), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["tie_word_embeddings"] is False
    assert any("never ties" in change for change in report.config_changes)


def test_convert_writes_null_draft_vocab_and_says_target_head_when_draft_has_no_lm_head(
    tmp_path: Path,
) -> None:
    """A full-vocab draft without lm_head gets draft_vocab_size: null (SGLang 0.5.23 fails on a
    missing key) and the report says SGLang serves the target's head."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG, variant=Variant(full_vocab=True, head=False))
    report = convert(write_checkpoint(checkpoint, tmp_path / "src"), tmp_path / "out")
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert "draft_vocab_size" in config and config["draft_vocab_size"] is None
    assert report.lm_head == "target"
    assert any("TARGET's lm_head" in change for change in report.config_changes)


def test_convert_keeps_trained_head_when_full_vocab_draft_has_its_own_lm_head(tmp_path: Path) -> None:
    """A full-vocab draft with its own lm_head gets draft_vocab_size = vocab_size, so SGLang serves it."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG, variant=Variant(full_vocab=True))
    report = convert(write_checkpoint(checkpoint, tmp_path / "src"), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["draft_vocab_size"] == TINY.vocab_size
    assert report.lm_head == "draft"


def test_convert_reports_minimum_sglang_when_output_uses_layers_naming(tmp_path: Path) -> None:
    """layers.0.* names need SGLang >= 0.5.12; midlayer.* loads in every probed version."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SGLANG), tmp_path / "src")
    layers = convert(src, tmp_path / "layers", ConvertOptions(layout=LayerNaming.LAYERS))
    midlayer = convert(src, tmp_path / "midlayer")
    assert [(n.feature.value, n.minimum_sglang) for n in layers.needs] == [
        ("layers.0.* weight names", "0.5.12")
    ]
    assert layers.minimum_sglang == "0.5.12"
    assert midlayer.needs == [] and midlayer.minimum_sglang == "0.4.10"


def test_convert_cached_converts_again_when_sglang_version_differs(tmp_path: Path) -> None:
    """The node cache keys on the SGLang version too: its checks depend on it."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SGLANG), tmp_path / "src")
    first = convert_cached(src, tmp_path / "cache")
    other = convert_cached(src, tmp_path / "cache", ConvertOptions(sglang_version="0.5.20"))
    assert other.path != first.path and other.report.sglang_version == "0.5.20"


def test_cli_convert_refuses_old_sglang_then_names_minimum_when_draft_has_input_norm(tmp_path: Path) -> None:
    """`--sglang-version 0.5.16` refuses an input_norm draft naming 0.5.17; the default converts it
    and prints the feature, its minimum version and whose lm_head is served."""
    src = write_checkpoint(SHAPES["speculators-eagle31"].checkpoint, tmp_path / "src")
    old = _cli("convert", str(src), str(tmp_path / "old"), "--sglang-version", "0.5.16")
    assert old.returncode != 0 and "Traceback" not in old.stderr
    assert "0.5.17" in old.stderr and "norm_before_fc (input_norm)" in old.stderr
    assert not (tmp_path / "old").exists()

    new = _cli("convert", str(src), str(tmp_path / "new"))
    assert new.returncode == 0, new.stderr
    assert "needs SGLang >= 0.5.17: norm_before_fc (input_norm)" in new.stdout
    assert "lm_head served: the draft's own" in new.stdout
    assert "loads in SGLang >= 0.5.17 (checked for 0.5.23)" in new.stdout


def test_docs_table_states_each_speculators_field_action_when_read() -> None:
    """docs/conversion.md has one row per speculators field the converter knows, with its action."""
    text = (REPO / "docs" / "conversion.md").read_text()
    for field, rule in SPECULATORS_FIELDS.items():
        assert f"| `{field}` | {rule.action.value} |" in text, field


# (top-level norm_before_fc, eagle_config.norm_before_fc) of a native SGLang draft that carries a trained
# input_norm.weight, and what SGLang 0.5.23 builds from that pair: LlamaForCausalLMEagle3.__init__ reads
# eagle_config.get("norm_before_fc", getattr(config, "norm_before_fc", False)), so eagle_config wins.
DISAGREEING_NORM_BEFORE_FC = {
    "top false, eagle_config true": (False, True),
    "top true, eagle_config false": (True, False),
}


def _disagreeing_draft(root: Path, top: bool, nested: bool) -> Path:
    checkpoint = build_checkpoint(SourceFormat.SGLANG, variant=Variant(norm_before_fc=True))
    checkpoint.config["norm_before_fc"] = top
    checkpoint.config["eagle_config"]["norm_before_fc"] = nested
    return write_checkpoint(checkpoint, root)


def test_convert_reads_norm_before_fc_as_sglang_does_when_top_level_and_eagle_config_disagree(
    tmp_path: Path, sglang_python: str
) -> None:
    """Where the two norm_before_fc fields disagree, eagle_config's wins, as SGLang's own draft class
    decides when it loads the unconverted draft (run in .venv-sglang): with eagle_config true SGLang
    builds input_norm and the converter writes eagle_config.norm_before_fc true; with eagle_config false
    SGLang builds none and would skip the trained input_norm.weight, so the converter refuses the draft
    with the field and the fix, and writes nothing."""
    sources = {
        case: _disagreeing_draft(tmp_path / case.replace(" ", "-").replace(",", ""), top, nested)
        for case, (top, nested) in DISAGREEING_NORM_BEFORE_FC.items()
    }
    (tmp_path / "params").mkdir()
    loaded = subprocess.run(
        [sglang_python, str(REPO / "tests" / "workers" / "sglang_draft_load.py"), str(tmp_path / "params"),
         *map(str, sources.values())],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    sglang = [json.loads(line) for line in loaded.stdout.splitlines() if line.startswith("{")]
    assert [load["has_input_norm"] for load in sglang] == [True, False]
    assert sglang[1]["filled_elements"] < sglang[1]["checkpoint_elements"]  # input_norm.weight skipped

    agreed = convert(sources["top false, eagle_config true"], tmp_path / "agreed")
    config = json.loads((tmp_path / "agreed" / "config.json").read_text())
    assert config["eagle_config"]["norm_before_fc"] is True and "norm_before_fc" not in config
    assert "input_norm.weight" in {t.output for t in agreed.tensors}
    with pytest.raises(ConversionError) as refused:
        convert(sources["top true, eagle_config false"], tmp_path / "refused")
    assert "config.json:norm_before_fc: checkpoint has input_norm.weight" in str(refused.value)
    assert "(fix: set norm_before_fc: true" in str(refused.value)
    assert not (tmp_path / "refused").exists()


def test_convert_converts_full_vocab_draft_when_it_carries_d2t_without_t2d(tmp_path: Path) -> None:
    """A draft over the whole target vocab needs no vocab map, so an identity d2t (all zero offsets)
    without its t2d is converted, not refused as a map whose t2d marks nothing: the map is checked only
    when both halves are there (when the draft vocab is smaller, both are required keys)."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG, variant=Variant(full_vocab=True))
    zeros = np.zeros(TINY.vocab_size, dtype=np.int64)
    checkpoint.tensors["d2t"] = FixtureTensor("I64", zeros.shape, zeros)
    report = convert(write_checkpoint(checkpoint, tmp_path / "src"), tmp_path / "out")
    assert json.loads((tmp_path / "out" / "config.json").read_text())["draft_vocab_size"] == TINY.vocab_size
    assert "d2t" in {t.output for t in report.tensors}


def test_convert_notes_each_differing_mla_field_when_target_layout_differs(tmp_path: Path) -> None:
    """An MLA draft whose kv_lora_rank (32) and v_head_dim (16) differ from the target's (64, 32) still
    converts (the draft sizes its own KV cache), and the target check names both fields, draft value then
    target value, separated by '; '."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SGLANG_MLA), tmp_path / "src")
    target = write_target_config(tmp_path / "target", TINY)
    config = json.loads((target / "config.json").read_text())
    config |= {"kv_lora_rank": 64, "v_head_dim": 32}
    (target / "config.json").write_text(json.dumps(config))
    report = convert(src, tmp_path / "out", ConvertOptions(target_config=target))
    detail = next(check.detail for check in report.checks if check.name == "target config")
    assert (
        "MLA layout differs from the target's (kv_lora_rank 32 vs target 64; v_head_dim 16 vs target 32): "
        "check the draft" in detail
    )
