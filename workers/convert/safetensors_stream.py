"""Safetensors as bytes: parse and check a header, write one, stream a tensor's raw bytes.

A safetensors file is an 8-byte little-endian header length, a JSON header (name -> dtype, shape,
byte range) and the tensor bytes. Renaming a tensor therefore needs no decoding at all: the converter
copies byte ranges and writes a new header. Nothing here imports torch or the safetensors package;
reads go through small memory-mapped windows, so memory stays flat however large the checkpoint is.
"""

from __future__ import annotations

import errno
import json
import math
import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from specsweep.documents import load_json
from specsweep.errors import ConversionError

# Bytes per element of each safetensors dtype (the spec's names).
DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E4M3": 1,
    "F8_E5M2": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "I64": 8,
    "U64": 8,
    "F64": 8,
}
HEADER_LENGTH_BYTES = 8
# The reference implementation refuses headers above 100 MB; a larger one is corruption, not a model.
MAX_HEADER_BYTES = 100_000_000
METADATA_KEY = "__metadata__"
# Small enough to stay in L2 while it is hashed, scanned, written and read back: with 1 MiB chunks
# the write from a memory map measured 2-4x slower on the dev VM.
CHUNK_BYTES = 256 << 10
# copy_file_range errors that mean "not between these files", not "the disk failed"
_NO_KERNEL_COPY = frozenset({errno.EXDEV, errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP})
MAP_WINDOW_BYTES = 16 << 20  # bytes mapped at once by iter_mapped (bounds the RSS it adds)


@dataclass(frozen=True)
class TensorEntry:
    """One tensor of a safetensors file: its name, dtype, shape and absolute byte range in the file."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    start: int
    end: int

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass(frozen=True)
class SafetensorsHeader:
    """A checked header: tensors in file order, the metadata block, and where the data begins."""

    path: Path
    tensors: tuple[TensorEntry, ...]
    metadata: dict[str, str]
    data_start: int
    file_size: int


def _corrupt(path: Path, problem: str) -> ConversionError:
    return ConversionError(
        problem,
        where=str(path),
        fix="the file is damaged or incomplete: copy or download it again and re-run",
    )


def read_header(path: Path) -> SafetensorsHeader:
    """Parse and check ``path``'s header without reading tensor data.

    Checked: the header length fits the file, the JSON parses, every dtype and shape is known and
    matches its byte range, and the ranges tile the data area exactly (no holes, no overlaps, nothing
    missing at the end). A truncated file fails the last check, so it is caught before any copying.
    """
    file_size = path.stat().st_size
    with path.open("rb") as f:
        prefix = f.read(HEADER_LENGTH_BYTES)
        if len(prefix) < HEADER_LENGTH_BYTES:
            raise _corrupt(path, f"not a safetensors file: {file_size} bytes, shorter than the 8-byte prefix")
        (header_len,) = struct.unpack("<Q", prefix)
        if header_len > MAX_HEADER_BYTES or HEADER_LENGTH_BYTES + header_len > file_size:
            raise _corrupt(path, f"header length {header_len} does not fit a file of {file_size} bytes")
        raw = f.read(header_len)
    try:
        header = load_json(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise _corrupt(path, f"header is not valid JSON ({err})") from err
    if not isinstance(header, dict):
        raise _corrupt(path, "header is not a JSON object")
    data_start = HEADER_LENGTH_BYTES + header_len
    metadata = header.pop(METADATA_KEY, None) or {}
    entries = sorted((_entry(path, name, spec, data_start) for name, spec in header.items()), key=_by_start)
    _check_tiling(path, entries, data_start, file_size)
    return SafetensorsHeader(path, tuple(entries), dict(metadata), data_start, file_size)


def _by_start(entry: TensorEntry) -> tuple[int, int]:
    return entry.start, entry.end


def _entry(path: Path, name: str, spec: object, data_start: int) -> TensorEntry:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise _corrupt(path, f"tensor {name!r}: header entry must have exactly dtype, shape, data_offsets")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if dtype not in DTYPE_SIZES:
        raise _corrupt(path, f"tensor {name!r}: unknown dtype {dtype!r}")
    if not (isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)):
        raise _corrupt(path, f"tensor {name!r}: shape {shape!r} is not a list of sizes")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
        raise _corrupt(path, f"tensor {name!r}: data_offsets {offsets!r} is not [begin, end]")
    begin, end = offsets
    expected = math.prod(shape) * DTYPE_SIZES[dtype]
    if end - begin != expected or begin < 0:
        raise _corrupt(
            path, f"tensor {name!r}: {dtype}{shape} needs {expected} bytes, its range holds {end - begin}"
        )
    return TensorEntry(name, dtype, tuple(shape), data_start + begin, data_start + end)


def _check_tiling(path: Path, entries: list[TensorEntry], data_start: int, file_size: int) -> None:
    cursor = data_start
    for entry in entries:
        if entry.start != cursor:
            raise _corrupt(path, f"tensor {entry.name!r} starts at byte {entry.start}, expected {cursor}")
        cursor = entry.end
    if cursor > file_size:
        raise _corrupt(
            path,
            f"truncated: the header promises {cursor - data_start} bytes of tensor data, "
            f"the file holds {file_size - data_start}",
        )
    if cursor < file_size:
        raise _corrupt(path, f"{file_size - cursor} unexpected bytes after the last tensor")


@dataclass(frozen=True)
class OutputTensor:
    """A tensor to write: output name, dtype, shape, and its size in bytes."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int


