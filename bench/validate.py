"""Validate a 100-point speculative grid through the batch API (one SGLang process).

Goal (issue #2): <= 30 s for 100 points on a 2-core machine, SGLang's import included.
Run: ``make bench`` or ``.venv/bin/python -m bench.validate``.
"""

from __future__ import annotations

import itertools
import time

from bench.common import REPO, emit
from workers.sglang import default_sglang_python, validate_many

TARGET = REPO / "tests" / "fixtures" / "kimi-k2"
DRAFT = REPO / "tests" / "fixtures" / "eagle3-draft"


def grid() -> list[list[str]]:
    """100 launches: steps 1..5 x topk {1,2,4,8} x draft tokens {2,4,8,16,32}."""
    base = ["--model-path", str(TARGET), "--tp-size", "8", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", str(DRAFT)]  # fmt: skip
    points = itertools.product([1, 2, 3, 4, 5], [1, 2, 4, 8], [2, 4, 8, 16, 32])
    return [
        [*base, "--speculative-num-steps", str(s), "--speculative-eagle-topk", str(k),
         "--speculative-num-draft-tokens", str(n)]
        for s, k, n in points
    ]  # fmt: skip


def main() -> None:
    python = default_sglang_python()
    if python is None:
        raise SystemExit("no .venv-sglang: run `make sglang-venv` first")
    points = grid()
    start = time.perf_counter()
    reports = validate_many(points, sglang_python=python)
    total = time.perf_counter() - start
    statuses = {s: sum(r.status == s for r in reports) for s in ("ok", "adjusted", "invalid")}
    emit("validate_100_points_total", "s", total, goal_s=30.0, points=len(points), **statuses)
    emit("validate_per_point", "s", total / len(points), goal_ratio_to_30s=total / 30.0)


if __name__ == "__main__":
    main()
