"""Copy tensors into output files in parallel pieces, hashing and value-scanning both sides.

Every tensor is cut into pieces of PIECE_BYTES, and a worker thread takes one piece at a time.
It walks the piece in chunks of CHUNK_BYTES (small enough to stay in L2): it hashes and value-scans
a chunk straight from the memory-mapped source, ``pwrite``s it to its output offset, reads the
written bytes back from the output file into its own buffer and hashes those. So each byte crosses
memory about as often as under ``cp`` (read once, written once; the read-back hits cache), and
the check costs little beyond the copy. Pieces are independent (every output offset is known in
advance), so a few threads keep the cores busy; no piece is ever held in memory.

A tensor's digest is XXH3-128 over its pieces' XXH3-128 digests in order: cheap to compute in
parallel, and equal for source and output exactly when every piece's bytes are.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import xxhash

from workers.checkpoint_source import CheckpointSource, SourceTensor
from workers.safetensors_stream import CHUNK_BYTES, pread_exact, pwrite_all
from workers.tensor_values import ValueScanner, ValueSummary, merge_summaries

PIECE_BYTES = 64 << 20  # a multiple of 8, so pieces split tensors on element boundaries
MAX_WORKERS = 4
_thread_state = threading.local()  # each worker's read-back buffer


@dataclass(frozen=True)
class TensorTask:
    """One source tensor: where to copy it (None: hash only) and which float dtype to scan (None: no scan)."""

    tensor: SourceTensor
    out_path: Path | None = None
    out_offset: int = 0
    scan_dtype: str | None = None


@dataclass(frozen=True)
class TensorOutcome:
    """Digests of a tensor's source bytes and (when copied) its output bytes, and its value summary."""

    digest: bytes
    out_digest: bytes | None
    values: ValueSummary | None


@dataclass(frozen=True)
class _Piece:
    task: TensorTask
    start: int  # offset within the tensor
    length: int


@dataclass(frozen=True)
class _PieceOutcome:
    digest: bytes
    out_digest: bytes | None
    values: ValueSummary | None


def copy_and_hash(
    source: CheckpointSource, tasks: list[TensorTask], workers: int | None = None
) -> dict[str, TensorOutcome]:
    """Run every task's pieces on a thread pool; outcomes by source tensor name.

    Output files must already exist (the caller writes their headers); pieces land at their offsets.
    """
    workers = workers or min(MAX_WORKERS, os.cpu_count() or 1)
    pieces = [piece for task in tasks for piece in _pieces(task)]
    with ExitStack() as stack:
        fds = _open_outputs(stack, {task.out_path for task in tasks if task.out_path is not None})
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tensor-copy") as pool:
            outcomes = list(pool.map(lambda piece: _run_piece(source, fds, piece), pieces))
    by_tensor: dict[str, list[_PieceOutcome]] = {}
    for piece, outcome in zip(pieces, outcomes, strict=True):
        by_tensor.setdefault(piece.task.tensor.name, []).append(outcome)
    return {name: _combine(parts) for name, parts in by_tensor.items()}


def _pieces(task: TensorTask) -> list[_Piece]:
    size = task.tensor.nbytes
    starts = range(0, size, PIECE_BYTES) if size else [0]
    return [_Piece(task, start, min(PIECE_BYTES, size - start)) for start in starts]


def _open_outputs(stack: ExitStack, paths: set[Path]) -> dict[Path, tuple[int, int]]:
    """(write fd, read fd) per output file, closed when ``stack`` closes."""
    fds: dict[Path, tuple[int, int]] = {}
    for path in paths:
        write_fd = os.open(path, os.O_WRONLY)
        stack.callback(os.close, write_fd)
        read_fd = os.open(path, os.O_RDONLY)
        stack.callback(os.close, read_fd)
        fds[path] = (write_fd, read_fd)
    return fds


def _run_piece(source: CheckpointSource, fds: dict[Path, tuple[int, int]], piece: _Piece) -> _PieceOutcome:
    task = piece.task
    source_hash = xxhash.xxh3_128()
    scanner = ValueScanner(task.scan_dtype) if task.scan_dtype else None
    out_hash = xxhash.xxh3_128() if task.out_path is not None else None
    write_fd, read_fd = fds[task.out_path] if task.out_path is not None else (-1, -1)
    buffer = _read_back_buffer()
    position = task.out_offset + piece.start
    for chunk in source.chunks(task.tensor, piece.start, piece.length):
        source_hash.update(chunk)
        if scanner is not None:
            scanner.add(chunk)
        if out_hash is not None:
            pwrite_all(write_fd, chunk, position)
            out_hash.update(pread_exact(read_fd, buffer, len(chunk), position))
        position += len(chunk)
    return _PieceOutcome(
        source_hash.digest(),
        out_hash.digest() if out_hash is not None else None,
        scanner.summary() if scanner else None,
    )


def _read_back_buffer() -> bytearray:
    buffer = getattr(_thread_state, "buffer", None)
    if buffer is None:
        buffer = _thread_state.buffer = bytearray(CHUNK_BYTES)
    return buffer


def _combine(parts: list[_PieceOutcome]) -> TensorOutcome:
    copied = [part.out_digest for part in parts if part.out_digest is not None]
    summaries = [part.values for part in parts if part.values is not None]
    return TensorOutcome(
        digest=xxhash.xxh3_128(b"".join(part.digest for part in parts)).digest(),
        out_digest=xxhash.xxh3_128(b"".join(copied)).digest() if len(copied) == len(parts) else None,
        values=merge_summaries(summaries) if summaries else None,
    )
