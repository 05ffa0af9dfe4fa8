"""Bridge to SGLang's own parser and resolver, run in SGLang's interpreter as a long-lived subprocess.

SGLang's import costs ~10 s and needs torch, so it lives in its own venv (``.venv-sglang``) and is
driven over a JSON-lines pipe (``resolver_main.py``): one process resolves a whole plan's worth of
launch commands.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from specsweep.errors import SpecsweepError

log = logging.getLogger(__name__)

RESOLVER_SCRIPT = Path(__file__).with_name("resolver_main.py")
SGLANG_VENV_ENV = "SPECSWEEP_SGLANG_PYTHON"
STARTUP_TIMEOUT_S = 300.0
RESOLVER_FIX = (
    "check that the interpreter has sglang==0.5.23 and its resolver dependencies (`make sglang-venv`)"
)


def default_sglang_python() -> str | None:
    """The SGLang interpreter to use when none is given: $SPECSWEEP_SGLANG_PYTHON, else ``.venv-sglang``.

    ``.venv-sglang`` is looked up next to the running interpreter's venv (the repo root in a checkout).
    """
    if os.environ.get(SGLANG_VENV_ENV):
        return os.environ[SGLANG_VENV_ENV]
    candidates = [Path(sys.prefix).parent / ".venv-sglang", Path.cwd() / ".venv-sglang"]
    for venv in candidates:
        python = venv / "bin" / "python"
        if python.exists():
            return str(python)
    return None


@dataclass(frozen=True, slots=True)
class ResolverResult:
    """SGLang's verdict on one launch command."""

    ok: bool
    resolved: dict[str, Any] | None
    error_type: str | None
    error_message: str | None
    parser_exit: int | None
    parser_stderr: str
    # SGLang's adaptive_unsupported_reason when it turned an asked --speculative-adaptive off, else None.
    adaptive_fallback_reason: str | None = None


def _require_interpreter(python: str) -> None:
    if not Path(python).exists():
        raise SpecsweepError(
            f"SGLang interpreter not found: {python}",
            fix="run `make sglang-venv` (creates .venv-sglang) or pass --sglang-python PATH",
        )


def installed_version(python: str) -> str:
    """SGLang's version in ``python``'s environment, from its package metadata (where ``sglang.__version__``
    falls back to) in a fraction of a second: the label of a report whose launches SGLang does not judge,
    without the 10-30 s import of SGLang that starting the resolver costs."""
    _require_interpreter(python)
    done = subprocess.run(
        [python, "-c", "import importlib.metadata as m; print(m.version('sglang'))"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    if done.returncode != 0:
        tail = "\n".join(done.stderr.strip().splitlines()[-8:])
        raise SpecsweepError(
            f"SGLang's version could not be read with {python} (exit code {done.returncode}):\n{tail}",
            fix=RESOLVER_FIX,
        )
    return done.stdout.strip()


class SGLangResolver:
    """One SGLang interpreter that resolves launch commands on request. Use as a context manager."""

    def __init__(self, python: str) -> None:
        _require_interpreter(python)
        self.python = python
        self.version: str | None = None
        self._proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> SGLangResolver:
        self._proc = subprocess.Popen(
            [self.python, str(RESOLVER_SCRIPT)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            bufsize=1,
        )
        hello = self._read_line()
        self.version = hello["sglang_version"]
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        if self._proc is None:
            return
        proc, self._proc = self._proc, None
        if proc.stdin:
            proc.stdin.close()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stdout:
            proc.stdout.close()
        if proc.stderr:
            proc.stderr.close()

    def _read_line(self) -> dict[str, Any]:
        assert self._proc is not None and self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line:
            self._proc.wait(timeout=10)
            stderr = self._proc.stderr.read() if self._proc.stderr else ""
            tail = "\n".join(stderr.strip().splitlines()[-8:])
            raise SpecsweepError(
                f"SGLang's resolver ({self.python}) exited with code {self._proc.returncode}:\n{tail}",
                fix=RESOLVER_FIX,
            )
        answer: dict[str, Any] = json.loads(line)
        return answer

    def resolve(self, argv: list[str]) -> ResolverResult:
        if self._proc is None or self._proc.stdin is None:
            raise RuntimeError("SGLangResolver used outside its context")
        self._proc.stdin.write(json.dumps({"argv": list(argv)}) + "\n")
        self._proc.stdin.flush()
        return ResolverResult(**self._read_line())
