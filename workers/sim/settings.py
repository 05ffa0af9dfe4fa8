"""The simulated server's own knobs, read from environment variables (never from new CLI flags).

A real SGLang command line must run unchanged under ``python -m workers.sim``, so everything SGLang
does not have comes from the environment:

==============================  ==========================================================================
``SPECSWEEP_SIM_PROFILE``       path to a JSON or YAML profile (``workers.sim.model.SimProfile`` fields);
                                fields left out keep the default profile's values.
``SPECSWEEP_SIM_PRESET``        a ``workers.sim.presets.PRESETS`` name: the physics of a real setup (roofline,
                                CUDA graphs, running cap, per-position acceptance) instead of the profile's
                                costs and acceptance; the profile still picks content categories.
``SPECSWEEP_SIM_TIME_SCALE``    real seconds per simulated second (``0.1`` runs 10x faster). Default 1.
``SPECSWEEP_SIM_SEED``          base seed of the per-request acceptance draws. Default 0.
``SPECSWEEP_SIM_LOAD_DELAY_S``  real seconds of "weight loading" before the server is ready. Default 0.
``SPECSWEEP_SIM_BIND_DELAY_S``  real seconds before the HTTP port is bound, as real SGLang binds it only
                                once the weights are loaded (minutes): the window in which another
                                process can take the port. Default 0.
``SPECSWEEP_SIM_FAULT``         one fault mode (see ``FaultMode``). Default: none.
``SPECSWEEP_SIM_FAULT_AFTER``   for ``crash_after`` / ``hang_mid_stream``: requests served normally first;
                                for ``lossy`` / ``lossy_tree``: output tokens left right first.
``SPECSWEEP_SIM_FAULT_EVERY``   for ``http_500``: every N-th generation request fails with HTTP 500.
``SPECSWEEP_SIM_REUSE_PORT``    ``1``: bind with SO_REUSEPORT, so several servers (each its own scheduler)
                                share one port; benchmarks use it to give a batch-independent paced
                                profile enough CPU. Default ``0`` (a busy port is an error).
==============================  ==========================================================================

SGLang's own ``SGLANG_HEALTH_CHECK_TIMEOUT`` (seconds, default 20) is honoured by ``/health`` as in SGLang.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from enum import StrEnum
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from specsweep.documents import load_json, load_yaml, yaml_problem
from specsweep.errors import SpecsweepError
from workers.sim.model import DEFAULT_PROFILE, SimProfile
from workers.sim.presets import PRESETS

ENV_PROFILE = "SPECSWEEP_SIM_PROFILE"
ENV_PRESET = "SPECSWEEP_SIM_PRESET"
ENV_TIME_SCALE = "SPECSWEEP_SIM_TIME_SCALE"
ENV_SEED = "SPECSWEEP_SIM_SEED"
ENV_LOAD_DELAY_S = "SPECSWEEP_SIM_LOAD_DELAY_S"
ENV_BIND_DELAY_S = "SPECSWEEP_SIM_BIND_DELAY_S"
ENV_FAULT = "SPECSWEEP_SIM_FAULT"
ENV_FAULT_AFTER = "SPECSWEEP_SIM_FAULT_AFTER"
ENV_FAULT_EVERY = "SPECSWEEP_SIM_FAULT_EVERY"
ENV_REUSE_PORT = "SPECSWEEP_SIM_REUSE_PORT"
ENV_HEALTH_TIMEOUT = "SGLANG_HEALTH_CHECK_TIMEOUT"


class SimSettingsError(SpecsweepError):
    """A simulator environment variable or profile file that cannot be used."""


class FaultMode(StrEnum):
    """Failures the simulator can reproduce, each with SGLang's own log text and exit behaviour."""

    NONE = "none"
    OOM = "oom"  # CUDA out of memory while loading: scheduler traceback, then the server kills itself
    NCCL = "nccl"  # NCCL error while initialising distributed: same path
    ASSERT = "assert"  # bare AssertionError in the scheduler at startup: same path
    CRASH_AFTER = "crash_after"  # CUDA illegal memory access once FAULT_AFTER requests were served
    HANG_BEFORE_READY = "hang_before_ready"  # listens, but never finishes loading (/health stays 503)
    HANG_MID_STREAM = "hang_mid_stream"  # the scheduler stalls halfway through request FAULT_AFTER + 1
    HTTP_500 = "http_500"  # every FAULT_EVERY-th generation request answers HTTP 500
    FLUSH_REFUSED = "flush_refused"  # /flush_cache always answers 400, as SGLang does while requests run
    # Wrong output: from output position FAULT_AFTER on, a speculative server emits other token ids than
    # the target's greedy ones (every speculative config; or only trees, topk > 1, as in EAGLE #301).
    LOSSY = "lossy"
    LOSSY_TREE = "lossy_tree"


