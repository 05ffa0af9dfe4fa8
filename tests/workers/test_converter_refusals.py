"""Drafter conversion refuses each bad input with a message naming the key or field and the fix.

Every case starts from a valid generated checkpoint, breaks one thing, and checks that conversion
fails with ConversionError, that the message names the culprit and a fix, and that no DST appears.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from harness.cli import main
from specsweep.errors import ConversionError
from workers.convert.converter import ConvertOptions, convert
from workers.convert.eagle3_format import LayerNaming, SourceFormat
from workers.convert.fixtures import (
    TINY,
    FixtureCheckpoint,
    FixtureTensor,
    bf16_bits,
    build_checkpoint,
    materialise,
    vocab_map,
    with_data,
    write_checkpoint,
    write_target_config,
)

REPO = Path(__file__).resolve().parents[2]
Q_PROJ = "layers.0.self_attn.q_proj.weight"


def _set_value(name: str, value: float) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        data = materialise(checkpoint.tensors[name]).copy()
        data.reshape(-1)[7] = bf16_bits(np.array([value], dtype=np.float32))[0]
        checkpoint.tensors[name] = with_data(checkpoint.tensors[name], data)

    return edit


def _fill(name: str, value: float) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        tensor = checkpoint.tensors[name]
        data = np.full(tensor.shape, bf16_bits(np.array([value], dtype=np.float32))[0], dtype=np.uint16)
        checkpoint.tensors[name] = with_data(tensor, data)

    return edit


def _wrong_shape(checkpoint: FixtureCheckpoint) -> None:
    tensor = checkpoint.tensors[Q_PROJ]
    checkpoint.tensors[Q_PROJ] = FixtureTensor("BF16", (tensor.shape[0], tensor.shape[1] // 2), seed=3)


def _add_key(name: str, shape: tuple[int, ...]) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        checkpoint.tensors[name] = FixtureTensor("BF16", shape, seed=4)

    return edit


def _drop_key(name: str) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        del checkpoint.tensors[name]

    return edit


def _d2t_absolute(checkpoint: FixtureCheckpoint) -> None:
    d2t, _ = vocab_map(TINY)
    ids = d2t + np.arange(TINY.draft_vocab_size)
    checkpoint.tensors["d2t"] = FixtureTensor("I64", ids.shape, ids)


def _d2t_bf16(checkpoint: FixtureCheckpoint) -> None:
    d2t, _ = vocab_map(TINY)
    checkpoint.tensors["d2t"] = FixtureTensor("BF16", d2t.shape, bf16_bits(d2t.astype(np.float32)))


def _d2t_f16(checkpoint: FixtureCheckpoint) -> None:
    d2t, _ = vocab_map(TINY)
    checkpoint.tensors["d2t"] = FixtureTensor("F16", d2t.shape, d2t.astype(np.float16))


def _fc_as_f32(checkpoint: FixtureCheckpoint) -> None:
    checkpoint.tensors["fc.weight"] = FixtureTensor("F32", checkpoint.tensors["fc.weight"].shape, seed=5)


def _t2d_extra_id(checkpoint: FixtureCheckpoint) -> None:
    _, t2d = vocab_map(TINY)
    t2d = t2d.copy()
    t2d[np.flatnonzero(~t2d)[0]] = True
    checkpoint.tensors["t2d"] = FixtureTensor("BOOL", t2d.shape, t2d)


def _config(**changes: object) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        checkpoint.config.update(changes)

    return edit


def _both(*edits: Callable[[FixtureCheckpoint], None]) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        for one in edits:
            one(checkpoint)

    return edit


def _layer_config(**changes: object) -> Callable[[FixtureCheckpoint], None]:
    def edit(checkpoint: FixtureCheckpoint) -> None:
        checkpoint.config["transformer_layer_config"].update(changes)

    return edit


# case -> (source format, edit, options, words the message must contain: culprit and fix)
CASES: dict[str, tuple[SourceFormat, Callable[[FixtureCheckpoint], None], dict, tuple[str, ...]]] = {
    "nan weight": (SourceFormat.SPECULATORS, _set_value(Q_PROJ, float("nan")), {}, (Q_PROJ, "NaN", "fix:")),
    "inf weight": (
        SourceFormat.SPECULATORS,
        _set_value("fc.weight", -float("inf")),
        {},
        ("fc.weight", "inf"),
    ),
    "all-zero weight": (
        SourceFormat.SPECULATORS,
        _fill("lm_head.weight", 0.0),
        {},
        ("lm_head.weight", "zeros"),
    ),
    "constant weight": (SourceFormat.SPECULATORS, _fill("fc.weight", 0.5), {}, ("fc.weight", "0.5")),
    "wrong shape": (
        SourceFormat.SPECULATORS,
        _wrong_shape,
        {},
        (Q_PROJ, "expected [64, 128]", "check hidden_size/heads/head_dim/intermediate_size"),
    ),
    "unknown key": (
        SourceFormat.SPECULATORS,
        _add_key("layers.0.mlp.extra.weight", (4,)),
        {},
        ("mlp.extra",),
    ),
    "missing key": (
        SourceFormat.SPECULATORS,
        _drop_key("layers.0.hidden_norm.weight"),
        {},
        ("midlayer.hidden_norm.weight", "missing"),
    ),
    "qwen3 q norm": (
        SourceFormat.SPECULATORS,
        _add_key("layers.0.self_attn.q_norm.weight", (16,)),
        {},
        ("q_norm", "qwen3"),
    ),
    "extra layer": (
        SourceFormat.SPECULATORS,
        _add_key("layers.1.input_layernorm.weight", (64,)),
        {},
        ("layers.1", "extra draft layer"),
    ),
    "input_norm without norm_before_fc": (
        SourceFormat.SPECULATORS,
        _add_key("input_norm.weight", (192,)),
        {},
        ("norm_before_fc", "input_norm.weight", "skips"),
    ),
    "norm_before_fc without input_norm": (
        SourceFormat.SPECULATORS,
        _config(norm_before_fc=True),
        {},
        ("input_norm.weight", "missing", "untrained"),
    ),
    "fc_norm and norm_before_fc": (
        SourceFormat.SGLANG,
        _config(fc_norm=True, norm_before_fc=True),
        {},
        ("fc_norm", "norm_before_fc", "both"),
    ),
    "trained embedding": (
        SourceFormat.SPECULATORS,
        _config(embed_requires_grad=True),
        {},
        ("embed_requires_grad", "set_embed", "target's"),
    ),
    "other speculator algorithm": (
        SourceFormat.SPECULATORS,
        _config(speculators_model_type="peagle"),
        {},
        ("speculators_model_type", "peagle", "eagle3"),
    ),
    "input_norm on old SGLang": (
        SourceFormat.SPECULATORS,
        _both(_config(norm_before_fc=True), _add_key("input_norm.weight", (192,))),
        {"sglang_version": "0.5.16"},
        ("--sglang-version 0.5.16", "0.5.17", "upgrade"),
    ),
    "layers layout on old SGLang": (
        SourceFormat.SGLANG,
        lambda checkpoint: None,
        {"layout": LayerNaming.LAYERS, "sglang_version": "0.5.11"},
        ("layers.0.* weight names", "0.5.12", "--layout midlayer"),
    ),
    "not a version": (
        SourceFormat.SGLANG,
        lambda checkpoint: None,
        {"sglang_version": "latest"},
        ("--sglang-version", "latest", "0.5.23"),
    ),
    "mla pre-fused qkv_a": (
        SourceFormat.SGLANG_MLA,
        _add_key("midlayer.self_attn.fused_qkv_a_proj_with_mqa.weight", (88, 128)),
        {},
        ("fused_qkv_a_proj_with_mqa", "never loads"),
    ),
    "mla norm_before_fc": (
        SourceFormat.SGLANG_MLA,
        _config(norm_before_fc=True),
        {},
        ("norm_before_fc", "Eagle3DeepseekV2ForCausalLM"),
    ),
    "mla without q_lora_rank": (
        SourceFormat.SGLANG_MLA,
        _config(q_lora_rank=None),
        {},
        ("q_lora_rank", "requires"),
    ),
    "mla wrong kv_b_proj": (
        SourceFormat.SGLANG_MLA,
        _add_key("midlayer.self_attn.kv_b_proj.weight", (8, 32)),
        {},
        ("kv_b_proj", "expected [128, 32]", "kv_lora_rank"),
    ),
    "mla llama keys": (
        SourceFormat.SGLANG_MLA,
        _add_key("midlayer.self_attn.q_proj.weight", (64, 128)),
        {},
        ("q_proj", "MLA draft layer"),
    ),
    "d2t absolute ids": (SourceFormat.SPECULATORS, _d2t_absolute, {}, ("d2t", "absolute", "arange")),
    "d2t as bf16": (SourceFormat.SPECULATORS, _d2t_bf16, {}, ("d2t", "BF16", "int64")),
    # F16 holds integers exactly up to 2048 (11-bit significand), BF16 up to 256 (8 bits).
    "d2t as f16": (SourceFormat.SPECULATORS, _d2t_f16, {}, ("d2t: stored as F16", "exactly only up to 2048")),
    # One F32 tensor among twelve BF16 ones: each dtype with its first tensor and how many more.
    "mixed float dtypes": (
        SourceFormat.SGLANG,
        _fc_as_f32,
        {},
        (
            "mixed float dtypes (BF16: midlayer.self_attn.q_proj.weight (+11), F32: fc.weight (+0))",
            "one dtype",
        ),
    ),
    "t2d count": (SourceFormat.SPECULATORS, _t2d_extra_id, {}, ("t2d", "marks 97", "96")),
    "missing d2t": (SourceFormat.SPECULATORS, _drop_key("d2t"), {}, ("d2t", "missing", "offsets")),
    "tie word embeddings": (
        SourceFormat.SGLANG,
        _config(tie_word_embeddings=True),
        {},
        ("config.json:tie_word_embeddings: is true", "false"),
    ),
    "LlamaForCausalLM kept": (
        SourceFormat.EAGLE,
        lambda checkpoint: None,
        {"source_format": SourceFormat.SGLANG},
        ("architectures", "LlamaForCausalLM", "--from eagle"),
    ),
    "norm_before_residual": (
        SourceFormat.SPECULATORS,
        _config(norm_before_residual=True),
        {},
        ("norm_before_residual",),
    ),
    "norm_before_residual in an SGLang checkpoint": (
        SourceFormat.SGLANG,
        _config(norm_before_residual=True),
        {},
        ("config.json:norm_before_residual: is true", "retrain with it false"),
    ),
    "qwen3 layer": (SourceFormat.SPECULATORS, _layer_config(model_type="qwen3"), {}, ("model_type", "qwen3")),
    "unknown config field": (SourceFormat.SPECULATORS, _config(fancy_mode=True), {}, ("fancy_mode",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_convert_refuses_with_key_and_fix_when_checkpoint_is_bad(case: str, tmp_path: Path) -> None:
    """Each bad input fails before DST exists, naming the key/field and a fix."""
    source_format, edit, options, words = CASES[case]
    checkpoint = build_checkpoint(source_format)
    edit(checkpoint)
    src = write_checkpoint(checkpoint, tmp_path / "src")
    with pytest.raises(ConversionError) as caught:
        convert(src, tmp_path / "out", ConvertOptions(**options))
    message = str(caught.value)
    for word in words:
        assert word in message, f"{word!r} not in:\n{message}"
    assert "fix:" in message
    assert sorted(p.name for p in tmp_path.iterdir()) == ["src"]


def test_convert_refuses_when_target_vocab_differs(tmp_path: Path) -> None:
    """--target-config with another vocab size is refused, naming vocab_size and both numbers."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    target = write_target_config(tmp_path / "target", TINY)
    config = json.loads((target / "config.json").read_text())
    config["vocab_size"] = 163840
    (target / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        ConversionError, match=r"vocab_size: draft says target vocab 256, the target config says 163840"
    ):
        convert(src, tmp_path / "out", ConvertOptions(target_config=target))
    assert not (tmp_path / "out").exists()


