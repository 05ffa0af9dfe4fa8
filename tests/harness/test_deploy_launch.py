"""The launch to deploy, as `best`, `report` and `best --emit` show it: the spec's paths, no listen address
and no node-local drafter copy, with where the measured launch differed; and deploy.json's provenance
names this sweep's own drafter source."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep
from harness.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KIMI = str(FIXTURES / "kimi-k2")
DRAFT = str(FIXTURES / "eagle3-draft")
CONFIGS = (
    SyntheticConfig("baseline"),
    SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1),
    SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4, step_cost=2.2),
)
SPEC = f"""engine: sglang
model_path: {KIMI}
drafter:
  path: {DRAFT}
  format: speculators
speculative:
  algorithm: EAGLE3
  chain_depths: [4, 8]
load:
  concurrency: [1, 16, 64]
  requests_per_level: 300
"""
LOOPBACK = re.compile(r"--host|--port|127\.0\.0\.1|localhost")


@pytest.fixture(scope="module")
def measured(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A finished sweep whose servers ran the drafter from a node cache copy (as nodes do) on a loopback
    host and port; the copy's conversion.json was written when another run, elsewhere, converted the same
    bytes first (the cache is keyed by content). Returns OUT and the node copy."""
    root = tmp_path_factory.mktemp("deploy")
    copy = root / "specsweep-0" / "drafters" / "0f3c9a"
    copy.mkdir(parents=True)
    (copy / "conversion.json").write_text(
        json.dumps({"source": "/data/other-run/inputs/eagle3-speculators", "source_digest": "abc"})
    )
    sweep = SyntheticSweep(
        configs=CONFIGS, concurrencies=(1, 16, 64), requests_per_level=300, seed=7, model_path=KIMI,
        draft_model_path=str(copy),
    )  # fmt: skip
    write_sweep(root / "out", sweep, spec_text=SPEC)
    return root / "out", copy


def _launch_lines(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.strip().startswith("launch:")]


def test_best_prints_deployable_launch_and_how_the_measured_one_differed_when_drafter_ran_from_node_copy(
    measured: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """Each winner's `launch:` line names the spec's model and drafter, no host/port and no node copy;
    the line under it says the measured launch left out --host/--port and ran the node's converted copy,
    and the drafter line says how to convert it (it used to print the measured command as is)."""
    out, copy = measured
    assert main(["best", str(out), "--bootstrap", "100"]) == 0
    text = capsys.readouterr().out
    lines = _launch_lines(text)
    assert len(lines) == 3, text
    for line in lines:
        assert str(copy) not in line and "/specsweep-0/drafters/" not in line and not LOOPBACK.search(line)
        assert f"--model-path {KIMI}" in line
    chains = [line for line in lines if "--speculative-draft-model-path" in line]
    assert chains and all(f"--speculative-draft-model-path {DRAFT} " in line for line in chains)
    assert "measured launch differed: --host, --port left out" in text
    assert "--speculative-draft-model-path was the node's converted copy" in text
    assert f"drafter: convert the drafter first (specsweep convert {DRAFT} {DRAFT}-sglang" in text


def test_best_names_the_published_drafter_when_publish_drafter_is_given(
    measured: tuple[Path, Path], capsys: pytest.CaptureFixture[str]
) -> None:
    """With --publish-drafter PATH the deploy launch loads the drafter from PATH and says how to put it there."""
    out, _ = measured
    assert main(["best", str(out), "--bootstrap", "100", "--publish-drafter", "/models/drafter-v2"]) == 0
    text = capsys.readouterr().out
    chains = [line for line in _launch_lines(text) if "--speculative-draft-model-path" in line]
    assert chains and all("--speculative-draft-model-path /models/drafter-v2 " in line for line in chains)
    assert f"publish the drafter there first: specsweep convert {DRAFT} /models/drafter-v2" in text


def test_report_shows_deployable_launches_when_drafter_ran_from_node_copy(
    measured: tuple[Path, Path], tmp_path: Path
) -> None:
    """The report's launch under each winner is the deploy launch; the page (outside the inlined plotly.js
    bundle) names neither the node copy nor a loopback listen address."""
    out, copy = measured
    target = tmp_path / "report.html"
    assert main(["report", str(out), "--bootstrap", "100", "-o", str(target)]) == 0
    page = target.read_text()
    launches = re.findall(r"<pre class='launch'>(.*?)</pre>", page, flags=re.DOTALL)
    assert len(launches) == 3
    for launch in launches:
        assert f"--model-path {KIMI}" in launch and not LOOPBACK.search(launch)
    body = page.split("</head>", 1)[1]
    assert str(copy) not in body and "/specsweep-0/drafters/" not in body
    assert "measured launch differed: --host, --port left out" in body


def test_best_emit_provenance_names_this_sweeps_drafter_when_the_node_copy_was_converted_by_another_run(
    measured: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """deploy.json's conversion record names this sweep's drafter directory as its source (the node
    copy's conversion.json named the run that converted the same bytes first), and launch.sh, the argvs
    and every `launch:` line carry no node copy and no loopback address."""
    out, copy = measured
    dest = tmp_path / "deploy"
    assert main(["best", str(out), "--bootstrap", "100", "--emit", str(dest)]) == 0
    text = capsys.readouterr().out
    result = json.loads((dest / "deploy.json").read_text())
    assert result["drafter"]["conversion"]["source"] == str(Path(DRAFT).absolute())
    assert "other-run" not in json.dumps(result["drafter"]["conversion"])
    launch_sh = (dest / "launch.sh").read_text()
    argvs = [result["static"]["argv"]] + ([result["adaptive"]["argv"]] if result["adaptive"] else [])
    for shown in [launch_sh, *(" ".join(a) for a in argvs), *_launch_lines(text)]:
        assert str(copy) not in shown and not LOOPBACK.search(shown), shown
    assert f"--speculative-draft-model-path {DRAFT}-sglang" in launch_sh
