"""Convert an EAGLE3 draft checkpoint to the layout SGLang loads, checking everything on the way.

A wrong rename loads "fine" in SGLang (unknown keys are skipped) and serves an untrained layer, so
conversion refuses anything it cannot map exactly and proves the result: config, key set, shapes,
dtypes, vocab map, values, and a read-back of every written tensor. Tensors are streamed as raw byte
ranges in small chunks (a rename needs no decoding; see tensor_copy), so memory stays flat whatever
the checkpoint's size. Output goes to a temp directory beside DST and is renamed into place; a
second run on the same source finds the stored report and does nothing.

``convert`` is the library entry point; ``convert_cached`` is what a node worker calls so each node
converts a given source once.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import xxhash

from specsweep.errors import ConversionError
from workers.convert.checkpoint_source import (
    CONFIG_FILE,
    SAFETENSORS_INDEX,
    CheckpointSource,
    SourceTensor,
    open_checkpoint,
    read_json,
)
from workers.convert.eagle3_format import (
    Detection,
    LayerNaming,
    MlaDims,
    NormalisedConfig,
    Problem,
    SourceFormat,
    TargetCheck,
    TensorFacts,
    check_target,
    check_tensors,
    check_vocab_mapping,
    decide_key,
    detect_format,
    judge_values,
    normalise_config,
    output_name,
)
from workers.convert.report import (
    REPORT_FILE,
    CheckResult,
    ConversionReport,
    DroppedKey,
    FeatureNeed,
    SourceFile,
    TensorRecord,
)
from workers.convert.safetensors_stream import (
    OutputTensor,
    encode_header,
    iter_mapped,
    read_header,
    write_all,
)
from workers.convert.tensor_copy import TensorOutcome, TensorTask, copy_and_hash
from workers.convert.tensor_values import FLOAT_DTYPES
from workers.sglang.drafts import (
    BASE_MINIMUM,
    FEATURE_SUPPORT,
    SGLANG_VERSION,
    DraftFeature,
    parse_version,
    supports,
)

log = logging.getLogger(__name__)

# Bump when the output for the same source and options changes: stored conversions are then redone.
CONVERTER_VERSION = 2
DEFAULT_MAX_SHARD_BYTES = 5 << 30
SINGLE_FILE = "model.safetensors"
_TEMP_MARK = ".converting-"


@dataclass(frozen=True)
class ConvertOptions:
    """How to convert: forced input format (or auto), target config dir, output layout, the nodes'
    SGLang version, permissions."""

    source_format: SourceFormat | None = None
    target_config: Path | None = None
    layout: LayerNaming = LayerNaming.MIDLAYER
    sglang_version: str = SGLANG_VERSION
    allow_pickle: bool = False
    allow_external_shards: bool = False  # read weight files that resolve outside the checkpoint directory
    force: bool = False
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES


@dataclass(frozen=True)
class CachedConversion:
    """A converted draft in the node cache: the directory to pass to SGLang and its report."""

    path: Path
    report: ConversionReport


def convert(src: Path | str, dst: Path | str, options: ConvertOptions | None = None) -> ConversionReport:
    """Convert ``src`` into ``dst``; a no-op (``reused=True``) when ``dst`` holds this very conversion."""
    options = options or ConvertOptions()
    src, dst = Path(src).absolute(), Path(dst).absolute()
    if dst.resolve().is_relative_to(src.resolve()) or src.resolve().is_relative_to(dst.resolve()):
        raise ConversionError(
            f"overlaps the source {src}", where=str(dst), fix="write the conversion to a separate directory"
        )
    target_digest = _target_digest(options)
    if dst.exists() or dst.is_symlink():
        digest = source_digest(
            src, allow_pickle=options.allow_pickle, allow_external_shards=options.allow_external_shards
        )
        done = _reusable(dst, digest, target_digest, options)
        if done is not None:
            log.info("%s already holds this conversion of %s; nothing to do", dst, src)
            return done
        if not options.force:
            raise ConversionError(
                "exists and does not hold a conversion of this source with these options",
                where=str(dst),
                fix="choose another DST, or pass --force to replace it",
            )
    return _convert_fresh(src, dst, options, target_digest)


def convert_cached(
    src: Path | str, cache_dir: Path | str, options: ConvertOptions | None = None
) -> CachedConversion:
    """Convert ``src`` once per node: the result lives in ``cache_dir`` under the source's hash.

    Concurrent callers on one node serialise on a lock file, so the second one finds the first's
    result. The source is hashed before and (as a side effect of streaming) during conversion; a
    difference means it changed underneath us and nothing is cached.
    """
    options = options or ConvertOptions()
    src, cache_dir = Path(src).absolute(), Path(cache_dir).absolute()
    cache_dir.mkdir(parents=True, exist_ok=True)
    digest = source_digest(
        src, allow_pickle=options.allow_pickle, allow_external_shards=options.allow_external_shards
    )
    target_digest = _target_digest(options)
    key = xxhash.xxh3_128(
        json.dumps(
            [digest, target_digest, options.layout, options.sglang_version, CONVERTER_VERSION]
        ).encode()
    ).hexdigest()[:32]
    dst = cache_dir / key
    with _locked(cache_dir / f".{key}.lock"):
        done = _reusable(dst, digest, target_digest, options) if dst.exists() else None
        if done is not None:
            return CachedConversion(dst, done)
        report = _convert_fresh(src, dst, replace(options, force=True), target_digest)
    if report.source_digest != digest:
        shutil.rmtree(dst, ignore_errors=True)
        raise ConversionError(
            "the source changed while it was being converted",
            where=str(src),
            fix="wait until the checkpoint is fully written, then run again",
        )
    return CachedConversion(dst, report)


# -- source identity ------------------------------------------------------------------------------


def source_digest(src: Path, *, allow_pickle: bool, allow_external_shards: bool = False) -> str:
    """The content hash of a source checkpoint (config and weight files), as a conversion records it."""
    with open_checkpoint(
        src, allow_pickle=allow_pickle, allow_external_shards=allow_external_shards
    ) as source:
        return _digest_of_files(_hash_files(source, _hash_tensors(source)))


def _hash_tensors(source: CheckpointSource) -> dict[str, bytes]:
    outcomes = copy_and_hash(source, [TensorTask(tensor) for tensor in source.tensors.values()])
    return {name: outcome.digest for name, outcome in outcomes.items()}


def _hash_files(source: CheckpointSource, tensor_digests: dict[str, bytes]) -> list[SourceFile]:
    """Digests of config, index and weight files; safetensors ones built from the tensor digests."""
    files = [_whole_file(source.root, source.root / CONFIG_FILE)]
    if (source.root / SAFETENSORS_INDEX).exists():
        files.append(_whole_file(source.root, source.root / SAFETENSORS_INDEX))
    for weight_file in source.files:
        header = weight_file.header
        if header is None:
            files.append(_whole_file(source.root, weight_file.path))
            continue
        hasher = xxhash.xxh3_128()
        with weight_file.path.open("rb") as f:
            hasher.update(f.read(header.data_start))
        for entry in header.tensors:
            hasher.update(tensor_digests[entry.name])
        files.append(
            SourceFile(
                path=weight_file.path.name,
                bytes=header.file_size,
                digest=hasher.hexdigest(),
                digest_scheme="xxh3-safetensors-tensors",
            )
        )
    return files


def _whole_file(root: Path, path: Path) -> SourceFile:
    hasher = xxhash.xxh3_128()
    size = path.stat().st_size
    with path.open("rb") as f:
        for chunk in iter_mapped(f.fileno(), 0, size):
            hasher.update(chunk)
    return SourceFile(
        path=str(path.relative_to(root)), bytes=size, digest=hasher.hexdigest(), digest_scheme="xxh3-file"
    )


def _digest_of_files(files: list[SourceFile]) -> str:
    listing = sorted((f.path, f.digest) for f in files)
    return xxhash.xxh3_128(json.dumps(listing).encode()).hexdigest()


def _target_digest(options: ConvertOptions) -> str | None:
    if options.target_config is None:
        return None
    path = Path(options.target_config) / CONFIG_FILE
    read_json(path, what="the target model's config (--target-config DIR)")
    return xxhash.xxh3_128(path.read_bytes()).hexdigest()


def _reusable(
    dst: Path, digest: str, target_digest: str | None, options: ConvertOptions
) -> ConversionReport | None:
    """The stored report when ``dst`` is exactly this conversion, else None."""
    try:
        stored = ConversionReport.model_validate_json((dst / REPORT_FILE).read_text())
    except (OSError, ValueError):
        return None
    same = (
        stored.converter_version == CONVERTER_VERSION
        and stored.source_digest == digest
        and stored.target_config_digest == target_digest
        and stored.layout == options.layout
        and stored.sglang_version == options.sglang_version
        and options.source_format in (None, stored.source_format)
        and all((dst / name).is_file() for name in stored.output_files)
    )
    return stored.model_copy(update={"reused": True}) if same else None


# -- planning: every check that needs no tensor data beyond the vocab map -------------------------


@dataclass(frozen=True)
class PlannedTensor:
    """A source tensor that will be written, with its canonical (SGLang-native) and output names."""

    source: SourceTensor
    canonical: str
    output: str


@dataclass(frozen=True)
class ConversionPlan:
    """What the conversion will do, decided and checked before any byte is copied."""

    detection: Detection
    config: NormalisedConfig
    kept: tuple[PlannedTensor, ...]
    dropped: tuple[DroppedKey, ...]
    checks: tuple[CheckResult, ...]
    needs: tuple[FeatureNeed, ...]


def plan_conversion(
    source: CheckpointSource, options: ConvertOptions, target: dict[str, Any] | None
) -> ConversionPlan:
    """Decide the mapping and run checks 1-5; raises one ConversionError listing every problem."""
    detection = _detect(source, options)
    normalised = normalise_config(source.config, detection.format, source.tensors)
    if isinstance(normalised, list):
        raise _refusal(source.root, "config", normalised)
    dims = normalised.dims
    kept: list[PlannedTensor] = []
    dropped: list[DroppedKey] = []
    problems: list[Problem] = []
    for tensor in _in_file_order(source):
        decision = decide_key(tensor.name, detection.format, dims)
        if decision.refusal is not None:
            problems.append(decision.refusal)
        elif decision.drop_reason is not None:
            dropped.append(DroppedKey(key=tensor.name, reason=decision.drop_reason))
        elif decision.canonical is not None:
            name = output_name(decision.canonical, tensor.name, detection.format, options.layout)
            kept.append(PlannedTensor(tensor, decision.canonical, name))
    duplicates = _duplicate_outputs(kept)
    problems += duplicates
    problems += check_tensors(
        [TensorFacts(t.canonical, t.source.name, t.source.dtype, t.source.shape) for t in kept], dims
    )
    target_check = check_target(dims, target) if target is not None else None
    if target_check is not None:
        problems += target_check.problems
    if problems:
        raise _refusal(source.root, "keys, shapes and dtypes", problems)
    needs = _feature_needs(normalised, kept, options)
    problems = _version_problems(needs, options)
    if problems:
        raise _refusal(source.root, "SGLang version", problems)
    by_canonical = {t.canonical: t.source for t in kept}
    vocab = [by_canonical.get(name) for name in ("d2t", "t2d")]
    d2t, t2d = (source.read_array(t) if t is not None else None for t in vocab)
    problems = check_vocab_mapping(d2t, t2d, dims)
    if problems:
        raise _refusal(source.root, "vocab mapping", problems)
    checks = _planning_checks(normalised, kept, dropped, target_check, d2t is not None)
    return ConversionPlan(detection, normalised, tuple(kept), tuple(dropped), checks, needs)


def _feature_needs(
    normalised: NormalisedConfig, kept: list[PlannedTensor], options: ConvertOptions
) -> tuple[FeatureNeed, ...]:
    """The version-dependent features the output uses: the draft's own, and layers.0.* names."""
    features = list(normalised.dims.features)
    if not normalised.dims.own_head:
        features.append(DraftFeature.TARGET_HEAD)
    if any(t.output.startswith("layers.0.") for t in kept) and DraftFeature.MLA not in features:
        features.append(DraftFeature.LAYERS_PREFIX)
    return tuple(
        FeatureNeed(
            feature=feature,
            minimum_sglang=FEATURE_SUPPORT[feature].minimum,
            older=FEATURE_SUPPORT[feature].older,
        )
        for feature in features
    )


