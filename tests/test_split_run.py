"""`make test`'s runner (tests/split_run.py): the Ray tests and the others as two pytest processes side by
side, then the quiet tests alone; one seed, one exit status, the slowest tests of every part."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_SUITE = {
    "pytest.ini": "[pytest]\nmarkers =\n    ray: starts a Ray cluster\n    quiet: alone on the machine\n",
    "test_with_ray.py": (
        "import os, time\nimport pytest\npytestmark = pytest.mark.ray\n\n"
        "def test_ray_part():\n"
        "    start = time.time(); time.sleep(1.5)\n"
        "    open('ray.span', 'w').write(f'{start} {time.time()} {os.getpid()}')\n"
    ),
    "test_without_ray.py": (
        "import os, time\n\n"
        "def test_other_part():\n"
        "    start = time.time(); time.sleep(1.5)\n"
        "    open('rest.span', 'w').write(f'{start} {time.time()} {os.getpid()}')\n\n"
        "def test_fails_when_asked():\n"
        "    assert os.environ.get('FAIL_OTHER') != '1', 'asked to fail'\n"
    ),
    "test_quiet.py": (
        "import os, time\nimport pytest\npytestmark = [pytest.mark.ray, pytest.mark.quiet]\n\n"
        "def test_quiet_part():\n"
        "    start = time.time(); time.sleep(0.2)\n"
        "    open('quiet.span', 'w').write(f'{start} {time.time()} {os.getpid()}')\n"
    ),
}


@pytest.fixture
def suite(tmp_path: Path) -> Path:
    for name, text in _SUITE.items():
        (tmp_path / name).write_text(text)
    return tmp_path


def _run(suite: Path, *args: str, fail_other: bool = False) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "FAIL_OTHER": "1" if fail_other else "0"}
    return subprocess.run(
        [sys.executable, "-m", "tests.split_run", *args],
        cwd=suite,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def _span(path: Path) -> tuple[float, float, int]:
    start, end, pid = path.read_text().split()
    return float(start), float(end), int(pid)


def test_split_run_runs_ray_and_other_tests_side_by_side_then_quiet_ones_alone_when_all_pass(
    suite: Path,
) -> None:
    """The Ray part and the other part in two processes at the same time (their 1.5 s tests overlap), the
    quiet test (Ray-marked too) after both ended, in a third; all with the seed given; the slowest tests
    of the parts are listed together; exit 0."""
    done = _run(suite, "--seed", "7", "--slowest", "2")
    assert done.returncode == 0, done.stdout + done.stderr
    ray_start, ray_end, ray_pid = _span(suite / "ray.span")
    rest_start, rest_end, rest_pid = _span(suite / "rest.span")
    quiet_start, _, quiet_pid = _span(suite / "quiet.span")
    assert len({ray_pid, rest_pid, quiet_pid}) == 3
    assert max(ray_start, rest_start) < min(ray_end, rest_end)  # they overlapped
    assert quiet_start > max(ray_end, rest_end)
    assert done.stdout.count("Using --random-order-seed=7") == 3
    assert "random order seed 7 (replay: make test RANDOM_ORDER_SEED=7)" in done.stdout
    slowest = done.stdout.split("slowest tests")[1].splitlines()[1:3]
    assert sorted(line.split()[1] for line in slowest) == [
        "test_with_ray::test_ray_part",
        "test_without_ray::test_other_part",
    ]
    assert all(float(line.split()[0].rstrip("s")) >= 1.5 for line in slowest)


def test_split_run_fails_and_prints_the_failure_when_the_other_part_fails(suite: Path) -> None:
    """A failure in the part printed after the Ray part fails the run (exit 1) and its report is shown."""
    done = _run(suite, "--seed", "3", fail_other=True)
    assert done.returncode == 1
    assert "FAILED test_without_ray.py::test_fails_when_asked" in done.stdout, done.stdout
    assert "AssertionError: asked to fail" in done.stdout


def test_split_run_passes_when_the_selection_has_no_ray_test(suite: Path) -> None:
    """Arguments reach every part: a selection without a Ray or quiet test leaves those parts nothing to
    run, which is not a failure while the other part ran and passed."""
    done = _run(suite, "--seed", "3", "test_without_ray.py", "-k", "other_part")
    assert done.returncode == 0, done.stdout
    assert not (suite / "ray.span").exists() and (suite / "rest.span").exists()
    assert not (suite / "quiet.span").exists()
    assert "exit codes 5, 0, 5" in done.stdout
