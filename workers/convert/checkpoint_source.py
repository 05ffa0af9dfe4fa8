"""Open a draft checkpoint directory: its config, weight files, and a chunk reader for every tensor.

Safetensors (single file or sharded with ``model.safetensors.index.json``) is read as byte ranges
and never decoded. ``.bin``/``.pt`` files are pickles: refused unless the caller allows them, then
loaded with ``torch.load(weights_only=True, mmap=True)`` so the tensors stay on disk until read.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from specsweep.documents import load_json
from specsweep.errors import ConversionError
from workers.convert.safetensors_stream import (
    CHUNK_BYTES,
    DTYPE_SIZES,
    SafetensorsHeader,
    iter_mapped,
    read_header,
)

log = logging.getLogger(__name__)

CONFIG_FILE = "config.json"
SAFETENSORS_INDEX = "model.safetensors.index.json"
PICKLE_SUFFIXES = (".bin", ".pt", ".pth")
HUB_SNAPSHOTS, HUB_BLOBS = "snapshots", "blobs"  # Hugging Face cache: snapshots/<rev>/<file> -> ../../blobs/
# torch dtype name -> safetensors dtype name, for pickled checkpoints.
_TORCH_DTYPES = {
    "torch.bfloat16": "BF16",
    "torch.float16": "F16",
    "torch.float32": "F32",
    "torch.float64": "F64",
    "torch.int64": "I64",
    "torch.int32": "I32",
    "torch.int16": "I16",
    "torch.int8": "I8",
    "torch.uint8": "U8",
    "torch.bool": "BOOL",
}
_NUMPY_DTYPES = {"I64": np.int64, "I32": np.int32, "BOOL": np.bool_, "F32": np.float32, "U8": np.uint8}


@dataclass(frozen=True)
class SourceTensor:
    """One tensor of the source: name, dtype, shape, size, and the file and byte offset it sits at."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    file: Path
    offset: int


@dataclass(frozen=True)
class WeightFile:
    """A weight file and, for safetensors, its checked header (None for a pickle)."""

    path: Path
    header: SafetensorsHeader | None


