"""Inputs changed in place between an interrupted sweep and its resume (issue #26, finding 2): a prompt
file edited at the same path is refused by name, and once accepted it is measured under new job ids that
``best`` never ranks with the earlier ones. One embedded Ray for the module, the simulator at a fast time
scale, short levels, two server slots (one for the test whose rule needs jobs one at a time)."""

from __future__ import annotations

import io
import json
import os
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from analysis import views
from analysis.layout import attempted_job_ids, committed_job_ids
from analysis.select import select_best
from analysis.store import open_store
from harness.cli import main
from harness.driver import RayConnection, connect_ray, run_sweep
from harness.inputs import ACCEPT_FLAG
from harness.plan import unchecked_plan
from harness.progress import LogProgress
from harness.queue import open_read_only, read_attempts, read_jobs
from harness.results import write_sweep_row
from harness.spec import parse_spec
from specsweep.errors import InputsChangedError
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

PROMPTS_BEFORE = [{"prompt": f"write a haiku about the number {i}", "category": "chat"} for i in range(6)]
PROMPTS_AFTER = [
    {"prompt": f"explain step by step why {i} + {i} = {2 * i}", "category": "math"} for i in range(6)
]


def _write_prompts(path: Path, rows: list[dict[str, str]]) -> None:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))


def _spec_data(root: Path) -> dict[str, Any]:
    """The baseline and one chain, two repeats each (four jobs, one at a time) on a prompt file."""
    target = write_target_config(root / "target", TINY)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")
    prompts = root / "prompts.jsonl"
    _write_prompts(prompts, PROMPTS_BEFORE)
    return {
        "engine": "sim",
        "model_path": str(target),
        "drafter": {"path": str(drafter), "format": "speculators"},
        "base_args": ["--tp-size", "8"],
        "speculative": {"chain_depths": [3]},
        "baseline": True,
        "repeats": 2,
        "max_servers": 1,
        "load": {
            "concurrency": [2],
            "requests_per_level": 4,
            "warmup_requests": 0,
            "workload": {"kind": "prompt_set", "path": str(prompts), "max_tokens": 12, "ignore_eos": True},
        },
        "retries": 0,
        "timeouts": {"startup_s": 30, "level_s": 60, "stop_s": 5, "placement_s": 60},
        "env": {"SPECSWEEP_SIM_TIME_SCALE": "0.05"},
        "output_dir": str(root / "out"),
    }


class _InterruptAfterFirstDone(LogProgress):
    """Ctrl-C (SIGINT to this process, which the driver handles) once the first job is done."""

    def event(self, line: str) -> None:
        super().event(line)
        if line.startswith("done"):
            os.kill(os.getpid(), signal.SIGINT)


@pytest.fixture(scope="module")
def ray_local(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RayConnection]:
    """The embedded Ray `run --ray-address local` starts for the spec, with node-local dirs (pid files,
    drafter cache) private to this module; every run in the module finds it and leaves it up."""
    root = tmp_path_factory.mktemp("node-local")
    saved = {k: os.environ.get(k) for k in ("SPECSWEEP_PID_DIR", "SPECSWEEP_DRAFTER_CACHE")}
    os.environ["SPECSWEEP_PID_DIR"] = str(root / "pids")
    os.environ["SPECSWEEP_DRAFTER_CACHE"] = str(root / "drafters")
    probe = {**_spec_data(tmp_path_factory.mktemp("probe")), "max_servers": 2}  # room for two slots
    connection = connect_ray("local", parse_spec(probe))
    yield connection
    connection.close()
    for key, value in saved.items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def _queue_jobs(out: Path) -> dict[str, tuple[str, int]]:
    conn = open_read_only(out)
    try:
        return {row.id: (row.state, row.attempts) for row in read_jobs(conn)}
    finally:
        conn.close()


