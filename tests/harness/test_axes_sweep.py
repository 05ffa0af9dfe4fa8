"""A sweep over two server axes and the speculative grid, end to end on the embedded demo cluster (simulated
SGLang servers): every axis setting runs, the results carry the axes, and `best --axis` ranks per value."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from analysis.views import connect
from harness.cli import main
from tests.harness.sim_sweeps import run_on_simulated_cluster
from workers.convert.eagle3_format import SourceFormat
from workers.convert.fixtures import TINY, build_checkpoint, write_checkpoint, write_target_config

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Two simulated 8-GPU nodes run (baseline + chain d=3) x max-running-requests {2, 8} x
    SGLANG_ENABLE_SPEC_V2 {0, 1} at concurrency 8: eight short jobs; yields OUT."""
    root = tmp_path_factory.mktemp("axes")
    target = write_target_config(root / "target", TINY)
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")
    out = root / "out"
    data = {
        "engine": "sim",
        "model_path": str(target),
        "drafter": {"path": str(drafter), "format": "speculators"},
        "base_args": ["--tp-size", "8"],
        "speculative": {"chain_depths": [3]},
        "axes": {
            "mrr": {"flag": "--max-running-requests", "values": ["2", "8"]},
            "spec_v2": {"env": "SGLANG_ENABLE_SPEC_V2", "values": ["0", "1"]},
        },
        "load": {
            "concurrency": [8],
            "requests_per_level": 16,
            "warmup_requests": 1,
            "workload": {"kind": "random_ids", "input_tokens": 8, "output_tokens": 24, "vocab_size": 256},
        },
        "retries": 1,
        "timeouts": {"startup_s": 60, "level_s": 120, "stop_s": 5, "placement_s": 120},
        "env": {"SPECSWEEP_SIM_TIME_SCALE": "0.05"},
        "output_dir": str(out),
    }
    plan, summary = run_on_simulated_cluster(data, root, nodes=2, gpus_per_node=8, cpus_per_node=2)
    assert summary.counts["done"] == len(plan.jobs) == 8
    yield out


def test_results_carry_each_jobs_axis_values_when_the_sweep_has_axes(swept: Path) -> None:
    """jobs.axes and the job_axes view name every job's setting; the simulated server ran the swept
    --max-running-requests (it reports it, and no more requests than that ran at once)."""
    con = connect(swept)
    rows = con.sql(
        "SELECT config_label, axes, effective_max_running_requests FROM jobs ORDER BY config_label"
    ).fetchall()
    assert len(rows) == 8
    for label, axes, mrr in rows:
        values = json.loads(axes)
        assert list(values) == ["mrr", "spec_v2"]
        assert label.endswith(f"[mrr={values['mrr']} spec_v2={values['spec_v2']}]")
        assert mrr == int(values["mrr"])
    per_value = dict(
        con.sql(
            "SELECT a.value, avg(r.output_tok_s) FROM results r JOIN job_axes a USING (sweep_id, job_id) "
            "WHERE a.axis = 'mrr' GROUP BY a.value"
        ).fetchall()
    )
    assert per_value["8"] > 1.5 * per_value["2"], "8 streams on 2 slots should be far slower than on 8"


def test_best_ranks_within_each_axis_value_when_axis_given(
    swept: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`best --axis mrr` gives one ranking per value, each of only the configs run at that value and with
    speedups over the baseline run at it; without --axis the labels tell every setting apart."""
    assert main(["best", str(swept), "--axis", "mrr", "--format", "json", "--bootstrap", "200"]) == 0
    rankings = json.loads(capsys.readouterr().out)
    assert rankings["axis"] == "mrr" and [v["value"] for v in rankings["values"]] == ["2", "8"]
    for ranking in rankings["values"]:
        (level,) = ranking["levels"]
        labels = {r["config_label"] for r in level["ranked"]} | {e["config_label"] for e in level["excluded"]}
        assert len(labels) == 4 and all(f"mrr={ranking['value']} " in label for label in labels)
        assert f"mrr={ranking['value']} " in level["baseline_label"]
    assert main(["best", str(swept), "--bootstrap", "200"]) == 0
    text = capsys.readouterr().out
    assert all(f"[mrr={m} spec_v2={v}]" in text for m in "28" for v in "01")
    assert main(["best", str(swept), "--axis", "nope"]) == 2
    assert "has no server axis 'nope'" in capsys.readouterr().err


def test_best_emit_deploys_the_winners_environment_when_an_axis_is_an_environment_variable(
    swept: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An environment-variable axis is part of the launch: deploy.json's recommended launch carries the
    winner's value of SGLANG_ENABLE_SPEC_V2 (and the spec's env), launch.sh exports it before its exec,
    and every `launch:` line `best` prints starts with the variables its config ran with."""
    dest = tmp_path / "deploy"
    assert main(["best", str(swept), "--emit", str(dest), "--bootstrap", "200"]) == 0
    capsys.readouterr()
    result = json.loads((dest / "deploy.json").read_text())
    chosen = result[result["recommended"]]
    label = result["static"]["config_label"] if result["recommended"] == "static" else None
    value = chosen["env"]["SGLANG_ENABLE_SPEC_V2"]
    assert value in ("0", "1") and chosen["env"]["SPECSWEEP_SIM_TIME_SCALE"] == "0.05"
    if label is not None:
        assert label.endswith(f"spec_v2={value}]")
    script = (dest / "launch.sh").read_text()
    assert f"\nexport SGLANG_ENABLE_SPEC_V2={value}\n" in script
    assert script.index("export SGLANG_ENABLE_SPEC_V2") < script.index("\nexec ")
    assert main(["best", str(swept), "--bootstrap", "200"]) == 0
    launches = [line.strip() for line in capsys.readouterr().out.splitlines() if "launch:" in line]
    assert launches and all(
        line.startswith("launch: SGLANG_ENABLE_SPEC_V2=") and " -m sglang.launch_server " in line
        for line in launches
    )
