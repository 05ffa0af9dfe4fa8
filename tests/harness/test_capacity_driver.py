"""Capacity under SLO on a simulated Ray cluster: the search against the simulator's own truth.

The cluster, models and spec helpers are test_driver's (imported, one cluster for this module). The truth
is not found by a search: it is the simulator's performance model (``workers.sim.model.ground_truth`` on the
default preset, the same scheduling, step costs and acceptance draws the simulated server runs, at the
launch's own factor) evaluated at every concurrency of the bracket, with many more requests than a probe
sends.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from analysis.store import open_store
from analysis.views import connect
from harness.cli import main
from tests.harness.test_driver import (  # noqa: F401  (fixtures used by name)
    make_spec,
    models,
    rows,
    run,
)
from workers.sglang import SpecParams
from workers.sim.model import QUANTILES, RANDOM_IDS, Load, ground_truth, open_loop_tpot_quantiles
from workers.sim.presets import DEFAULT_PRESET
from workers.sim.reported import job_launch_factors

# Quiet: its p90 TPOTs sit within a few percent of an SLO between two CUDA-graph steps, and a busy machine's
# late reads move them across it, so `make test` runs it alone (tests/split_run.py).
pytestmark = [pytest.mark.ray, pytest.mark.quiet]

SCALE = 0.5  # real seconds per simulated second: a few ms of scheduling noise stay well under a TPOT step
# The SLOs on p90 TPOT, in simulated seconds (the spec's limit is this x SCALE in real milliseconds); 35 ms
# on the old linear profile for both tests. On the default preset the 4-token chain's p90 TPOT flattens at
# 29 ms once its 48 running requests (SGLang's speculative default) are full, so 35 ms never broke inside
# the bracket. The concurrency test's 25.7 ms sits where both configs' batches pad past a CUDA graph (32
# streams hold: 23.9 and 24.1 ms; 33 pad to 40: 26.8 and 26.1 ms), so both capacities are 32, with room
# for the measurement's bias on this box: the client reads TPOT late when the CPU is busy (at a load
# average of 5 the baseline's p90 at 31 streams read 6.8% over its truth, failing 25.5 ms). Launches run
# at factor 1 (SPECSWEEP_SIM_LAUNCH_SIGMA 0): past 32 streams the chain's p90 is flat within 1% up to 40
# (26.1-26.8 ms), so a launch factor of a few percent moved its truth to 36 and a probe found 40; at 20 ms the chain's truth was 22 streams (23 and 24 pad to 24,
# 2% over the SLO) and a probe's p90 found 24. The rate test's 20 ms: rates 25.6 and 36.6 req/s at 64
# output tokens (measured 25.56 and 35.37 against truths 26.13 and 35.91 at a load average of 18), about 47
# and 61 req/s at 32 (measured 45.75 and 60.79 against 47.03 and 61.12 at a load average of 17, 45.87 and
# 60.14 against 47.3 and 60.8 at 11); at 25 ms the baseline's probes ran at about 3,800 chunks/s and at a
# load average of 21 found 22.3 req/s for a truth of 30.8.
SLO_CONCURRENCY_TPOT_P90_S = 0.0257
SLO_RATE_TPOT_P90_S = 0.020
INPUT = 32
# Output tokens per request: the concurrency test's 64 keep its SLO between the CUDA-graph steps with room on
# both sides (at 32 the chain's p90 at 32 streams is 25.96 ms, 1% under the 26.4 ms that 33 streams would
# need, against 7.6-8.8% under 25.7 ms at 64). The rate test's 32 halve a request's life, so the same server
# load comes at twice the rate and a 200-request probe takes half the time (about 4 s instead of 8); the
# tokens per second at capacity, and with them the chunks the box serves, stay as at 64 (about 1,500/s), and
# the model's own level-to-level spread of the capacity is no wider (12 single-run capacities against the
# pooled truth: sd 2.0% and 2.4% at 32, 2.2% and 2.3% at 64).
CONCURRENCY_OUTPUT, RATE_OUTPUT = 64, 32
MIX = ((RANDOM_IDS, 1.0),)  # random token ids: the simulator's random_ids acceptance
BURSTINESS = 20.0  # gamma arrivals of the rate probes (see below)
CONFIGS = {
    "baseline": SpecParams(),
    "chain d=4": SpecParams(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    ),
}


def true_concurrency(params: SpecParams, lo: int, hi: int, requests: int, factor: float) -> float:
    """The highest concurrency below the first one whose modelled per-request p90 TPOT breaks the SLO,
    from the model at every concurrency of the bracket (a probe's closed loop of ``requests``, repeated
    until 20,000 verify steps) at the launch's ``factor``."""
    p90 = QUANTILES.index(0.9)
    for concurrency in range(lo, hi + 1):
        load = Load(concurrency, INPUT, CONCURRENCY_OUTPUT, requests, mix=MIX)
        truth = ground_truth(DEFAULT_PRESET, params, load, factor=factor)
        if truth.tpot_quantiles[p90] > SLO_CONCURRENCY_TPOT_P90_S:
            return concurrency - 1
    return hi


