"""``specsweep`` command line: argv in, exit code out.

This is the only place that prints user errors and chooses exit codes: 0 success, 2 user error
(bad input, with a message naming the problem and the fix), 3 "adjusted" for ``validate``, 4 for
``load`` when no request succeeded, 5 when a write found the disk full (``DiskFullError``: nothing is
half-written; ``run --resume`` continues a sweep), 6 when no config meets the SLOs (``best`` at every
level, ``best --objective capacity``, ``best --emit``: ``NoConfigMeetsSlosError``; what each config missed
is printed first), 130 on Ctrl-C, 141 (128 + SIGPIPE, as a shell reports it) when the reader of the
output left early (``| head``). An OSError no command turned into a message is still one line (exit 2) when the user's paths or permissions caused it (``USER_OS_ERRNOS``,
with the path it names; ``-vv`` logs where it was raised); any other stays a traceback, as a bug.
Subcommands live in ``harness.commands``; their modules are imported lazily so that ``specsweep
validate`` does not pay for Ray or DuckDB.
"""

from __future__ import annotations

import argparse
import errno
import importlib
import logging
import os
import signal
import sqlite3
import sys

from specsweep import __version__
from specsweep.errors import SpecsweepError, disk_full_error, is_disk_full

# Subcommand name -> module under harness.commands defining COMMAND. Order is the help order.
COMMAND_MODULES: dict[str, str] = {
    "validate": "validate",
    "convert": "convert",
    "load": "load",
    "plan": "plan",
    "run": "run",
    "status": "status",
    "schema": "schema",
    "sql": "sql",
    "best": "best",
    "compare": "compare",
    "report": "report",
    "demo": "demo",
}

log = logging.getLogger("specsweep")

# OSErrors that a path the user gave causes (a file where a folder belongs, a read-only file system, no
# permission); a missing file is not among them, as a file the code itself expected can be missing too.
USER_OS_ERRNOS = frozenset(
    {errno.EACCES, errno.EPERM, errno.EROFS, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.ENAMETOOLONG}
)


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The top-level parser; with ``only``, import just that subcommand's module (fast path)."""
    parser = argparse.ArgumentParser(
        prog="specsweep",
        description="Find the best speculative-decoding configuration for an SGLang server.",
    )
    parser.add_argument("--version", action="version", version=f"specsweep {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output (-vv: debug)")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name, module_name in COMMAND_MODULES.items():
        if only is not None and name != only:
            subparsers.add_parser(name)
            continue
        command = importlib.import_module(f"harness.commands.{module_name}").COMMAND
        # argparse %-formats a sub-command's help (its line in the command list) but not its description
        sub = subparsers.add_parser(
            command.name,
            help=command.help.replace("%", "%%"),
            description=command.description or command.help,
        )
        command.add_arguments(sub)
        sub.set_defaults(_run=command.run)
    return parser


def _requested_command(argv: list[str]) -> str | None:
    """The subcommand named in argv (first non-option word), to import only its module."""
    for word in argv:
        if word == "--":
            return None
        if not word.startswith("-"):
            return word if word in COMMAND_MODULES else None
    return None


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``specsweep`` console script."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(only=_requested_command(argv))
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not hasattr(args, "_run"):
        parser.print_help()
        return 2
    try:
        return int(args._run(args))
    except SpecsweepError as err:
        return _report(args.command, err)
    except BrokenPipeError:  # the reader of our output left (`specsweep best OUT | head`): not an error
        _discard_stdout()
        return 128 + signal.SIGPIPE
    except (OSError, sqlite3.Error) as err:
        if is_disk_full(err):  # a write that found the disk full, wherever it was
            return _report(args.command, disk_full_error(err))
        if isinstance(err, OSError) and err.errno in USER_OS_ERRNOS and err.filename:
            log.debug("the error was raised here", exc_info=True)
            return _report(args.command, _path_error(err))
        raise
    except KeyboardInterrupt:
        print(f"specsweep {args.command}: interrupted", file=sys.stderr)
        return 130


def _discard_stdout() -> None:
    """Point stdout at /dev/null, so the interpreter's final flush of what the closed pipe did not take
    raises no second BrokenPipeError at exit (the recipe of Python's ``signal`` module docs)."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


def _path_error(err: OSError) -> SpecsweepError:
    """The one-line error for an OSError a user's path caused (``USER_OS_ERRNOS``)."""
    return SpecsweepError(
        err.strerror or type(err).__name__,
        where=str(err.filename),
        fix="use a path this user can write, whose folders are folders (not files) on a writable file system",
    )


def _report(command: str, err: SpecsweepError) -> int:
    """Print a user error (one line, plus its fix) and return its exit code."""
    print(f"specsweep {command}: error: {err}", file=sys.stderr)
    return err.exit_code


if __name__ == "__main__":
    sys.exit(main())
