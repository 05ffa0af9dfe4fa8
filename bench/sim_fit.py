"""The Nelder-Mead fit behind ``workers.sim.presets.FITTED``: each preset's free numbers against its published
points in ``bench/sim_calibration.py``, re-runnable, printing the fitted numbers.

Free per preset: ``flop_eff``, ``forward_fixed_s``, ``draft_fixed_s``, ``overhead_s``, ``target_token_s``,
``expert_novelty`` (MoE targets only) and the ``chat`` acceptance vector (8 depths); ``mem_eff`` is held at
0.8 (what an H200 measured) and ``sibling_recall`` at ``presets.SIBLING_PRIOR`` (no published run varies
topk). The loss is the squared relative error of every point's throughput and, where published, accept
length, plus a smoothness prior on the acceptance vector (``SMOOTHNESS`` x the squared steps between
neighbouring depths), which pins the depths no point reaches. Costs are searched in log space and
fractions in logit space, so Nelder-Mead never leaves their ranges. The start is the preset's ``FITTED``
numbers (``--from-base``: the uncalibrated ``BASES`` ones); a fit from ``FITTED`` reproduces them to the
rounding the module keeps (4 significant digits) unless the loss has moved.
Run: ``.venv/bin/python -m bench.sim_fit [--preset NAME] [--from-base] [--iterations N]`` (a minute or
two per preset).
"""

from __future__ import annotations

import argparse
import itertools
import math
import sys
from dataclasses import replace
from typing import Any

import numpy as np
from scipy.optimize import minimize

from bench.sim_calibration import POINTS, simulate_with
from workers.sim.physics import Preset
from workers.sim.presets import BASES, FITTED, SIBLING_PRIOR, categories

SMOOTHNESS = 0.1
DEPTHS = 8
COSTS = ("forward_fixed_s", "draft_fixed_s", "overhead_s", "target_token_s")
FRACTIONS = ("flop_eff",)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


def _sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def free_names(preset: Preset) -> tuple[str, ...]:
    """The scalar fields the fit moves for ``preset`` (expert_novelty only where the target has experts)."""
    return FRACTIONS + COSTS + (("expert_novelty",) if preset.target.experts else ())


def start_vector(name: str, from_base: bool) -> np.ndarray:
    """The search's start: the preset's FITTED numbers, or the base preset's."""
    base = BASES[name]
    fitted: dict[str, Any] = {} if from_base else FITTED[name]
    values = []
    for field_name in free_names(base):
        value = fitted.get(field_name, getattr(base, field_name))
        values.append(math.log(max(value, 1e-9)) if field_name in COSTS else _logit(value))
    chat = (fitted["acceptance"]["chat"].positions if fitted else base.acceptance["chat"].positions) + (
        base.acceptance["chat"].positions[-1],
    ) * DEPTHS
    values += [_logit(a) for a in chat[:DEPTHS]]
    return np.array(values)


def decode(name: str, x: np.ndarray) -> dict[str, Any]:
    """The preset fields a search vector stands for."""
    base = BASES[name]
    names = free_names(base)
    fields: dict[str, Any] = {"mem_eff": 0.8, "sibling_recall": SIBLING_PRIOR}
    for field_name, value in zip(names, x[: len(names)], strict=True):
        fields[field_name] = math.exp(value) if field_name in COSTS else _sigmoid(value)
    fields["acceptance"] = categories(tuple(_sigmoid(v) for v in x[len(names) :]))
    return fields


def loss(name: str, x: np.ndarray) -> float:
    """Squared relative errors of the preset's points, plus the acceptance vector's smoothness prior."""
    fields = decode(name, x)
    preset = replace(BASES[name], **fields)
    total = 0.0
    for point in POINTS:
        if point.preset != name:
            continue
        throughput, accept = simulate_with(preset, point)
        total += (throughput / point.throughput - 1) ** 2
        if accept is not None and point.accept_length is not None:
            total += (accept / point.accept_length - 1) ** 2
    chat = fields["acceptance"]["chat"].positions
    return total + SMOOTHNESS * sum((b - a) ** 2 for a, b in itertools.pairwise(chat))


def _rounded(value: float) -> float:
    return float(f"{value:.4g}")


def fit(name: str, *, from_base: bool, iterations: int) -> tuple[dict[str, Any], float, float]:
    """(fitted fields rounded as FITTED keeps them, loss at the start, loss at the end)."""
    x0 = start_vector(name, from_base)
    result = minimize(
        lambda x: loss(name, x),
        x0,
        method="Nelder-Mead",
        options={"maxiter": iterations, "xatol": 1e-5, "fatol": 1e-9},
    )
    fields = decode(name, result.x)
    rounded = {k: _rounded(v) for k, v in fields.items() if isinstance(v, float)}
    rounded["acceptance.chat"] = tuple(round(a, 3) for a in fields["acceptance"]["chat"].positions)
    return rounded, loss(name, x0), float(result.fun)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", choices=sorted(FITTED), action="append", help="default: every fitted one")
    parser.add_argument("--from-base", action="store_true", help="start from the uncalibrated base preset")
    parser.add_argument("--iterations", type=int, default=4000)
    args = parser.parse_args(argv)
    for name in args.preset or sorted(FITTED):
        fields, start, end = fit(name, from_base=args.from_base, iterations=args.iterations)
        print(f"{name}: loss {start:.5f} -> {end:.5f}")
        for key, value in fields.items():
            print(f"  {key}: {value}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
