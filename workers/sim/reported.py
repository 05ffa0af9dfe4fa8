"""The launch factor a simulated launch ran at, as its /server_info reports it (tests and benchmarks).

The default preset varies each launch's costs by one factor (``CostModel.launch_factor``, keyed by the
launch's tag); a truth for a measured launch passes that factor (``ground_truth(..., factor=...)``).
"""

from __future__ import annotations

import json
import urllib.request
from typing import Any


def server_launch_factor(url: str) -> float:
    """The factor a running simulated server reports in /server_info."""
    with urllib.request.urlopen(f"{url}/server_info", timeout=10) as reply:
        return float(json.loads(reply.read())["simulator"]["launch_factor"])


def job_launch_factors(con: Any) -> dict[str, float]:
    """Each stored job's launch factor by config label, from the /server_info its node recorded."""
    rows = con.sql("SELECT config_label, server_info_json FROM jobs WHERE server_info_json IS NOT NULL")
    return {label: float(json.loads(info)["simulator"]["launch_factor"]) for label, info in rows.fetchall()}
