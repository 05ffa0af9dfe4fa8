"""The architecture holds: four wings around one contract, imports that point one way, one list of
error classes, and docs that name only paths that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("specsweep", "harness", "workers", "analysis", "bench", "tests")


def _module(path: Path) -> str:
    return ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")


def _imports(path: Path) -> set[str]:
    """Every project module ``path`` imports (top-level or inside a function)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {name for name in found if name.split(".")[0] in PACKAGES}


SOURCES = {_module(p): p for pkg in PACKAGES for p in (REPO / pkg).rglob("*.py") if ".venv" not in p.parts}
IMPORTS = {name: _imports(path) for name, path in SOURCES.items()}


def _importers_of(prefix: str) -> set[str]:
    return {
        name
        for name, targets in IMPORTS.items()
        if any(t == prefix or t.startswith(prefix + ".") for t in targets)
    }


def test_workers_top_level_holds_only_the_contract_when_listed() -> None:
    """workers/ holds its wings as subpackages; only __init__.py and job.py (the contract) at the top."""
    assert sorted(p.name for p in (REPO / "workers").glob("*.py")) == ["__init__.py", "job.py"]
    for wing in ("node", "convert", "load", "sim", "sglang"):
        init = REPO / "workers" / wing / "__init__.py"
        assert ast.get_docstring(ast.parse(init.read_text())), (
            f"workers/{wing}/__init__.py needs its docstring"
        )


def test_only_the_driver_imports_the_node_wing_when_outside_workers() -> None:
    """The harness starts node actors only from the driver; convert, load and sim never reach into node."""
    importers = {
        m for m in _importers_of("workers.node") if not m.startswith(("tests", "bench", "workers.node"))
    }
    assert importers == {"harness.driver"}


@pytest.mark.parametrize("wing", ["workers.convert", "workers.load", "workers.sim"])
def test_wing_imports_no_other_wing_when_a_subsystem(wing: str) -> None:
    """A subsystem wing imports the contract, workers.sglang, analysis and specsweep, never another wing."""
    others = {"workers.node", "workers.convert", "workers.load", "workers.sim"} - {wing}
    for name, targets in IMPORTS.items():
        if name.startswith(wing + ".") or name == wing:
            bad = {t for t in targets if any(t == o or t.startswith(o + ".") for o in others)}
            assert not bad, f"{name} imports {bad}"


def test_nothing_outside_tests_imports_tests_when_installed() -> None:
    """``tests`` is not installed with the package: no library or benchmark module may import it."""
    assert {m for m in _importers_of("tests") if not m.startswith("tests")} == set()


def test_analysis_imports_no_harness_or_workers_when_lowest_layer() -> None:
    """harness -> workers -> analysis: the analysis layer never imports the layers above it."""
    for name, targets in IMPORTS.items():
        if name.startswith("analysis"):
            assert not {t for t in targets if t.startswith(("harness", "workers"))}, name


ERROR_CLASS_VALUES = {
    "bad_args", "resolve_error", "config_mismatch", "cuda_oom", "bad_drafter", "nccl_error", "crash",
    "startup_timeout", "health_lost", "stop_failed", "gpus_busy", "node_lost", "attempt_timeout",
    "worker_error", "cancelled",
}  # fmt: skip


def test_error_class_literals_live_in_one_module_when_grepped() -> None:
    """An attempt's error class is always an ``ErrorClass`` member; its string appears only where the enum
    is defined."""
    from specsweep.error_classes import ErrorClass

    assert {c.value for c in ErrorClass} >= ERROR_CLASS_VALUES
    values = {c.value for c in ErrorClass}
    for name, path in SOURCES.items():
        if name.startswith("tests") or name == "specsweep.error_classes":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in values:
                raise AssertionError(
                    f"{path.relative_to(REPO)}:{node.lineno}: {node.value!r}: use ErrorClass"
                )


EXAMPLES = [path for path in (REPO / "examples").glob("*") if path.is_file()]  # not examples/inputs/'s data
DOCS = sorted([*(REPO / "docs").glob("*.md"), REPO / "README.md", *EXAMPLES])
_MODULE_RUN = re.compile(r"python -m ([A-Za-z_][\w.]*)")
_REPO_PATH = re.compile(
    r"(?<![\w/.-])((?:harness|workers|analysis|bench|tests|examples|docs|specsweep)/[\w./-]*\w)"
)


def _module_exists(module: str) -> bool:
    parts = module.split(".")
    base = REPO.joinpath(*parts)
    return base.with_suffix(".py").is_file() or (base / "__init__.py").is_file()


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(REPO)))
def test_doc_names_only_paths_that_exist_when_read(doc: Path) -> None:
    """Every ``python -m <project module>`` and every repository path a doc or example names exists."""
    text = doc.read_text()
    for module in _MODULE_RUN.findall(text):
        if module.split(".")[0] in PACKAGES:
            assert _module_exists(module), f"{doc.name}: python -m {module} does not exist"
    for path in _REPO_PATH.findall(text):
        if "*" in path or "<" in path:
            continue
        assert (REPO / path).exists(), f"{doc.name}: {path} does not exist"


def test_search_imports_no_simulator_when_learning_from_measurements() -> None:
    """The search learns from measurements only: nothing in harness/search imports the simulator's model
    or physics (issue #27: a search sharing the truth's equations proves nothing)."""
    assert {m for m in _importers_of("workers.sim") if m.startswith("harness.search")} == set()
