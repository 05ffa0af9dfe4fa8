"""``specsweep run SWEEP.yaml``: plan the sweep, then run it on a Ray cluster (or an embedded one)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from harness.commands.base import Command
from harness.commands.plan import (
    add_validation_arguments,
    plan_summary,
    require_jobs,
    require_nothing_dropped,
    validated_plan,
)
from harness.plan import check_prompt_set, unchecked_plan
from harness.spec import load_spec
from specsweep.errors import DiskFullError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SWEEP.yaml", help="the sweep spec")
    parser.add_argument(
        "--out",
        metavar="DIR|URI",
        help="results directory, or an s3:// or gs:// URI (default: the spec's output_dir)",
    )
    parser.add_argument(
        "--state-dir",
        metavar="DIR",
        help="object-store --out: where this host keeps the sweep's queue (default: a directory under "
        "$SPECSWEEP_STATE_DIR keyed by the URI; docs/cluster.md)",
    )
    parser.add_argument(
        "--ray-address",
        default="auto",
        metavar="local|auto|ADDR",
        help="local: start an embedded Ray; auto: the running cluster (as under `ray job submit`); or an "
        "address (default: auto)",
    )
    parser.add_argument("--resume", action="store_true", help="continue the sweep already in --out")
    parser.add_argument(
        "--no-validate",
        action="store_true",
        help="run every grid point as written, without validation (SGLang itself judges each launch)",
    )
    parser.add_argument(
        "--allow-dropped",
        action="store_true",
        help="run the valid points even when validation dropped some (default: refuse, listing why)",
    )
    parser.add_argument(
        "--confirm",
        action="store_true",
        help="after the sweep, launch the adaptive schedule built from its per-level winners on the same "
        "load levels (the spec's confirm_adaptive; also adds it to a finished sweep with --resume)",
    )
    parser.add_argument(
        "--accept-changed-inputs",
        action="store_true",
        help="with --resume: measure inputs changed in place since the sweep ran (prompt files, drafter, "
        "target configs, engine) under new job ids, kept apart from the earlier results",
    )
    add_validation_arguments(parser)


def run(args: argparse.Namespace) -> int:
    from harness.progress import progress_for
    from harness.results import output_for
    from harness.startup import sweep_start

    spec, text = load_spec(args.spec)
    if args.confirm:
        spec = spec.model_copy(update={"confirm_adaptive": True})
    location = args.out or spec.output_dir
    out = output_for(location, args.state_dir)  # a malformed URI is refused before planning
    check_prompt_set(spec)
    progress = progress_for(sys.stdout)
    how = "as written (--no-validate)" if args.no_validate else _validation(args)
    try:
        # The queue exists from here on: `specsweep status OUT` says "planning" while this runs.
        with sweep_start(out, spec.sweep_id(), resume=args.resume, detail=how) as start:
            progress.event(f"planning {spec.sweep_id()}: {how}")
            plan = unchecked_plan(spec) if args.no_validate else validated_plan(spec, args)
            print(plan_summary(plan), flush=True)
            require_jobs(plan, args.spec)
            require_nothing_dropped(plan, args.spec, allow_dropped=args.allow_dropped)
            from harness.driver import run_sweep  # imports Ray: after the queue exists

            summary = run_sweep(
                spec,
                text,
                plan,
                out,
                ray_address=args.ray_address,
                resume=args.resume,
                progress=progress,
                accept_changed_inputs=args.accept_changed_inputs,
                start=start,
            )
    except DiskFullError as err:
        raise DiskFullError(
            err.problem,
            where=err.where,
            fix=f"free space on that disk, then continue with `{resume_command(args, location)}`",
        ) from None
    finally:
        progress.close()
    counts = summary.counts
    print(
        f"sweep {plan.sweep_id}: done {counts['done']}, failed {counts['failed']}, pending {counts['pending']} "
        f"-> {location}"
    )
    if summary.interrupted:
        print(f"interrupted: continue with `{resume_command(args, location)}`", file=sys.stderr)
        return 130
    return 1 if counts["failed"] else 0


def _validation(args: argparse.Namespace) -> str:
    """How planning will validate the grid, in words (the progress line and ``status`` show it)."""
    if args.builtin_only:
        return "validating the grid with the built-in rules"
    return "validating the grid with SGLang's resolver (a few seconds per point)"


def resume_command(args: argparse.Namespace, out: str | Path) -> str:
    """The command that continues this sweep: the same spec, OUT, state directory and Ray address, plus
    --resume."""
    argv = ["specsweep", "run", args.spec, "--out", str(out), "--resume"]
    if getattr(args, "confirm", False):
        argv.append("--confirm")
    if getattr(args, "state_dir", None):
        argv += ["--state-dir", args.state_dir]
    if args.ray_address != "auto":
        argv += ["--ray-address", args.ray_address]
    return shlex.join(argv)


COMMAND = Command(
    name="run",
    help="run a sweep on a Ray cluster: every valid point, every load level, results as Parquet",
    add_arguments=add_arguments,
    run=run,
)