def encode_header(tensors: list[OutputTensor], metadata: dict[str, str]) -> bytes:
    """The 8-byte prefix plus JSON header for ``tensors`` laid out back to back in the given order.

    The JSON is padded with spaces to a multiple of 8 bytes, as the reference writer does, so tensor
    data stays aligned.
    """
    header: dict[str, object] = {METADATA_KEY: metadata}
    offset = 0
    for tensor in tensors:
        header[tensor.name] = {
            "dtype": tensor.dtype,
            "shape": list(tensor.shape),
            "data_offsets": [offset, offset + tensor.nbytes],
        }
        offset += tensor.nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)
    return struct.pack("<Q", len(body)) + body


def iter_mapped(fd: int, start: int, end: int, chunk_bytes: int = CHUNK_BYTES) -> Iterator[memoryview]:
    """Bytes ``[start, end)`` of ``fd`` as read-only views of a memory map, ``chunk_bytes`` at a time.

    Mapping saves the copy a read() makes into a buffer (the bytes are already in the page cache).
    Windows of MAP_WINDOW_BYTES are mapped in turn and unmapped when the caller drops the last
    view of one, so the resident mapped size stays at about two windows. Chunk boundaries are
    counted from ``start``: a multiple of 8 keeps them on element boundaries.
    """
    window = MAP_WINDOW_BYTES - MAP_WINDOW_BYTES % chunk_bytes
    position = start
    while position < end:
        length = min(window, end - position)
        aligned = position - position % mmap.ALLOCATIONGRANULARITY
        mapped = mmap.mmap(
            fd,
            length + position - aligned,
            flags=mmap.MAP_SHARED | mmap.MAP_POPULATE,
            prot=mmap.PROT_READ,
            offset=aligned,
        )
        view = memoryview(mapped)[position - aligned :]
        del mapped  # unmapped once the last view of this window is gone
        for offset in range(0, length, chunk_bytes):
            yield view[offset : offset + chunk_bytes]
        position += length


def write_all(fd: int, data: memoryview) -> None:
    """Write all of ``data`` (os.write may write less than asked)."""
    while data:
        written = os.write(fd, data)
        data = data[written:]


def pwrite_all(fd: int, data: memoryview, offset: int) -> None:
    """Write all of ``data`` at ``offset`` (positional, so threads can fill one file side by side)."""
    while data:
        written = os.pwrite(fd, data, offset)
        data, offset = data[written:], offset + written


def copy_range(src_fd: int, src_offset: int, dst_fd: int, dst_offset: int, nbytes: int) -> bool:
    """Copy ``nbytes`` file to file inside the kernel (``cp``'s way: no pass through user memory).

    Returns False, having copied nothing, where the kernel cannot do it for these two files (other
    filesystems, old kernels); the caller then writes the bytes itself. A short source is an error.
    """
    copied = 0
    while copied < nbytes:
        try:
            got = os.copy_file_range(
                src_fd, dst_fd, nbytes - copied, src_offset + copied, dst_offset + copied
            )
        except OSError as err:
            if copied == 0 and err.errno in _NO_KERNEL_COPY:
                return False
            raise
        if got <= 0:
            raise ConversionError(
                f"file ended at byte {src_offset + copied} while copying up to {src_offset + nbytes}",
                fix="the file changed or shrank during conversion: re-run once it is stable",
            )
        copied += got
    return True
