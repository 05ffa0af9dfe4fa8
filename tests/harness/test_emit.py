"""best --emit: a portable launch, an adaptive schedule SGLang itself loads and routes, and the mix choice."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from analysis.deploy import config_shapes, level_concurrency, plan_deployment
from analysis.select import select_best
from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep
from analysis.views import connect
from harness.cli import main

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KIMI = str(FIXTURES / "kimi-k2")
DRAFT = str(FIXTURES / "eagle3-draft")
CONFIGS = (
    SyntheticConfig("baseline"),
    SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1),
    SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4, step_cost=2.2),
    SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.0, step_cost=1.9),
)
SPEC = f"""engine: sglang
model_path: {KIMI}
drafter:
  path: {DRAFT}
  format: speculators
speculative:
  algorithm: EAGLE3
  chain_depths: [4, 8]
  num_steps: [3]
  topk: [4]
  num_draft_tokens: [8]
load:
  concurrency: [1, 16, 64]
  requests_per_level: 300
deploy_weights:
  concurrency=1: 1
  concurrency=16: 2
  concurrency=64: 1
"""

# SGLang's own loader and router, run in the resolver venv on the emitted file.
SGLANG_ROUTE = """
import json, sys
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams, _load_adaptive_config
path, initial = sys.argv[1], int(sys.argv[2])
_load_adaptive_config(path)
params = AdaptiveSpeculativeParams(initial, path)
print(json.dumps({bs: params.get_steps_for_batch(bs) for bs in (1, 8, 16, 40, 64, 200)}))
"""


def _sweep(out: Path, configs: tuple[SyntheticConfig, ...] = CONFIGS) -> None:
    sweep = SyntheticSweep(
        configs=configs, concurrencies=(1, 16, 64), requests_per_level=300, seed=7, model_path=KIMI,
        draft_model_path=DRAFT,
    )  # fmt: skip
    write_sweep(out, sweep, spec_text=SPEC)


def test_best_emit_writes_portable_launch_and_adaptive_schedule_sglang_routes_when_chains_win(
    tmp_path: Path, sglang_python: str
) -> None:
    """The emitted launches name the spec's model and the published drafter (no host, port or node path);
    the adaptive config holds each level's winning chain depth (0 where no speculation wins), validates
    `ok` with SGLang's resolver, and SGLang's own AdaptiveSpeculativeParams routes batch sizes to it."""
    out, dest = tmp_path / "out", tmp_path / "deploy"
    _sweep(out)
    done = subprocess.run(
        [sys.executable, "-m", "harness.cli", "best", str(out), "--emit", str(dest)],
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "recommended adaptive" in done.stdout
    # SGLang's resolver takes seconds: the step says so, a plain line as the output is not a terminal
    step = r"^\d\d:\d\d:\d\d best --emit: building and validating the deploy launches: \d+ s$"
    assert re.search(step, done.stdout, flags=re.M), done.stdout
    result = json.loads((dest / "deploy.json").read_text())
    adaptive = result["adaptive"]
    assert adaptive["chosen"] == {
        "concurrency=1": "chain d=4",
        "concurrency=16": "chain d=4",
        "concurrency=64": "baseline",
    }
    assert json.loads((dest / "adaptive.json").read_text()) == {
        "1": {"candidate_steps": [3]}, "4": {"candidate_steps": [3]}, "32": {"candidate_steps": [0]},
    }  # fmt: skip
    assert adaptive["validation"]["status"] == "ok"
    assert adaptive["validation"]["checked_by"] == ["builtin", "sglang 0.5.23"]
    published = DRAFT + "-sglang"
    assert result["drafter"]["publish_command"] == [
        "specsweep",
        "convert",
        DRAFT,
        published,
        "--target-config",
        KIMI,
    ]
    for argv in (adaptive["argv"], result["static"]["argv"]):
        assert "--host" not in argv and "--port" not in argv and not any("/tmp/specsweep" in a for a in argv)
        assert argv[argv.index("--model-path") + 1] == KIMI
        assert argv[argv.index("--speculative-draft-model-path") + 1] == published
    assert "--speculative-adaptive" in (dest / "launch.sh").read_text()
    routed = subprocess.run(
        [sglang_python, "-c", SGLANG_ROUTE, str(dest / "adaptive.json"), "3"],
        capture_output=True, text=True, timeout=600, check=True,
    )  # fmt: skip
    steps = json.loads(routed.stdout.strip().splitlines()[-1])
    assert steps == {"1": 3, "8": 3, "16": 3, "40": 0, "64": 0, "200": 0}


def test_plan_deployment_reports_what_schedule_gives_up_when_tree_wins_level(tmp_path: Path) -> None:
    """Where a tree wins a level the adaptive schedule uses the best chain or baseline there and says
    what it gives up; the recommendation is whichever scores higher on the weighted mix."""
    tree_wins_low = (
        *CONFIGS[:3],
        SyntheticConfig("tree s=3 k=4 n=8", "EAGLE3", 3, 4, 8, accept_length=3.9, step_cost=1.2),
    )
    _sweep(tmp_path, tree_wins_low)
    con = connect(tmp_path)
    selection = select_best(con, tmp_path)
    assert selection.levels[0].winner is not None
    assert selection.levels[0].winner.config_label == "tree s=3 k=4 n=8"
    deployment = plan_deployment(selection, config_shapes(con), level_concurrency(con))
    adaptive = deployment.adaptive
    assert adaptive is not None and "concurrency=1" in adaptive.gives_up
    assert "tree s=3 k=4 n=8" in adaptive.gives_up["concurrency=1"]
    assert adaptive.chosen["concurrency=1"].startswith("chain")
    better = max(deployment.static.mix_score, adaptive.mix_score)
    chosen = adaptive.mix_score if deployment.recommended == "adaptive" else deployment.static.mix_score
    assert chosen == better


def test_plan_deployment_refuses_weights_when_level_unknown(tmp_path: Path) -> None:
    """A load-mix weight on a level the sweep did not rank is a user error naming the levels."""
    from specsweep.errors import ResultsError

    _sweep(tmp_path)
    con = connect(tmp_path)
    with pytest.raises(ResultsError, match="concurrency=2") as info:
        plan_deployment(
            select_best(con, tmp_path), config_shapes(con), level_concurrency(con), {"concurrency=2": 1}
        )
    assert "concurrency=16" in str(info.value.fix)


@pytest.fixture(scope="module")
def emit_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished sweep with its spec, whose chains win (so emit writes adaptive.json first)."""
    out = tmp_path_factory.mktemp("emit") / "out"
    _sweep(out)
    return out