def sglang_version(text: str) -> tuple[int, int, int, int]:
    """``--sglang-version`` parsed, or a ConversionError saying what a version looks like."""
    version = parse_version(text)
    if version is None:
        raise ConversionError(
            f"{text!r} is not an SGLang version",
            where="--sglang-version",
            fix=f"give the version the nodes run, like {SGLANG_VERSION} or 0.5.15.post1",
        )
    return version


def _version_problems(needs: tuple[FeatureNeed, ...], options: ConvertOptions) -> list[Problem]:
    version = sglang_version(options.sglang_version)
    return [
        Problem(
            f"--sglang-version {options.sglang_version}",
            f"the output needs {need.feature}, first loaded by SGLang {need.minimum_sglang}; "
            f"older versions do not load it correctly ({need.older})",
            "use --layout midlayer"
            if need.feature is DraftFeature.LAYERS_PREFIX
            else f"upgrade SGLang on the nodes to >= {need.minimum_sglang}",
        )
        for need in needs
        if not supports(version, need.feature)
    ]


def minimum_sglang(needs: tuple[FeatureNeed, ...]) -> str:
    """The oldest SGLang version that loads an output with these features."""
    versions = [BASE_MINIMUM, *(need.minimum_sglang for need in needs)]
    return max(versions, key=lambda text: parse_version(text) or (0, 0, 0, 0))


