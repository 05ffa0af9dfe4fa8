"""Drafter conversion: every input format converts bit-exactly, atomically, once.

Checkpoints come from ``workers.convert.fixtures`` (tiny dims); outputs are read back with the real
``safetensors`` library, not the converter's own reader.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from specsweep.errors import ConversionError
from workers.convert.converter import ConvertOptions, convert, convert_cached
from workers.convert.eagle3_format import LayerNaming, SourceFormat
from workers.convert.fixtures import (
    TINY,
    FixtureDims,
    FixtureTensor,
    build_checkpoint,
    write_checkpoint,
    write_target_config,
)
from workers.convert.report import ConversionReport

REPO = Path(__file__).resolve().parents[2]


def _source_name(output: str, source_format: SourceFormat) -> str:
    """The source key an SGLang-native output key came from."""
    if source_format is SourceFormat.SPECULATORS and output.startswith("midlayer."):
        return "layers.0." + output.removeprefix("midlayer.")
    return output


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


CASES = {
    "speculators-single": (SourceFormat.SPECULATORS, {}, {}),
    "speculators-sharded": (SourceFormat.SPECULATORS, {"shards": 3}, {}),
    "sglang-native": (SourceFormat.SGLANG, {}, {}),
    "eagle-safetensors": (SourceFormat.EAGLE, {}, {}),
    "eagle-pickle": (SourceFormat.EAGLE, {"as_pickle": True}, {"allow_pickle": True}),
}


@pytest.mark.parametrize("case", list(CASES))
def test_convert_writes_bit_identical_tensors_when_source_in_each_format(case: str, tmp_path: Path) -> None:
    """Each format converts; every output tensor equals its source tensor bit for bit."""
    source_format, write_args, options = CASES[case]
    src = write_checkpoint(build_checkpoint(source_format), tmp_path / "src", **write_args)
    report = convert(src, tmp_path / "out", ConvertOptions(**options))

    assert report.source_format is source_format
    out = load_file(tmp_path / "out" / "model.safetensors")
    if write_args.get("as_pickle"):
        source = torch.load(src / "pytorch_model.bin", weights_only=True)
    else:
        files = sorted(src.glob("*.safetensors"))
        source = {k: v for f in files for k, v in load_file(f).items()}
    assert set(out) == {
        "midlayer." + part
        for part in (
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
        )
    } | {"fc.weight", "norm.weight", "lm_head.weight", "d2t", "t2d"}
    for name, tensor in out.items():
        original = source[_source_name(name, source_format)]
        assert tensor.dtype == original.dtype and tensor.shape == original.shape
        assert torch.equal(tensor.view(torch.uint8), original.contiguous().view(torch.uint8)), name
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLMEagle3"]
    assert config["model_type"] == "llama" and config["tie_word_embeddings"] is False
    assert config["vocab_size"] == TINY.vocab_size and config["draft_vocab_size"] == TINY.draft_vocab_size
    assert config["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(TINY.aux_layer_ids)
    assert "transformer_layer_config" not in config and "speculators_model_type" not in config


def test_convert_records_files_mapping_drops_and_checks_when_speculators_source(tmp_path: Path) -> None:
    """conversion.json lists source files with hashes, the detection, every key, every drop, every check."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    target = write_target_config(tmp_path / "target", TINY)
    convert(src, tmp_path / "out", ConvertOptions(target_config=target))

    report = ConversionReport.model_validate_json((tmp_path / "out" / "conversion.json").read_text())
    assert "speculators_model_type" in report.detection
    assert {f.path for f in report.source_files} == {"config.json", "model.safetensors"}
    assert all(len(f.digest) == 32 for f in report.source_files)
    mapping = {t.source: t.output for t in report.tensors}
    assert mapping["layers.0.self_attn.q_proj.weight"] == "midlayer.self_attn.q_proj.weight"
    assert mapping["d2t"] == "d2t"
    assert [d.key for d in report.dropped] == ["embed_tokens.weight"]
    assert "target's embedding" in report.dropped[0].reason
    names = [c.name for c in report.checks]
    assert names == [
        "config",
        "key set",
        "shapes",
        "dtypes",
        "vocab mapping",
        "target config",
        "values",
        "round trip",
    ]
    assert all(c.status == "pass" for c in report.checks)
    assert any("OUTPUT of layer id" in change for change in report.config_changes)


