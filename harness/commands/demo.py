"""``specsweep demo``: a whole sweep on simulated 8-GPU nodes, then the best config per level."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from harness.commands.base import Command

# Simulated nodes by default: one per job of examples/demo.yaml (its five configs), so its jobs run in one
# round and the demo takes one job's time (three levels of 12 s), not two. At 64 streams the five real-time
# servers send about 6,100 chunks/s in all (740 for the tree to 1,760 for the baseline), well below the
# ~45,000 a 2-core machine serves; the first round of three sent about 4,500.
DEMO_NODES = 5


def _node_count(text: str) -> int:
    """--nodes: at least one simulated node (with none, no server slot could ever be placed)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r} is not a node count (a whole number, 1 or more)")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--out", type=Path, default=Path("results/demo"), help="results directory (default: results/demo)"
    )
    parser.add_argument(
        "--nodes", type=_node_count, default=DEMO_NODES, help=f"simulated 8-GPU nodes (default: {DEMO_NODES})"
    )
    parser.add_argument(
        "--nodes-per-server",
        type=_node_count,
        default=1,
        help="nodes each server spans, TP over all their GPUs (e.g. --nodes 4 --nodes-per-server 2: two "
        "TP16 servers at a time; default: 1)",
    )


def _print_winners(out: Path) -> None:
    from analysis.select import select_best
    from analysis.views import connect
    from harness.deploy_launch import deploy_launches

    con = connect(out)
    try:
        selection = select_best(con, out)
        launches = deploy_launches(con)
    finally:
        con.close()
    print(f"\nbest config per load level (ranked by {selection.objective}, {selection.objective_unit}):")
    for level in selection.levels:
        winner = level.winner
        if winner is None:
            print(f"  {level.load_level}: no config meets the SLOs")
            continue
        speedup = f"{winner.speedup:.2f}x" if winner.speedup is not None else "n/a"
        ci = (
            f" (95% CI {winner.speedup_ci.low:.2f}-{winner.speedup_ci.high:.2f})" if winner.speedup_ci else ""
        )
        print(f"  {level.load_level}: {winner.config_label}, {speedup} vs no speculation{ci}")
        launch = launches.get(winner.config_label)
        print(f"      {launch.command if launch else '(launch command unknown)'}")
        if launch is not None and launch.drafter_note:
            print(f"      drafter: {launch.drafter_note}")


def _write_report(out: Path) -> Path:
    from analysis.report import render_report, write_report
    from analysis.select import select_best
    from analysis.views import connect
    from harness.commands.report import server_timeline
    from harness.deploy_launch import deploy_launches

    con = connect(out)
    try:
        page = render_report(con, select_best(con, out), server_timeline(), launches=deploy_launches(con))
    finally:
        con.close()
    return write_report(page, out / "report.html")


def run(args: argparse.Namespace) -> int:
    from harness.demo import demo_spec, prepare_output, simulated_cluster, write_demo_inputs
    from harness.driver import run_sweep
    from harness.plan import plan_with_local_configs
    from harness.progress import progress_for
    from workers.sglang import default_sglang_python

    started = time.monotonic()
    out: Path = args.out
    prepare_output(out)
    inputs = write_demo_inputs(out)
    spec, text = demo_spec(out, inputs, nodes_per_server=args.nodes_per_server)
    use_resolver = default_sglang_python() is not None
    print(
        f"planning {out}: validating every grid point ({'SGLang 0.5.23' if use_resolver else 'built-in rules'})"
    )
    plan = plan_with_local_configs(spec, use_resolver=use_resolver)
    servers = f", servers of {args.nodes_per_server} nodes" if args.nodes_per_server > 1 else ""
    print(f"{len(plan.jobs)} jobs on {args.nodes} simulated 8-GPU nodes{servers}")
    with simulated_cluster(args.nodes, spec.gpus_per_server, cpus_per_node=2) as address:
        progress = progress_for(sys.stdout)
        try:
            summary = run_sweep(spec, text, plan, out, ray_address=address, resume=False, progress=progress)
        finally:
            progress.close()
    if summary.interrupted:
        return 130
    _print_winners(out)
    report = _write_report(out)
    print(f"\nreport: {report}")
    print(f"done in {time.monotonic() - started:.0f} s; query the results with `specsweep sql {out}`")
    return 1 if summary.counts["failed"] else 0


COMMAND = Command(
    name="demo",
    help="run a small sweep on the simulated SGLang server (no GPU) and print the best config",
    add_arguments=add_arguments,
    run=run,
)
