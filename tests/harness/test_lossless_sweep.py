"""The lossless check end to end on the embedded demo cluster: a sweep with `lossless_check: true` whose
simulated tree config is lossy (SPECSWEEP_SIM_FAULT=lossy_tree) is flagged, alone, over a measured floor;
`best` marks it, `--emit` refuses it unless --allow-lossy; an accept threshold below 1.0 is marked in
the plan, before anything runs."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from analysis.views import connect
from harness.cli import main
from tests.harness.sim_sweeps import run_on_simulated_cluster
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config
from workers.load.lossless import CHECK_PROMPTS

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
TREE = "tree s=2 k=2 n=4"
FAULT_AFTER = 5


@pytest.fixture(scope="module")
def checked(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """One simulated 24-GPU node runs baseline, chain d=3 and a topk-2 tree at once, with the check on and
    the simulator lossy for trees from output token FAULT_AFTER; yields OUT."""
    root = tmp_path_factory.mktemp("lossless")
    target = write_target_config(root / "target", TINY)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")
    out = root / "out"
    data = {
        "engine": "sim",
        "model_path": str(target),
        "drafter": {"path": str(drafter), "format": "speculators"},
        "base_args": ["--tp-size", "8"],
        "speculative": {"chain_depths": [3], "num_steps": [2], "topk": [2], "num_draft_tokens": [4]},
        "lossless_check": True,
        "load": {
            "concurrency": [8],
            "requests_per_level": 16,
            "warmup_requests": 1,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 24, "vocab_size": 256},
        },
        "retries": 1,
        "timeouts": {"startup_s": 60, "level_s": 120, "stop_s": 5, "placement_s": 120},
        "env": {
            "SPECSWEEP_SIM_TIME_SCALE": "0.05",
            "SPECSWEEP_SIM_FAULT": "lossy_tree",
            "SPECSWEEP_SIM_FAULT_AFTER": str(FAULT_AFTER),
        },
        "output_dir": str(out),
    }
    plan, summary = run_on_simulated_cluster(data, root, nodes=1, gpus_per_node=24, cpus_per_node=3)
    assert sorted(j.config_label for j in plan.jobs) == ["baseline", "chain d=3", TREE]
    assert summary.counts["done"] == 3
    yield out


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_lossless_check_flags_only_the_lossy_config_when_the_simulator_is_lossy_for_trees(
    checked: Path,
) -> None:
    """The floor is measured (the baseline serial vs batched: 0 of 16 prompts differ on the simulator), the
    tree's outputs differ from the baseline's beyond it, each first at token FAULT_AFTER, and the chain's
    do not: exactly the tree is lossy."""
    con = connect(checked)
    assert con.sql("SELECT prompts, diverged, floor_rate FROM lossless_floor").fetchall() == [
        (len(CHECK_PROMPTS), 0, 0.0)
    ]
    rows = con.sql(
        "SELECT config_label, compared, diverged, first_diverging_positions, lossy FROM lossless_results "
        "ORDER BY config_label"
    ).fetchall()
    assert [(label, compared, lossy) for label, compared, _, _, lossy in rows] == [
        ("chain d=3", 2 * len(CHECK_PROMPTS), False),
        (TREE, 2 * len(CHECK_PROMPTS), True),
    ]
    chain, tree = rows
    assert chain[2] == 0 and chain[3] == []
    assert tree[2] > 0 and set(tree[3]) == {FAULT_AFTER}
    per_prompt = con.sql(
        "SELECT count(*), count(first_diverging_position) FROM lossless_divergence WHERE config_label = ?",
        params=[TREE],
    ).fetchall()
    assert per_prompt == [(2 * len(CHECK_PROMPTS), tree[2])]


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_best_marks_the_lossy_config_and_shows_the_floor_when_the_check_ran(
    checked: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`best` ranks the lossy config as measured with a LOSSY mark, and prints the floor and each speculative
    config's verdict; the JSON output carries the same."""
    assert main(["best", str(checked), "--bootstrap", "200"]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.lstrip().startswith(TREE) or f" {TREE} " in line]
    (tree_row,) = [line for line in rows if "%" in line and "floor" not in line and "tie:" not in line]
    assert tree_row.rstrip().endswith("LOSSY")
    assert not any("chain d=3" in line and "LOSSY" in line for line in text.splitlines())
    assert f"differs in 0 of {len(CHECK_PROMPTS)} prompts (0.0%)" in text
    assert f"LOSSY    {TREE}: greedy outputs differ from the baseline's in" in text
    assert f"first diverging at token {FAULT_AFTER} (" in text
    assert main(["best", str(checked), "--bootstrap", "200", "--format", "json"]) == 0
    lossless = json.loads(capsys.readouterr().out)["lossless"]
    assert [c["config_label"] for c in lossless["configs"] if c["lossy"]] == [TREE]


