"""The record of one conversion, written as ``conversion.json`` next to the converted weights.

It is what makes a conversion auditable and repeatable: which files (and hashes) went in, how the
format was detected, where every key went, what was dropped and why, and every check's result. The
converter compares a stored report with the current source to make a re-run a no-op.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from workers.convert.eagle3_format import LayerNaming, SourceFormat

REPORT_SCHEMA_VERSION = 1
REPORT_FILE = "conversion.json"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)


class SourceFile(_Strict):
    """One input file and its content hash."""

    path: str = Field(description="path relative to the source directory")
    bytes: int = Field(description="file size in bytes")
    digest: str = Field(description="hex digest (see digest_scheme)")
    digest_scheme: Literal["xxh3-file", "xxh3-safetensors-tensors"] = Field(
        description="xxh3-file: XXH3-128 of the whole file; xxh3-safetensors-tensors: XXH3-128 of the "
        "header bytes followed by each tensor's digest (see TensorRecord.xxh3), in file order; a "
        "content identity, not a defence against crafted collisions"
    )


class TensorRecord(_Strict):
    """Where one source tensor went: the key mapping, with the bytes' hash on both sides."""

    source: str = Field(description="key in the source checkpoint")
    output: str = Field(description="key written to the output")
    output_file: str = Field(description="output file holding it")
    dtype: str = Field(description="safetensors dtype, unchanged by conversion")
    shape: list[int] = Field(description="tensor shape, unchanged by conversion")
    xxh3: str = Field(
        description="XXH3-128 over the XXH3-128 digests of the tensor's consecutive 64 MiB pieces; "
        "computed from the source bytes and again from the output bytes, which must agree (check 7)"
    )


class DroppedKey(_Strict):
    """A source key deliberately not written, and why it is safe to leave out."""

    key: str = Field(description="key in the source checkpoint")
    reason: str = Field(description="why the draft served by SGLang does not need it")


class CheckResult(_Strict):
    """One of the reference's checks and its outcome (a failed check stops the conversion)."""

    name: str = Field(description="check name, e.g. 'shapes' or 'values'")
    status: Literal["pass", "warn"] = Field(description="pass, or warn: converted but worth a look")
    detail: str = Field(description="what was checked, or the warnings")


class ConversionReport(_Strict):
    """Everything about one conversion; ``reused`` is true when a re-run found it already done."""

    schema_version: int = Field(default=REPORT_SCHEMA_VERSION, description="conversion.json format version")
    converter_version: int = Field(description="bumped whenever the converter's output changes")
    source: str = Field(description="absolute source directory")
    destination: str = Field(description="absolute output directory")
    source_format: SourceFormat = Field(description="detected (or given) input format")
    detection: str = Field(description="why that format: the evidence, or 'given with --from'")
    layout: LayerNaming = Field(description="output key layout for the draft layer")
    source_files: list[SourceFile] = Field(description="every input file read, with its hash")
    source_digest: str = Field(description="XXH3-128 over the source files' paths and digests")
    target_config_digest: str | None = Field(
        description="XXH3-128 of the --target-config config.json, if any"
    )
    tensors: list[TensorRecord] = Field(description="the key mapping, one row per output tensor")
    dropped: list[DroppedKey] = Field(description="every source key not written, and why")
    config_changes: list[str] = Field(description="every change made to the config, in words")
    checks: list[CheckResult] = Field(description="every check run and its result")
    output_files: list[str] = Field(description="files written to the destination")
    bytes_written: int = Field(description="tensor bytes written")
    seconds: float = Field(description="wall time of the conversion")
    reused: bool = Field(default=False, description="true when this run found the same conversion done")
