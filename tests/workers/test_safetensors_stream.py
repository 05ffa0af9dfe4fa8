"""Safetensors byte-level reading/writing and chunk-wise value checks, against the real library."""

from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.torch import load_file, save_file

from specsweep.errors import ConversionError
from workers.convert.fixtures import bf16_bits
from workers.convert.safetensors_stream import (
    MAP_WINDOW_BYTES,
    OutputTensor,
    copy_range,
    encode_header,
    iter_mapped,
    pwrite_all,
    read_header,
)
from workers.convert.tensor_values import ValueScanner


def test_read_header_matches_library_layout_when_file_written_by_safetensors(tmp_path: Path) -> None:
    """Byte ranges parsed from a file the real library wrote hold exactly each tensor's bytes."""
    tensors = {
        "b": torch.arange(12, dtype=torch.float32).reshape(3, 4),
        "a": torch.tensor([1.5, -2.0], dtype=torch.bfloat16),
        "mask": torch.tensor([True, False, True]),
    }
    path = tmp_path / "x.safetensors"
    save_file(tensors, path)
    header = read_header(path)
    raw = path.read_bytes()
    for entry in header.tensors:
        expected = tensors[entry.name].contiguous().view(torch.uint8).numpy().tobytes()
        assert raw[entry.start : entry.end] == expected
        assert entry.shape == tuple(tensors[entry.name].shape)


def test_encode_header_loads_in_library_when_bytes_appended(tmp_path: Path) -> None:
    """A header from encode_header followed by the raw bytes is a file the real library loads."""
    values = np.arange(6, dtype=np.float32)
    mask = np.array([True, False])
    header = encode_header(
        [OutputTensor("v", "F32", (2, 3), values.nbytes), OutputTensor("m", "BOOL", (2,), mask.nbytes)],
        {"format": "pt"},
    )
    assert (len(header) - 8) % 8 == 0
    path = tmp_path / "y.safetensors"
    path.write_bytes(header + values.tobytes() + mask.tobytes())
    loaded = load_file(path)
    assert torch.equal(loaded["v"], torch.from_numpy(values).reshape(2, 3))
    assert torch.equal(loaded["m"], torch.from_numpy(mask))


def test_read_header_refuses_when_range_disagrees_with_shape(tmp_path: Path) -> None:
    """A tensor whose byte range does not fit dtype x shape is named in the error."""
    header = encode_header([OutputTensor("w", "F32", (4,), 12)], {})
    path = tmp_path / "bad.safetensors"
    path.write_bytes(header + bytes(12))
    with pytest.raises(ConversionError, match=r"tensor 'w': F32\[4\] needs 16 bytes, its range holds 12"):
        read_header(path)


def test_read_header_refuses_when_file_has_trailing_bytes(tmp_path: Path) -> None:
    """Bytes after the last tensor mean a damaged file, not something to ignore."""
    header = encode_header([OutputTensor("w", "F32", (1,), 4)], {})
    path = tmp_path / "tail.safetensors"
    path.write_bytes(header + bytes(4) + b"junk")
    with pytest.raises(ConversionError, match="4 unexpected bytes after the last tensor"):
        read_header(path)


@pytest.mark.parametrize(
    "header",
    [
        b'{"w": {"dtype": "F32", "shape": [' + b"9" * 5000 + b'], "data_offsets": [0, 4]}}',
        b"[" * 100_000 + b"]" * 100_000,
    ],
    ids=["5000_digits", "deep_nesting"],
)
def test_read_header_refuses_as_damaged_when_header_holds_a_huge_integer_or_deep_nesting(
    header: bytes, tmp_path: Path
) -> None:
    """A header JSON with an integer past Python's digit limit or nesting past the parser's depth is a
    damaged file (ConversionError naming it), not a ValueError or RecursionError traceback."""
    path = tmp_path / "hostile.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header + bytes(4))
    with pytest.raises(ConversionError, match="header is not valid JSON") as caught:
        read_header(path)
    assert str(path) in str(caught.value)


