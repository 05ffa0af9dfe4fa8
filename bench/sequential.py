"""Sequential levels on the demo sweep: level time with ``load.precision`` vs every level in full.

Runs examples/demo.yaml (the simulated server, two simulated 8-GPU nodes) twice, with levels of at most
24 s (the demo's own 12 s end before the 64-stream levels have had the three rounds per stream the rule
waits for): every level in full, and with ``load.precision: 0.05`` (a closed-loop level stops once its
throughput's 95% interval is narrower than 5%). Reports the summed level time of both runs, the cut,
how many levels stopped for precision, and whether ``best`` picks the same winner at every level.
Goal (issue #16): level time cut >= 30% with the same winners. Run: ``.venv/bin/python -m bench.sequential``
(about 7 minutes on 2 cores on the default preset).
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

import yaml

from bench.common import emit

PRECISION = 0.05
DURATION_S = 24.0
CUT_GOAL = 0.30


def run_demo(out: Path, precision: float | None) -> tuple[float, dict[str, str], int]:
    """(summed level seconds, winner label per level, levels stopped for precision) of one demo run."""
    from analysis.select import select_best
    from analysis.views import connect
    from harness.demo import demo_spec, simulated_cluster, write_demo_inputs
    from harness.driver import run_sweep
    from harness.plan import plan_with_local_configs
    from harness.progress import LogProgress
    from harness.spec import parse_spec

    inputs = write_demo_inputs(out)
    _, text = demo_spec(out, inputs)
    data = yaml.safe_load(text)
    data["load"]["duration_s"] = DURATION_S
    if precision is not None:
        data["load"]["precision"] = precision
    text = yaml.safe_dump(data, sort_keys=False)
    spec = parse_spec(data)
    plan = plan_with_local_configs(spec, use_resolver=False)
    with simulated_cluster(2, spec.gpus_per_server, cpus_per_node=2) as address:
        summary = run_sweep(
            spec, text, plan, out, ray_address=address, resume=False, progress=LogProgress(io.StringIO())
        )
    assert summary.counts["failed"] == 0, summary
    con = connect(out)
    try:
        seconds, stopped = con.execute(
            "SELECT sum(duration_s), count(*) FILTER (WHERE stop_reason = 'precision') FROM results"
        ).fetchall()[0]
        selection = select_best(con, out)
    finally:
        con.close()
    winners = {lv.load_level: lv.winner.config_label if lv.winner else "-" for lv in selection.levels}
    return float(seconds), winners, int(stopped)


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="specsweep-seq-") as root:
        full_s, full_winners, _ = run_demo(Path(root) / "full", None)
        seq_s, seq_winners, stopped = run_demo(Path(root) / "sequential", PRECISION)
    cut = 1.0 - seq_s / full_s
    same = full_winners == seq_winners
    print(f"# demo sweep: levels in full {full_s:.1f} s, with load.precision {PRECISION}: {seq_s:.1f} s")
    print(f"# levels stopped for precision: {stopped}; winners full {full_winners}")
    print(f"#                                       winners sequential {seq_winners}")
    emit("sequential_level_time_cut", "fraction", cut, goal=f">= {CUT_GOAL}", meets_goal=cut >= CUT_GOAL,
         same_winners=same, full_level_s=full_s, sequential_level_s=seq_s, precision=PRECISION)  # fmt: skip
    return 0 if cut >= CUT_GOAL and same else 1


if __name__ == "__main__":
    sys.exit(main())