def _destination(case: str, tmp_path: Path, request: pytest.FixtureRequest) -> Path:
    taken = tmp_path / "taken"
    taken.write_text("keep me\n")
    if case == "an existing file":
        return taken
    if case == "a path under a file":
        return taken / "deploy"
    if case == "a path in /proc":
        return Path("/proc/specsweep-emit-test/deploy")
    read_only: Path = request.getfixturevalue("read_only_disk")
    return read_only / "deploy"


@pytest.mark.parametrize(
    "case", ["an existing file", "a path under a file", "a path in /proc", "a read-only file system"]
)
def test_best_emit_says_so_in_one_line_and_writes_nothing_when_the_destination_cannot_be_written(
    case: str,
    emit_results: Path,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """`best --emit DIR` where DIR cannot hold the files (a file, under a file, /proc, a read-only mount,
    which stops root too) exits 2 with one line naming --emit and its fix, no traceback, and writes
    nothing (it used to end in an OSError traceback)."""
    dest = _destination(case, tmp_path, request)
    before = sorted(tmp_path.rglob("*"))
    assert main(["best", str(emit_results), "--emit", str(dest), "--bootstrap", "100"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2, err
    assert err.startswith("specsweep best: error: --emit: cannot write the deployment files into ")
    assert sorted(tmp_path.rglob("*")) == before
    assert (tmp_path / "taken").read_text() == "keep me\n" and not Path("/proc/specsweep-emit-test").exists()


def test_best_emit_removes_the_files_it_wrote_when_a_later_one_cannot_be_written(
    emit_results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Nothing half-written: when launch.sh cannot be written (a folder holds its name) after adaptive.json
    was, adaptive.json is removed again and the error is one line naming launch.sh."""
    dest = tmp_path / "deploy"
    (dest / "launch.sh").mkdir(parents=True)
    (dest / "launch.sh" / "keep").write_text("x")
    assert main(["best", str(emit_results), "--emit", str(dest), "--bootstrap", "100"]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 2 and "launch.sh" in err, err
    assert sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*")) == ["launch.sh", "launch.sh/keep"]


def test_best_emit_exits_6_and_writes_nothing_when_no_config_meets_the_slos(
    emit_results: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--emit has nothing to deploy when no config meets the SLOs: exit 6, as `best` and its capacity
    ranking then (it was 2, the code of a mistake in the command), one line, no files."""
    dest = tmp_path / "deploy"
    args = [
        "best",
        str(emit_results),
        "--slo",
        "ttft_p99_ms<=0.001",
        "--emit",
        str(dest),
        "--bootstrap",
        "100",
    ]
    assert main(args) == 6
    err = capsys.readouterr().err
    assert "no config meets every SLO" in err and "Traceback" not in err
    assert not dest.exists() or not any(dest.iterdir())


def test_best_emit_follows_the_measured_confirmation_when_it_disagrees_with_the_prediction(
    emit_results: Path, tmp_path: Path
) -> None:
    """The sweep predicts the adaptive server best on the mix; its confirmation measured half of each
    level's winner (mix score 0.5, below the best static config's), so emit recommends static:
    deploy.json says static and carries the confirmation, and launch.sh runs the static launch."""
    import dataclasses
    import shlex

    from analysis.confirmation import confirm
    from analysis.deploy import spec_weights
    from harness.emit import emit

    con = connect(emit_results)
    selection = select_best(con, emit_results, replicates=100)
    shapes, concurrency, weights = config_shapes(con), level_concurrency(con), spec_weights(con)
    assert plan_deployment(selection, shapes, concurrency, weights).recommended == "adaptive"
    halves = []
    for level in selection.levels:
        assert level.winner is not None
        half = dataclasses.replace(
            level.winner, config_label="adaptive", objective=level.winner.objective / 2
        )
        halves.append(dataclasses.replace(level, ranked=(*level.ranked, half)))
    confirmation = confirm(
        selection, dataclasses.replace(selection, levels=tuple(halves)), "adaptive", "{}", shapes, concurrency,
        weights,
    )  # fmt: skip
    assert confirmation.mix_score == pytest.approx(0.5) and confirmation.recommended == "static"
    result = emit(con, selection, tmp_path / "deploy", use_resolver=False, confirmation=confirmation)
    assert result["recommended"] == "static" and result["adaptive"] is not None
    written = json.loads((tmp_path / "deploy" / "deploy.json").read_text())
    assert written["recommended"] == "static" and written["confirmation"]["mix_score"] == pytest.approx(0.5)
    launch = (tmp_path / "deploy" / "launch.sh").read_text()
    assert launch == "#!/bin/sh\nexec " + shlex.join(result["static"]["argv"]) + "\n"
