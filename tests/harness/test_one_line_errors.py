"""User mistakes and damaged state end in one line naming the problem and the fix (exit 2), never a
traceback, found before any long work, and nothing half-written."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from analysis.synthetic import standard_sweep, write_sweep
from harness.cli import main
from harness.commands.run import resume_command
from harness.queue import QUEUE_FILE, JobQueue
from harness.results import claim_output_dir
from specsweep.errors import ResultsError
from tests.conftest import fill
from tests.object_store import S3Server, free_port

SPEC = {
    "engine": "sim",
    "model_path": "/nonexistent/target",
    "load": {"concurrency": [1], "requests_per_level": 2},
}


def one_line_error(capsys: pytest.CaptureFixture[str], *needles: str) -> str:
    err = capsys.readouterr().err
    assert "Traceback" not in err and err.startswith("specsweep ")
    for needle in needles:
        assert needle in err
    return err


@pytest.mark.parametrize(
    "content", [b"", b"this is not an SQLite database at all" * 100], ids=["empty", "garbage"]
)
def test_status_names_the_queue_when_queue_sqlite_is_damaged(
    content: bytes, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`status` on an empty or corrupt queue.sqlite: exit 2, naming the file; a resume refuses it alike."""
    (tmp_path / QUEUE_FILE).write_bytes(content)
    assert main(["status", str(tmp_path)]) == 2
    one_line_error(capsys, QUEUE_FILE, "damaged or empty")
    with pytest.raises(ResultsError, match="damaged or empty"):
        JobQueue(tmp_path)
    assert (tmp_path / QUEUE_FILE).read_bytes() == content  # left as it was


def test_run_names_the_encoding_when_the_spec_is_not_utf8(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A Latin-1 spec is refused with the byte position, not a UnicodeDecodeError."""
    spec = tmp_path / "sweep.yaml"
    spec.write_bytes(yaml.safe_dump(SPEC).encode() + b"output_dir: caf\xe9\n")  # Latin-1 e-acute
    assert main(["run", str(spec), "--no-validate"]) == 2
    one_line_error(capsys, "not UTF-8", str(spec))


@pytest.mark.parametrize("kind", ["file", "unwritable"])
def test_run_refuses_the_output_path_before_ray_when_it_cannot_hold_results(
    kind: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --out FILE` and an OUT that cannot be created are refused at once (no Ray started)."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    out = tmp_path / "a-file" if kind == "file" else Path("/proc/specsweep-cannot-exist/out")
    if kind == "file":
        out.write_text("not a directory")
    assert main(["run", str(spec), "--no-validate", "--out", str(out), "--ray-address", "local"]) == 2
    one_line_error(capsys, str(out), "--out")


@pytest.mark.parametrize("case", ["scheme", "query", "unreachable", "no_bucket", "no_credentials"])
def test_run_refuses_an_object_store_out_before_ray_when_it_cannot_be_used(
    case: str,
    s3: S3Server,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A bad URI, an endpoint where nothing listens, a missing bucket or no credentials: one line naming
    the problem, exit 2, before Ray starts and before any state directory is made."""
    import ray

    monkeypatch.setenv("SPECSWEEP_STATE_DIR", str(tmp_path / "state"))
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump(SPEC))
    bucket = s3.new_bucket()
    uri, needle = {
        "scheme": (f"s5://{bucket}/p", "unsupported output location scheme"),
        "query": (f"s3://{bucket}/p?endpoint_url=x", "unknown URI option(s) endpoint_url"),
        "unreachable": (
            f"s3://{bucket}/p?endpoint_override=127.0.0.1:{free_port()}&scheme=http",
            "cannot reach the object store",
        ),
        "no_bucket": (f"s3://{bucket}-missing/p", "does not exist"),
        "no_credentials": (f"s3://{bucket}/p", "no AWS credentials found"),
    }[case]
    if case == "no_credentials":
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
            monkeypatch.delenv(name)
        monkeypatch.setenv("HOME", str(tmp_path))
    assert main(["run", str(spec), "--no-validate", "--out", uri, "--ray-address", "local"]) == 2
    err = one_line_error(capsys, needle, "fix:")
    assert len(err.strip().splitlines()) == 2, err  # the problem, then its fix
    assert not ray.is_initialized() and not (tmp_path / "state").exists()


