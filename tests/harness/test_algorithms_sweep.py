"""examples/deepseek-v3-algorithms.yaml end to end on the embedded demo cluster (simulated SGLang servers):
EAGLE3 vs NEXTN vs NGRAM, the algorithm in the results, `best --axis speculative_algorithm` per algorithm."""

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

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "deepseek-v3-algorithms.yaml"
REPETITIVE = "def add_one(x): return x + 1 " * 12  # an n-gram cache drafts most of this


@pytest.fixture(scope="module")
def swept(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The example with the node paths replaced by a tiny DeepSeek-V3-shaped target (one MTP layer) and a
    tiny EAGLE3 drafter, on two simulated 8-GPU nodes: baseline + chains 2 and 4 per algorithm, one
    level of 4 streams over repetitive prompts; yields OUT."""
    root = tmp_path_factory.mktemp("algorithms")
    target = write_target_config(root / "target", TINY)
    config = json.loads((target / "config.json").read_text())
    (target / "config.json").write_text(json.dumps({**config, "num_nextn_predict_layers": 1}))
    drafter = write_checkpoint(build_checkpoint(SourceFormat.SPECULATORS, TINY), root / "drafter")
    prompts = root / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": f"{REPETITIVE} # {i}"}) + "\n" for i in range(8)))
    out = root / "out"
    data = yaml.safe_load(EXAMPLE.read_text())
    data.update(
        engine="sim",
        sglang_python=None,
        model_path=str(target),
        drafter={"path": str(drafter), "format": "speculators"},
        load={
            "concurrency": [4],
            "requests_per_level": 12,
            "warmup_requests": 1,
            "workload": {"kind": "prompt_set", "path": str(prompts), "max_tokens": 48},
        },
        retries=1,
        timeouts={"startup_s": 60, "level_s": 120, "stop_s": 5, "placement_s": 120},
        env={"SPECSWEEP_SIM_TIME_SCALE": "0.05"},
        output_dir=str(out),
    )
    data["speculative"]["chain_depths"] = [2, 4]
    plan, summary = run_on_simulated_cluster(data, root, nodes=2, gpus_per_node=8, cpus_per_node=2)
    assert summary.counts["done"] == len(plan.jobs) == 7
    yield out


def test_results_carry_the_algorithm_and_its_acceptance_when_algorithms_are_compared(swept: Path) -> None:
    """jobs.axes names each job's algorithm (the baseline has none); only the EAGLE3 jobs converted and
    loaded the drafter (their inputs carry its digest); NEXTN ran as EAGLE on the target's MTP layer, and
    NGRAM accepted several tokens per step on prompts that repeat themselves, with no draft model."""
    con = connect(swept)
    rows = con.sql(
        "SELECT j.config_label, j.axes, j.input_digests, j.effective_speculative_algorithm, "
        "avg(r.accept_length_mean) FROM jobs j LEFT JOIN results r USING (sweep_id, job_id) "
        "GROUP BY ALL ORDER BY 1"
    ).fetchall()
    assert len(rows) == 7
    accept: dict[str, list[float]] = {}
    for label, axes, digests, effective, accept_length in rows:
        if label == "baseline":
            assert axes is None and effective is None
            continue
        algorithm = json.loads(axes)["speculative_algorithm"]
        assert label.endswith(f"[speculative_algorithm={algorithm}]")
        assert ("drafter" in json.loads(digests)) == (algorithm == "EAGLE3"), label
        assert effective == {"EAGLE3": "EAGLE3", "NEXTN": "EAGLE", "NGRAM": "NGRAM"}[algorithm]
        accept.setdefault(algorithm, []).append(accept_length)
    assert sorted(accept) == ["EAGLE3", "NEXTN", "NGRAM"]
    assert min(accept["NGRAM"]) > 1.5


def test_best_ranks_each_algorithm_against_the_one_baseline_when_axis_is_the_algorithm(
    swept: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`best --axis speculative_algorithm` gives one ranking per algorithm, each of that algorithm's
    chains with speedups over the sweep's one baseline."""
    argv = ["best", str(swept), "--axis", "speculative_algorithm", "--format", "json", "--bootstrap", "200"]
    assert main(argv) == 0
    rankings = json.loads(capsys.readouterr().out)
    assert [v["value"] for v in rankings["values"]] == ["EAGLE3", "NEXTN", "NGRAM"]
    for ranking in rankings["values"]:
        (level,) = ranking["levels"]
        assert level["baseline_label"] == "baseline"
        labels = {r["config_label"] for r in level["ranked"]} | {e["config_label"] for e in level["excluded"]}
        assert labels - {"baseline"} == {
            f"chain d={d} [speculative_algorithm={ranking['value']}]" for d in (2, 4)
        }


def test_report_shows_every_algorithms_configs_when_algorithms_are_compared(
    swept: Path, tmp_path: Path
) -> None:
    """`report` lists each algorithm's chains under their own labels beside the one baseline."""
    html = tmp_path / "report.html"
    assert main(["report", str(swept), "-o", str(html), "--bootstrap", "200"]) == 0
    text = html.read_text()
    for algorithm in ("EAGLE3", "NEXTN", "NGRAM"):
        assert f"chain d=4 [speculative_algorithm={algorithm}]" in text
