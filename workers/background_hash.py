"""Hash (and optionally value-scan) byte ranges in a background thread while the copy runs.

The converter copies tensors in the kernel (``copy_file_range``) and needs, per tensor, the source
bytes' hash and value statistics and the output bytes' hash. Reading and hashing a chunk release
the GIL, so one thread per stream overlaps them with the copy.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import xxhash

from workers.tensor_values import ValueScanner, ValueSummary

ChunkReader = Callable[[], Iterator[memoryview]]


@dataclass(frozen=True)
class HashJob:
    """Bytes to hash under ``key``: a chunk reader, and the float dtype to scan (None: hash only)."""

    key: str
    read: ChunkReader
    scan_dtype: str | None = None


@dataclass(frozen=True)
class HashResult:
    """The XXH3-128 digest of a job's bytes and, when scanned, its value summary."""

    digest: bytes
    values: ValueSummary | None


class BackgroundHasher:
    """Runs submitted jobs in order in one thread; ``finish()`` returns results by key."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.Queue[HashJob | None] = queue.Queue()
        self._results: dict[str, HashResult] = {}
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, job: HashJob) -> None:
        self._jobs.put(job)

    def finish(self) -> dict[str, HashResult]:
        """Wait for every submitted job; re-raises the first read error in the caller's thread."""
        self._jobs.put(None)
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._results

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._error is not None:
                continue  # drain: the caller learns of the error from finish()
            try:
                self._results[job.key] = _hash(job)
            except BaseException as err:  # surfaced by finish(); the thread must not die silently
                self._error = err


def _hash(job: HashJob) -> HashResult:
    hasher = xxhash.xxh3_128()
    scanner = ValueScanner(job.scan_dtype) if job.scan_dtype else None
    for chunk in job.read():
        hasher.update(chunk)
        if scanner is not None:
            scanner.add(chunk)
    return HashResult(hasher.digest(), scanner.summary() if scanner else None)
