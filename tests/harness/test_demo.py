"""The demo end to end, at a reduced size: its best config per level is the simulator's true best."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from analysis.select import select_best
from analysis.views import connect
from harness.demo import demo_spec, prepare_output, simulated_cluster, write_demo_inputs
from harness.driver import run_sweep
from harness.plan import plan_with_local_configs
from harness.progress import progress_for
from harness.spec import parse_spec
from workers.sim.model import DEFAULT_PROFILE, Load, ground_truth

pytestmark = pytest.mark.ray

DURATION_S = 6.0  # the demo runs 8 s per level; fewer requests at concurrency 1 let acceptance luck decide


@pytest.fixture(scope="module")
def demo_out(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo spec, 3 s per level, run on two simulated 8-GPU nodes (builtin validation: fast)."""
    out = tmp_path_factory.mktemp("demo") / "results"
    prepare_output(out)
    spec, _ = demo_spec(out, write_demo_inputs(out))
    data = spec.model_dump(mode="json")
    data["load"]["duration_s"] = DURATION_S
    spec = parse_spec(data, source="reduced demo")
    plan = plan_with_local_configs(spec, use_resolver=False)
    with simulated_cluster(nodes=2, gpus_per_node=8, cpus_per_node=2) as address:
        summary = run_sweep(
            spec,
            "reduced demo\n",
            plan,
            out,
            ray_address=address,
            resume=False,
            progress=progress_for(sys.stdout),
        )
    assert summary.counts["done"] == len(plan.jobs) == 5
    return out


def _true_winner(con, level: str, concurrency: int) -> str:
    """The config with the highest true throughput for this level's measured request count."""
    rows = con.sql(
        "SELECT j.config_label, j.effective_speculative_algorithm, j.effective_speculative_num_steps, "
        "j.effective_speculative_eagle_topk, j.effective_speculative_num_draft_tokens, "
        "j.effective_max_running_requests, count(*) "
        "FROM requests r JOIN jobs j USING (sweep_id, job_id) "
        "WHERE r.load_level = ? AND NOT r.warmup GROUP BY ALL",
        params=[level],
    ).fetchall()
    from workers.sglang import SpecParams

    truth = {
        label: ground_truth(
            DEFAULT_PROFILE,
            SpecParams(algo, steps, topk, draft, mrr),
            Load(concurrency=concurrency, input_len=256, output_len=128, num_requests=n),
        ).output_throughput
        for label, algo, steps, topk, draft, mrr, n in rows
    }
    assert len(truth) == 5
    return max(truth, key=truth.__getitem__)


def test_demo_picks_simulators_true_best_config_when_run_at_each_level(demo_out: Path) -> None:
    """At every concurrency level the demo's winner is the config the performance model says is fastest:
    the wide tree alone, a short chain under load (the crossover the demo exists to show)."""
    con = connect(demo_out)
    selection = select_best(con, demo_out)
    winners = {level.load_level: level.winner.config_label for level in selection.levels}
    assert set(winners) == {"concurrency=1", "concurrency=16", "concurrency=64"}
    for level, winner in winners.items():
        assert winner == _true_winner(con, level, int(level.split("=")[1])), (level, winner)
    assert winners["concurrency=1"] != winners["concurrency=64"]
    con.close()


def test_demo_winner_command_is_an_sglang_launch_when_engine_is_sim(demo_out: Path) -> None:
    """The printed command is SGLang's (`-m sglang.launch_server`), with the effective speculative flags."""
    con = connect(demo_out)
    selection = select_best(con, demo_out)
    con.close()
    for level in selection.levels:
        command = level.winner.launch_command
        assert " -m sglang.launch_server " in command and "workers.sim" not in command
        assert "--speculative-num-draft-tokens" in command or level.winner.is_baseline


def test_demo_command_refuses_foreign_output_directory_when_not_empty(tmp_path: Path) -> None:
    """`specsweep demo --out DIR` never deletes a directory it did not write."""
    (tmp_path / "precious.txt").write_text("keep me")
    proc = subprocess.run(
        [sys.executable, "-m", "harness.cli", "demo", "--out", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2
    assert "holds no earlier demo" in proc.stderr and "Traceback" not in proc.stderr
    assert (tmp_path / "precious.txt").read_text() == "keep me"


def test_demo_stores_client_delay_calibration_when_levels_ran(demo_out: Path) -> None:
    """Each level keeps the load generator's loopback calibration; the sweep row holds their median."""
    con = connect(demo_out)
    levels = con.sql("SELECT client_delay_p50_us, client_delay_p99_us FROM levels").fetchall()
    ((p50, p99),) = con.sql("SELECT client_delay_p50_us, client_delay_p99_us FROM sweep").fetchall()
    con.close()
    assert len(levels) == 15 and all(a is not None and b is not None and 0 < a <= b for a, b in levels)
    assert p50 is not None and 0 < p50 <= p99