def test_iter_mapped_yields_exact_bytes_when_range_is_unaligned_and_spans_windows(tmp_path: Path) -> None:
    """Mapped chunks reproduce an odd-offset range longer than one map window, chunk by chunk."""
    data = os.urandom(MAP_WINDOW_BYTES + (3 << 20) + 77)
    path = tmp_path / "blob"
    path.write_bytes(data)
    start, end = 4097 + 3, len(data) - 5
    fd = os.open(path, os.O_RDONLY)
    try:
        chunks = [bytes(chunk) for chunk in iter_mapped(fd, start, end, chunk_bytes=1 << 20)]
    finally:
        os.close(fd)
    assert b"".join(chunks) == data[start:end]
    assert all(len(chunk) == 1 << 20 for chunk in chunks[:-1])


def test_copy_range_copies_pwritten_bytes_when_both_ends_are_files(tmp_path: Path) -> None:
    """Bytes written at an offset are copied file to file at other offsets; a short source is refused."""
    data = os.urandom(300_000)
    src = os.open(tmp_path / "src", os.O_RDWR | os.O_CREAT)
    dst = os.open(tmp_path / "dst", os.O_RDWR | os.O_CREAT)
    try:
        pwrite_all(src, memoryview(data), 4096)
        assert copy_range(src, 4096, dst, 100, len(data))
        assert (tmp_path / "dst").read_bytes()[100:] == data
        with pytest.raises(ConversionError, match="file ended at byte"):
            copy_range(src, 8192, dst, 0, len(data))
    finally:
        os.close(src)
        os.close(dst)


def test_copy_range_declines_without_copying_when_the_kernel_cannot(tmp_path: Path) -> None:
    """Where copy_file_range refuses the pair (here: overlapping ranges of one file) it copies nothing
    and says so, so the caller can write the bytes itself."""
    path = tmp_path / "one"
    path.write_bytes(bytes(range(256)) * 64)
    fd = os.open(path, os.O_RDWR)
    try:
        assert copy_range(fd, 0, fd, 100, 8192) is False
    finally:
        os.close(fd)
    assert path.read_bytes() == bytes(range(256)) * 64


def _scan(dtype: str, values: np.ndarray, chunk_elements: int = 3) -> ValueScanner:
    raw = (
        bf16_bits(values).tobytes()
        if dtype == "BF16"
        else values.astype(np.float16 if dtype == "F16" else np.float32).tobytes()
    )
    size = 2 if dtype in ("BF16", "F16") else 4
    scanner = ValueScanner(dtype)
    step = chunk_elements * size
    for start in range(0, len(raw), step):
        scanner.add(memoryview(raw)[start : start + step])
    return scanner


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_value_scanner_counts_nan_and_inf_when_either_sign(dtype: str) -> None:
    """NaN, +inf and -inf are each counted, whatever chunk they land in; large finite values are not."""
    values = np.array([0.1, np.nan, -np.inf, 3.0, np.inf, -60000.0, 2.0], dtype=np.float32)
    summary = _scan(dtype, values).summary()
    assert summary.non_finite == 3 and summary.elements == 7
    assert not summary.all_zero and summary.constant_bits is None


@pytest.mark.parametrize("dtype", ["BF16", "F16", "F32"])
def test_value_scanner_reports_zero_and_constant_when_values_uniform(dtype: str) -> None:
    """All +-0 is all-zero; all 1.0 is constant with value 1.0; finite values are not flagged."""
    zeros = _scan(dtype, np.array([0.0, -0.0, 0.0, 0.0], dtype=np.float32)).summary()
    assert zeros.all_zero and zeros.non_finite == 0
    ones = _scan(dtype, np.ones(10, dtype=np.float32)).summary()
    assert not ones.all_zero and ones.constant_value(dtype) == 1.0
    varied = _scan(dtype, np.array([1.0] * 9 + [1.5], dtype=np.float32)).summary()
    assert varied.constant_bits is None
