"""The demo sweep's TTFT p99 at each level against the simulator's steady-state truth.

Runs `specsweep demo`'s own sweep (examples/demo.yaml as shipped: 12 s levels, a 1 s ramp-up, the default
category mix) on the demo's default number of simulated 8-GPU nodes, then compares every config's TTFT p99
in each level's window (the `levels` view) with ``workers.sim.model.steady_state`` on the default preset for
the same config, concurrency, prompt length, mix and launch factor. Without the ramp-up and the window,
TTFT p99 at 64 streams is the start-up burst of 64 simultaneous prefills, not the steady tail (on the
default preset 46 ms for the baseline to 88 ms for the wide tree; on the old linear profile the burst was
676 to 692 ms and the tail 50 to 434 ms).

The demo runs at real time, so what it measures also holds the machine's own scheduling delays: run it on a
machine doing nothing else. Every result line says how many cores other processes used meanwhile
(``other_cpu_cores``). One busy loop elsewhere on 2 cores moved the baseline's p99 from within 4% to +16%:
the simulated server read some requests after it had begun the prefill they should have joined, so they
waited for the next one (+7 ms), and first tokens were written and read later (+3 ms).
Goal (issue #14): at 64 streams every config's TTFT p99 within 25% of the steady-state truth.
Run: ``.venv/bin/python -m bench.demo_ttft`` (about 2 minutes on 2 cores: the demo's five jobs run in one round).
"""

from __future__ import annotations

import io
import sys
import tempfile
from pathlib import Path

from bench.common import OtherCpu, emit

GOAL_CONCURRENCY = 64
TOLERANCE = 0.25


def run_demo(out: Path) -> list[tuple[str, int, float, float]]:
    """(config label, concurrency, measured TTFT p99 ms, true TTFT p99 ms) of every config and level."""
    from analysis.views import connect
    from harness.commands.demo import DEMO_NODES
    from harness.demo import demo_spec, prepare_output, simulated_cluster, write_demo_inputs
    from harness.driver import run_sweep
    from harness.plan import plan_with_local_configs
    from harness.progress import LogProgress
    from workers.sglang import SpecParams
    from workers.sim.model import DEFAULT_MIX, Load, steady_state
    from workers.sim.presets import DEFAULT_PRESET
    from workers.sim.reported import job_launch_factors

    prepare_output(out)
    spec, text = demo_spec(out, write_demo_inputs(out))
    plan = plan_with_local_configs(spec, use_resolver=False)
    with simulated_cluster(DEMO_NODES, spec.gpus_per_server, cpus_per_node=2) as address:
        summary = run_sweep(
            spec, text, plan, out, ray_address=address, resume=False, progress=LogProgress(io.StringIO())
        )
    assert summary.counts["failed"] == 0, summary
    con = connect(out)
    try:
        factors = job_launch_factors(con)
        rows = con.sql(
            "SELECT j.config_label, l.concurrency, l.ttft_p99_ms, j.effective_speculative_algorithm, "
            "j.effective_speculative_num_steps, j.effective_speculative_eagle_topk, "
            "j.effective_speculative_num_draft_tokens, j.effective_max_running_requests, "
            "(SELECT round(avg(r.prompt_tokens)) FROM requests r WHERE r.sweep_id = l.sweep_id "
            " AND r.job_id = l.job_id AND r.load_level = l.load_level AND NOT r.warmup) "
            "FROM levels l JOIN jobs j USING (sweep_id, job_id) ORDER BY l.concurrency, j.config_label"
        ).fetchall()
    finally:
        con.close()
    ramp_up_s = spec.load.ramp_up_s
    found = []
    for label, concurrency, p99_ms, algo, steps, topk, draft, mrr, prompt in rows:
        truth = steady_state(
            DEFAULT_PRESET,
            SpecParams(algo, steps, topk, draft, mrr),
            Load(concurrency, int(prompt), spec.load.workload.max_tokens, 0, mix=DEFAULT_MIX),
            ramp_up_s=ramp_up_s,
            factor=factors[label],
        )
        found.append((label, concurrency, p99_ms, truth.ttft_p99_s * 1e3))
    return found


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="specsweep-ttft-") as root, OtherCpu() as others:
        found = run_demo(Path(root) / "demo")
    print(f"# other processes used {others.cores:.2f} cores during the sweep (0 on an idle machine)")
    within = True
    for label, concurrency, measured_ms, true_ms in found:
        deviation = measured_ms / true_ms - 1.0
        print(f"# c={concurrency:<3} {label:<20} TTFT p99 {measured_ms:7.1f} ms, truth {true_ms:7.1f} ms, "
              f"{deviation:+.1%}")  # fmt: skip
        if concurrency == GOAL_CONCURRENCY:
            within &= abs(deviation) <= TOLERANCE
            emit("demo_ttft_p99_vs_steady_truth", "ratio", measured_ms / true_ms, goal=f"within {TOLERANCE:.0%}",
                 meets_goal=abs(deviation) <= TOLERANCE, config=label, concurrency=concurrency,
                 measured_ms=measured_ms, truth_ms=true_ms, other_cpu_cores=round(others.cores, 3))  # fmt: skip
    return 0 if within else 1


if __name__ == "__main__":
    sys.exit(main())