def true_rate(params: SpecParams, lo: float, hi: float, requests: int, factor: float) -> float:
    """The highest rate before the modelled p90 TPOT of a probe's open loop (``requests`` gamma arrivals
    on an idle server, 20 runs pooled, at the launch's ``factor``) breaks the SLO: 25% steps up from
    ``lo`` to the first break, then 5% and 1% steps up from the last rate that held, so within 1% below
    the break (15-16 evaluations instead of the 34-41 of 8% and 1% steps, about 6 s of CPU less per
    config; the rates differ by under 1%)."""
    p90 = QUANTILES.index(0.9)
    load = Load(1, INPUT, RATE_OUTPUT, requests, mix=MIX)

    def holds(rate: float) -> bool:
        tpot = open_loop_tpot_quantiles(
            DEFAULT_PRESET, params, rate, load, runs=20, burstiness=BURSTINESS, factor=factor
        )
        return tpot[p90] <= SLO_RATE_TPOT_P90_S

    rate = lo
    for step in (1.25, 1.05, 1.01):
        while rate * step <= hi and holds(rate * step):
            rate *= step
    return rate


def searched(
    cluster_models: dict[str, str], out: Path, output: int, load: dict[str, Any]
) -> tuple[dict[str, tuple[float, str, int]], list[tuple[str, float, bool]], dict[str, float]]:
    """Run a sweep of CONFIGS with ``load`` of ``output``-token requests (one server at a time); each
    config's (capacity, bound, probes), every probe's (config, load, passed) and each config's launch
    factor."""
    data = make_spec(
        cluster_models,
        out,
        speculative={"chain_depths": [4]},
        max_servers=1,  # one server at a time: two on this 2-core box would slow each other's clients
        load={
            # no warmup: the truths are of an idle server (the open loop's first request on an idle
            # server, the closed loop's clients starting together), and 4 warmup requests cost a
            # request's life per probe (0.4-0.8 s; the cache is flushed after them either way)
            "warmup_requests": 0,
            "workload": {"kind": "random_ids", "input_tokens": INPUT, "output_tokens": output},
            **load,
        },
        timeouts={"startup_s": 60, "level_s": 120, "stop_s": 5, "placement_s": 60},
        env={"SPECSWEEP_SIM_TIME_SCALE": str(SCALE), "SPECSWEEP_SIM_LAUNCH_SIGMA": "0"},
    )
    summary, log = run(data)
    assert summary.counts["failed"] == 0 and summary.counts["done"] == len(CONFIGS), log
    levels = len(load.get("concurrency", []))  # probes are neither levels nor requests rows
    assert len(rows(out, "levels")) == levels * len(CONFIGS)
    assert len(rows(out, "requests")) == levels * len(CONFIGS) * load["requests_per_level"]
    con = connect(open_store(out))
    found = {
        label: (capacity, bound, probes)
        for label, capacity, bound, probes in con.sql(
            "SELECT config_label, capacity, bound, probes FROM capacity_results"
        ).fetchall()
    }
    probes = con.sql(
        "SELECT j.config_label, c.probe_load, c.passed FROM capacity c JOIN jobs j USING (sweep_id, job_id) "
        "ORDER BY c.probe_index"
    ).fetchall()
    factors = job_launch_factors(con)
    con.close()
    return found, probes, factors


def check(
    found: dict[str, tuple[float, str, int]], probes: list[tuple[str, float, bool]], truth: dict[str, float]
) -> None:
    """Within 5% of the truth in at most 8 probes, bracketed, every pass below every fail."""
    report = [f"{label}: found {found[label]}, truth {truth[label]:.4g}" for label in CONFIGS]
    print("\n".join(report))
    for label in CONFIGS:
        capacity, bound, count = found[label]
        mine = [(load, passed) for lbl, load, passed in probes if lbl == label]
        assert max(load for load, ok in mine if ok) < min(load for load, ok in mine if not ok), mine
        assert bound == "bracketed" and count <= 8, report
        assert abs(capacity - truth[label]) <= 0.05 * truth[label], (report, mine)