@pytest.mark.ray
@pytest.mark.timeout(900)
def test_best_emit_refuses_a_lossy_config_unless_allowed_when_it_is_the_one_to_deploy(
    checked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With an SLO only the tree meets (a throughput bound between the tree's and the nearest other
    config's, above or below as the physics orders them), the tree is the one config to deploy, so no tie
    lets a simpler launch win: `--emit` refuses it in one line naming it and --allow-lossy (exit 2,
    nothing written), and writes it with --allow-lossy."""
    con = connect(checked)
    ((tree_tps,),) = con.sql(
        "SELECT output_tok_s_per_gpu FROM results WHERE config_label = ?", params=[TREE]
    ).fetchall()
    others = [
        v
        for (v,) in con.sql(
            "SELECT output_tok_s_per_gpu FROM results WHERE config_label <> ?", params=[TREE]
        ).fetchall()
    ]
    con.close()
    above = [v for v in others if v > tree_tps]
    below = [v for v in others if v < tree_tps]
    if not below:  # the slowest: only it is at most the midpoint to the next one
        slo = f"output_tok_s_per_gpu<={(tree_tps + min(above)) / 2:.3f}"
    elif not above:  # the fastest: only it is at least the midpoint to the next one
        slo = f"output_tok_s_per_gpu>={(tree_tps + max(below)) / 2:.3f}"
    else:  # between: a band around it
        slo = (
            f"output_tok_s_per_gpu>={(tree_tps + max(below)) / 2:.3f},"
            f"output_tok_s_per_gpu<={(tree_tps + min(above)) / 2:.3f}"
        )
    dest = tmp_path / "deploy"
    best = ["best", str(checked), "--slo", slo, "--bootstrap", "200", "--emit", str(dest)]
    assert main(best) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert f"'{TREE}', is flagged lossy" in err[0] and "--allow-lossy" in err[-1]
    assert not dest.exists() or not any(dest.iterdir())
    assert main([*best, "--allow-lossy"]) == 0
    deploy = json.loads((dest / "deploy.json").read_text())
    assert deploy["static"]["config_label"] == TREE and list(deploy["lossy"]) == [TREE]
    assert (dest / "launch.sh").exists()


def test_plan_marks_a_config_lossy_by_design_when_an_accept_threshold_is_below_one(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A speculative launch with --speculative-accept-threshold-acc below 1.0 is marked lossy in the plan,
    before any launch; the same config at 1.0, and the baselines (no drafts to accept), are not."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "engine": "sim",
                "model_path": "/nodes/kimi-k25",
                "drafter": {"path": "/nodes/drafter"},
                "base_args": ["--tp-size", "8"],
                "speculative": {"chain_depths": [3]},
                "axes": {"acc": {"flag": "--speculative-accept-threshold-acc", "values": ["1.0", "0.5"]}},
                "load": {"concurrency": [1], "requests_per_level": 4},
            }
        )
    )
    configs = [
        "--target-config",
        str(FIXTURES / "kimi-k25"),
        "--draft-config",
        str(FIXTURES / "eagle3-draft"),
    ]
    assert main(["plan", str(spec), "--builtin-only", "--json", *configs]) == 0
    jobs = json.loads(capsys.readouterr().out)["jobs"]
    assert {j["label"]: j["lossy_by_design"] for j in jobs} == {
        "baseline [acc=1.0]": None,
        "chain d=3 [acc=1.0]": None,
        "baseline [acc=0.5]": None,
        "chain d=3 [acc=0.5]": "--speculative-accept-threshold-acc 0.5 below 1.0 accepts drafts the target "
        "would not pick",
    }
    assert main(["plan", str(spec), "--builtin-only", *configs]) == 0
    assert (
        "lossy by design: chain d=3 [acc=0.5]: --speculative-accept-threshold-acc 0.5"
        in capsys.readouterr().out
    )