def _detect(source: CheckpointSource, options: ConvertOptions) -> Detection:
    if options.source_format is not None:
        return Detection(options.source_format, "given with --from")
    detected = detect_format(source.config, source.tensors)
    if isinstance(detected, Problem):
        raise _refusal(source.root, "format detection", [detected])
    return detected


def _in_file_order(source: CheckpointSource) -> list[SourceTensor]:
    """Tensors in the order they sit on disk, so the copy reads each file front to back."""
    file_rank = {weight_file.path: rank for rank, weight_file in enumerate(source.files)}
    return sorted(source.tensors.values(), key=lambda t: (file_rank[t.file], t.offset))


def _duplicate_outputs(kept: list[PlannedTensor]) -> list[Problem]:
    seen: dict[str, str] = {}
    problems = []
    for tensor in kept:
        if tensor.canonical in seen:
            problems.append(
                Problem(
                    tensor.source.name,
                    f"maps to {tensor.canonical}, as does {seen[tensor.canonical]}",
                    "keep only one of the two spellings",
                )
            )
        seen[tensor.canonical] = tensor.source.name
    return problems


def _planning_checks(
    normalised: NormalisedConfig,
    kept: list[PlannedTensor],
    dropped: list[DroppedKey],
    target_check: TargetCheck | None,
    with_vocab_map: bool,
) -> tuple[CheckResult, ...]:
    dims = normalised.dims
    dtype = next((t.source.dtype for t in kept if t.source.dtype in FLOAT_DTYPES), "none")
    vocab = (
        f"d2t offsets map {dims.draft_vocab_size} draft ids onto sorted target ids, equal to nonzero(t2d)"
        if with_vocab_map
        else f"draft vocab == target vocab ({dims.vocab_size}); no map needed"
    )
    target = "; ".join(
        ["vocab size, hidden size and aux layer ids match the target config"]
        + (target_check.notes if target_check else [])
    )
    attention = "MLA" if isinstance(dims.attention, MlaDims) else "llama"
    head = (
        f"draft lm_head over {dims.draft_vocab_size} ids"
        if dims.own_head
        else "no draft lm_head: SGLang serves the target's"
    )
    return (
        CheckResult(
            name="config",
            status="pass",
            detail=f"architectures {normalised.config['architectures']}, {attention} attention, one layer, "
            f"vocab_size {dims.vocab_size}, {head}",
        ),
        CheckResult(
            name="key set",
            status="pass",
            detail=f"{len(kept)} keys kept, every required key present, {len(dropped)} dropped with reasons",
        ),
        CheckResult(name="shapes", status="pass", detail="every shape matches the config"),
        CheckResult(name="dtypes", status="pass", detail=f"weights {dtype}, d2t I64, t2d BOOL"),
        CheckResult(name="vocab mapping", status="pass", detail=vocab),
        CheckResult(
            name="target config",
            status="pass" if target_check else "warn",
            detail=target if target_check else "not checked: no --target-config given",
        ),
    )