def test_report_refuses_a_directory_target_before_the_work_when_o_is_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report -o DIR` fails in a moment, naming the directory, instead of after the whole analysis."""
    out = tmp_path / "out"
    write_sweep(out, standard_sweep(requests_per_level=20, concurrencies=(1,)))
    assert main(["report", str(out), "-o", str(tmp_path)]) == 2
    one_line_error(capsys, "is a directory", "-o report.html")


def test_report_says_the_disk_is_full_with_exit_5_when_its_target_disk_is_full(
    small_disk: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`report -o` onto a full disk: one line naming the target and the full disk, exit 5 (DiskFullError),
    no report and no temporary file left."""
    out = tmp_path / "out"
    write_sweep(out, standard_sweep(requests_per_level=20, concurrencies=(1,)))
    fill(small_disk)
    target = small_disk / "report.html"
    assert main(["report", str(out), "-o", str(target)]) == 5
    err = one_line_error(capsys, str(target), "the disk is full", "No space left on device", "fix:")
    assert len(err.strip().splitlines()) == 2, err
    assert sorted(p.name for p in small_disk.iterdir()) == ["filler"]


@pytest.mark.parametrize("command", ["best", "report", "sql"])
def test_analysis_names_the_file_when_a_result_file_is_truncated(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated levels file: one line naming it, exit 2, no report written (`sql` reads a file only
    when a query reads its table, as over a bucket)."""
    out = tmp_path / "out"
    write_sweep(out, standard_sweep(requests_per_level=20, concurrencies=(1,)))
    damaged = sorted(out.glob("levels/*/*/part-0.parquet"))[0]
    damaged.write_bytes(damaged.read_bytes()[:100])
    argv = {
        "best": ["best", str(out)],
        "report": ["report", str(out)],
        "sql": ["sql", str(out), "SELECT count(*) FROM levels"],
    }
    assert main(argv[command]) == 2
    one_line_error(capsys, str(damaged), "damaged")
    assert not (out / "report.html").exists()


def test_claim_refuses_to_overwrite_results_when_the_queue_was_deleted(tmp_path: Path) -> None:
    """Committed results without queue.sqlite: a plain run (or a resume) is refused, nothing written."""
    write_sweep(tmp_path, standard_sweep(requests_per_level=20, concurrencies=(1,)))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for resume in (False, True):
        with pytest.raises(ResultsError, match="no sweep queue"):
            claim_output_dir(tmp_path, "synthetic", "spec: 1\n", resume=resume)
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


@pytest.mark.parametrize(("address", "tail"), [("local", " --ray-address local"), ("auto", "")])
def test_resume_hint_keeps_the_ray_address_when_one_was_given(address: str, tail: str) -> None:
    """The printed resume command repeats --ray-address (a plain resume of a local run would look for a
    cluster and fail)."""
    args = argparse.Namespace(spec="my sweep.yaml", ray_address=address, state_dir=None)
    hint = resume_command(args, Path("out dir"))
    assert hint == f"specsweep run 'my sweep.yaml' --out 'out dir' --resume{tail}"


@pytest.mark.parametrize("nodes", ["0", "-2", "two"])
def test_demo_refuses_at_once_when_nodes_is_not_a_positive_count(
    nodes: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """`demo --nodes 0` is a usage error (exit 2) at once, not a 300 s wait for a placement that cannot
    happen followed by "set gpus_per_server to at most 0"."""
    with pytest.raises(SystemExit) as exited:
        main(["demo", "--nodes", nodes])
    assert exited.value.code == 2 and "node count" in capsys.readouterr().err


@pytest.mark.parametrize("command", ["plan", "run"])
def test_plan_and_run_refuse_an_unreachable_hub_dataset_before_any_launch_when_offline(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Hugging Face prompt set that is neither cached nor reachable (offline): `plan` and `run` exit 2
    with one error naming the dataset and the fix, before validation, Ray or a server; nothing is
    written (no results directory, no cache)."""
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    cache, out = tmp_path / "hub", tmp_path / "out"
    workload = {"kind": "prompt_set", "format": "gsm8k", "hf": {"cache_dir": str(cache)}, "max_tokens": 8}
    spec = tmp_path / "sweep.yaml"
    spec.write_text(yaml.safe_dump({**SPEC, "load": {**SPEC["load"], "workload": workload}}))  # type: ignore[dict-item]
    argv = [command, str(spec)] + (["--no-validate", "--out", str(out)] if command == "run" else [])
    assert main(argv) == 2
    err = one_line_error(capsys, "openai/gsm8k@main is not in", "offline mode is on", "fix: ", "hf download")
    assert len(err.strip().splitlines()) == 2  # the problem, then its fix
    assert not out.exists() and not cache.exists()
