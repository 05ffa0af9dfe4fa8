"""`make test`'s runner: the suite as two pytest processes side by side, the Ray tests in one and every other
test in the other, then the ten slowest tests of both.

Why two: the Ray tests (``@pytest.mark.ray``, 58 of about 1,340) take two thirds of the suite's time, most of
it the wall time of simulated servers and Ray's start-ups rather than CPU, and they must run one after
another (never two Ray clusters at once); the other tests use the second core meanwhile. Both processes
shuffle their modules with the same seed, printed first, so an order can be replayed
(``make test RANDOM_ORDER_SEED=<seed>``). Extra arguments go to both processes; the exit status is pytest's
"tests failed" (1) if either part failed, and "no tests" (5) only if neither collected any.
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

NO_TESTS_COLLECTED = 5  # pytest.ExitCode.NO_TESTS_COLLECTED, without importing pytest here


@dataclass(frozen=True, slots=True)
class Part:
    """One of the two pytest processes: which tests (a marker expression) and what to call it."""

    name: str
    markers: str


RAY = Part("ray tests (one after another)", "ray")
REST = Part("other tests", "not ray")


@dataclass(frozen=True, slots=True)
class TestTime:
    """A test's time as pytest's JUnit report records it: setup, call and teardown together."""

    seconds: float
    test_id: str


def pytest_argv(part: Part, seed: int, report: Path, extra: list[str]) -> list[str]:
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
        f"--junitxml={report}",
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


def run(seed: int, extra: list[str], count: int) -> int:
    """Both parts side by side: the Ray part streams to this terminal, the other part's output follows it."""
    print(f"random order seed {seed} (replay: make test RANDOM_ORDER_SEED={seed})", flush=True)
    with tempfile.TemporaryDirectory(prefix="specsweep-tests-") as tmp:
        folder = Path(tmp)
        reports = [folder / "ray.xml", folder / "rest.xml"]
        start = time.monotonic()
        with open(folder / "rest.log", "w+") as rest_log:
            rest = subprocess.Popen(
                pytest_argv(REST, seed, reports[1], extra), stdout=rest_log, stderr=subprocess.STDOUT
            )
            try:
                print(f"== {RAY.name}; {REST.name} beside them, printed after", flush=True)
                ray_code = subprocess.call(pytest_argv(RAY, seed, reports[0], extra))
                ray_s = time.monotonic() - start
            finally:
                rest_code = rest.wait()
            rest_log.seek(0)
            print(f"\n== {REST.name}", flush=True)
            sys.stdout.write(rest_log.read())
        wall_s = time.monotonic() - start
        print(f"\n== the {count} slowest tests (setup, call and teardown)")
        for entry in slowest(reports, count):
            print(f"{entry.seconds:8.2f}s  {entry.test_id}")
    print(
        f"\n== suite: {wall_s:.1f} s of wall time (the Ray part {ray_s:.1f} s); exit codes {ray_code}, {rest_code}"
    )
    return combined_status([ray_code, rest_code])


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
