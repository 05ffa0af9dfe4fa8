"""What every benchmark shares: one JSON line per result, tagged with the git sha and host."""

from __future__ import annotations

import json
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]


def git_sha() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True
        )
    except OSError:
        return "unknown"
    return out.stdout.strip() or "unknown"


def emit(
    name: str, unit: str, value: float, samples: list[float] | None = None, **extra: Any
) -> dict[str, Any]:
    """Print one result line: ``{"name", "unit", "value", "n", "p50", "p99", "git_sha", "host", ...}``."""
    data = np.asarray(samples if samples else [value], dtype=float)
    line = {
        "name": name,
        "unit": unit,
        "value": value,
        "n": int(data.size),
        "p50": float(np.percentile(data, 50)),
        "p99": float(np.percentile(data, 99)),
        "git_sha": git_sha(),
        "host": platform.node(),
        **extra,
    }
    print(json.dumps(line), flush=True)
    return line


def python() -> str:
    """The interpreter running the benchmark (the project venv's under `make bench`)."""
    return sys.executable
