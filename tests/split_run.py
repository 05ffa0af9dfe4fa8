"""`make test`'s runner: the suite in two stages, then the ten slowest tests.

1. The Ray tests (``@pytest.mark.ray``) in one pytest process and every other test in a second one, side
   by side. The Ray tests take most of the suite's time, most of it the wall time of simulated servers and
   Ray's start-ups rather than CPU, and must run one after another (never two Ray clusters at once); the
   other tests use the second core meanwhile.
2. The tests marked ``@pytest.mark.quiet`` (Ray or not), alone on the machine, one after another: they
   measure latency tails or throughput margins against a truth on a machine of two cores, where the other
   process's load would be measured with them.

Every process shuffles its modules with the same seed, printed first, so an order can be replayed
(``make test RANDOM_ORDER_SEED=<seed>``). Extra arguments go to every process; the exit status is pytest's
"tests failed" (1) if any part failed, and "no tests" (5) only if no part collected any.
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ElementTree
from dataclasses import dataclass
from pathlib import Path
from typing import IO

NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED, without importing pytest here


@dataclass(frozen=True, slots=True)
class Part:
    """One pytest process: which tests (a marker expression), what to call it, its report's file name."""

    name: str
    markers: str
    report: str


RAY = Part("Ray tests, one after another", "ray and not quiet", "ray.xml")
REST = Part("other tests", "not ray and not quiet", "rest.xml")
QUIET = Part("quiet tests, alone on the machine", "quiet", "quiet.xml")


@dataclass(frozen=True, slots=True)
class TestTime:
    """A test's time as pytest's JUnit report records it: setup, call and teardown together."""

    seconds: float
    test_id: str


def pytest_argv(part: Part, seed: int, folder: Path, extra: list[str]) -> list[str]:
    """The command line of one part: random order by module with the shared seed, its JUnit report."""
    return [
        sys.executable,
        "-m",
        "pytest",
        "-p",
        "no:cacheprovider",
        "-p",
        "random_order",
        "--random-order-bucket=module",
        f"--random-order-seed={seed}",
        "-ra",
        "-m",
        part.markers,
        f"--junitxml={folder / part.report}",
        *extra,
    ]


def slowest(reports: list[Path], count: int) -> list[TestTime]:
    """The ``count`` slowest tests over the parts' JUnit reports (a part that crashed may have none)."""
    times = []
    for report in reports:
        if not report.exists():
            continue
        for case in ElementTree.parse(report).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            times.append(TestTime(float(case.get("time") or 0.0), test_id))
    return sorted(times, key=lambda t: t.seconds, reverse=True)[:count]


def combined_status(codes: list[int]) -> int:
    """0 if every part passed or had nothing to run (but one ran something), else the worst outcome."""
    if all(code == NO_TESTS_COLLECTED for code in codes):
        return NO_TESTS_COLLECTED
    failed = [code for code in codes if code not in (0, NO_TESTS_COLLECTED)]
    return max(failed) if failed else 0


def side_by_side(seed: int, folder: Path, extra: list[str], rest_log: IO[str]) -> list[int]:
    """Stage 1: the Ray part streams to this terminal while the other part writes ``rest_log``."""
    rest = subprocess.Popen(pytest_argv(REST, seed, folder, extra), stdout=rest_log, stderr=subprocess.STDOUT)
    try:
        print(f"== {RAY.name}; the {REST.name} beside them, printed after", flush=True)
        ray_code = subprocess.call(pytest_argv(RAY, seed, folder, extra))
    finally:
        rest_code = rest.wait()
    return [ray_code, rest_code]


def run(seed: int, extra: list[str], count: int) -> int:
    """Both stages; then the slowest tests, the stages' wall times and every part's exit code."""
    print(f"random order seed {seed} (replay: make test RANDOM_ORDER_SEED={seed})", flush=True)
    with tempfile.TemporaryDirectory(prefix="specsweep-tests-") as tmp:
        folder = Path(tmp)
        start = time.monotonic()
        with open(folder / "rest.log", "w+") as rest_log:
            codes = side_by_side(seed, folder, extra, rest_log)
            rest_log.seek(0)
            print(f"\n== {REST.name}", flush=True)
            sys.stdout.write(rest_log.read())
        first_s = time.monotonic() - start
        print(f"\n== {QUIET.name}", flush=True)
        codes.append(subprocess.call(pytest_argv(QUIET, seed, folder, extra)))
        wall_s = time.monotonic() - start
        print(f"\n== the {count} slowest tests (setup, call and teardown)")
        for entry in slowest([folder / part.report for part in (RAY, REST, QUIET)], count):
            print(f"{entry.seconds:8.2f}s  {entry.test_id}")
    print(
        f"\n== suite: {wall_s:.1f} s of wall time ({first_s:.1f} s side by side, then "
        f"{wall_s - first_s:.1f} s quiet); exit codes {', '.join(map(str, codes))}"
    )
    return combined_status(codes)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m tests.split_run", description=__doc__.splitlines()[0], allow_abbrev=False
    )
    parser.add_argument("--seed", type=int, default=None, help="random order seed (default: a new one)")
    parser.add_argument("--slowest", type=int, default=10, help="how many of the slowest tests to print")
    args, extra = parser.parse_known_args(argv)
    seed = args.seed if args.seed is not None else random.randrange(1_000_000)
    return run(seed, extra, args.slowest)


if __name__ == "__main__":
    sys.exit(main())
