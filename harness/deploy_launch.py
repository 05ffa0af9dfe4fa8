"""The launch a team deploys for each measured config, as ``best``, ``report``, ``demo`` and ``--emit`` show it.

A measured launch names where the sweep ran it: a loopback ``--host``/``--port``, the launcher's tag and,
for a drafter that needed conversion, the node's converted copy under ``/tmp/specsweep-<uid>/drafters/``.
None of that is deployable. The deploy launch names the spec's model path and the drafter where it is
published (``--publish-drafter``, or ``<drafter path>-sglang`` when ``--emit`` prints how to publish it);
without either, the spec's own drafter path with a note that it must be converted first. Each launch
says where the measured one differed, so a reader can tell the two apart.
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING

import yaml

from harness.plan import point_env
from harness.spec import SweepSpec, parse_spec
from specsweep.errors import ResultsError, SpecError
from workers.sglang import deploy as sglang_deploy

if TYPE_CHECKING:
    import duckdb

NO_SPEC = "the sweep row holds no spec this version reads: paths are as measured"


@dataclass(frozen=True)
class DeployLaunch:
    """One config's launch to deploy, how the measured launch differed, and what to do about the drafter."""

    command: str  # one shell line, the server's environment variables first
    argv: tuple[str, ...]
    differed: str | None  # where the measured launch differed, in words (None: it did not)
    drafter_note: str | None  # the drafter must be converted first: how
    env: tuple[tuple[str, str], ...] = ()  # the spec's env and the config's environment-variable axes


@dataclass(frozen=True)
class DrafterTarget:
    """Where the deploy launch names the drafter, and whether it still has to be published there."""

    source: str
    published: str
    needs_conversion: bool
    publish_command: tuple[str, ...] | None


def sweep_spec(con: duckdb.DuckDBPyConnection, *, where: str = "--emit") -> SweepSpec:
    """The spec the sweep ran (its sweep row), or a ``ResultsError`` naming ``where`` when it holds none."""
    spec = _spec_or_none(con)
    if spec is None:
        raise ResultsError(
            "the sweep row holds no spec, so the model and drafter to deploy are unknown",
            where=where,
            fix="emit from the output directory of `specsweep run` (OUT/sweep/... holds the spec)",
        )
    return spec


def _spec_or_none(con: duckdb.DuckDBPyConnection) -> SweepSpec | None:
    """The sweep's spec, or None where the sweep row holds none this version reads (synthetic results, a
    spec of another specsweep version): the launches are then shown as measured, and say so."""
    rows = con.sql("SELECT spec_text FROM sweep").fetchall()
    data = yaml.safe_load(rows[0][0]) if rows and rows[0][0] else None
    if not isinstance(data, dict) or "model_path" not in data:
        return None
    try:
        return parse_spec(data, source="the sweep's spec")
    except SpecError:
        return None


def measured_args(con: duckdb.DuckDBPyConnection) -> dict[str, list[str]]:
    """Per config label, the SGLang arguments its first done job on the sweep's current inputs ran with."""
    rows = con.sql(
        "SELECT config_label, arg_min(sglang_argv, repeat_index) FROM current_jobs "
        "WHERE sglang_argv IS NOT NULL GROUP BY 1 ORDER BY 1"
    ).fetchall()
    return {label: sglang_deploy.launch_args(argv) for label, argv in rows}


def measured_env(con: duckdb.DuckDBPyConnection, spec: SweepSpec) -> dict[str, dict[str, str]]:
    """Per config label, the environment its server ran with: the spec's ``env`` and the values of the
    config's environment-variable axes (an axis such as ``SGLANG_ENABLE_SPEC_V2`` is part of the launch)."""
    rows = con.sql("SELECT config_label, arg_min(axes, repeat_index) FROM current_jobs GROUP BY 1").fetchall()
    return {label: point_env(spec, tuple(json.loads(axes).items()) if axes else ()) for label, axes in rows}


def env_prefix(env: tuple[tuple[str, str], ...]) -> str:
    """``NAME=value`` assignments a shell applies to the one command after them (each value quoted)."""
    return "".join(f"{name}={shlex.quote(value)} " for name, value in env)