def test_convert_refuses_when_aux_layer_count_disagrees_with_fc_width(tmp_path: Path) -> None:
    """Four aux layer ids against an fc trained on three is refused, explaining the width."""
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS)
    checkpoint.config["eagle_aux_hidden_state_layer_ids"] = [1, 2, 3, 6]
    src = write_checkpoint(checkpoint, tmp_path / "src")
    with pytest.raises(
        ConversionError, match=r"fc.weight: shape \[64, 192\]: width 192 = 3 aux hidden states"
    ):
        convert(src, tmp_path / "out")


def test_convert_refuses_when_safetensors_file_truncated(tmp_path: Path) -> None:
    """A file cut short is refused before copying, saying how many bytes the header promised."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src")
    weights = src / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ConversionError, match="truncated: the header promises") as caught:
        convert(src, tmp_path / "out")
    assert "model.safetensors" in str(caught.value) and "download it again" in str(caught.value)
    assert not (tmp_path / "out").exists()


def test_convert_refuses_pickle_when_allow_pickle_not_given(tmp_path: Path) -> None:
    """.bin weights are refused without --allow-pickle (CLI exit 2, no traceback)."""
    src = write_checkpoint(build_checkpoint(SourceFormat.EAGLE), tmp_path / "src", as_pickle=True)
    with pytest.raises(ConversionError, match="--allow-pickle"):
        convert(src, tmp_path / "out")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "convert", str(src), str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "pytorch_model.bin" in proc.stderr and "--allow-pickle" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_convert_lists_every_problem_when_several_keys_are_bad(tmp_path: Path) -> None:
    """All key/shape problems come in one message, not one per run."""
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS)
    _wrong_shape(checkpoint)
    _drop_key("layers.0.hidden_norm.weight")(checkpoint)
    _add_key("mystery.weight", (3,))(checkpoint)
    src = write_checkpoint(checkpoint, tmp_path / "src")
    with pytest.raises(ConversionError, match="3 problems") as caught:
        convert(src, tmp_path / "out")
    message = str(caught.value)
    assert Q_PROJ in message and "hidden_norm" in message and "mystery.weight" in message


def test_convert_refuses_when_dst_overlaps_src(tmp_path: Path) -> None:
    """DST equal to or inside SRC is refused even with --force (it would replace the source)."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SGLANG), tmp_path / "src")
    for dst in (src, src / "converted"):
        with pytest.raises(ConversionError, match="overlaps the source"):
            convert(src, dst, ConvertOptions(force=True))
    assert (src / "model.safetensors").is_file() and not (src / "converted").exists()