def _refusal(root: Path, stage: str, problems: list[Problem]) -> ConversionError:
    lines = "\n".join(f"  - {problem}" for problem in problems)
    return ConversionError(
        f"refused at {stage} check ({len(problems)} problem{'s' * (len(problems) != 1)}):\n{lines}",
        where=str(root),
        fix="fix each listed key or field as its line says; nothing was written",
    )


# -- streaming ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Shard:
    file_name: str
    tensors: tuple[PlannedTensor, ...]


def _shards(kept: tuple[PlannedTensor, ...], max_shard_bytes: int) -> list[_Shard]:
    """Consecutive runs of at most ``max_shard_bytes`` (a bigger tensor gets a shard of its own)."""
    groups: list[list[PlannedTensor]] = [[]]
    size = 0
    for tensor in kept:
        if groups[-1] and size + tensor.source.nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(tensor)
        size += tensor.source.nbytes
    if len(groups) == 1:
        return [_Shard(SINGLE_FILE, tuple(groups[0]))]
    count = len(groups)
    return [
        _Shard(f"model-{i:05d}-of-{count:05d}.safetensors", tuple(group)) for i, group in enumerate(groups, 1)
    ]


@dataclass(frozen=True)
class _StreamResult:
    tensors: list[TensorRecord]
    source_files: list[SourceFile]
    value_checks: CheckResult
    round_trip: CheckResult
    output_files: list[str]
    bytes_written: int


