"""What a user copies must work: every example spec validates, and the spec reference is current."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from harness.spec import load_spec, parse_spec
from harness.spec_docs import spec_markdown

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_SPECS = sorted((REPO / "examples").glob("*.yaml"))
DOC_SPEC_BLOCKS = [
    (doc.name, block)
    for doc in sorted((REPO / "docs").glob("*.md"))
    for block in re.findall(r"```yaml\n(.*?)```", doc.read_text(), flags=re.S)
    if "model_path:" in block
]


def test_docs_config_md_matches_schema_when_regenerated() -> None:
    """docs/config.md is exactly what `specsweep schema --markdown` prints (regenerate it on change)."""
    assert (REPO / "docs" / "config.md").read_text() == spec_markdown(), (
        "docs/config.md is stale: run `.venv/bin/specsweep schema --markdown > docs/config.md`"
    )


def test_every_field_is_described_when_schema_built() -> None:
    """Every spec field carries a description (the reference and `specsweep schema` depend on it)."""
    assert "|  |" not in spec_markdown().replace("| field | type | default | meaning |", "")


SPEC_TEXTS = [(p.name, p.read_text()) for p in EXAMPLE_SPECS] + DOC_SPEC_BLOCKS


@pytest.mark.parametrize("text", [t for _, t in SPEC_TEXTS], ids=[n for n, _ in SPEC_TEXTS])
def test_example_spec_validates_when_loaded(text: str) -> None:
    """Each examples/*.yaml, and each sweep spec shown in docs/, is a valid sweep spec."""
    spec = parse_spec(yaml.safe_load(text), source="example")
    assert spec.load.concurrency or spec.load.rates


def test_examples_exist_when_repo_checked_out() -> None:
    """The examples the docs point to are there, and load from disk as `specsweep run` reads them."""
    assert {p.name for p in EXAMPLE_SPECS} >= {"demo.yaml", "kimi-k25-eagle3.yaml"}
    for path in EXAMPLE_SPECS:
        load_spec(path)


def test_seed_launches_script_gives_each_verdict_when_run_from_another_directory(
    tmp_path: Path, sglang_python: str
) -> None:
    """examples/seed-launches.sh runs from any directory: the three launches end invalid, invalid and
    adjusted (exit codes 2, 2, 3), and the script itself exits 0 only because each verdict was expected.
    It runs as the README's quick tour runs it (specsweep on PATH, an empty HOME): the tour's docs test
    leaves it to this test rather than start its three SGLang resolvers twice."""
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "HOME": str(tmp_path / "home")}
    env["SPECSWEEP_SGLANG_PYTHON"] = sglang_python
    (tmp_path / "home").mkdir()
    done = subprocess.run(
        [str(REPO / "examples" / "seed-launches.sh")], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stdout + done.stderr
    codes = re.findall(r"^exit code (\d+) ", done.stdout, flags=re.M)
    assert codes == ["2", "2", "3"], done.stdout
    assert "not found" not in done.stdout + done.stderr


def test_seed_launches_script_fails_with_the_fix_when_specsweep_is_missing(tmp_path: Path) -> None:
    """A missing specsweep ends the script at once with exit 2 and the command that installs it (it printed
    "not found" three times and exited 0)."""
    env = {**os.environ, "SPECSWEEP": str(tmp_path / "no-such-specsweep")}
    done = subprocess.run(
        [str(REPO / "examples" / "seed-launches.sh")], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert "make venv sglang-venv" in done.stderr
    assert "==" not in done.stdout


def test_docs_results_md_defines_every_term_of_the_glossary_when_read() -> None:
    """docs/results.md's "Terms" is the glossary the report shows (leased, MRR, MAD, slot, mix score, ...),
    word for word: a term added to or changed in analysis/glossary.py must reach the doc."""
    from analysis.glossary import glossary_markdown

    assert glossary_markdown() in (REPO / "docs" / "results.md").read_text(), (
        "docs/results.md's Terms section is stale: paste analysis.glossary.glossary_markdown() there"
    )
