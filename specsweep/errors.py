"""User-facing errors.

Every mistake a user can make (a bad flag, a malformed spec, a broken checkpoint) raises a subclass of
``SpecsweepError`` that says what is wrong, where, and how to fix it. Only the CLI prints them and picks
the exit code, so library callers get exceptions, never ``sys.exit``.
"""

from __future__ import annotations


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


class StoreError(ResultsError):
    """An output location that cannot be used: a bad object-store URI, an unreachable endpoint, a missing
    bucket, missing or rejected credentials."""


class ClusterError(SpecsweepError):
    """The Ray cluster cannot run the sweep as asked (placement, resources, driver lock)."""


class WorkloadError(SpecsweepError):
    """A load level or workload that cannot run (unreadable prompts file, bad load arguments)."""