@pytest.mark.parametrize("poison", ["9" * 5000, "[" * 100_000 + "]" * 100_000], ids=["5000_digits", "deep"])
@pytest.mark.parametrize("victim", ["config.json", "model.safetensors.index.json", "target config.json"])
def test_convert_names_the_file_in_one_line_when_a_json_file_holds_a_huge_integer_or_deep_nesting(
    victim: str, poison: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An integer past Python's digit limit or nesting past the parser's depth in the draft's config, its
    shard index or the target's config: `convert` exits 2 naming the file and its line, no traceback, no
    DST."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src", shards=2)
    target = write_target_config(tmp_path / "target", TINY)
    path = target / "config.json" if victim.startswith("target") else src / victim
    path.write_text(path.read_text().rstrip().removesuffix("}") + ',\n"hostile": ' + poison + "}")
    argv = ["convert", str(src), str(tmp_path / "out"), "--target-config", str(target)]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{path}: is not valid JSON" in err and "line " in err
    assert not (tmp_path / "out").exists()


def _shard_outside(tmp_path: Path, how: str) -> tuple[Path, Path]:
    """A two-shard checkpoint whose first shard lives in ``tmp_path/elsewhere``, reached through an index
    entry ("../elsewhere/...") or a symlink in place; returns (checkpoint dir, the outside file)."""
    src = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "src", shards=2)
    shard = src / "model-00001-of-00002.safetensors"
    outside = tmp_path / "elsewhere" / shard.name
    outside.parent.mkdir()
    shard.rename(outside)
    if how == "symlink":
        shard.symlink_to(outside)
    else:
        index = src / "model.safetensors.index.json"
        data = json.loads(index.read_text())
        data["weight_map"] = {
            k: f"../elsewhere/{v}" if v == shard.name else v for k, v in data["weight_map"].items()
        }
        index.write_text(json.dumps(data))
    return src, outside