def test_convert_writes_layers_prefix_when_layout_layers(tmp_path: Path) -> None:
    """--layout layers writes layers.0.* (the name newer SGLang maps midlayer to)."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SGLANG), tmp_path / "src")
    convert(src, tmp_path / "out", ConvertOptions(layout=LayerNaming.LAYERS))
    names = set(load_file(tmp_path / "out" / "model.safetensors"))
    assert "layers.0.self_attn.q_proj.weight" in names
    assert not any(name.startswith("midlayer.") for name in names)


def test_convert_shards_with_index_when_output_exceeds_shard_size(tmp_path: Path) -> None:
    """Above the shard size the output is several files plus model.safetensors.index.json."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    report = convert(src, tmp_path / "out", ConvertOptions(max_shard_bytes=40_000))

    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    shard_files = sorted(set(index["weight_map"].values()))
    assert len(shard_files) > 1
    loaded = {k: v for f in shard_files for k, v in load_file(tmp_path / "out" / f).items()}
    assert set(loaded) == set(index["weight_map"]) == {t.output for t in report.tensors}
    assert index["metadata"]["total_size"] == report.bytes_written


def test_convert_keeps_embedding_when_target_hidden_size_differs(tmp_path: Path) -> None:
    """With target_hidden_size != hidden_size the draft needs its own embedding, so it is kept."""
    dims = FixtureDims(64, 4, 2, 16, 128, 96, 256, 96, 8, (1, 3, 6))
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, dims), tmp_path / "src")
    report = convert(src, tmp_path / "out")
    assert "embed_tokens.weight" in {t.output for t in report.tensors}
    assert report.dropped == []


# -- numerical equivalence ---------------------------------------------------------------------------


