"""``specsweep best OUT --emit DIR``: the launch to deploy, its adaptive alternative, and the drafter's provenance.

Files (each written under a temporary name and renamed; when one cannot be written, those already
written by this call are removed again and the error is one line naming DIR):

- ``DIR/deploy.json``: the weights, the static and adaptive candidates with their mix scores, both
  launch argvs and their validation, which one is recommended, the candidates tied on the mix (``tie``)
  and why the simpler launch was preferred inside a tie (``preference``), and the drafter's provenance;
- ``DIR/launch.sh``: the recommended launch as one shell line; for a server over N nodes
  (``nodes_per_server``) instead ``DIR/launch-rank0.sh`` .. ``launch-rank<N-1>.sh``, one per node, each
  taking rank 0's ``HOST:PORT`` from ``$DIST_INIT_ADDR`` (every rank validated with SGLang's resolver);
- ``DIR/adaptive.json``: the ``--speculative-adaptive-config`` file, when a schedule was built.

The launch names the model and drafter as the spec does (a drafter that needed conversion by where
``specsweep convert`` publishes it, ``--publish-drafter``), and no listen address or node-local path.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shlex
from contextlib import suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analysis.deploy import config_shapes, level_concurrency, plan_deployment
from analysis.lossless import lossless_summary, refuse_lossy
from analysis.store import write_local_atomic
from harness.deploy_launch import (
    DrafterTarget,
    drafter_target,
    export_lines,
    measured_args,
    measured_env,
    sweep_spec,
)
from harness.spec import SweepSpec
from specsweep.errors import ResultsError, disk_full_error, is_disk_full
from workers.sglang import deploy as sglang_deploy
from workers.sglang import multinode
from workers.sglang.rules import read_model_config
from workers.sglang.validate import validate_many

if TYPE_CHECKING:
    import duckdb

    from analysis.confirmation import Confirmation
    from analysis.select import Selection

CONVERSION_REPORT = "conversion.json"  # what `specsweep convert` writes next to the converted weights


def emit(
    con: duckdb.DuckDBPyConnection,
    selection: Selection,
    dest: Path,
    *,
    publish_drafter: str | None = None,
    use_resolver: bool = True,
    confirmation: Confirmation | None = None,
    allow_lossy: bool = False,
) -> dict[str, Any]:
    """Plan the deployment of ``selection``'s sweep, write the files into ``dest``, return deploy.json's
    object. With a measured ``confirmation`` the recommendation follows its measured mix score. A config
    the lossless check flagged is refused (``LossyConfigError``) unless ``allow_lossy``."""
    spec = sweep_spec(con)
    deployment = plan_deployment(
        selection, config_shapes(con), level_concurrency(con), spec.deploy_weights or None
    )
    lossless = lossless_summary(con)
    flagged = lossless.flagged() if lossless else {}
    deployed = [deployment.static.config_label]
    if deployment.adaptive is not None:
        deployed += [deployment.adaptive.chain_label, *deployment.adaptive.chosen.values()]
    refuse_lossy(deployed, flagged, allow_lossy=allow_lossy)
    argvs = measured_args(con)
    envs = measured_env(con, spec)
    target = drafter_target(spec, publish_drafter, emitting=True)
    drafter = _drafter_provenance(con, spec, target)
    python = spec.sglang_python or "python3"

    def portable(label: str) -> list[str]:
        return sglang_deploy.deploy_args(
            argvs[label], model_path=spec.model_path, draft_path=target.published if target else None
        )

    static_args = portable(deployment.static.config_label)
    files = _Files(dest)
    adaptive: dict[str, Any] | None = None
    launches = [static_args]
    if deployment.adaptive is not None:
        schedule = deployment.adaptive.steps_by_batch_size
        config = sglang_deploy.adaptive_config(schedule)
        config_path = files.write("adaptive.json", (json.dumps(config, indent=2) + "\n").encode())
        adaptive_args = sglang_deploy.adaptive_args(
            portable(deployment.adaptive.chain_label), schedule, str(config_path)
        )
        adaptive = {**dataclasses.asdict(deployment.adaptive), "config": config}
        launches.append(adaptive_args)
    validations = _validations(spec, con, use_resolver, launches)
    result: dict[str, Any] = {
        "sweep_id": selection.sweep_id,
        "objective": selection.objective,
        "slos": list(selection.slos),
        "request_slos": list(selection.request_slos),
        "weights": deployment.weights,
        "recommended": confirmation.recommended if confirmation else deployment.recommended,
        "tie": list(deployment.tie),
        "preference": [
            *deployment.preference,
            *([confirmation.preference] if confirmation and confirmation.preference else []),
        ],
        "confirmation": dataclasses.asdict(confirmation) if confirmation else None,
        "static": {
            **dataclasses.asdict(deployment.static),
            "argv": sglang_deploy.command(python, static_args),
            "env": envs.get(deployment.static.config_label, {}),
            "validation": validations[0],
        },
        "adaptive": None,
        "adaptive_note": deployment.adaptive_note,
        "drafter": drafter,
        "lossy": {label: why for label, why in flagged.items() if label in deployed},  # with --allow-lossy
    }
    if adaptive is not None:
        result["adaptive"] = {
            **adaptive,
            "argv": sglang_deploy.command(python, launches[1]),
            "env": envs.get(adaptive["chain_label"], {}),
            "validation": validations[1],
        }
    if result["adaptive"] is None:
        result["recommended"] = "static"
    chosen = result[result["recommended"]]["argv"]
    exports = export_lines(result[result["recommended"]]["env"])
    if spec.nodes_per_server == 1:
        files.write("launch.sh", ("#!/bin/sh\n" + exports + "exec " + shlex.join(chosen) + "\n").encode())
    else:
        result["ranks"] = _rank_scripts(
            files, spec, con, use_resolver, sglang_deploy.launch_args(chosen), exports
        )
    files.write("deploy.json", (json.dumps(result, indent=2, default=str) + "\n").encode())
    return result


def _rank_scripts(
    files: _Files,
    spec: SweepSpec,
    con: duckdb.DuckDBPyConnection,
    use_resolver: bool,
    args: list[str],
    exports: str,
) -> list[dict[str, Any]]:
    """One launch script per node of a multi-node server (each with the server's ``exports``), each rank's
    argv validated as SGLang resolves it (with a stand-in rendezvous address); what deploy.json says of
    each."""
    nodes, python = spec.nodes_per_server, spec.sglang_python or "python3"
    slot = sglang_deploy.DIST_INIT_ADDR_SLOT
    argvs = [sglang_deploy.rank_command(python, args, nodes, rank, slot) for rank in range(nodes)]
    stand_in = [[multinode.VALIDATION_DIST_INIT_ADDR if t == slot else t for t in argv[3:]] for argv in argvs]
    validations = _validations(spec, con, use_resolver, stand_in)
    variable = '"${DIST_INIT_ADDR:?set DIST_INIT_ADDR to HOST:PORT of rank 0 (a free port on its node)}"'
    ranks = []
    for rank, (argv, validation) in enumerate(zip(argvs, validations, strict=True)):
        name = f"launch-rank{rank}.sh"
        line = shlex.join(argv).replace(slot, variable)
        where = "the first node (it serves HTTP)" if rank == 0 else f"node {rank + 1} of {nodes}"
        files.write(
            name, f"#!/bin/sh\n# node rank {rank} of {nodes}: run on {where}\n{exports}exec {line}\n".encode()
        )
        ranks.append({"node_rank": rank, "script": name, "argv": argv, "validation": validation})
    return ranks


def check_destination(dest: Path) -> None:
    """Refuse, before any ranking, an ``--emit DIR`` that cannot hold the files: an existing file, a path
    under a file, or a folder on a read-only file system or that this user may not write. What only a
    write can tell (a path in /proc) the write refuses, also in one line (``_Files``)."""
    path = dest.absolute()
    existing = next(p for p in (path, *path.parents) if p.exists())
    if not existing.is_dir():
        raise _unwritable(dest, "it is a file" if existing == path else f"{existing} is a file, not a folder")
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise _unwritable(dest, f"{existing} is on a read-only file system")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise _unwritable(dest, f"this user may not write into {existing}")


class _Files:
    """The files one ``emit`` writes into ``dest`` (made when missing), each atomically; a write that fails
    removes the ones already written, so DIR never holds a launch.sh and deploy.json that disagree."""

    def __init__(self, dest: Path) -> None:
        self.dest = dest
        self.written: list[Path] = []

    def write(self, name: str, data: bytes) -> Path:
        """Write ``dest/name``; returns its absolute path (what a launch names)."""
        path = self.dest.resolve() / name
        try:
            write_local_atomic(path, data)
        except OSError as err:
            for done in self.written:
                with suppress(OSError):
                    done.unlink()
            if is_disk_full(err):
                raise disk_full_error(err, where=str(path), doing="writing the deployment files") from None
            raise _unwritable(self.dest, f"writing {path} failed: {err.strerror}") from None
        self.written.append(path)
        return path


def _unwritable(dest: Path, why: str) -> ResultsError:
    return ResultsError(
        f"cannot write the deployment files into {dest}: {why}",
        where="--emit",
        fix="pass --emit a folder this user can write (it is made when missing), e.g. --emit deploy/",
    )


def _drafter_provenance(
    con: duckdb.DuckDBPyConnection, spec: SweepSpec, target: DrafterTarget | None
) -> dict[str, Any] | None:
    """Where the deployed drafter lives, where it came from, and how to publish it there. The node cache
    keys conversions by content, so a copy's conversion.json may be another sweep's (converted from its
    own directory): the record names this sweep's source, and the copy's only where it is this sweep's."""
    if spec.drafter is None or target is None:
        return None
    measured = [
        row[0]
        for row in con.sql(
            "SELECT DISTINCT draft_model_path FROM current_jobs WHERE draft_model_path IS NOT NULL ORDER BY 1"
        ).fetchall()
    ]
    source = str(Path(spec.drafter.path).absolute())
    conversion = _this_sweeps_conversion(con, measured)
    if conversion is not None and conversion.get("source") != source:
        conversion = {**conversion, "source": source, "reused": True}
    return {
        "source": target.source,
        "format": spec.drafter.format,
        "published": target.published,
        "publish_command": list(target.publish_command) if target.publish_command else None,
        "measured_copies": measured,
        "conversion": conversion,
    }


def _this_sweeps_conversion(con: duckdb.DuckDBPyConnection, copies: list[str]) -> dict[str, Any] | None:
    """The conversion.json of a measured copy converted from the bytes of the sweep's current drafter
    (its recorded input digest); the first readable one when the sweep recorded none."""
    from harness.inputs import loads

    rows = con.sql("SELECT input_digests FROM sweep").fetchall()
    digest = loads(rows[0][0]).get("drafter") if rows else None
    for path in copies:
        report = Path(path) / CONVERSION_REPORT
        if report.is_file():
            conversion: dict[str, Any] = json.loads(report.read_text())
            if digest is None or conversion.get("source_digest") == digest:
                return conversion
    return None


def _validations(
    spec: SweepSpec, con: duckdb.DuckDBPyConnection, use_resolver: bool, launches: list[list[str]]
) -> list[dict[str, Any]]:
    """Validate the deploy launches against the configs this machine can read (the spec's model directory,
    or the measured drafter copy), all with one SGLang process (its start-up is most of a check); without
    the target's config SGLang's resolver cannot run, the builtin can."""
    target = spec.model_path if read_model_config(spec.model_path) is not None else None
    drafts = [
        row[0]
        for row in con.sql(
            "SELECT DISTINCT draft_model_path FROM current_jobs WHERE draft_model_path IS NOT NULL"
        ).fetchall()
    ]
    draft = next((d for d in drafts if read_model_config(d) is not None), None)
    reports = validate_many(
        launches,
        use_resolver=use_resolver and target is not None,
        target_config_dir=target,
        draft_config_dir=draft,
    )
    return [{"status": r.status, "checked_by": r.checked_by, **r.to_json_dict()} for r in reports]


def describe(result: dict[str, Any], dest: Path) -> str:
    """What ``best --emit`` prints after the ranking."""
    static = result["static"]
    lines = [
        "",
        f"deploy ({dest}): recommended {result['recommended']}; load mix weights {result['weights']}",
        f"   static: {static['config_label']!r}, mix score {static['mix_score']:.3f} of the per-level best; "
        f"validate {static['validation']['status']}",
    ]
    adaptive = result["adaptive"]
    if adaptive is not None:
        schedule = ", ".join(
            f"batch >= {bs}: {steps} steps" for bs, steps in adaptive["steps_by_batch_size"].items()
        )
        lines.append(
            f"   adaptive: {schedule}; expected mix score {adaptive['mix_score']:.3f}; "
            f"validate {adaptive['validation']['status']} ({', '.join(adaptive['validation']['checked_by'])})"
        )
        for level, what in adaptive["gives_up"].items():
            lines.append(f"      gives up at {level}: {what}")
    else:
        lines.append(f"   adaptive: none ({result['adaptive_note']})")
    if result["tie"]:
        lines.append(f"   tie on the mix: {', '.join(result['tie'])}")
    lines.extend(f"   prefer: {why}" for why in result["preference"])
    if result["drafter"] is not None:
        publish = result["drafter"]["publish_command"]
        lines.append(
            f"   drafter: {result['drafter']['published']}"
            + (f" (publish it: {shlex.join(publish)})" if publish else "")
        )
    ranks = result.get("ranks")
    if ranks:
        for rank in ranks:
            lines.append(
                f"   launch node rank {rank['node_rank']}: {dest / rank['script']} "
                f"(DIST_INIT_ADDR=HOST:PORT of rank 0); validate {rank['validation']['status']}"
            )
    else:
        lines.append(f"   launch: {dest / 'launch.sh'}")
    return "\n".join(lines)
