"""Capacity under SLO on a simulated Ray cluster: the search against the simulator's own truth.

The cluster, models and spec helpers are test_driver's (imported, one cluster for this module). The truth
is not found by a search: it is the simulator's performance model (``workers.sim.model.ground_truth``, the
same scheduling, step costs and acceptance draws the simulated server runs) evaluated at every
concurrency of the bracket, with many more requests than a probe sends.
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
    cluster,
    env_dirs,
    make_spec,
    models,
    rows,
    run,
)
from workers.sglang import SpecParams
from workers.sim.model import DEFAULT_PROFILE, QUANTILES, RANDOM_IDS, Load, ground_truth

pytestmark = pytest.mark.ray

SCALE = 0.5  # real seconds per simulated second: a few ms of scheduling noise stay well under a TPOT step
SLO_TPOT_P90_S = 0.035  # simulated seconds; the spec's limit is this x SCALE in real milliseconds
LO, HI = 4, 96
INPUT, OUTPUT, REQUESTS = 32, 64, 120
CONFIGS = {
    "baseline": SpecParams(),
    "chain d=4": SpecParams(
        speculative_algorithm="EAGLE3",
        speculative_num_steps=3,
        speculative_eagle_topk=1,
        speculative_num_draft_tokens=4,
    ),
}


def true_capacity(params: SpecParams) -> int:
    """The highest concurrency below the first one whose modelled per-request p90 TPOT breaks the SLO,
    from the model at every concurrency of the bracket (a probe's closed loop of REQUESTS requests)."""
    p90 = QUANTILES.index(0.9)
    for concurrency in range(LO, HI + 1):
        load = Load(concurrency, INPUT, OUTPUT, REQUESTS, mix=((RANDOM_IDS, 1.0),))
        if ground_truth(DEFAULT_PROFILE, params, load).tpot_quantiles[p90] > SLO_TPOT_P90_S:
            return concurrency - 1
    return HI


def test_capacity_search_finds_each_configs_slo_capacity_within_5_percent_in_8_probes(
    cluster: Any,  # noqa: F811  (the fixture imported above)
    models: dict[str, str],  # noqa: F811
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """One launch per config runs at most 8 probe levels and finds the concurrency at which p90 TPOT
    meets the SLO within 5% of the model's; every probe is stored, bisection-consistent (each passing
    load below each failing one); best --objective capacity ranks the configs by it."""
    out = tmp_path / "out"
    data = make_spec(
        models,
        out,
        speculative={"chain_depths": [4]},
        max_servers=1,  # one server at a time: two on this 2-core box would slow each other's clients
        load={
            "requests_per_level": REQUESTS,
            "warmup_requests": 4,
            "workload": {"kind": "random_ids", "input_tokens": INPUT, "output_tokens": OUTPUT},
            "capacity": {
                "kind": "concurrency",
                "slo": f"tpot_p90_ms<={SLO_TPOT_P90_S * 1000 * SCALE:g}",
                "lo": float(LO),
                "hi": float(HI),
                "max_probes": 8,
            },
        },
        timeouts={"startup_s": 60, "level_s": 120, "stop_s": 5, "placement_s": 60},
        env={"SPECSWEEP_SIM_TIME_SCALE": str(SCALE)},
    )
    summary, log = run(data)
    assert summary.counts["failed"] == 0 and summary.counts["done"] == len(CONFIGS), log
    assert rows(out, "levels") == [] and rows(out, "requests") == []  # probes only: no fixed levels
    con = connect(open_store(out))
    found = {
        label: (capacity, bound, probes)
        for label, capacity, bound, probes in con.sql(
            "SELECT config_label, capacity, bound, probes FROM capacity_results"
        ).fetchall()
    }
    probes = con.sql(
        "SELECT j.config_label, c.probe_load, c.passed, c.tpot_p90_ms, c.margin "
        "FROM capacity c JOIN jobs j USING (sweep_id, job_id) ORDER BY c.probe_index"
    ).fetchall()
    con.close()
    report = []
    for label, params in CONFIGS.items():
        truth = true_capacity(params)
        capacity, bound, count = found[label]
        report.append(f"{label}: found {capacity} ({bound}, {count} probes), truth {truth}")
        mine = [(load, passed) for lbl, load, passed, _, _ in probes if lbl == label]
        assert max(load for load, ok in mine if ok) < min(load for load, ok in mine if not ok)
        assert bound == "bracketed" and count <= 8
        assert abs(capacity - truth) <= 0.05 * truth, (report, probes)
    print("\n".join(report))
    capsys.readouterr()
    assert main(["best", str(out), "--objective", "capacity", "--json"]) == 0
    ranked = json.loads(capsys.readouterr().out)["ranked"]
    assert [r["config_label"] for r in ranked] == sorted(found, key=lambda k: -found[k][0])
    assert [r["capacity"] for r in ranked] == sorted((f[0] for f in found.values()), reverse=True)