def _rms(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-5) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def _draft_forward(
    weights: dict[str, torch.Tensor], layer: str, embeds: torch.Tensor, aux_hidden: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One EAGLE3 draft step as SGLang runs it: (draft logits, greedy target ids via d2t).

    ``layer`` is the key prefix of the draft layer in this checkpoint's own naming.
    """
    w = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    dims = TINY
    hidden = aux_hidden @ w["fc.weight"].T
    residual = hidden
    x = torch.cat(
        [_rms(embeds, w[layer + "input_layernorm.weight"]), _rms(hidden, w[layer + "hidden_norm.weight"])], -1
    )
    tokens = x.shape[0]
    q = (
        (x @ w[layer + "self_attn.q_proj.weight"].T)
        .view(tokens, dims.num_heads, dims.head_dim)
        .transpose(0, 1)
    )
    k = (
        (x @ w[layer + "self_attn.k_proj.weight"].T)
        .view(tokens, dims.num_kv_heads, dims.head_dim)
        .transpose(0, 1)
    )
    v = (
        (x @ w[layer + "self_attn.v_proj.weight"].T)
        .view(tokens, dims.num_kv_heads, dims.head_dim)
        .transpose(0, 1)
    )
    groups = dims.num_heads // dims.num_kv_heads
    k, v = k.repeat_interleave(groups, 0), v.repeat_interleave(groups, 0)
    attn = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    hidden = attn.transpose(0, 1).reshape(tokens, -1) @ w[layer + "self_attn.o_proj.weight"].T + residual
    residual = hidden
    h = _rms(hidden, w[layer + "post_attention_layernorm.weight"])
    gate, up = h @ w[layer + "mlp.gate_proj.weight"].T, h @ w[layer + "mlp.up_proj.weight"].T
    hidden = (torch.nn.functional.silu(gate) * up) @ w[layer + "mlp.down_proj.weight"].T + residual
    logits = _rms(hidden, w["norm.weight"]) @ w["lm_head.weight"].T
    draft_ids = logits.argmax(-1)
    return logits, draft_ids + w["d2t"][draft_ids]


def test_draft_forward_gives_identical_logits_when_run_from_source_and_converted_weights(
    tmp_path: Path,
) -> None:
    """The same draft step on the speculators weights (layers.0.*) and the converted ones (midlayer.*)
    gives identical logits and target ids; swapping two norms in the converted weights does not."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    convert(src, tmp_path / "out")
    generator = torch.Generator().manual_seed(0)
    embeds = torch.randn(5, TINY.hidden_size, generator=generator)
    aux = torch.randn(5, 3 * TINY.target_hidden_size, generator=generator)
    source = load_file(src / "model.safetensors")
    converted = load_file(tmp_path / "out" / "model.safetensors")

    logits_src, ids_src = _draft_forward(source, "layers.0.", embeds, aux)
    logits_out, ids_out = _draft_forward(converted, "midlayer.", embeds, aux)
    assert torch.equal(logits_src, logits_out)
    assert torch.equal(ids_src, ids_out)
    assert bool(((ids_out >= 0) & (ids_out < TINY.vocab_size)).all())

    swapped = dict(converted)
    swapped["midlayer.input_layernorm.weight"], swapped["midlayer.hidden_norm.weight"] = (
        converted["midlayer.hidden_norm.weight"],
        converted["midlayer.input_layernorm.weight"],
    )
    logits_swapped, _ = _draft_forward(swapped, "midlayer.", embeds, aux)
    assert not torch.equal(logits_src, logits_swapped)


# -- repeatable and atomic ---------------------------------------------------------------------------


def test_convert_is_a_noop_when_rerun_on_same_source(tmp_path: Path) -> None:
    """A second run finds the stored conversion (same source hash) and writes nothing."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    first = convert(src, tmp_path / "out")
    weights = tmp_path / "out" / "model.safetensors"
    stamp = weights.stat().st_mtime_ns

    again = convert(src, tmp_path / "out")
    assert again.reused and not first.reused
    assert again.source_digest == first.source_digest
    assert weights.stat().st_mtime_ns == stamp

    proc = _cli("convert", str(src), str(tmp_path / "out"))
    assert proc.returncode == 0 and "nothing to do" in proc.stdout


def test_convert_refuses_then_replaces_when_dst_differs_without_and_with_force(tmp_path: Path) -> None:
    """An existing DST from another source is kept unless --force; with it, it is replaced."""
    src_a = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, seed=1), tmp_path / "a")
    src_b = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, seed=2), tmp_path / "b")
    convert(src_a, tmp_path / "out")

    with pytest.raises(ConversionError, match="--force"):
        convert(src_b, tmp_path / "out")
    kept = ConversionReport.model_validate_json((tmp_path / "out" / "conversion.json").read_text())
    assert kept.source == str(src_a)

    replaced = convert(src_b, tmp_path / "out", ConvertOptions(force=True))
    assert not replaced.reused and replaced.source == str(src_b)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b", "out"]


def test_convert_cached_converts_once_when_called_twice_and_again_when_source_changes(tmp_path: Path) -> None:
    """The node cache is keyed by the source hash: a repeat call reuses, a changed source converts anew."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SGLANG), tmp_path / "src")
    first = convert_cached(src, tmp_path / "cache")
    second = convert_cached(src, tmp_path / "cache")
    assert second.path == first.path and second.report.reused and not first.report.reused
    assert (first.path / "config.json").is_file()

    write_checkpoint(build_checkpoint(SourceFormat.SGLANG, seed=5), src)
    third = convert_cached(src, tmp_path / "cache")
    assert third.path != first.path and not third.report.reused


def test_convert_leaves_no_dst_when_killed_mid_write(tmp_path: Path) -> None:
    """SIGKILL while the weights are being written leaves no DST; the next run cleans up and succeeds."""
    dims = FixtureDims(1024, 8, 4, 128, 4096, 8000, 32000, 1024, 8, (1, 3, 6))
    src = write_checkpoint(
        build_checkpoint(SourceFormat.SPECULATORS, dims, fast_values=True), tmp_path / "src"
    )
    dst = tmp_path / "out"
    child = subprocess.Popen([sys.executable, "-m", "harness.cli", "convert", str(src), str(dst)], cwd=REPO)
    try:
        deadline = time.monotonic() + 60
        partial = None
        while partial is None and child.poll() is None and time.monotonic() < deadline:
            partial = next(iter(tmp_path.glob(".out.converting-*/model.safetensors")), None)
            time.sleep(0.001)  # leave the CPU to the child on a small box
        assert partial is not None, "conversion finished before it could be interrupted"
        os.kill(child.pid, signal.SIGKILL)
        child.wait(timeout=30)
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    assert child.returncode == -signal.SIGKILL
    assert not dst.exists()

    report = convert(src, dst)
    assert not report.reused and dst.is_dir()
    assert not list(tmp_path.glob(".out.converting-*"))


def test_cli_convert_prints_json_report_when_json_flag(tmp_path: Path) -> None:
    """`specsweep convert --json` prints the report; the detected format is named."""
    src = write_checkpoint(build_checkpoint(SourceFormat.EAGLE), tmp_path / "src")
    proc = _cli("convert", str(src), str(tmp_path / "out"), "--json")
    assert proc.returncode == 0, proc.stderr
    report = ConversionReport.model_validate_json(proc.stdout)
    assert report.source_format is SourceFormat.EAGLE
    assert any("LlamaForCausalLM" in change for change in report.config_changes)


def test_cli_convert_says_detected_format_when_human_output(tmp_path: Path) -> None:
    """Plain output names the detected format and why, each check, and every dropped key."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    proc = _cli("convert", str(src), str(tmp_path / "out"))
    assert proc.returncode == 0, proc.stderr
    assert "detected format: speculators (config has speculators_model_type='eagle3')" in proc.stdout
    assert "dropped embed_tokens.weight" in proc.stdout
    assert "round trip" in proc.stdout


def test_convert_warns_when_a_norm_is_all_ones(tmp_path: Path) -> None:
    """A norm of exactly 1.0 everywhere converts, with a warning that it looks untrained."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG)
    ones = np.full(TINY.hidden_size, 0x3F80, dtype=np.uint16)  # bf16 1.0
    checkpoint.tensors["norm.weight"] = FixtureTensor("BF16", ones.shape, ones)
    src = write_checkpoint(checkpoint, tmp_path / "src")
    report = convert(src, tmp_path / "out")
    values = next(c for c in report.checks if c.name == "values")
    assert values.status == "warn" and "norm.weight" in values.detail and "untrained" in values.detail


def test_convert_drops_verifier_copies_with_reason_when_speculators_source(tmp_path: Path) -> None:
    """verifier_* tensors (training-time copies of the target's) are dropped, each with its reason."""
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS)
    checkpoint.tensors["verifier_lm_head.weight"] = FixtureTensor("BF16", (TINY.vocab_size, TINY.hidden_size))
    src = write_checkpoint(checkpoint, tmp_path / "src")
    report = convert(src, tmp_path / "out")
    reasons = {d.key: d.reason for d in report.dropped}
    assert set(reasons) == {"embed_tokens.weight", "verifier_lm_head.weight"}
    assert "verifier" in reasons["verifier_lm_head.weight"]
    assert "verifier_lm_head.weight" not in load_file(tmp_path / "out" / "model.safetensors")


