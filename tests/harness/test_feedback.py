"""Feedback on long steps: `run` says what it starts (planning, hashing inputs, starting Ray) before it
does it, `status OUT` answers from the run's first second (planning, or stopped while planning), a run
killed before its sweep started leaves a queue that a plain run and --resume both take, and `specsweep
load` prints where the level stands without a terminal at a bounded rate."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from harness.cli import main
from harness.progress import PLAIN_INTERVAL_S
from specsweep.crash_points import CRASH_ENV, CRASH_EXIT_CODE
from tests.launch_args import chain_launch_args
from workers.node.launcher import ServerProcess, start_sim

FIXTURES = Path(__file__).parents[1] / "fixtures"
REPO = Path(__file__).parents[2]


def _spec(folder: Path) -> Path:
    """A baseline-only simulated sweep of one tiny level (planning needs no drafter)."""
    data = {
        "engine": "sim",
        "model_path": str(FIXTURES / "kimi-k2"),
        "base_args": ["--tp-size", "8"],
        "gpus_per_server": 8,
        "baseline": True,
        "load": {"concurrency": [1], "requests_per_level": 2},
        "output_dir": str(folder / "out"),
    }
    path = folder / "sweep.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def _specsweep(*argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """`specsweep ARGV` in a child process (this checkout's code), its output captured."""
    return subprocess.run(
        [sys.executable, "-m", "harness.cli", *argv],
        capture_output=True,
        text=True,
        timeout=240,
        env={**os.environ, "PYTHONPATH": str(REPO), **(env or {})},
    )


def _status(out: Path, capsys: pytest.CaptureFixture[str]) -> str:
    """What `specsweep status OUT` prints (exit code 0 asserted)."""
    capsys.readouterr()
    code = main(["status", str(out)])
    text = capsys.readouterr().out
    assert code == 0, text
    return text


@pytest.fixture
def gated_python(tmp_path: Path, sglang_python: str) -> Iterator[tuple[Path, Path]]:
    """SGLang's own interpreter behind a gate: it starts the real resolver only once the gate file
    exists, so a test can look at a run while it is surely still planning. Yields (interpreter, gate)."""
    gate = tmp_path / "gate-open"
    wrapper = tmp_path / "sglang-python"
    wrapper.write_text(
        f'#!/bin/sh\nwhile [ ! -e "{gate}" ]; do sleep 0.1; done\nexec "{sglang_python}" "$@"\n'
    )
    wrapper.chmod(0o755)
    yield wrapper, gate
    gate.touch()  # a wrapper still waiting (its run killed) goes on to the resolver, which ends at EOF


def test_status_says_planning_when_run_is_still_validating(
    tmp_path: Path, gated_python: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """While `run` waits on SGLang's resolver, `status OUT` answers "planning" with what it validates
    and the driver's pid (not "no sweep queue here"); once that driver is killed, status says it stopped
    while planning and that it is gone."""
    python, _ = gated_python
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "harness.cli", "run", str(_spec(tmp_path)), "--out", str(out)]
    argv += ["--sglang-python", str(python), "--ray-address", "local"]
    run = subprocess.Popen(
        argv,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 60  # a safety net for a run that never makes its queue, not a timing
        while not (out / "queue.sqlite").exists() and run.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert run.poll() is None and (out / "queue.sqlite").exists(), "no queue while the run plans"
        assert run.stdout is not None
        first = run.stdout.readline()  # the planning line comes before the resolver is asked
        assert "planning" in first and "SGLang's resolver" in first, first
        text = _status(out, capsys)
        assert re.search(
            rf"planning: validating the grid with SGLang's resolver.*driver pid {run.pid} ", text
        ), text
        assert "stopped" not in text
    finally:
        os.killpg(run.pid, signal.SIGKILL)
        run.wait()
    text = _status(out, capsys)
    assert "stopped while planning" in text and f"pid {run.pid} on" in text and "is gone" in text, text


def test_run_says_each_step_before_it_when_killed_while_starting_ray(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run` prints a line before planning, before hashing the inputs and before starting Ray; killed
    while Ray starts (as kill -9 would), its queue says so; a plain run and a --resume of that OUT are
    both taken (neither "already holds a sweep" nor "nothing to resume")."""
    spec, out = _spec(tmp_path), tmp_path / "out"
    crash = {CRASH_ENV: "phase:starting Ray"}
    base = ["run", str(spec), "--out", str(out), "--builtin-only", "--ray-address", "local"]
    done = _specsweep(*base, env=crash)
    assert done.returncode == CRASH_EXIT_CODE, done.stdout + done.stderr
    steps = [line.split(" ", 1)[1] for line in done.stdout.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert [step.split(":")[0] for step in steps] == [
        f"planning {_sweep_id(done.stdout)}",
        "hashing inputs",
        "starting Ray",
    ], done.stdout
    assert steps[-1] == "starting Ray: an embedded one on this machine"
    assert "stopped while starting Ray" in _status(out, capsys)
    for again in (base, [*base, "--resume"]):
        done = _specsweep(*again, env=crash)
        assert done.returncode == CRASH_EXIT_CODE, done.stdout + done.stderr


def test_run_leaves_no_queue_when_planning_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run that stops before its sweep starts (here: a grid point with an unknown drafter path) takes
    back the queue and the directory it made, so OUT is as before and status finds no queue."""
    spec = _spec(tmp_path)
    data = yaml.safe_load(spec.read_text())
    data["drafter"] = {"path": str(tmp_path / "nowhere"), "format": "sglang"}
    data["speculative"] = {"chain_depths": [2]}
    spec.write_text(yaml.safe_dump(data))
    out = tmp_path / "out"
    assert main(["run", str(spec), "--out", str(out), "--builtin-only"]) == 2
    assert not out.exists()


def _sweep_id(stdout: str) -> str:
    match = re.search(r"^plan (\w+):", stdout, re.M)
    assert match, stdout
    return match.group(1)


@pytest.fixture(scope="module")
def sim() -> Iterator[ServerProcess]:
    """The simulated server in real time: a level of a few seconds sends a few dozen requests."""
    args = chain_launch_args(FIXTURES / "kimi-k2", FIXTURES / "eagle3-draft", 3, "--enable-metrics")
    with start_sim(args, env={"SPECSWEEP_SIM_TIME_SCALE": "1"}) as server:
        yield server


@pytest.mark.parametrize("processes", [1, 2])
def test_load_prints_counts_at_a_bounded_rate_when_not_a_terminal(
    processes: int, sim: ServerProcess, tmp_path: Path
) -> None:
    """Piped, `specsweep load` prints timestamped lines on stderr: the stage, then "measuring: done N,
    in flight M, errors E" at most every PLAIN_INTERVAL_S, the last one with every request done (the
    file's row count) and none in flight; with shard processes too. No escape codes."""
    out = tmp_path / "records.parquet"
    argv = ["load", "--url", sim.url, "--concurrency", "4", "--duration", str(2 * PLAIN_INTERVAL_S + 1)]
    argv += ["--input-tokens", "8", "--output-tokens", "32", "--processes", str(processes), "--out", str(out)]
    began = time.monotonic()
    done = _specsweep(*argv)
    elapsed = time.monotonic() - began
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stderr.splitlines() if re.match(r"\d\d:\d\d:\d\d ", line)]
    assert "\x1b" not in done.stderr
    measuring = [line for line in lines if " measuring: " in line]
    assert len(measuring) >= 2, done.stderr  # at least one while it ran, and the last
    assert len(lines) <= elapsed / PLAIN_INTERVAL_S + 2, done.stderr
    rows = pq.read_table(out).num_rows
    assert measuring[-1].endswith(f"measuring: done {rows}, in flight 0, errors 0"), (rows, done.stderr)
    assert any(int(re.search(r"in flight (\d+)", line).group(1)) > 0 for line in measuring[:-1]), done.stderr
