"""Capacity under SLO: the highest load at which a server meets level SLOs, by bisection over probe levels.

One server launch answers it: the search asks a ``probe`` callback to run one load level and say whether
the SLOs held there, and narrows the bracket ``[lo, hi]`` until the highest passing and lowest failing
loads are within ``tolerance`` of each other or ``max_probes`` are spent (the bisection of SGLang's
auto-benchmark and of vLLM's SLA sweep). Rates are bisected geometrically, so the answer's error is a
fraction of it wherever capacity lies in the bracket; concurrencies likewise, rounded to integers.

The bracket's ends are not probed first: every probe goes to the middle of what is still unknown, so all
``max_probes`` narrow it (eight probes split a 16x bracket to about 1%). When no probe failed the answer is
"at least the highest pass" (``bound = "at_least"``: raise ``hi``); when none passed it is "below the
lowest fail" (``bound = "below"``: lower ``lo``).

A probe's verdict is taken as it comes (bisection needs one per probe); the levels column it is judged by
has sampling noise, so a verdict can be wrong only where that noise spans the limit, which puts the
answer within that band of the true capacity. Each probe records its ``margin`` (the smallest relative
slack of its SLO clauses, negative when one failed) so close calls show; more requests per probe narrow
the band.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

from analysis.schema import LevelRecord
from analysis.slo import Slo
from workers.job import CapacitySearch

MAX_PROBE_ERROR_RATE = 0.01  # a probe whose failed requests exceed this share fails, whatever its latency
Bound = Literal["bracketed", "at_least", "below"]


@dataclass(frozen=True, slots=True)
class Verdict:
    """What one probe level said: whether every SLO held, and by how much (relative, < 0 when not)."""

    passed: bool
    margin: float | None  # None when a limited column has no value (e.g. no successful request)


@dataclass(frozen=True, slots=True)
class Probe:
    """One probe: its position in the search, the load it ran, and its verdict."""

    index: int
    load: float
    verdict: Verdict


@dataclass(frozen=True, slots=True)
class CapacityOutcome:
    """The search's answer: the highest passing load (None when none passed) and every probe it made."""

    capacity: float | None
    bound: Bound
    probes: tuple[Probe, ...]


def verdict(slos: tuple[Slo, ...], level: LevelRecord) -> Verdict:
    """Whether a probe level meets every clause (and at most MAX_PROBE_ERROR_RATE failed requests), with
    the smallest relative slack of its clauses as the margin."""
    slacks: list[float] = []
    for slo in slos:
        value = getattr(level, slo.metric)
        if value is None:
            return Verdict(False, None)
        scale = abs(slo.threshold) or 1.0
        slack = (slo.threshold - value) if slo.op in ("<=", "<") else (value - slo.threshold)
        slacks.append(slack / scale)
    margin = min(slacks)
    held = all(slo.holds(getattr(level, slo.metric)) for slo in slos)
    errors_ok = (level.error_rate or 0.0) <= MAX_PROBE_ERROR_RATE
    return Verdict(held and errors_ok, margin)


def next_load(search: CapacitySearch, passed: float | None, failed: float | None) -> float | None:
    """The next load to probe between the highest pass and the lowest fail so far (the bracket's ends
    stand in for the missing ones), or None once they are close enough."""
    low = passed if passed is not None else search.lo
    high = failed if failed is not None else search.hi
    if high <= low * (1 + search.tolerance):
        return None
    if search.kind == "rate":
        return math.sqrt(low * high)
    low_i, high_i = math.ceil(low), math.floor(high)
    if passed is not None:
        low_i = int(passed)
    if failed is not None:
        high_i = int(failed)
    if passed is None and failed is None:
        return float(round(math.sqrt(low_i * high_i)))
    # strictly between the known ends (an unprobed end of the bracket is itself a candidate)
    first = low_i + (passed is not None)
    last = high_i - (failed is not None)
    if first > last:
        return None
    return float(min(max(round(math.sqrt(low_i * high_i)), first), last))


def search_capacity(search: CapacitySearch, probe: Callable[[float], Verdict]) -> CapacityOutcome:
    """Run the bisection with ``probe`` (one load level on the running server per call)."""
    passed: float | None = None
    failed: float | None = None
    probes: list[Probe] = []
    while len(probes) < search.max_probes:
        load = next_load(search, passed, failed)
        if load is None:
            break
        verdict = probe(load)
        probes.append(Probe(len(probes), load, verdict))
        if verdict.passed:
            passed = load
        else:
            failed = load
    bound: Bound = "below" if passed is None else ("at_least" if failed is None else "bracketed")
    return CapacityOutcome(passed, bound, tuple(probes))
