"""``specsweep plan SWEEP.yaml``: which jobs a sweep will run, and why each requested point is in or out."""

from __future__ import annotations

import argparse
import json

from harness.commands.base import Command
from harness.plan import POINT_STATUSES, Plan, check_prompt_set, plan_with_local_configs
from harness.spec import SweepSpec, load_spec
from specsweep.errors import SpecError


def add_validation_arguments(parser: argparse.ArgumentParser) -> None:
    """Options shared by ``plan`` and ``run``: how the grid is validated."""
    parser.add_argument(
        "--sglang-python",
        metavar="PATH",
        help="interpreter with SGLang for validation (default: the spec's sglang_python when it exists "
        "here, else .venv-sglang)",
    )
    parser.add_argument(
        "--builtin-only",
        action="store_true",
        help="validate with the built-in rules only (no SGLang process)",
    )
    parser.add_argument(
        "--target-config",
        metavar="DIR",
        help="local directory with the target's config.json (when model_path exists only on the nodes)",
    )
    parser.add_argument(
        "--draft-config",
        metavar="DIR",
        help="local directory with the converted drafter's config.json "
        "(when the drafter exists only on the nodes)",
    )


def validated_plan(spec: SweepSpec, args: argparse.Namespace) -> Plan:
    """``plan_with_local_configs`` with the validation flags of ``plan`` / ``run``."""
    return plan_with_local_configs(
        spec,
        sglang_python=args.sglang_python,
        use_resolver=not args.builtin_only,
        target_config_dir=args.target_config,
        draft_config_dir=args.draft_config,
    )


def require_jobs(plan: Plan, source: str) -> None:
    """Refuse a plan in which no point survived validation, showing why."""
    if plan.jobs:
        return
    reasons = "\n  ".join(f"{v.point.label}: {'; '.join(v.reasons) or 'invalid'}" for v in plan.dropped)
    raise SpecError(
        f"no valid point remains:\n  {reasons}", where=source, fix="correct base_args or the speculative grid"
    )


def plan_summary(plan: Plan) -> str:
    """What planning did, in lines a user reads before anything runs: the counts, then every dropped
    point with its reasons and every adjusted point with what SGLang changed."""
    by_status = {status: [v for v in plan.verdicts if v.status == status] for status in POINT_STATUSES}
    counts = ", ".join(f"{len(verdicts)} {status}" for status, verdicts in by_status.items() if verdicts)
    lines = [
        f"plan {plan.sweep_id}: {len(plan.verdicts)} point(s): {counts or 'none'} -> {len(plan.jobs)} job(s)"
    ]
    for status in ("invalid", "adjusted"):
        word = "dropped" if status == "invalid" else "adjusted"
        for v in by_status[status]:
            lines.append(f"  {word} {v.point.label}: {'; '.join(v.reasons) or 'no reason given'}")
    for label, why in lossy_by_design(plan).items():
        lines.append(f"  lossy {label}: {why} (best marks it, --emit refuses it without --allow-lossy)")
    return "\n".join(lines)


def lossy_by_design(plan: Plan) -> dict[str, str]:
    """Config label -> why its launch is lossy before it runs (an accept threshold below 1.0)."""
    return {job.config_label: why for job in plan.jobs if (why := job.lossy_by_design())}


def require_nothing_dropped(plan: Plan, source: str, *, allow_dropped: bool) -> None:
    """Refuse to run a plan that dropped points unless the user said a partial grid is fine."""
    if not plan.dropped or allow_dropped:
        return
    labels = ", ".join(v.point.label for v in plan.dropped)
    raise SpecError(
        f"{len(plan.dropped)} of {len(plan.verdicts)} point(s) would not run ({labels}); the reasons are "
        "listed above",
        where=source,
        fix="correct the spec (see `specsweep plan`), or pass --allow-dropped to run only the valid points",
    )


def _params(p: object) -> str:
    if p is None:
        return "-"
    d = p.as_dict()  # type: ignore[attr-defined]
    if d["speculative_algorithm"] is None:
        return "no speculation"
    text = (
        f"{d['speculative_algorithm']} s={d['speculative_num_steps']} k={d['speculative_eagle_topk']} "
        f"n={d['speculative_num_draft_tokens']}"
    )
    return text + (f" mrr={d['max_running_requests']}" if d["max_running_requests"] is not None else "")


def print_plan(plan: Plan) -> None:
    from rich.table import Table

    from harness.output import table_console

    jobs_of: dict[str, list[str]] = {}
    for job in plan.jobs:
        jobs_of.setdefault(job.config_id, []).append(job.job_id)
    table = Table(title=f"sweep {plan.sweep_id}: {len(plan.jobs)} job(s)", title_justify="left")
    for column in ("point", "requested", "effective", "status", "job id(s) / reasons"):
        table.add_column(column, overflow="fold")
    lossy_ids = {job.config_id for job in plan.jobs if job.lossy_by_design()}
    for v in plan.verdicts:
        detail = ", ".join(jobs_of.get(v.config_id, [])) if v.config_id else "; ".join(v.reasons)
        if v.config_id and v.reasons:
            detail += "\n" + "; ".join(v.reasons)
        status = v.status + (" LOSSY" if v.config_id in lossy_ids else "")
        table.add_row(v.point.label, _params(v.point.requested), _params(v.effective), status, detail)
    table_console().print(table)
    for label, why in lossy_by_design(plan).items():
        print(f"lossy by design: {label}: {why}")


def run(args: argparse.Namespace) -> int:
    spec, _ = load_spec(args.spec)
    check_prompt_set(spec)
    plan = validated_plan(spec, args)
    if args.json:
        print(json.dumps(plan.to_json_dict(), indent=2))
    else:
        print_plan(plan)
        if spec.search.strategy == "model":
            print(
                "search: model - these jobs are the space; `specsweep run` launches only those the search "
                "picks as results come in (docs/search.md)"
            )
    require_jobs(plan, args.spec)
    return 0


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("spec", metavar="SWEEP.yaml", help="the sweep spec")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    add_validation_arguments(parser)


COMMAND = Command(
    name="plan",
    help="expand and validate a sweep: requested -> effective config, status and job id of every point",
    add_arguments=add_arguments,
    run=run,
)
