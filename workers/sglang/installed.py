"""Which SGLang an interpreter has installed, asked of the interpreter itself (no import of SGLang: the
package metadata answers in a fraction of a second, where ``import sglang`` takes seconds and a GPU stack)."""

from __future__ import annotations

import subprocess

DISTRIBUTION = "sglang"  # the name SGLang is installed under (pip, uv)
_QUERY = (
    "import importlib.metadata as m\n"
    "try:\n"
    f"    print(m.version({DISTRIBUTION!r}))\n"
    "except m.PackageNotFoundError:\n"
    "    pass\n"
)


def installed_version(python: str, timeout_s: float = 60.0) -> str | None:
    """The SGLang version ``python`` would run, or None when it has no SGLang or cannot be run."""
    try:
        done = subprocess.run([python, "-c", _QUERY], capture_output=True, text=True, timeout=timeout_s)
    except (OSError, subprocess.TimeoutExpired):
        return None
    version = done.stdout.strip()
    return version if done.returncode == 0 and version else None
