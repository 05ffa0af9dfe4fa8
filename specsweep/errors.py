"""User-facing errors.

Every mistake a user can make (a bad flag, a malformed spec, a broken checkpoint) raises a subclass of
``SpecsweepError`` that says what is wrong, where, and how to fix it. Only the CLI prints them and picks
the exit code, so library callers get exceptions, never ``sys.exit``.
"""

from __future__ import annotations

import errno
import os
import sqlite3

DISK_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})
SQLITE_FULL = 13  # sqlite3's result code for a write that found the disk full


class SpecsweepError(Exception):
    """A problem the user can fix. ``where`` is a path, YAML field or job id; ``fix`` says what to do."""

    exit_code = 2

    def __init__(self, problem: str, *, where: str | None = None, fix: str | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.where = where
        self.fix = fix

    def __str__(self) -> str:
        head = f"{self.where}: {self.problem}" if self.where else self.problem
        return f"{head}\n  fix: {self.fix}" if self.fix else head


class InvalidArgumentsError(SpecsweepError):
    """An SGLang launch command that SGLang would refuse or silently misread."""


class SpecError(SpecsweepError):
    """A sweep spec (YAML) that does not validate."""


class ConversionError(SpecsweepError):
    """A drafter checkpoint that cannot be converted safely."""


class ResultsError(SpecsweepError):
    """A results directory that holds no (or incomplete) sweep results, or a bad query on it."""


class NoConfigMeetsSlosError(ResultsError):
    """No config meets the SLOs (``best``, its capacity ranking, ``--emit``): there is nothing to deploy.
    Its own exit code, so a script tells "no winner" from a mistake in the command (2)."""

    exit_code = 6


class StoreError(ResultsError):
    """An output location that cannot be used: a bad object-store URI, an unreachable endpoint, a missing
    bucket, missing or rejected credentials."""


class ClusterError(SpecsweepError):
    """The Ray cluster cannot run the sweep as asked (placement, resources, driver lock)."""


class WorkloadError(SpecsweepError):
    """A load level or workload that cannot run (unreadable prompts file, bad load arguments)."""


class InputsChangedError(SpecsweepError):
    """A resume whose inputs (prompt files, drafter, target configs, engine) changed in place since the
    sweep's results were measured: continuing would rank measurements of different inputs together."""


class DiskFullError(SpecsweepError):
    """A write found the disk full (or a quota or file-size limit reached): the command stopped there.
    Every file is written under a temporary name and renamed, and the queue is SQLite, so nothing is
    half-written; a sweep continues with ``--resume`` once there is space."""

    exit_code = 5


def is_disk_full(err: BaseException | None) -> bool:
    """True for an OSError (Python's or pyarrow's) or an SQLite error that says the disk is full."""
    if isinstance(err, OSError):
        return err.errno in DISK_FULL_ERRNOS
    return isinstance(err, sqlite3.Error) and getattr(err, "sqlite_errorcode", None) == SQLITE_FULL


def disk_full_error(
    err: OSError | sqlite3.Error, *, where: str | None = None, doing: str = "writing"
) -> DiskFullError:
    """The one-line DiskFullError for ``err`` (``is_disk_full(err)``)."""
    reason = os.strerror(err.errno) if isinstance(err, OSError) and err.errno else str(err)
    path = where or (err.filename if isinstance(err, OSError) else None)
    return DiskFullError(
        f"the disk is full while {doing}: {reason}",
        where=str(path) if path else None,
        fix="free space on that disk (or write to another one), then run the command again",
    )