def _stream(
    source: CheckpointSource, plan: ConversionPlan, out_dir: Path, max_shard_bytes: int
) -> _StreamResult:
    """Write each shard's header, then copy, hash, scan and read back every tensor (tensor_copy).

    Dropped tensors are hashed too, so the source files' digests cover every byte.
    """
    shards = _shards(plan.kept, max_shard_bytes)
    tasks: list[TensorTask] = []
    locations: dict[str, str] = {}
    for shard in shards:
        offset = _create_shard(out_dir / shard.file_name, shard)
        for planned in shard.tensors:
            tensor = planned.source
            scan = tensor.dtype if tensor.dtype in FLOAT_DTYPES else None
            tasks.append(TensorTask(tensor, out_dir / shard.file_name, offset, scan))
            locations[tensor.name] = shard.file_name
            offset += tensor.nbytes
    tasks += [TensorTask(tensor) for tensor in _in_file_order(source) if tensor.name not in locations]
    outcomes = copy_and_hash(source, tasks)
    value_check = _judge_all_values(source.root, plan, outcomes)
    _check_round_trip(out_dir, shards, plan, outcomes)
    return _StreamResult(
        tensors=[
            _record(t, locations[t.source.name], outcomes[t.source.name].digest.hex()) for t in plan.kept
        ],
        source_files=_hash_files(source, {name: outcome.digest for name, outcome in outcomes.items()}),
        value_checks=value_check,
        round_trip=CheckResult(
            name="round trip",
            status="pass",
            detail=f"output headers re-read; {len(plan.kept)} tensors read back, XXH3-128 equal to the source's",
        ),
        output_files=_finish_index(out_dir, shards),
        bytes_written=sum(t.source.nbytes for t in plan.kept),
    )