def export_lines(env: dict[str, str]) -> str:
    """A script's ``export NAME=value`` lines, so the server its ``exec`` starts runs with ``env``."""
    return "".join(f"export {name}={shlex.quote(value)}\n" for name, value in env.items())


def drafter_target(spec: SweepSpec, publish_drafter: str | None, *, emitting: bool) -> DrafterTarget | None:
    """Where the deploy launch names the spec's drafter (None: the sweep has none)."""
    if spec.drafter is None:
        return None
    source = spec.drafter.path
    needs_conversion = spec.drafter.format != "sglang"
    if not needs_conversion:
        published = source
    elif publish_drafter is not None:
        published = publish_drafter
    else:
        published = source.rstrip("/") + "-sglang" if emitting else source
    destination = published if published != source else source.rstrip("/") + "-sglang"
    command = (
        ("specsweep", "convert", source, destination, "--target-config", spec.model_path)
        if needs_conversion
        else None
    )
    return DrafterTarget(source, published, needs_conversion, command)


def deploy_launches(
    con: duckdb.DuckDBPyConnection, publish_drafter: str | None = None, *, emitting: bool = False
) -> dict[str, DeployLaunch]:
    """Per measured config label, its deploy launch (see the module docstring)."""
    spec = _spec_or_none(con)
    measured = measured_args(con)
    if spec is None:  # synthetic results: the measured interpreter and paths, minus the listen address
        python = con.sql("SELECT any_value(sglang_argv[1]) FROM current_jobs").fetchall()[0][0]
        return {
            label: _launch(python or "python3", args, sglang_deploy.strip_launch_only(args), None, NO_SPEC)
            for label, args in measured.items()
        }
    drafter = drafter_target(spec, publish_drafter, emitting=emitting)
    python = spec.sglang_python or "python3"
    envs = measured_env(con, spec)
    return {
        label: _launch(
            python,
            args,
            sglang_deploy.deploy_args(
                args, model_path=spec.model_path, draft_path=drafter.published if drafter else None
            ),
            drafter,
            None,
            tuple(envs.get(label, {}).items()),
        )
        for label, args in measured.items()
    }


def _launch(
    python: str,
    measured: list[str],
    deployed: list[str],
    drafter: DrafterTarget | None,
    note: str | None,
    env: tuple[tuple[str, str], ...] = (),
) -> DeployLaunch:
    argv = sglang_deploy.command(python, deployed)
    uses_drafter = sglang_deploy.DRAFT_FLAG in deployed
    drafter_note = None
    if drafter is not None and uses_drafter and drafter.needs_conversion and drafter.publish_command:
        if drafter.published == drafter.source:
            drafter_note = (
                f"convert the drafter first ({shlex.join(drafter.publish_command)}) and point "
                f"{sglang_deploy.DRAFT_FLAG} at the converted copy (or pass --publish-drafter PATH)"
            )
        else:
            drafter_note = f"publish the drafter there first: {shlex.join(drafter.publish_command)}"
    changes = sglang_deploy.changed_flags(measured, deployed)
    left_out = [flag for flag, value in changes.items() if value is None]
    words = [f"{', '.join(left_out)} left out (where and which launch the sweep ran)"] if left_out else []
    words += [
        f"{flag} {_measured_value(flag, value, drafter)}"
        for flag, value in changes.items()
        if value is not None
    ]
    if note is not None:
        words.append(note)
    command = env_prefix(env) + shlex.join(argv)
    return DeployLaunch(command, tuple(argv), "; ".join(words) or None, drafter_note, env)


def _measured_value(flag: str, value: str, drafter: DrafterTarget | None) -> str:
    """How the measured launch set ``flag``, in words; the node's drafter copy is named as such, not by
    its path (it exists only on the node, for the sweep)."""
    if flag == sglang_deploy.DRAFT_FLAG and drafter is not None and value != drafter.source:
        return "was the node's converted copy"
    return f"was {value}"