class SimSettings(BaseModel):
    """Everything the simulator takes from outside SGLang's command line."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    profile: SimProfile = Field(default=DEFAULT_PROFILE, description="Costs and acceptance model.")
    preset: str | None = Field(
        default=None,
        description="Physics preset name (workers.sim.presets.PRESETS); None: the profile's model.",
    )
    time_scale: float = Field(default=1.0, gt=0, description="Real seconds per simulated second.")
    seed: int = Field(default=0, description="Base seed of the per-request acceptance draws.")
    load_delay_s: float = Field(default=0.0, ge=0, description="Real seconds before the server is ready.")
    bind_delay_s: float = Field(
        default=0.0, ge=0, description="Real seconds before the HTTP port is bound (SGLang's weight loading)."
    )
    fault: FaultMode = Field(default=FaultMode.NONE, description="Injected failure, if any.")
    fault_after: int = Field(default=0, ge=0, description="Requests served normally before the fault.")
    fault_every: int = Field(default=2, ge=1, description="Period of HTTP 500 answers (http_500 mode).")
    health_timeout_s: float = Field(default=20.0, gt=0, description="SGLang's /health generation timeout.")
    reuse_port: bool = Field(
        default=False, description="Bind with SO_REUSEPORT: several servers share one port (benchmarks)."
    )


def load_profile(path: Path) -> SimProfile:
    """A profile file (JSON, or YAML by suffix) over the default profile; names the bad field on error."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise SimSettingsError(
            f"cannot read simulator profile: {exc.strerror}",
            where=str(path),
            fix=f"point {ENV_PROFILE} at a file",
        ) from exc
    try:
        data = _parse_profile_text(text, yaml_syntax=path.suffix.lower() in (".yaml", ".yml"))
    except ValueError as exc:
        raise SimSettingsError(f"profile is not valid JSON/YAML: {exc}", where=str(path)) from exc
    if not isinstance(data, dict):
        raise SimSettingsError("profile must be a mapping of field: value", where=str(path))
    try:
        return SimProfile.model_validate({**DEFAULT_PROFILE.model_dump(), **data})
    except ValidationError as exc:
        problems = "; ".join(f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors())
        raise SimSettingsError(
            f"bad simulator profile: {problems}",
            where=str(path),
            fix=f"use the fields of workers.sim.model.SimProfile: {', '.join(SimProfile.model_fields)}",
        ) from exc


def _parse_profile_text(text: str, *, yaml_syntax: bool) -> object:
    """JSON or YAML text to data; every syntax error comes out as ValueError."""
    if not yaml_syntax:
        return load_json(text)
    import yaml

    try:
        return load_yaml(text)
    except yaml.YAMLError as exc:
        raise ValueError(yaml_problem(exc)) from exc


def _switch(raw: str) -> bool:
    """``1``/``true``/``yes`` or ``0``/``false``/``no`` (any case); anything else is a ValueError."""
    value = raw.strip().lower()
    if value in ("1", "true", "yes"):
        return True
    if value in ("0", "false", "no"):
        return False
    raise ValueError(f"not a switch: {raw!r}")


def settings_from_env(environ: Mapping[str, str] | None = None) -> SimSettings:
    """Read the knobs from ``environ`` (default ``os.environ``); unset variables keep their defaults."""
    env = os.environ if environ is None else environ
    values: dict[str, object] = {}
    if env.get(ENV_PROFILE):
        values["profile"] = load_profile(Path(env[ENV_PROFILE]))
    preset = env.get(ENV_PRESET)
    if preset:
        if preset not in PRESETS:
            raise SimSettingsError(
                f"{ENV_PRESET}={preset!r} is not a simulator preset",
                where=ENV_PRESET,
                fix=f"use one of {', '.join(sorted(PRESETS))}",
            )
        values["preset"] = preset
    for name, key, convert in (
        (ENV_TIME_SCALE, "time_scale", float),
        (ENV_SEED, "seed", int),
        (ENV_LOAD_DELAY_S, "load_delay_s", float),
        (ENV_BIND_DELAY_S, "bind_delay_s", float),
        (ENV_FAULT, "fault", FaultMode),
        (ENV_FAULT_AFTER, "fault_after", int),
        (ENV_FAULT_EVERY, "fault_every", int),
        (ENV_HEALTH_TIMEOUT, "health_timeout_s", float),
        (ENV_REUSE_PORT, "reuse_port", _switch),
    ):
        raw = env.get(name)
        if raw is None or raw == "":
            continue
        try:
            values[key] = convert(raw)
        except ValueError as exc:
            choices = f" (one of {', '.join(m.value for m in FaultMode)})" if convert is FaultMode else ""
            raise SimSettingsError(f"{name}={raw!r} is not valid{choices}", where=name) from exc
    try:
        return SimSettings(**values)
    except ValidationError as exc:
        problems = "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors())
        raise SimSettingsError(
            f"bad simulator settings: {problems}", fix="check the SPECSWEEP_SIM_* variables"
        ) from exc
