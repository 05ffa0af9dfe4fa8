"""Drafter conversion vs ``cp`` of the same bytes: throughput ratio and the converter's peak RSS.

Generates a 2 GiB Kimi-like speculators checkpoint (without its embedding, which conversion drops,
so both sides move the same bytes) under /tmp, then alternates ``cp`` and ``specsweep convert`` for
several rounds, each in a child process. Page cache: the source stays cached for both; each run
starts after ``sync`` so neither inherits the other's dirty pages, and the order flips every round.
Reports medians. Goals (issue #4): convert >= 0.8x cp throughput, peak RSS <= 300 MiB.

    python -m bench.convert [--rounds N] [--keep]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, emit, python
from workers.eagle3_fixtures import KIMI_LIKE, build_checkpoint, write_checkpoint
from workers.eagle3_format import SourceFormat

RATIO_GOAL = 0.8
RSS_GOAL_MIB = 300


def _timed_child(argv: list[str]) -> tuple[float, float]:
    """(wall seconds, peak RSS MiB) of one child process, measured with wait4's rusage."""
    os.sync()
    started = time.perf_counter()
    child = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - started
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode != 0:
        raise SystemExit(f"{argv[:4]} failed with exit code {child.returncode}")
    return elapsed, usage.ru_maxrss / 1024


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoint")
    args = parser.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="specsweep-bench-convert-", dir="/tmp"))
    try:
        checkpoint = build_checkpoint(SourceFormat.SPECULATORS, KIMI_LIKE, include_embedding=False)
        src = write_checkpoint(checkpoint, work / "src")
        weights = src / "model.safetensors"
        size = weights.stat().st_size
        cp_seconds: list[float] = []
        convert_seconds: list[float] = []
        rss: list[float] = []
        for round_number in range(args.rounds):
            runs = ["cp", "convert"] if round_number % 2 == 0 else ["convert", "cp"]
            for which in runs:
                out = work / f"out-{which}"
                if which == "cp":
                    out.mkdir()
                    seconds, _ = _timed_child(["cp", str(weights), str(out / weights.name)])
                    cp_seconds.append(seconds)
                else:
                    cli = [python(), "-m", "harness.cli", "convert", str(src), str(out)]
                    seconds, peak = _timed_child(cli)
                    convert_seconds.append(seconds)
                    rss.append(peak)
                shutil.rmtree(out)
        mib = size / (1 << 20)
        cp_rates = [mib / s for s in cp_seconds]
        convert_rates = [mib / s for s in convert_seconds]
        ratios = [c / k for c, k in zip(cp_seconds, convert_seconds, strict=True)]
        common = {"bytes": size, "rounds": args.rounds}
        emit("convert.cp_throughput", "MiB/s", statistics.median(cp_rates), cp_rates, **common)
        emit("convert.throughput", "MiB/s", statistics.median(convert_rates), convert_rates, **common)
        ratio = statistics.median(ratios)
        emit(
            "convert.throughput_vs_cp",
            "ratio",
            ratio,
            ratios,
            goal=f">= {RATIO_GOAL}",
            meets_goal=ratio >= RATIO_GOAL,
            **common,
        )
        peak = max(rss)
        emit(
            "convert.peak_rss",
            "MiB",
            peak,
            rss,
            goal=f"<= {RSS_GOAL_MIB}",
            meets_goal=peak <= RSS_GOAL_MIB,
            **common,
        )
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
