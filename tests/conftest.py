"""Shared test fixtures: model config fixtures, the SGLang interpreter, GPU auto-skip."""

from __future__ import annotations

import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.object_store import S3Server, moto_server
from workers.sglang import default_sglang_python

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def sigint_as_from_a_terminal() -> Iterator[None]:
    """Children start with Ctrl-C's default action, as under a terminal. A suite started in the background
    of a script (``make test &``, some CI runners) inherits SIGINT ignored and hands that to every child,
    so a test that presses Ctrl-C on ``specsweep load`` would wait for an exit that never comes. Python's
    own handler here makes exec reset SIGINT to its default in each child."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def kimi_target() -> Path:
    """A Kimi-K2-shaped target: DeepseekV3ForCausalLM, hidden 7168, vocab 163840, no MTP layer."""
    return FIXTURES / "kimi-k2"


@pytest.fixture(scope="session")
def eagle3_draft() -> Path:
    """An EAGLE3 draft config for the Kimi-shaped target (LlamaForCausalLMEagle3, draft vocab 32000)."""
    return FIXTURES / "eagle3-draft"


@pytest.fixture(scope="session")
def sglang_python() -> str:
    """SGLang 0.5.23's interpreter (.venv-sglang). Tests that need it fail, never skip, without it."""
    python = default_sglang_python()
    if python is None:
        pytest.fail(
            "no SGLang interpreter: run `make sglang-venv` (make test does) or set SPECSWEEP_SGLANG_PYTHON"
        )
    return python


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    """moto's S3-compatible server on 127.0.0.1, one for the session (each test makes its own bucket)."""
    with moto_server(tmp_path_factory.mktemp("moto") / "moto.log") as server:
        yield server


@pytest.fixture
def s3(s3_server: S3Server, monkeypatch: pytest.MonkeyPatch) -> S3Server:
    """The S3 server, with this process's environment pointed at it (keys, region, endpoint)."""
    for name, value in s3_server.env().items():
        monkeypatch.setenv(name, value)
    return s3_server


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs mounted for this test. Mounting needs root with the right to mount (CI and this
    project's machines have it); where the kernel refuses the mount for lack of privilege the test is
    skipped with that reason, any other mount failure fails it."""
    yield from _tmpfs(tmp_path / "disk", "size=64m")


@pytest.fixture
def read_only_disk(tmp_path: Path) -> Iterator[Path]:
    """An empty tmpfs mounted read-only for this test: even root cannot write there (EROFS), which chmod
    alone does not achieve. Skipped, as ``small_disk``, where mounting is not allowed."""
    yield from _tmpfs(tmp_path / "read-only", "size=1m,ro")


def _tmpfs(mount: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted on ``mount`` with ``options`` while the fixture lasts."""
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        reason = done.stderr.decode().strip()
        if "permission denied" in reason.lower() or "must be superuser" in reason.lower():
            pytest.skip(f"cannot mount a tmpfs without the privilege to mount: {reason}")
        pytest.fail(f"cannot mount a tmpfs: {reason}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


def fill(disk: Path) -> Path:
    """Write a file until the disk is full; returns it (delete it to free the space)."""
    filler = disk / "filler"
    with open(filler, "wb") as handle:
        try:
            while True:
                handle.write(b"\0" * (1 << 16))
                handle.flush()
        except OSError:
            pass
    return filler


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Skip @pytest.mark.gpu tests on machines without an NVIDIA GPU, and @pytest.mark.no_gpu tests (how the
    real SGLang fails where it finds no GPU) on machines with one."""
    if shutil.which("nvidia-smi"):
        mark, skip = "no_gpu", pytest.mark.skip(reason="checks a machine without an NVIDIA GPU")
    else:
        mark, skip = "gpu", pytest.mark.skip(reason="needs an NVIDIA GPU")
    for item in items:
        if mark in item.keywords:
            item.add_marker(skip)
