"""Copy tensors into output files, hashing and value-scanning the source and reading every copy back.

Tensors are cut into pieces of PIECE_BYTES. Two threads share the work, so neither waits on the
other's kind of step:

- the writer moves each piece into its output file, in order. Where both ends are files it asks
  the kernel to copy the whole piece (``copy_file_range``, what ``cp`` does): one call that runs
  without the GIL and never passes the bytes through user memory. Otherwise (pickled sources,
  filesystems that refuse) it ``pwrite``s the source chunks.
- the checker walks each piece in chunks of CHUNK_BYTES (small enough to stay in L2): it hashes
  and value-scans a chunk straight from the memory-mapped source; once the writer has finished the
  piece, it maps the written bytes back from the output file and hashes those.

The checker's many small steps need the GIL; the writer needs it only between pieces, so the two
do not trade it back and forth (two threads of small steps spent more time handing over the GIL,
and contending for the output file's lock, than copying). No piece is ever held in memory.

A tensor's digest is XXH3-128 over its pieces' XXH3-128 digests in order: equal for source and
output exactly when every piece's bytes are.
"""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path

import xxhash

from workers.convert.checkpoint_source import CheckpointSource, SourceTensor
from workers.convert.safetensors_stream import MAP_WINDOW_BYTES, copy_range, iter_mapped, pwrite_all
from workers.convert.tensor_values import ValueScanner, ValueSummary, merge_summaries

PIECE_BYTES = 64 << 20  # a multiple of 8, so pieces split tensors on element boundaries


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


def copy_and_hash(source: CheckpointSource, tasks: list[TensorTask]) -> dict[str, TensorOutcome]:
    """Copy, hash, scan and read back every task's pieces; outcomes by source tensor name.

    Output files must already exist (the caller writes their headers); pieces land at their offsets.
    """
    pieces = [piece for task in tasks for piece in _pieces(task)]
    with ExitStack() as stack:
        fds = _open_outputs(stack, {task.out_path for task in tasks if task.out_path is not None})
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="tensor-write") as writer:
            written = [
                writer.submit(_write_piece, source, fds[piece.task.out_path][0], piece)
                if piece.task.out_path is not None
                else None
                for piece in pieces
            ]
            try:
                outcomes = [
                    _check_piece(source, fds, piece, done)
                    for piece, done in zip(pieces, written, strict=True)
                ]
            finally:
                for done in written:
                    if done is not None:
                        done.cancel()
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


def _write_piece(source: CheckpointSource, write_fd: int, piece: _Piece) -> None:
    """Writer thread: the piece's source bytes to its output offset, by the kernel where it can."""
    position = piece.task.out_offset + piece.start
    in_file = source.file_position(piece.task.tensor)
    if in_file is not None and copy_range(
        in_file[0], in_file[1] + piece.start, write_fd, position, piece.length
    ):
        return
    for chunk in source.chunks(piece.task.tensor, piece.start, piece.length):
        pwrite_all(write_fd, chunk, position)
        position += len(chunk)


def _check_piece(
    source: CheckpointSource, fds: dict[Path, tuple[int, int]], piece: _Piece, written: Future[None] | None
) -> _PieceOutcome:
    """Checker: hash and scan the source piece, then (once written) hash what the output file holds."""
    task = piece.task
    source_hash = xxhash.xxh3_128()
    scanner = ValueScanner(task.scan_dtype) if task.scan_dtype else None
    for chunk in source.chunks(task.tensor, piece.start, piece.length):
        source_hash.update(chunk)
        if scanner is not None:
            scanner.add(chunk)
    out_digest = None
    if written is not None and task.out_path is not None:
        written.result()
        out_digest = _read_back(fds[task.out_path][1], task.out_offset + piece.start, piece.length)
    return _PieceOutcome(source_hash.digest(), out_digest, scanner.summary() if scanner else None)


def _read_back(read_fd: int, start: int, length: int) -> bytes:
    """XXH3-128 of ``length`` bytes of the output at ``start``, as the output file now holds them.

    Mapped from the page cache (no copy into a buffer), a whole window per hash update.
    """
    out_hash = xxhash.xxh3_128()
    for window in iter_mapped(read_fd, start, start + length, chunk_bytes=MAP_WINDOW_BYTES):
        out_hash.update(window)
    return out_hash.digest()


def _combine(parts: list[_PieceOutcome]) -> TensorOutcome:
    copied = [part.out_digest for part in parts if part.out_digest is not None]
    summaries = [part.values for part in parts if part.values is not None]
    return TensorOutcome(
        digest=xxhash.xxh3_128(b"".join(part.digest for part in parts)).digest(),
        out_digest=xxhash.xxh3_128(b"".join(copied)).digest() if len(copied) == len(parts) else None,
        values=merge_summaries(summaries) if summaries else None,
    )