def test_concurrency_capacity_is_within_5_percent_of_the_model_in_8_probes_when_searched(
    cluster: Any,
    models: dict[str, str],  # noqa: F811  (the fixture imported above)
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One launch per config runs a fixed level, then at most 8 closed-loop probes, and finds the
    concurrency at which p90 TPOT meets the SLO within 5% of the model's; best --objective capacity ranks
    the configs by it and the report shows and plots it."""
    out = tmp_path / "out"
    lo, hi, requests = 4, 96, 120
    capacity = {"kind": "concurrency", "lo": float(lo), "hi": float(hi), "max_probes": 8}
    found, probes, factors = searched(
        models,
        out,
        CONCURRENCY_OUTPUT,
        {
            # the fixed level is only there to show levels and probes share the launch: at 48 clients
            # (the chain's running requests) its 120 requests take about 2 s per config (at 16 clients
            # 3.3-4.2 s, at 2 clients 18-29 s)
            "concurrency": [48],
            "requests_per_level": requests,
            "capacity": {**capacity, "slo": f"tpot_p90_ms<={SLO_CONCURRENCY_TPOT_P90_S * 1000 * SCALE:g}"},
        },
    )
    truth = {label: true_concurrency(p, lo, hi, requests, factors[label]) for label, p in CONFIGS.items()}
    check(found, probes, truth)
    capsys.readouterr()
    assert main(["best", str(out), "--objective", "capacity", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    # highest capacity first, each config with what its launch found (two configs at one capacity, as the
    # physics preset's baseline and chain can be at this SLO, rank by label: a tie either way)
    assert sorted(r["config_label"] for r in ranked) == sorted(found)
    assert [r["capacity"] for r in ranked] == [found[r["config_label"]][0] for r in ranked]
    assert [r["capacity"] for r in ranked] == sorted((f[0] for f in found.values()), reverse=True)
    assert main(["best", str(out), "--objective", "capacity"]) == 0
    text = capsys.readouterr().out
    winner = ranked[0]
    assert f"{winner['config_label']}" in text and f"{winner['capacity']:.4g} in flight" in text
    assert main(["report", str(out), "-o", str(tmp_path / "report.html")]) == 0
    page = (tmp_path / "report.html").read_text()
    assert "<section id='capacity'>" in page and "<figure id='plot-capacity'>" in page
    assert f"{ranked[-1]['capacity']:.4g} in flight" in page


def test_rate_capacity_is_within_5_percent_of_the_model_in_8_probes_when_searched(
    cluster: Any,
    models: dict[str, str],  # noqa: F811
    tmp_path: Path,
) -> None:
    """Open loop: at most 8 rate probes per launch find the rate at which p90 TPOT meets the SLO within
    5% of the model's. Arrivals are gamma with shape 20 (gaps within about 22% of their mean): with
    Poisson arrivals the p90 TPOT of one 200-request level varies 8-11% from level to level in the model
    itself, which no single-launch search can resolve to 5% (docs/results.md, noisy verdicts). Requests
    of 32 output tokens (RATE_OUTPUT): the truth is the model's for that length, and the capacity's
    level-to-level spread is as at 64 tokens, in about half a probe's time near it."""
    # a 32x bracket, as wide as [4, 128] before (and [2, 64]), so the geometric bisection halves it as many
    # times; the truths (about 47 and 61 req/s) lie 0.5-0.6 of the way up it in log rate, not at an end.
    # Its first probe at 45 req/s sends 200 requests in 4.4 s (22.6 req/s, [4, 128]'s first, in 8.8 s): the
    # probes' arrival spans add up to 29 and 26 s against 40 and 31 s for [4, 128] at the truths' verdicts.
    # The overload probe at 108 req/s fails by half its limit whatever the box's load does to it.
    lo, hi, requests = 8.0, 256.0, 200
    found, probes, factors = searched(
        models,
        tmp_path / "out",
        RATE_OUTPUT,
        {
            "requests_per_level": requests,
            "arrival": "gamma",
            "burstiness": BURSTINESS,
            "capacity": {
                "kind": "rate",
                "lo": lo,
                "hi": hi,
                "max_probes": 8,
                "slo": f"tpot_p90_ms<={SLO_RATE_TPOT_P90_S * 1000 * SCALE:g}",
            },
        },
    )
    # the simulator runs at SCALE: a real rate r is the model's rate r x SCALE
    model = {
        label: true_rate(p, lo * SCALE, hi * SCALE, requests, factors[label]) for label, p in CONFIGS.items()
    }
    check(found, probes, {label: rate / SCALE for label, rate in model.items()})