class CheckpointSource:
    """An opened checkpoint. Use as a context manager: it holds one descriptor per weight file."""

    def __init__(self, root: Path, config: dict[str, Any], files: list[WeightFile]) -> None:
        self.root = root
        self.config = config
        self.files = files
        self._stack = ExitStack()
        self._fds: dict[Path, int] = {}
        self._pickled: dict[str, Any] = {}
        self.tensors = self._collect()

    @property
    def is_pickle(self) -> bool:
        return any(f.header is None for f in self.files)

    def __enter__(self) -> CheckpointSource:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._stack.close()
        self._fds.clear()
        self._pickled.clear()

    def _collect(self) -> dict[str, SourceTensor]:
        tensors: dict[str, SourceTensor] = {}
        for weight_file in self.files:
            header = weight_file.header
            found = (
                self._safetensors_tensors(weight_file.path, header)
                if header is not None
                else self._pickle_tensors(weight_file.path)
            )
            for tensor in found:
                if tensor.name in tensors:
                    raise ConversionError(
                        f"tensor {tensor.name!r} appears in both {tensors[tensor.name].file.name} "
                        f"and {tensor.file.name}",
                        where=str(self.root),
                        fix="remove the stale shard; each tensor must be stored once",
                    )
                tensors[tensor.name] = tensor
        return tensors

    def _safetensors_tensors(self, path: Path, header: SafetensorsHeader) -> list[SourceTensor]:
        fd = os.open(path, os.O_RDONLY)
        self._stack.callback(os.close, fd)
        self._fds[path] = fd
        return [SourceTensor(e.name, e.dtype, e.shape, e.nbytes, path, e.start) for e in header.tensors]

    def _pickle_tensors(self, path: Path) -> list[SourceTensor]:
        import torch  # heavy: only for pickled checkpoints the user allowed

        try:
            state = _load_weights_only(torch, path)
        except Exception as err:
            raise ConversionError(
                f"cannot load as a weights-only pickle: {err}",
                where=str(path),
                fix="convert it to safetensors with the tool that trained it",
            ) from err
        state = state.get("state_dict", state) if isinstance(state, dict) else state
        if not isinstance(state, dict):
            raise ConversionError(
                "pickle does not hold a name -> tensor mapping", where=str(path), fix="export a state_dict"
            )
        found: list[SourceTensor] = []
        for order, (name, tensor) in enumerate(state.items()):
            if not isinstance(tensor, torch.Tensor) or str(tensor.dtype) not in _TORCH_DTYPES:
                raise ConversionError(
                    f"entry {name!r} is not a tensor of a supported dtype",
                    where=str(path),
                    fix="export a plain state_dict of tensors",
                )
            tensor = tensor.contiguous()
            self._pickled[name] = tensor
            dtype = _TORCH_DTYPES[str(tensor.dtype)]
            nbytes = tensor.numel() * DTYPE_SIZES[dtype]
            found.append(SourceTensor(name, dtype, tuple(tensor.shape), nbytes, path, order))
        return found

    def chunks(self, tensor: SourceTensor, start: int = 0, length: int | None = None) -> Iterator[memoryview]:
        """Bytes ``[start, start + length)`` of the tensor as read-only views of at most CHUNK_BYTES.

        Nothing is copied: safetensors bytes come from a memory map, pickled ones from the tensor.
        """
        length = tensor.nbytes - start if length is None else length
        if tensor.name in self._pickled:
            raw = self._pickled_bytes(tensor)
            for offset in range(start, start + length, CHUNK_BYTES):
                yield raw[offset : min(offset + CHUNK_BYTES, start + length)]
            return
        begin = tensor.offset + start
        yield from iter_mapped(self._fds[tensor.file], begin, begin + length)

    def file_position(self, tensor: SourceTensor) -> tuple[int, int] | None:
        """(open descriptor, byte offset in its file) of a safetensors tensor; None for a pickled one.

        Lets a copier have the kernel move the bytes file to file (copy_file_range), as ``cp`` does.
        """
        fd = self._fds.get(tensor.file)
        return None if fd is None or tensor.name in self._pickled else (fd, tensor.offset)

    def _pickled_bytes(self, tensor: SourceTensor) -> memoryview:
        return memoryview(self._pickled[tensor.name].reshape(-1).view(_torch_uint8()).numpy())

    def read_array(self, tensor: SourceTensor) -> np.ndarray:
        """A small tensor as a numpy array (for d2t/t2d), read whole."""
        raw = b"".join(bytes(chunk) for chunk in self.chunks(tensor))
        return np.frombuffer(raw, dtype=_NUMPY_DTYPES.get(tensor.dtype, np.uint8))


def _load_weights_only(torch: Any, path: Path) -> Any:
    """torch.load with weights_only=True, memory-mapped when the file format allows it."""
    try:
        return torch.load(path, map_location="cpu", weights_only=True, mmap=True)
    except RuntimeError:
        # Legacy (non-zip) pickles cannot be memory-mapped.
        return torch.load(path, map_location="cpu", weights_only=True)


def _torch_uint8() -> Any:
    import torch

    return torch.uint8


def open_checkpoint(
    root: Path, *, allow_pickle: bool, allow_external_shards: bool = False
) -> CheckpointSource:
    """Read ``root``'s config and weight-file headers; refuse what cannot be read safely, including a
    weight file that resolves outside ``root`` unless ``allow_external_shards``."""
    if not root.is_dir():
        raise ConversionError(
            "is not a directory", where=str(root), fix="pass the draft checkpoint directory as SRC"
        )
    config = read_json(root / CONFIG_FILE, what="the draft's config")
    files = _weight_files(root, allow_pickle=allow_pickle, allow_external=allow_external_shards)
    return CheckpointSource(root, config, files)