def test_convert_renames_legacy_aux_norms_when_sglang_source_has_eagle31_norms(tmp_path: Path) -> None:
    """EAGLE-3.1 aux_norm_low/mid/high become fc_norm.0/1/2; use_aux_norm becomes fc_norm: true."""
    checkpoint = build_checkpoint(SourceFormat.SGLANG)
    for legacy in ("aux_norm_low", "aux_norm_mid", "aux_norm_high"):
        checkpoint.tensors[f"{legacy}.weight"] = FixtureTensor(
            "BF16", (TINY.target_hidden_size,), kind="norm"
        )
    checkpoint.config["use_aux_norm"] = True
    src = write_checkpoint(checkpoint, tmp_path / "src")
    report = convert(src, tmp_path / "out")
    mapping = {t.source: t.output for t in report.tensors}
    assert mapping["aux_norm_mid.weight"] == "fc_norm.1.weight"
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    assert config["fc_norm"] is True and "use_aux_norm" not in config


def test_convert_cached_converts_once_when_two_callers_race(tmp_path: Path) -> None:
    """Two workers on one node asking at once: one converts, the other reuses its result."""
    from concurrent.futures import ThreadPoolExecutor

    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    with ThreadPoolExecutor(max_workers=2) as pool:
        results = list(pool.map(lambda _: convert_cached(src, tmp_path / "cache"), range(2)))
    assert results[0].path == results[1].path
    assert sorted(r.report.reused for r in results) == [False, True]