@pytest.mark.parametrize("how", ["index_entry", "symlink"])
def test_convert_refuses_a_shard_outside_the_checkpoint_unless_allowed_when_index_or_link_points_out(
    how: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A weight file that resolves outside SRC (an index entry with ../, a symlinked shard) is refused in
    one line naming where it resolves, before it is read and with no DST; --allow-external-shards reads
    it, and a sweep's drafter.allow_external_shards reaches the node's conversion."""
    src, outside = _shard_outside(tmp_path, how)
    out = tmp_path / "out"
    assert main(["convert", str(src), str(out)]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"resolves to {outside}, outside the checkpoint directory" in err
    assert "--allow-external-shards" in err and not out.exists()
    assert main(["convert", str(src), str(out), "--allow-external-shards"]) == 0
    assert (out / "conversion.json").is_file()


def test_converted_drafter_follows_the_spec_when_a_shard_is_outside_the_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The sweep's conversion (planner and node worker) refuses an outside shard unless the spec's
    drafter.allow_external_shards says yes."""
    from workers.convert.cache import converted_drafter
    from workers.job import DrafterSpec

    src, _ = _shard_outside(tmp_path, "symlink")
    monkeypatch.setenv("SPECSWEEP_DRAFTER_CACHE", str(tmp_path / "cache"))
    with pytest.raises(ConversionError, match="outside the checkpoint directory"):
        converted_drafter(DrafterSpec(path=str(src)), "/nonexistent/target")
    allowed = DrafterSpec(path=str(src), allow_external_shards=True)
    assert (converted_drafter(allowed, "/nonexistent/target") / "conversion.json").is_file()


def test_convert_reads_a_hugging_face_cache_snapshot_when_its_files_link_into_blobs(tmp_path: Path) -> None:
    """In the Hub cache, snapshots/<rev>/<file> are symlinks into the repo's blobs/: that is inside, no
    flag needed."""
    repo = tmp_path / "models--org--drafter"
    built = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS), tmp_path / "built", shards=2)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (repo / "blobs").mkdir()
    for number, file in enumerate(sorted(built.iterdir())):
        blob = repo / "blobs" / f"blob{number}"
        file.rename(blob)
        (snapshot / file.name).symlink_to(Path("..", "..", "blobs", blob.name))
    convert(snapshot, tmp_path / "out")
    assert (tmp_path / "out" / "conversion.json").is_file()


def test_convert_refuses_as_a_broken_map_not_absolute_ids_when_d2t_runs_past_the_target_vocab(
    tmp_path: Path,
) -> None:
    """d2t = [0, 255, 256, ..., 349]: strictly increasing, but past the target's 256 ids from its third
    entry, so it is no id list of this target (absolute or as offsets: arange + d2t = [0, 256, 258, ...]).
    The refusal says the map and t2d disagree (export both from one vocab map), not that d2t holds
    absolute ids, whose fix (d2t = ids - arange) would still point past the vocab. Every id counts:
    the second one (255) is in range."""
    checkpoint = build_checkpoint(SourceFormat.SPECULATORS)
    d2t = np.concatenate([[0], np.arange(255, 255 + TINY.draft_vocab_size - 1)]).astype(np.int64)
    checkpoint.tensors["d2t"] = FixtureTensor("I64", d2t.shape, d2t)
    src = write_checkpoint(checkpoint, tmp_path / "src")
    with pytest.raises(ConversionError) as caught:
        convert(src, tmp_path / "out")
    message = str(caught.value)
    assert "d2t: arange(draft_vocab) + d2t is not the sorted list of target ids t2d marks" in message
    assert "absolute" not in message
    assert not (tmp_path / "out").exists()
