"""The shape every subcommand has: a name, arguments, and a run function returning an exit code."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Command:
    """A ``specsweep`` subcommand.

    ``run`` returns the process exit code. It raises ``SpecsweepError`` for user mistakes; the CLI
    prints those (no traceback) and exits with their ``exit_code``.
    """

    name: str
    help: str
    add_arguments: Callable[[argparse.ArgumentParser], None]
    run: Callable[[argparse.Namespace], int]
    description: str | None = None