def _create_shard(path: Path, shard: _Shard) -> int:
    """Create ``path`` with the shard's header and its final size; return where tensor data starts."""
    header = encode_header(
        [OutputTensor(t.output, t.source.dtype, t.source.shape, t.source.nbytes) for t in shard.tensors],
        {"format": "pt"},
    )
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        write_all(fd, memoryview(header))
        os.ftruncate(fd, len(header) + sum(t.source.nbytes for t in shard.tensors))
    finally:
        os.close(fd)
    return len(header)


def _judge_all_values(root: Path, plan: ConversionPlan, outcomes: dict[str, TensorOutcome]) -> CheckResult:
    """Check 6 over every kept float tensor: refuse on a problem, collect warnings."""
    problems: list[Problem] = []
    warnings: list[str] = []
    for planned in plan.kept:
        summary = outcomes[planned.source.name].values
        if summary is None:
            continue
        verdict = judge_values(planned.source.name, planned.canonical, planned.source.dtype, summary)
        if isinstance(verdict, Problem):
            problems.append(verdict)
        elif verdict is not None:
            warnings.append(verdict)
    if problems:
        raise _refusal(root, "values", problems)
    return CheckResult(
        name="values",
        status="warn" if warnings else "pass",
        detail="; ".join(warnings) or "every float tensor finite, none all-zero or constant",
    )


def _record(planned: PlannedTensor, file_name: str, digest: str) -> TensorRecord:
    return TensorRecord(
        source=planned.source.name,
        output=planned.output,
        output_file=file_name,
        dtype=planned.source.dtype,
        shape=list(planned.source.shape),
        xxh3=digest,
    )


def _check_round_trip(
    out_dir: Path, shards: list[_Shard], plan: ConversionPlan, outcomes: dict[str, TensorOutcome]
) -> None:
    """Check 7: each written header parses to the plan, and each tensor read back hashes the same."""
    problems = [
        Problem(t.output, "bytes read back differ from the source's", "check the disk, then re-run")
        for t in plan.kept
        if outcomes[t.source.name].out_digest != outcomes[t.source.name].digest
    ]
    for shard in shards:
        written = read_header(out_dir / shard.file_name)
        got = [(e.name, e.dtype, e.shape) for e in written.tensors]
        want = [(t.output, t.source.dtype, t.source.shape) for t in shard.tensors]
        if got != want:
            problems.append(Problem(shard.file_name, "written header differs from the plan", "re-run"))
    if problems:
        raise _refusal(out_dir, "round trip", problems)


def _finish_index(out_dir: Path, shards: list[_Shard]) -> list[str]:
    """Write the shard index when there is more than one file; return the weight file names."""
    names = [shard.file_name for shard in shards]
    if len(shards) > 1:
        index = {
            "metadata": {"total_size": sum(t.source.nbytes for s in shards for t in s.tensors)},
            "weight_map": {t.output: s.file_name for s in shards for t in s.tensors},
        }
        (out_dir / SAFETENSORS_INDEX).write_text(json.dumps(index, indent=2) + "\n")
        names.append(SAFETENSORS_INDEX)
    return names