def read_json(path: Path, *, what: str) -> dict[str, Any]:
    """A JSON object from ``path``, or a ConversionError naming the file and what it should be."""
    try:
        data = load_json(path.read_text())
    except FileNotFoundError as err:
        raise ConversionError(f"missing ({what})", where=str(path), fix=f"provide {what}") from err
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ConversionError(f"is not valid JSON: {err}", where=str(path), fix="repair the file") from err
    if not isinstance(data, dict):
        raise ConversionError("is not a JSON object", where=str(path), fix=f"provide {what}")
    return data


def _weight_files(root: Path, *, allow_pickle: bool, allow_external: bool) -> list[WeightFile]:
    index = root / SAFETENSORS_INDEX
    if index.exists():
        return _indexed_shards(root, index, allow_external=allow_external)
    singles = sorted(root.glob("*.safetensors"))
    if len(singles) == 1:
        _check_contained(root, singles[0], allow_external=allow_external)
        return [WeightFile(singles[0], read_header(singles[0]))]
    if len(singles) > 1:
        raise ConversionError(
            f"{len(singles)} .safetensors files and no {SAFETENSORS_INDEX}",
            where=str(root),
            fix=f"add the {SAFETENSORS_INDEX} that came with the shards",
        )
    pickles = sorted(
        p for p in root.iterdir() if p.suffix in PICKLE_SUFFIXES and "training_args" not in p.name
    )
    if not pickles:
        raise ConversionError(
            "no weights found (.safetensors, .bin or .pt)", where=str(root), fix="point SRC at the checkpoint"
        )
    if not allow_pickle:
        raise ConversionError(
            f"weights are pickles ({', '.join(p.name for p in pickles)}); loading a pickle can run code",
            where=str(root),
            fix="pass --allow-pickle if you trust the source (loaded with weights_only=True)",
        )
    for path in pickles:
        _check_contained(root, path, allow_external=allow_external)
    return [WeightFile(path, None) for path in pickles]


def _check_contained(root: Path, path: Path, *, allow_external: bool) -> None:
    """Refuse, before reading it, a weight file (an index entry, or a symlink) that resolves outside the
    checkpoint: a checkpoint must not make the converter read, and copy into its output, a file elsewhere
    on the node. In the Hugging Face cache a snapshot's files link into the repo's ``blobs/``: inside."""
    if allow_external:
        return
    resolved, inside = path.resolve(), root.resolve()
    if root.parent.name == HUB_SNAPSHOTS:
        blobs = (root.parent.parent / HUB_BLOBS).resolve()
        if resolved.is_relative_to(blobs):
            return
    if not resolved.is_relative_to(inside):
        raise ConversionError(
            f"weight file {path} resolves to {resolved}, outside the checkpoint directory",
            where=str(root),
            fix="copy the shard into the checkpoint directory, or pass --allow-external-shards "
            "(drafter.allow_external_shards in a sweep) if you trust where it points",
        )


def _indexed_shards(root: Path, index: Path, *, allow_external: bool) -> list[WeightFile]:
    weight_map = read_json(index, what="the shard index").get("weight_map")
    if not isinstance(weight_map, dict) or not weight_map:
        raise ConversionError("has no weight_map", where=str(index), fix="restore the original index file")
    shards = sorted({root / name for name in weight_map.values()})
    for shard in shards:
        _check_contained(root, shard, allow_external=allow_external)
        if not shard.is_file():
            raise ConversionError(
                f"names shard {shard.name}, which is missing", where=str(index), fix="copy the missing shard"
            )
    files = [WeightFile(shard, read_header(shard)) for shard in shards]
    for weight_file in files:
        shard = weight_file.path
        names = {e.name for e in weight_file.header.tensors} if weight_file.header else set()
        listed = {name for name, file in weight_map.items() if root / file == shard}
        if names != listed:
            extra, missing = sorted(names - listed), sorted(listed - names)
            raise ConversionError(
                f"index and shard {shard.name} disagree: in shard only {extra[:5]}, in index only {missing[:5]}",
                where=str(index),
                fix="restore the index that was written with these shards",
            )
    return files
