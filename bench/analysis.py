"""``best`` and ``report`` on ten million generated request rows.

Goals (issue #7), on a 2-core machine: ``specsweep best OUT`` <= 2 s and ``specsweep report OUT``
<= 30 s, each timed as the user runs it (a fresh process, imports included). The data set is 17
configs (16 speculative + baseline) x 5 concurrency levels, written in the sweep's on-disk layout by
``analysis.synthetic`` with realistic list columns (chunk stamps, per-token gaps, draft histograms).
Run: ``make bench`` or ``.venv/bin/python -m bench.analysis [--data DIR] [--rows N]``.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from analysis.synthetic import WARMUP_FRACTION, SyntheticConfig, SyntheticSweep, write_sweep
from bench.common import emit

CONCURRENCIES = (1, 8, 32, 64, 128)
BEST_GOAL_S = 2.0
REPORT_GOAL_S = 30.0


def bench_sweep(rows: int) -> SyntheticSweep:
    """16 speculative configs (chains and trees) + the baseline, sized to ``rows`` request rows."""
    configs = [SyntheticConfig("baseline")]
    for depth in (2, 3, 4, 5, 6, 8, 10, 12):
        configs.append(
            SyntheticConfig(
                f"chain d={depth}", "EAGLE3", depth - 1, 1, depth,
                accept_length=1 + 2.4 * (1 - 0.72 ** (depth - 1)), step_cost=1 + 0.06 * depth,
            )
        )  # fmt: skip
    for steps, topk, draft in ((2, 2, 4), (3, 2, 6), (3, 4, 8), (4, 4, 8), (4, 4, 16), (5, 8, 16),
                               (6, 8, 32), (8, 8, 32)):  # fmt: skip
        configs.append(
            SyntheticConfig(
                f"tree s={steps} k={topk} n={draft}", "EAGLE3", steps, topk, draft,
                accept_length=1 + 2.6 * (1 - 0.7**steps) + 0.05 * topk, step_cost=1 + 0.03 * draft + 0.05 * steps,
            )
        )  # fmt: skip
    groups = len(configs) * len(CONCURRENCIES)
    per_level = math.ceil(rows / groups / (1 + WARMUP_FRACTION))
    while groups * (per_level + max(1, int(per_level * WARMUP_FRACTION))) < rows:
        per_level += 1
    return SyntheticSweep(
        configs=tuple(configs),
        concurrencies=CONCURRENCIES,
        requests_per_level=per_level,
        output_tokens=(16, 160),
        sweep_id="bench",
        seed=11,
    )


def _timed(argv: list[str]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (user + system) of one run of ``argv``.

    CPU time is reported beside wall time because a shared 2-core box inflates wall time.
    """
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    result = subprocess.run(argv, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({result.returncode}):\n{result.stderr[-3000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return elapsed, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", type=int, default=10_000_000, help="request rows to generate")
    parser.add_argument("--data", type=Path, help="reuse (or create and keep) the data set here")
    parser.add_argument("--repeats", type=int, default=3, help="timed runs of `best`")
    args = parser.parse_args()
    keep = args.data is not None
    out = args.data or Path(tempfile.mkdtemp(prefix="specsweep-bench-analysis-"))
    try:
        sweep = bench_sweep(args.rows)
        if not (out / "sweep").exists():
            start = time.perf_counter()
            write_sweep(out, sweep)
            emit("analysis_generate", "s", time.perf_counter() - start, rows_target=args.rows)
        import duckdb

        rows = duckdb.sql(
            f"SELECT count(*) FROM read_parquet('{out}/requests/*/*/part-0.parquet')"
        ).fetchall()[0][0]
        size_gb = sum(p.stat().st_size for p in out.rglob("*.parquet")) / 1e9
        cli = [sys.executable, "-m", "harness.cli"]
        load = os.getloadavg()[0]
        best = [_timed([*cli, "best", str(out)]) for _ in range(args.repeats)]
        walls = [w for w, _ in best]
        best_p50 = sorted(walls)[len(walls) // 2]
        emit("analysis_best", "s", best_p50, walls, rows=rows, data_gb=round(size_gb, 2),
             cpu_s=sorted(c for _, c in best)[len(best) // 2], cores=os.cpu_count(), load_avg_1m=load,
             goal_s=BEST_GOAL_S, ratio_to_goal=best_p50 / BEST_GOAL_S)  # fmt: skip
        report, report_cpu = _timed([*cli, "report", str(out), "-o", str(out / "report.html")])
        emit("analysis_report", "s", report, rows=rows, cpu_s=report_cpu, cores=os.cpu_count(),
             load_avg_1m=os.getloadavg()[0], goal_s=REPORT_GOAL_S,
             ratio_to_goal=report / REPORT_GOAL_S)  # fmt: skip
    finally:
        if not keep:
            shutil.rmtree(out, ignore_errors=True)


if __name__ == "__main__":
    main()