def test_resume_refuses_then_measures_new_job_ids_when_prompt_file_edited_in_place(
    ray_local: RayConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt file edited at the same path between an interrupted run and --resume: the resume is
    refused (exit 2, one line naming the file, nothing run or written); --accept-changed-inputs measures
    every job under a new id, keeps the earlier done job as it was, and `best` ranks only the jobs of the
    new prompts (a note says what it left out), never the earlier job as a repeat of its config.

    Two slots (the module's others run one): the interrupt still lands after the first done job with the
    rest not done, and the resume's four new jobs take two rounds instead of four."""
    data = {**_spec_data(tmp_path), "max_servers": 2}
    spec = parse_spec(data)
    out = Path(data["output_dir"])
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    summary = run_sweep(
        spec,
        spec_file.read_text(),
        unchecked_plan(spec),
        out,
        ray_address="local",
        resume=False,
        progress=_InterruptAfterFirstDone(io.StringIO()),
    )
    assert summary.interrupted
    before = _queue_jobs(out)
    first_done = {job for job, (state, _) in before.items() if state == "done"}
    assert len(before) == 4 and 1 <= len(first_done) < 4, before

    _write_prompts(Path(data["load"]["workload"]["path"]), PROMPTS_AFTER)
    argv = ["run", str(spec_file), "--resume", "--ray-address", "local", "--no-validate"]
    capsys.readouterr()
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "inputs changed in place" in err and data["load"]["workload"]["path"] in err, err
    assert "--accept-changed-inputs" in err and "Traceback" not in err
    assert _queue_jobs(out) == before  # refused before anything ran

    assert main([*argv, "--accept-changed-inputs"]) == 0, capsys.readouterr().err
    after = _queue_jobs(out)
    new_ids = set(after) - set(before)
    assert len(new_ids) == 4 and all(after[job] == ("done", 1) for job in new_ids), after
    assert all(after[job] == before[job] for job in first_done)  # kept, not run again
    assert set(after) == first_done | new_ids  # the earlier prompts' pending jobs are withdrawn

    store = open_store(str(out))
    con = views.connect(store)
    try:
        selection = select_best(con, store, replicates=200)
    finally:
        con.close()
    (level,) = selection.levels
    assert {r.config_label: r.repeats for r in level.ranked} == {"baseline": 2, "chain d=3": 2}
    assert {job for r in level.ranked for job in r.job_ids} == new_ids
    assert any("than the sweep's current ones (prompts differ" in note for note in selection.notes), (
        selection.notes
    )

    # Where the sweep row does not say which inputs are current (an input changed where only the nodes
    # see it), the jobs' own digests still differ: `best` refuses to rank them together.
    write_sweep_row(store, selection.sweep_id, spec_file.read_text(), sglang_version=None, created_ns=1)
    capsys.readouterr()
    assert main(["best", str(out)]) == 2
    err = capsys.readouterr().err
    assert "measured on different inputs" in err and "prompts" in err and "Traceback" not in err, err


class _EditPromptsAfterFirstDone(LogProgress):
    """Rewrite the prompt file in place once the first job is done, before the next one is handed out."""

    def __init__(self, path: Path) -> None:
        super().__init__(io.StringIO())
        self.path = path

    def event(self, line: str) -> None:
        super().event(line)
        if line.startswith("done") and self.path.read_text() != _rows_text(PROMPTS_AFTER):
            _write_prompts(self.path, PROMPTS_AFTER)


def _rows_text(rows: list[dict[str, str]]) -> str:
    return "".join(json.dumps(row) + "\n" for row in rows)


def _attempts(out: Path) -> list[tuple[str, str, str | None]]:
    conn = open_read_only(out)
    try:
        return [(a.job_id, a.outcome, a.error_class) for a in read_attempts(conn)]
    finally:
        conn.close()


def test_run_stops_as_inputs_changed_and_keeps_nothing_when_prompt_file_edited_mid_run(
    ray_local: RayConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A prompt file edited while the sweep runs: the next attempt, which measured the edited file, is
    not committed; it is released as `inputs_changed` (not a failure of the job, not retried) and the run
    stops with an InputsChangedError naming the file. Accepting the change on resume measures every job
    under a new id; the withdrawn job's attempt files go with it, so `best` needs no --allow-partial."""
    data = _spec_data(tmp_path)
    spec = parse_spec(data)
    out = Path(data["output_dir"])
    prompts = Path(data["load"]["workload"]["path"])
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    with pytest.raises(InputsChangedError) as stopped:
        run_sweep(
            spec,
            spec_file.read_text(),
            unchecked_plan(spec),
            out,
            ray_address="local",
            resume=False,
            progress=_EditPromptsAfterFirstDone(prompts),
        )
    assert "while the sweep ran" in stopped.value.problem and str(prompts) in stopped.value.problem
    assert ACCEPT_FLAG in stopped.value.fix
    states = _queue_jobs(out)
    done = {job for job, (state, _) in states.items() if state == "done"}
    assert len(done) == 1 and {state for state, _ in states.values()} == {"done", "pending"}, states
    changed = [(job, outcome) for job, outcome, error in _attempts(out) if error == "inputs_changed"]
    assert len(changed) == 1 and changed[0][1] == "released", _attempts(out)
    assert committed_job_ids(out) == done  # the attempt on the edited file committed nothing

    argv = ["run", str(spec_file), "--resume", "--ray-address", "local", "--no-validate"]
    assert main([*argv, "--accept-changed-inputs"]) == 0, capsys.readouterr().err
    after = _queue_jobs(out)
    new_ids = set(after) - set(states)
    assert len(new_ids) == 4 and all(after[job] == ("done", 1) for job in new_ids), after
    assert changed[0][0] not in after and changed[0][0] not in attempted_job_ids(out)  # withdrawn
    capsys.readouterr()
    assert main(["best", str(out), "--bootstrap", "100"]) == 0, capsys.readouterr().err
    assert "1 job(s) measured on other inputs" in capsys.readouterr().out


def test_confirmation_is_measured_again_under_a_new_id_when_inputs_change_after_it_ran(
    ray_local: RayConnection, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A finished sweep with its confirmation job, then the prompt file edited and the change accepted:
    the resume launches a new confirmation (built from the new prompts' results, under an id of the new
    inputs) instead of taking the one measured on the earlier prompts, and `best` reports the new one.
    Two slots: the baseline and the chain of each run side by side, then the confirmation (four rounds of
    launches instead of six); both measured at once, so the box's load weighs on both alike."""
    data = {**_spec_data(tmp_path), "repeats": 1, "confirm_adaptive": True, "max_servers": 2}
    data["load"] = {**data["load"], "concurrency": [1, 4]}
    # a confirmation is queued only where a chain wins a level, so its lead must be the simulated steps':
    # at 0.05 of real time they are a twentieth as long as at 1, and on a busy box the HTTP path's CPU
    # decided the level (in a suite run at a load average of 5-7 the baseline won both: no confirmation);
    # at 0.5 the module's four short levels still take seconds
    data["env"] = {"SPECSWEEP_SIM_TIME_SCALE": "0.5"}
    spec_file = tmp_path / "sweep.yaml"
    spec_file.write_text(yaml.safe_dump(data))
    out = Path(data["output_dir"])
    argv = ["run", str(spec_file), "--ray-address", "local", "--no-validate"]
    assert main(argv) == 0, capsys.readouterr().err
    before = _queue_jobs(out)
    (first,) = _confirmation_ids(out)
    assert before[first] == ("done", 1), before

    _write_prompts(Path(data["load"]["workload"]["path"]), PROMPTS_AFTER)
    assert main([*argv, "--resume", "--accept-changed-inputs"]) == 0, capsys.readouterr().err
    after = _queue_jobs(out)
    assert after[first] == ("done", 1)  # kept as it was, not launched again
    (second,) = _confirmation_ids(out) - {first}
    assert after[second] == ("done", 1), after
    capsys.readouterr()
    assert main(["best", str(out), "--json", "--bootstrap", "100"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["confirmation"] is not None and answer["confirmation"]["config_label"] == "adaptive"
    con = views.connect(open_store(str(out)))
    try:
        rows = con.sql("SELECT job_id FROM current_jobs WHERE role = 'confirmation'").fetchall()
    finally:
        con.close()
    assert rows == [(second,)]


def _confirmation_ids(out: Path) -> set[str]:
    conn = open_read_only(out)
    try:
        return {row.id for row in read_jobs(conn) if row.label == "adaptive"}
    finally:
        conn.close()
