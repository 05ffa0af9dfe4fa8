"""Drafter conversion vs ``cp`` of the same bytes: throughput ratio and the converter's peak RSS.

Generates a 2 GiB Kimi-like speculators checkpoint (without its embedding, which conversion drops,
so every side moves the same bytes) under /tmp. Each round runs, in child processes and in a
rotating order: ``cp`` of the weights file; ``specsweep convert`` end to end (interpreter start and
imports included); and the library call the node worker makes (``convert()`` timed inside its
child, after imports). Each run starts after ``sync`` so none inherits another's dirty pages; the
source stays in the page cache for all. Reports medians of per-round ratios. Goals (issue #4):
>= 0.8x cp throughput, peak RSS <= 300 MiB (the larger of the two converter children).

    python -m bench.convert [--rounds N] [--checkpoint DIR] [--keep]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import REPO, emit, python
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import KIMI_LIKE, build_checkpoint, write_checkpoint

RATIO_GOAL = 0.8
RSS_GOAL_MIB = 300
RUNS = ("cp", "cli", "library")


def _child(argv: list[str]) -> tuple[float, float, str]:
    """(wall seconds, peak RSS MiB, stdout) of one child process; rusage from wait4."""
    os.sync()
    started = time.perf_counter()
    child = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, text=True)
    stdout = child.stdout.read() if child.stdout else ""
    _, status, usage = os.wait4(child.pid, 0)
    elapsed = time.perf_counter() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"{argv[:4]} failed with exit code {os.waitstatus_to_exitcode(status)}")
    return elapsed, usage.ru_maxrss / 1024, stdout


def _library_child(src: Path, dst: Path) -> None:
    """Child mode: time one convert() call after imports; print the seconds as JSON."""
    from workers.convert.converter import convert

    started = time.perf_counter()
    convert(src, dst)
    print(json.dumps({"seconds": time.perf_counter() - started}))


def _run(which: str, weights: Path, src: Path, out: Path) -> tuple[float, float]:
    if which == "cp":
        out.mkdir()
        seconds, rss, _ = _child(["cp", str(weights), str(out / weights.name)])
        return seconds, rss
    if which == "cli":
        seconds, rss, _ = _child([python(), "-m", "harness.cli", "convert", str(src), str(out)])
        return seconds, rss
    _, rss, stdout = _child([python(), "-m", "bench.convert", "--library-child", str(src), str(out)])
    return json.loads(stdout)["seconds"], rss


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--checkpoint", type=Path, help="use this speculators checkpoint instead of generating one"
    )
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoint (path printed)")
    parser.add_argument("--library-child", nargs=2, type=Path, metavar=("SRC", "DST"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.library_child:
        _library_child(*args.library_child)
        return 0
    work = Path(tempfile.mkdtemp(prefix="specsweep-bench-convert-", dir="/tmp"))
    try:
        src = args.checkpoint or write_checkpoint(
            build_checkpoint(SourceFormat.SPECULATORS, KIMI_LIKE, include_embedding=False, fast_values=True),
            work / "src",
        )
        weights = src / "model.safetensors"
        size = weights.stat().st_size
        seconds: dict[str, list[float]] = {which: [] for which in RUNS}
        rss: list[float] = []
        for round_number in range(args.rounds):
            shift = round_number % len(RUNS)
            for which in RUNS[shift:] + RUNS[:shift]:
                out = work / f"out-{which}"
                elapsed, peak = _run(which, weights, src, out)
                seconds[which].append(elapsed)
                if which != "cp":
                    rss.append(peak)
                shutil.rmtree(out)
        _report(size, seconds, rss, args.rounds)
    finally:
        if args.keep:
            print(f"# kept {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    return 0


def _report(size: int, seconds: dict[str, list[float]], rss: list[float], rounds: int) -> None:
    mib = size / (1 << 20)
    common = {"bytes": size, "rounds": rounds}
    for which, name in (("cp", "cp"), ("cli", "cli"), ("library", "library")):
        rates = [mib / s for s in seconds[which]]
        emit(f"convert.{name}_throughput", "MiB/s", statistics.median(rates), rates, **common)
    for which, what in (
        ("cli", "specsweep convert, interpreter start included"),
        ("library", "convert() call"),
    ):
        ratios = [c / s for c, s in zip(seconds["cp"], seconds[which], strict=True)]
        ratio = statistics.median(ratios)
        emit(
            f"convert.{which}_vs_cp",
            "ratio",
            ratio,
            ratios,
            what=what,
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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