# -- atomic publish -------------------------------------------------------------------------------


def _convert_fresh(
    src: Path, dst: Path, options: ConvertOptions, target_digest: str | None
) -> ConversionReport:
    started = time.perf_counter()
    target = (
        read_json(Path(options.target_config) / CONFIG_FILE, what="the target config")
        if options.target_config is not None
        else None
    )
    if not dst.parent.is_dir():
        raise ConversionError(
            "parent directory does not exist", where=str(dst), fix="create it or choose another DST"
        )
    with open_checkpoint(
        src, allow_pickle=options.allow_pickle, allow_external_shards=options.allow_external_shards
    ) as source:
        plan = plan_conversion(source, options, target)
        _remove_stale_temps(dst)
        with _temp_dir(dst) as tmp:
            try:
                streamed = _stream(source, plan, tmp, options.max_shard_bytes)
            except OSError as err:
                raise ConversionError(
                    f"writing failed: {err}", where=str(tmp), fix="free disk space or fix permissions, re-run"
                ) from err
            report = ConversionReport(
                converter_version=CONVERTER_VERSION,
                source=str(src),
                destination=str(dst),
                source_format=plan.detection.format,
                detection=plan.detection.reason,
                layout=options.layout,
                sglang_version=options.sglang_version,
                needs=list(plan.needs),
                minimum_sglang=minimum_sglang(plan.needs),
                lm_head="draft" if plan.config.dims.own_head else "target",
                source_files=streamed.source_files,
                source_digest=_digest_of_files(streamed.source_files),
                target_config_digest=target_digest,
                tensors=streamed.tensors,
                dropped=list(plan.dropped),
                config_changes=list(plan.config.changes),
                checks=[*plan.checks, streamed.value_checks, streamed.round_trip],
                output_files=[CONFIG_FILE, *streamed.output_files, REPORT_FILE],
                bytes_written=streamed.bytes_written,
                seconds=round(time.perf_counter() - started, 3),
            )
            (tmp / CONFIG_FILE).write_text(json.dumps(plan.config.config, indent=2) + "\n")
            (tmp / REPORT_FILE).write_text(report.model_dump_json(indent=2) + "\n")
            _publish(tmp, dst)
    return report


def _temp_name(dst: Path) -> Path:
    return dst.parent / f".{dst.name}{_TEMP_MARK}{os.getpid()}"


@contextlib.contextmanager
def _temp_dir(dst: Path) -> Iterator[Path]:
    """A fresh directory beside ``dst`` (same filesystem, so the final rename is atomic)."""
    tmp = _temp_name(dst)
    tmp.mkdir()
    try:
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _remove_stale_temps(dst: Path) -> None:
    """Remove temp dirs left by killed conversions to ``dst``; refuse if one is still running."""
    prefix = f".{dst.name}{_TEMP_MARK}"
    for leftover in dst.parent.glob(f"{prefix}*"):
        pid_text = leftover.name.removeprefix(prefix)
        if pid_text.isdigit() and int(pid_text) != os.getpid() and _alive(int(pid_text)):
            raise ConversionError(
                f"another conversion (pid {pid_text}) is writing this destination",
                where=str(dst),
                fix="wait for it to finish, or choose another DST",
            )
        log.info("removing %s, left by an interrupted conversion", leftover)
        shutil.rmtree(leftover, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _publish(tmp: Path, dst: Path) -> None:
    """Move the finished temp dir to ``dst``, replacing an old one (the caller checked --force)."""
    if not (dst.exists() or dst.is_symlink()):
        os.rename(tmp, dst)
        return
    if not dst.is_dir() or dst.is_symlink():
        raise ConversionError(
            "exists and is not a directory", where=str(dst), fix="remove it or pick another DST"
        )
    old = dst.parent / f".{dst.name}.replaced-{os.getpid()}"
    os.rename(dst, old)
    os.rename(tmp, dst)
    shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with path.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
