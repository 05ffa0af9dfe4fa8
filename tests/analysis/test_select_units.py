"""best on small sweeps, fast: exact refusals, notes, fields and arithmetic (the mutation tests' target).

Each sweep has a few dozen requests per level and each selection 100-400 bootstrap replicates, so a
test takes well under a second; ``test_select.py`` checks the statistics on larger sweeps.
"""

from __future__ import annotations

import math
import shlex
import shutil
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from analysis.goodput import parse_request_slos
from analysis.layout import attempt_path, job_part_path, sweep_part_path
from analysis.metrics import MEASURED, METRICS_BY_NAME
from analysis.schema import capacity_table, write_parquet_atomic
from analysis.select import (
    OBJECTIVE_METRICS,
    SLO_METRICS,
    Interval,
    Selection,
    _interval,
    _more_repeats,
    quantile_replicates,
    rate_replicates,
    ratio_replicates,
    select_best,
    share_text,
)
from analysis.slo import parse_slos
from analysis.synthetic import SyntheticConfig, SyntheticSweep, job_id_of, sglang_argv, write_sweep
from analysis.views import connect
from specsweep.errors import ResultsError

from .conftest import as_open_loop
from .test_capacity import _probe

BASELINE = SyntheticConfig("baseline")
D4 = SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1)
D8 = SyntheticConfig("chain d=8", "EAGLE3", 7, 1, 8, accept_length=3.4, step_cost=2.2)
SMALL = SyntheticSweep(configs=(BASELINE, D4, D8), concurrencies=(4, 64), requests_per_level=60, seed=3)
FAST = 100  # bootstrap replicates: the fewest select_best accepts


@pytest.fixture(scope="module")
def small_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SMALL written once; tests that change files work on a copy (``_copy``)."""
    out = tmp_path_factory.mktemp("small")
    write_sweep(out, SMALL)
    return out


def _copy(small_results: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    shutil.copytree(small_results, out)
    return out


def _select(out: Path, **kwargs: object) -> Selection:
    return select_best(connect(out), out, replicates=kwargs.pop("replicates", FAST), **kwargs)  # type: ignore[arg-type]


def _column(out: Path, sql: str, *params: object) -> list[object]:
    return [row[0] for row in connect(out).execute(sql, list(params)).fetchall()]


@pytest.mark.parametrize(
    ("kwargs", "problem", "where", "fix"),
    [
        ({"confidence": 1.0}, "--confidence 1.0 is not a probability in [0.5, 1)", None, "e.g. 0.95"),
        ({"confidence": 0.49}, "--confidence 0.49 is not a probability in [0.5, 1)", None, "e.g. 0.95"),
        ({"replicates": 99}, "--bootstrap 99 is too few for an interval", None, "use at least 100"),
        *(
            (
                {"max_error_rate": rate},
                f"--max-error-rate {rate:g} is not a share of requests",
                "--max-error-rate",
                "use a value from 0 (no failed request allowed) to 1 (any)",
            )
            for rate in (-0.01, 1.01)
        ),
        (
            {"objective": "tok_s_per_gpu"},
            "unknown metric 'tok_s_per_gpu'",
            "--objective",
            "did you mean output_tok_s_per_gpu, output_tok_s_per_user? known metrics: "
            + ", ".join(SLO_METRICS),
        ),
        *(
            (
                {"objective": name},
                f"metric {name!r} cannot be an objective (it is not a rankable rate or percentile)",
                "--objective",
                f"use one of: {', '.join(OBJECTIVE_METRICS)} (it can still be an SLO)",
            )
            for name in ("num_errors", "server_accept_length")  # a level column; SGLang's own count
        ),
        *(
            (
                kwargs,
                "goodput counts the requests that meet per-request SLOs, and none were given",
                where,
                'pass --request-slo "ttft_ms<=2000,tpot_ms<=50" (any of ttft_ms, tpot_ms, e2e_ms) '
                "or set request_slo in the spec",
            )
            for kwargs, where in (
                ({"objective": "goodput"}, "--objective"),
                ({"objective": "goodput_share"}, "--objective"),
                ({"slos": parse_slos("goodput_share>=0.5", SLO_METRICS)}, "--slo"),
            )
        ),
        (
            {"at": "concurrency=5"},
            "load level 'concurrency=5' was not measured",
            "--at",
            "use one of: concurrency=4, concurrency=64",
        ),
    ],
)
def test_select_best_refuses_bad_arguments_with_the_whole_message(
    small_results: Path, kwargs: dict[str, object], problem: str, where: str | None, fix: str
) -> None:
    """Each refusal says what is wrong, where, and what to do, word for word."""
    with pytest.raises(ResultsError) as refused:
        _select(small_results, **kwargs)
    assert (refused.value.problem, refused.value.where, refused.value.fix) == (problem, where, fix)


@pytest.mark.parametrize(
    "kwargs", [{"confidence": 0.5}, {"replicates": 100}, {"max_error_rate": 0.0}, {"max_error_rate": 1.0}]
)
def test_select_best_accepts_arguments_on_their_bounds(
    small_results: Path, kwargs: dict[str, object]
) -> None:
    """The bounds themselves are valid: confidence 0.5, 100 replicates, error limits 0 and 1."""
    selection = _select(small_results, **kwargs)
    assert [lv.winner.config_label for lv in selection.levels if lv.winner] == ["chain d=4", "baseline"]


def test_select_best_reports_its_settings_and_levels_in_load_order(small_results: Path) -> None:
    """The selection echoes what it ranked by; levels come by concurrency (4 before 64), not by name."""
    slos = parse_slos("ttft_p99_ms<=100000", SLO_METRICS)
    request_slos = parse_request_slos("e2e_ms<=100000")
    selection = _select(
        small_results, slos=slos, request_slos=request_slos, confidence=0.9, seed=5, max_error_rate=0.5
    )
    assert selection.sweep_id == "synthetic"
    assert (selection.objective, selection.objective_unit) == (
        "output_tok_s_per_gpu",
        METRICS_BY_NAME["output_tok_s_per_gpu"].unit,
    )
    assert selection.better == "higher"
    assert selection.slos == ("ttft_p99_ms<=100000",)
    assert selection.request_slos == ("e2e_ms<=100000",)
    assert (selection.confidence, selection.max_error_rate, selection.replicates) == (0.9, 0.5, FAST)
    assert [lv.load_level for lv in selection.levels] == ["concurrency=4", "concurrency=64"]
    assert selection.notes == ()
    (only,) = _select(small_results, at="concurrency=64").levels
    assert only.load_level == "concurrency=64"


def test_select_best_ranks_each_config_with_its_own_fields_when_apart(small_results: Path) -> None:
    """Per level: ranks by objective, the level's values and the job's launch, speedup = objective /
    baseline's, every interval around its point value, the runner-up's difference interval above 0."""
    selection = _select(small_results)
    for level, concurrency in zip(selection.levels, SMALL.concurrencies, strict=True):
        assert level.baseline_label == "baseline"
        by_label = {r.config_label: r for r in level.ranked}
        assert level.baseline_objective == by_label["baseline"].objective
        assert [r.rank for r in level.ranked] == [1, 2, 3]
        truth = sorted(SMALL.configs, key=lambda c: -SMALL.true_output_tok_s_per_gpu(c, concurrency))
        assert [r.config_label for r in level.ranked] == [c.label for c in truth]
        assert level.excluded == ()
        for ranked in level.ranked:
            cfg = SMALL.config(ranked.config_label)
            job_id = job_id_of(SMALL, cfg, 0)
            assert ranked.job_ids == (job_id,) and ranked.repeats == 1
            (value,) = _column(
                small_results,
                "SELECT output_tok_s_per_gpu FROM results WHERE job_id = ? AND load_level = ?",
                job_id,
                level.load_level,
            )
            assert ranked.objective == value and ranked.objective_mad is None
            assert ranked.is_baseline == (cfg is BASELINE)
            assert ranked.launch_command == shlex.join(sglang_argv(SMALL, cfg))
            assert ranked.sglang_argv == sglang_argv(SMALL, cfg)
            assert ranked.error_rate == 0.0
            assert (ranked.goodput_rps, ranked.goodput_share, ranked.slo_values) == (None, None, {})
            ci = ranked.objective_ci
            assert ci is not None and ci.low < ranked.objective < ci.high
            assert (ci.high - ci.low) < 0.5 * ranked.objective
            assert ranked.speedup == ranked.objective / by_label["baseline"].objective
            if ranked.is_baseline:
                assert ranked.speedup_ci is None
            else:
                assert ranked.speedup_ci is not None
                assert ranked.speedup_ci.low < ranked.speedup < ranked.speedup_ci.high
            assert not ranked.tie and ranked.more_repeats is None
            if ranked.rank == 1:
                assert ranked.difference_ci is None
            else:
                difference = level.ranked[0].objective - ranked.objective
                assert ranked.difference_ci is not None
                assert 0 < ranked.difference_ci.low < difference < ranked.difference_ci.high


def test_select_best_draws_the_same_intervals_for_the_same_seed(small_results: Path) -> None:
    """A ranking is reproducible: the same seed gives the same intervals, another seed other ones. The
    default seed is ``best --seed``'s default, 0, so the demo's and the confirmation's rankings (which
    pass none) match ``best``'s."""
    default, zero, one = (
        _select(small_results, at="concurrency=4", **seed) for seed in ({}, {"seed": 0}, {"seed": 1})
    )
    assert default == zero
    assert default.levels[0].ranked[0].objective_ci != one.levels[0].ranked[0].objective_ci


def test_select_best_ranks_a_job_without_a_recorded_argv(small_results: Path, tmp_path: Path) -> None:
    """A job row without SGLang's argv (``sglang_argv`` null) is ranked with none."""
    out = _copy(small_results, tmp_path)
    path = job_part_path(out, "jobs", "synthetic", job_id_of(SMALL, D4, 0))
    rows = pq.read_table(path)
    field = rows.schema.get_field_index("sglang_argv")
    write_parquet_atomic(
        rows.set_column(field, "sglang_argv", pa.nulls(1, rows.schema.field(field).type)), path
    )
    ranked = {r.config_label: r.sglang_argv for r in _select(out, at="concurrency=4").levels[0].ranked}
    assert ranked == {
        "chain d=4": None,
        "chain d=8": sglang_argv(SMALL, D8),
        "baseline": sglang_argv(SMALL, BASELINE),
    }


def test_select_best_intervals_widen_with_confidence(small_results: Path) -> None:
    """The interval at 95% holds the one at 50%, about 1.96 / 0.674 times as wide (normal replicates)."""
    narrow, wide = (_select(small_results, confidence=c, replicates=400).levels[0] for c in (0.5, 0.95))
    for a, b in zip(narrow.ranked, wide.ranked, strict=True):
        for ci_a, ci_b in ((a.objective_ci, b.objective_ci), (a.speedup_ci, b.speedup_ci)):
            if ci_a is None:
                assert ci_b is None
                continue
            assert ci_b.low < ci_a.low < ci_a.high < ci_b.high
            assert (ci_b.high - ci_b.low) / (ci_a.high - ci_a.low) == pytest.approx(1.96 / 0.674, rel=0.2)


def test_select_best_ranks_lowest_first_with_inverse_speedup_when_objective_is_latency(
    small_results: Path,
) -> None:
    """``latency`` is e2e_p50_ms: lower wins, speedup = baseline / config, differences stay positive
    (config minus winner) with their intervals around them."""
    selection = _select(small_results, objective="latency")
    assert (selection.objective, selection.better) == ("e2e_p50_ms", "lower")
    for level in selection.levels:
        objectives = [r.objective for r in level.ranked]
        assert objectives == sorted(objectives)
        for ranked in level.ranked:
            assert ranked.speedup == level.baseline_objective / ranked.objective
            assert ranked.objective_ci.low < ranked.objective < ranked.objective_ci.high
            if not ranked.is_baseline:
                assert ranked.speedup_ci.low < ranked.speedup < ranked.speedup_ci.high
            if ranked.rank > 1:
                difference = ranked.objective - level.ranked[0].objective
                assert 0 < ranked.difference_ci.low < difference < ranked.difference_ci.high


def test_select_best_gives_null_speedups_when_the_baseline_has_no_objective_value(tmp_path: Path) -> None:
    """A baseline whose requests all failed has no latency: it is excluded for that, and the configs
    ranked by latency get no speedup."""
    configs = (SyntheticConfig("baseline", error_rate=1.0), D4, D8)
    write_sweep(tmp_path, SyntheticSweep(configs, concurrencies=(4,), requests_per_level=30))
    level = _select(tmp_path, objective="tpot_p50_ms", max_error_rate=1.0).levels[0]
    assert (level.baseline_label, level.baseline_objective) == ("baseline", None)
    assert [(e.config_label, e.reasons) for e in level.excluded] == [
        ("baseline", ("tpot_p50_ms has no value (no successful requests)",))
    ]
    assert sorted(r.config_label for r in level.ranked) == ["chain d=4", "chain d=8"]
    assert all(r.speedup is None and r.speedup_ci is None for r in level.ranked)


def test_select_best_resamples_a_per_gpu_rate_per_request_at_an_open_loop_level(tmp_path: Path) -> None:
    """Open loop: the replicates are sums over requests / duration / GPUs, centred on the objective."""
    configs = (SyntheticConfig("baseline", gpus=2), SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, 2.6, 1.1))
    write_sweep(tmp_path, SyntheticSweep(configs=configs, concurrencies=(8,), requests_per_level=200, seed=4))
    as_open_loop(tmp_path, 4.0)
    # per GPU the baseline on 2 GPUs beats the chain on 8; in all the chain wins
    for objective, order in (
        ("output_tok_s_per_gpu", ["baseline", "chain d=4"]),
        ("output_tok_s", ["chain d=4", "baseline"]),
    ):
        (level,) = _select(tmp_path, objective=objective, replicates=400).levels
        assert [r.config_label for r in level.ranked] == order
        for ranked in level.ranked:
            ci = ranked.objective_ci
            assert (ci.high + ci.low) / 2 == pytest.approx(ranked.objective, rel=0.01)
            assert 0.02 * ranked.objective < ci.high - ci.low < 0.3 * ranked.objective
        speedup_ci = level.ranked[order.index("chain d=4")].speedup_ci
        assert speedup_ci.low < level.ranked[order.index("chain d=4")].speedup < speedup_ci.high


def test_select_best_resamples_latencies_at_a_closed_loop_level_with_fixed_output_lengths(
    tmp_path: Path,
) -> None:
    """Closed loop, every request 128 tokens: the rate's uncertainty lies in the latencies, so each
    interval has a width around its objective although the per-request values never vary."""
    sweep = SyntheticSweep(
        (BASELINE, D4), concurrencies=(4,), requests_per_level=40, output_tokens=(128, 128)
    )
    write_sweep(tmp_path, sweep)
    for ranked in _select(tmp_path).levels[0].ranked:
        ci = ranked.objective_ci
        assert ci.low < ranked.objective < ci.high and ci.high - ci.low > 0.01 * ranked.objective


def test_select_best_excludes_each_slo_miss_with_its_value(small_results: Path) -> None:
    """A ranked config shows its SLO values; an excluded one gets a reason per missed clause, in the
    form "metric = value is not op threshold", and a null value misses."""
    slos = parse_slos("tpot_p99_ms<=12,accept_length_p50>=2", SLO_METRICS)
    level = _select(small_results, slos=slos, at="concurrency=4").levels[0]
    (tpot_base,) = _column(
        small_results,
        "SELECT tpot_p99_ms FROM results WHERE config_label = 'baseline' AND load_level = 'concurrency=4'",
    )
    assert [(e.config_label, e.reasons, e.error_rate) for e in level.excluded] == [
        (
            "baseline",
            (f"tpot_p99_ms = {tpot_base:.4g} is not <= 12", "accept_length_p50 = null is not >= 2"),
            0.0,
        )
    ]
    assert [r.config_label for r in level.ranked] == ["chain d=4", "chain d=8"]
    for ranked in level.ranked:
        assert set(ranked.slo_values) == {"tpot_p99_ms", "accept_length_p50"}
        assert ranked.slo_values["tpot_p99_ms"] <= 12 and ranked.slo_values["accept_length_p50"] >= 2
        assert ranked.speedup == ranked.objective / level.baseline_objective  # excluded, still the baseline


def test_select_best_excludes_a_flaky_config_above_the_error_limit_and_one_without_successes(
    tmp_path: Path,
) -> None:
    """Above --max-error-rate: excluded with its rate in the reason. With the limit raised the flaky one
    ranks, its error rate shown; one with no success has no latency to rank by. A config with several
    faults gets every reason."""
    flaky = SyntheticConfig("flaky", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1, error_rate=0.3)
    broken = SyntheticConfig("broken", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1, error_rate=1.0)
    write_sweep(
        tmp_path, SyntheticSweep((BASELINE, flaky, broken), concurrencies=(4,), requests_per_level=40)
    )
    (rate,) = _column(tmp_path, "SELECT error_rate FROM results WHERE config_label = 'flaky'")
    assert 0.1 < rate < 0.5
    level = _select(tmp_path).levels[0]
    assert [(e.config_label, e.reasons, e.error_rate) for e in level.excluded] == [
        (
            "broken",
            ("error rate 100.0% is above the limit 1.0% (--max-error-rate)",),
            1.0,
        ),
        ("flaky", (f"error rate {rate:.1%} is above the limit 1.0% (--max-error-rate)",), rate),
    ]
    level = _select(tmp_path, max_error_rate=1.0).levels[0]
    assert level.excluded == ()
    assert {r.config_label: r.error_rate for r in level.ranked} == {
        "flaky": rate,
        "baseline": 0.0,
        "broken": 1.0,
    }
    level = _select(tmp_path, max_error_rate=1.0, objective="tpot_p50_ms").levels[0]
    assert [(e.config_label, e.reasons) for e in level.excluded] == [
        ("broken", ("tpot_p50_ms has no value (no successful requests)",))
    ]
    level = _select(tmp_path, max_error_rate=rate).levels[0]
    assert "flaky" in {r.config_label for r in level.ranked}
    # every reason a config has, in order: each SLO missed, then the error rate, then the missing objective
    level = _select(tmp_path, objective="tpot_p50_ms", slos=parse_slos("ttft_p99_ms<=1", SLO_METRICS)).levels[
        0
    ]
    ttft = dict(connect(tmp_path).execute("SELECT config_label, ttft_p99_ms FROM results").fetchall())
    assert {e.config_label: e.reasons for e in level.excluded} == {
        "baseline": (f"ttft_p99_ms = {ttft['baseline']:.4g} is not <= 1",),
        "broken": (
            "ttft_p99_ms = null is not <= 1",
            "error rate 100.0% is above the limit 1.0% (--max-error-rate)",
            "tpot_p50_ms has no value (no successful requests)",
        ),
        "flaky": (
            f"ttft_p99_ms = {ttft['flaky']:.4g} is not <= 1",
            f"error rate {rate:.1%} is above the limit 1.0% (--max-error-rate)",
        ),
    }
    assert level.ranked == ()


def test_select_best_counts_goodput_under_request_slos(small_results: Path) -> None:
    """goodput_rps = requests meeting the per-request SLOs / duration; none meeting them: 0, and a
    goodput speedup over a baseline with no goodput is null."""
    loose = _select(small_results, request_slos=parse_request_slos("e2e_ms<=1e9"), at="concurrency=4")
    for ranked in loose.levels[0].ranked:
        (job_id,) = ranked.job_ids
        ((ok, duration),) = (
            connect(small_results)
            .execute(
                "SELECT num_ok, duration_s FROM results WHERE job_id = ? AND load_level = 'concurrency=4'",
                [job_id],
            )
            .fetchall()
        )
        assert ranked.goodput_share == 1.0
        assert ranked.goodput_rps == pytest.approx(ok / duration)
    none = _select(small_results, request_slos=parse_request_slos("ttft_ms<=0")).levels[0]
    assert all(r.goodput_rps == 0.0 and r.goodput_share == 0.0 for r in none.ranked)
    # TPOT: baseline ~10.6 ms, chain d=4 ~4.5 ms per token at concurrency 4
    level = _select(small_results, objective="goodput", request_slos=parse_request_slos("tpot_ms<=7")).levels[
        0
    ]
    by_label = {r.config_label: r for r in level.ranked}
    assert by_label["baseline"].goodput_rps == 0.0 and by_label["chain d=4"].goodput_share > 0.9
    assert by_label["chain d=4"].objective == by_label["chain d=4"].goodput_rps
    assert by_label["chain d=4"].speedup is None and by_label["chain d=4"].speedup_ci is None


def test_select_best_ranks_under_an_slo_on_goodput_given_request_slos(small_results: Path) -> None:
    """With per-request SLOs an SLO may name goodput: a config below the share is excluded with its value
    (at TPOT <= 7 ms the baseline's share is 0, chain d=8's 23%, chain d=4's over 90%)."""
    level = _select(
        small_results,
        slos=parse_slos("goodput_share>=0.2", SLO_METRICS),
        request_slos=parse_request_slos("tpot_ms<=7"),
        at="concurrency=4",
    ).levels[0]
    assert [(e.config_label, e.reasons) for e in level.excluded] == [
        ("baseline", ("goodput_share = 0 is not >= 0.2",))
    ]
    assert [r.config_label for r in level.ranked] == ["chain d=4", "chain d=8"]
    assert all(r.slo_values["goodput_share"] >= 0.2 for r in level.ranked)


def test_select_best_gives_no_goodput_share_to_a_run_without_requests_in_its_window(
    small_results: Path, tmp_path: Path
) -> None:
    """A run none of whose requests was sent inside the measurement window has goodput 0 and no share
    (not 0%: there is nothing to share)."""
    out = _copy(small_results, tmp_path)
    path = job_part_path(out, "requests", "synthetic", job_id_of(SMALL, D8, 0))
    rows = pq.read_table(path)
    outside = pa.compute.if_else(
        pa.compute.equal(rows["load_level"], "concurrency=4"), False, rows["in_window"]
    )
    write_parquet_atomic(
        rows.set_column(rows.schema.get_field_index("in_window"), "in_window", outside), path
    )
    level = _select(out, request_slos=parse_request_slos("e2e_ms<=1e9"), at="concurrency=4").levels[0]
    assert {r.config_label: (r.goodput_rps, r.goodput_share) for r in level.ranked}["chain d=8"] == (
        0.0,
        None,
    )
    assert all(
        r.goodput_rps > 0 and r.goodput_share == 1.0 for r in level.ranked if r.config_label != "chain d=8"
    )


# (warmup, in_window, error_type, tpot_ms, ttft_ms) of ten requests, and whether each is good under
# "tpot_ms<=10,ttft_ms<=100" (worked in the test's docstring).
HAND_ROWS = (
    (True, False, None, 5.0, 50.0),  # warmup: not counted, though it would be good
    (False, False, None, 5.0, 50.0),  # sent during the ramp-up: not counted, though it would be good
    (False, True, None, 5.0, 50.0),  # good
    (False, True, None, 8.0, 90.0),  # good
    (False, True, None, 20.0, 50.0),  # TPOT too slow
    (False, True, None, 5.0, 300.0),  # TTFT too slow
    (False, True, None, None, 50.0),  # a one-token answer has no TPOT: that limit does not count
    (False, True, "http_500", 5.0, 50.0),  # failed
    (False, True, None, None, 300.0),  # no TPOT, TTFT too slow
    (False, True, None, 10.0, 100.0),  # exactly at both limits: good
)


def test_select_best_counts_goodput_by_hand_when_rows_are_warmup_ramp_failed_or_lack_a_tpot(
    small_results: Path, tmp_path: Path
) -> None:
    """goodput under "tpot_ms<=10,ttft_ms<=100" on ten hand-made requests of one run (HAND_ROWS): the
    warmup and the ramp-up request are left out although they would be good, so 8 requests were sent
    inside the window; of those, rows 2, 3, 6 (a null TPOT does not count against it) and 9 (limits are
    inclusive) are good, 4 slow, 7 failed: goodput_share = 4 / 8 = 0.5, goodput_rps = 4 / duration_s.
    Counting the ramp-up gives 5/9, a null TPOT as a miss 3/8, strict limits 3/8."""
    out = _copy(small_results, tmp_path)
    job_id = job_id_of(SMALL, D4, 0)
    path = job_part_path(out, "requests", "synthetic", job_id)
    table = pq.read_table(path)
    rows = table.to_pylist()
    level = [row for row in rows if row["load_level"] == "concurrency=4"][: len(HAND_ROWS)]
    for row, (warmup, in_window, error_type, tpot_ms, ttft_ms) in zip(level, HAND_ROWS, strict=True):
        row.update(
            warmup=warmup, in_window=in_window, error_type=error_type, tpot_ms=tpot_ms, ttft_ms=ttft_ms
        )
    others = [row for row in rows if row["load_level"] != "concurrency=4"]
    write_parquet_atomic(pa.Table.from_pylist(others + level, schema=table.schema), path)
    (duration_s,) = _column(
        out, "SELECT duration_s FROM results WHERE job_id = ? AND load_level = 'concurrency=4'", job_id
    )
    level_choice = _select(
        out,
        request_slos=parse_request_slos("tpot_ms<=10,ttft_ms<=100"),
        at="concurrency=4",
        max_error_rate=1.0,
    ).levels[0]
    ranked = {r.config_label: r for r in level_choice.ranked}["chain d=4"]
    assert ranked.goodput_share == 0.5
    assert ranked.goodput_rps == pytest.approx(4 / duration_s, rel=1e-12)  # type: ignore[operator]


def test_select_best_ties_one_good_request_with_none(small_results: Path) -> None:
    """A request SLO only the fastest request meets: its config wins with one good request, which is
    not distinguishable from none (a resample may leave that request out, so the difference's interval
    starts at 0 exactly); the configs with no goodput follow by name, and with no baseline goodput
    there is no speedup. With no good request at all every config ties at 0, the first by name included
    (it is one of the tie set, not a winner), and no repeats would help."""
    level = "concurrency=4"
    fastest, second = _column(
        small_results,
        f"SELECT e2e_ms FROM requests WHERE load_level = ? AND {MEASURED} ORDER BY e2e_ms LIMIT 2",
        level,
    )
    request_slos = parse_request_slos(f"e2e_ms<={(fastest + second) / 2!r}")
    with warnings.catch_warnings():  # speedup resamples over a baseline of 0: no numpy warning leaks out
        warnings.simplefilter("error")
        choice = _select(
            small_results, objective="goodput", request_slos=request_slos, at=level, replicates=400
        )
    winner, *rest = choice.levels[0].ranked
    assert [r.config_label for r in choice.levels[0].ranked] == ["chain d=4", "baseline", "chain d=8"]
    assert winner.objective == winner.goodput_rps > 0 and winner.objective_ci.low == 0.0
    for ranked in rest:
        assert (ranked.objective, ranked.objective_ci) == (0.0, Interval(0.0, 0.0))
        assert ranked.tie and ranked.difference_ci == Interval(0.0, winner.objective_ci.high)
        needed = math.ceil((winner.objective_ci.high / 2 / winner.objective) ** 2)
        assert ranked.more_repeats == max(1, needed - 1)
    assert all(r.speedup is None and r.speedup_ci is None for r in choice.levels[0].ranked)
    none = _select(
        small_results, objective="goodput", request_slos=parse_request_slos("ttft_ms<=0"), at=level
    )
    assert [
        (r.config_label, r.objective, r.tie, r.difference_ci, r.more_repeats) for r in none.levels[0].ranked
    ] == [
        ("baseline", 0.0, True, None, None),
        ("chain d=4", 0.0, True, Interval(0.0, 0.0), None),
        ("chain d=8", 0.0, True, Interval(0.0, 0.0), None),
    ]


def test_select_best_separates_configs_less_than_one_unit_apart(small_results: Path) -> None:
    """Accept lengths differ by less than one token: the runner-up's difference interval lies in (0, 1),
    so it is no tie and gets no estimate of repeats; the baseline has no accept length to rank by."""
    level = _select(small_results, objective="accept_length_p50", at="concurrency=4").levels[0]
    assert [r.config_label for r in level.ranked] == ["chain d=8", "chain d=4"]
    runner_up = level.ranked[1]
    difference = level.ranked[0].objective - runner_up.objective
    assert 0 < runner_up.difference_ci.low < difference < runner_up.difference_ci.high < 1
    assert not runner_up.tie and runner_up.more_repeats is None
    assert [(e.config_label, e.reasons) for e in level.excluded] == [
        (
            "baseline",
            (
                "accept_length_p50 has no value (its requests do not report it: the baseline does not speculate)",
            ),
        )
    ]


def test_select_best_says_when_a_speculative_config_reports_no_value_for_the_objective(
    small_results: Path, tmp_path: Path
) -> None:
    """A speculative config whose successful requests lack the objective is excluded for that, not for
    failed requests, and not as the baseline."""
    out = _copy(small_results, tmp_path)
    path = job_part_path(out, "levels", "synthetic", job_id_of(SMALL, D4, 0))
    rows = pq.read_table(path)
    field = rows.schema.get_field_index("accept_length_p50")
    write_parquet_atomic(
        rows.set_column(field, "accept_length_p50", pa.nulls(rows.num_rows, pa.float64())), path
    )
    level = _select(out, objective="accept_length_p50", at="concurrency=4").levels[0]
    assert [(e.config_label, e.reasons) for e in level.excluded] == [
        (
            "baseline",
            (
                "accept_length_p50 has no value (its requests do not report it: the baseline does not speculate)",
            ),
        ),
        ("chain d=4", ("accept_length_p50 has no value (its successful requests do not report it)",)),
    ]
    assert [r.config_label for r in level.ranked] == ["chain d=8"]


def _write_repeats(out: Path) -> SyntheticSweep:
    """Two chains close together and the baseline, launches 3% apart: three launches of chain d=5 and the
    baseline, two of chain d=4. The chains tie, and a few more repeats would separate them."""
    factors = (1.0, 1.03, 0.97)
    configs = (
        SyntheticConfig("baseline", repeats=3, launch_tpot_factors=factors),
        SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, 2.6, 1.1, repeats=2, launch_tpot_factors=factors[:2]),
        SyntheticConfig("chain d=5", "EAGLE3", 4, 1, 5, 2.68, 1.1, repeats=3, launch_tpot_factors=factors),
    )
    sweep = SyntheticSweep(configs=configs, concurrencies=(4,), requests_per_level=60, seed=11)
    write_sweep(out, sweep)
    return sweep


def test_select_best_takes_medians_over_repeats_and_estimates_repeats_for_a_tie(tmp_path: Path) -> None:
    """With two or three launches: objective = median, MAD given, job ids in launch order, an interval
    that resamples the launches; the tie's estimate of more repeats follows its interval's half-width
    (1 / sqrt(repeats) shrinkage), counted from the fewer repeats of the two."""
    sweep = _write_repeats(tmp_path)
    level = _select(tmp_path, replicates=400).levels[0]
    assert [r.config_label for r in level.ranked] == ["chain d=5", "chain d=4", "baseline"]
    for ranked in level.ranked:
        cfg = sweep.config(ranked.config_label)
        assert ranked.job_ids == tuple(job_id_of(sweep, cfg, r) for r in range(cfg.repeats))
        values = [
            _column(tmp_path, "SELECT output_tok_s_per_gpu FROM results WHERE job_id = ?", job_id)[0]
            for job_id in ranked.job_ids
        ]
        median = float(np.median(values))
        assert ranked.repeats == cfg.repeats and ranked.objective == median
        assert ranked.objective_mad == float(np.median([abs(v - median) for v in values]))
        # launches are resampled too, so the interval holds every launch's value, not just the median
        assert ranked.objective_ci.low < min(values) and max(values) < ranked.objective_ci.high
    tied = level.ranked[1]
    assert tied.tie and tied.repeats == 2
    ci = tied.difference_ci
    difference = level.ranked[0].objective - tied.objective
    assert ci.low <= 0 < difference < ci.high
    needed = math.ceil(2 * ((ci.high - ci.low) / 2 / difference) ** 2)
    assert needed - 2 <= 100 and tied.more_repeats == max(1, needed - 2)
    assert level.ranked[2].is_baseline and not level.ranked[2].tie and level.ranked[2].more_repeats is None


@pytest.mark.parametrize(
    ("difference", "interval", "repeats", "more"),
    [
        (1.0, Interval(-1.0, 3.0), 2, 6),  # half-width 2: 2 x 4 = 8 repeats needed
        (1.0, Interval(-0.1, 0.1), 2, 1),  # already enough by the formula: at least one more
        (0.0, Interval(-1.0, 1.0), 2, None),  # equal point values: no number of repeats separates them
        (-1.0, Interval(-3.0, 1.0), 2, None),
        (1.0, Interval(-10.04, 10.04), 1, 100),  # 101 needed: 100 more, the most reported
        (1.0, Interval(-10.09, 10.09), 1, None),  # 102 needed: not worth reporting
    ],
)
def test_more_repeats_scales_the_half_width_by_one_over_sqrt_repeats(
    difference: float, interval: Interval, repeats: int, more: int | None
) -> None:
    """The estimate a tie reports: repeats x (half-width / difference)^2 in all, minus those run."""
    assert _more_repeats(difference, interval, repeats) == more


def test_select_best_notes_what_the_results_lack(small_results: Path, tmp_path: Path) -> None:
    """No sweep row, a done job without levels rows, a baseline missing at one level: each gets its note,
    and that level's speedups are null."""
    out = _copy(small_results, tmp_path)
    shutil.rmtree(sweep_part_path(out, "synthetic").parent)
    job_d8 = job_id_of(SMALL, D8, 0)
    job_part_path(out, "levels", "synthetic", job_d8).unlink()
    base_levels = job_part_path(out, "levels", "synthetic", job_id_of(SMALL, BASELINE, 0))
    rows = pq.read_table(base_levels)
    write_parquet_atomic(rows.filter(pa.compute.equal(rows["load_level"], "concurrency=4")), base_levels)
    selection = _select(out)
    assert selection.notes == (
        "no sweep row (OUT/sweep/...): spec and versions are unknown",
        "config 'chain d=8' is done but has no levels rows: not ranked",
        "concurrency=64: the baseline was not measured here: speedups are null",
    )
    high = selection.levels[1]
    assert high.baseline_label == "baseline" and high.baseline_objective is None
    assert [r.config_label for r in high.ranked] == ["chain d=4"]
    assert high.ranked[0].speedup is None and high.ranked[0].speedup_ci is None
    assert selection.levels[0].ranked[0].speedup is not None


def test_select_best_notes_baselines_and_failures(tmp_path: Path) -> None:
    """Two no-speculation configs: the first by name is the baseline, noted; a failed job is named with
    its error; with no baseline at all the speedups are null, noted."""
    failing = SyntheticConfig("chain d=16", "EAGLE3", 15, 1, 16, accept_length=4.0, fails=True)
    configs = (BASELINE, SyntheticConfig("baseline b"), D4, failing)
    write_sweep(tmp_path / "a", SyntheticSweep(configs=configs, concurrencies=(4,), requests_per_level=30))
    selection = _select(tmp_path / "a")
    assert selection.notes == (
        "config 'chain d=16' failed (ServerStartupError: server exited with code 1 during startup (CUDA out of "
        "memory)): not ranked",
        "several baseline configs ['baseline', 'baseline b']: speedups use 'baseline'",
    )
    level = selection.levels[0]
    assert {r.config_label: r.is_baseline for r in level.ranked} == {
        "baseline": True,
        "baseline b": False,
        "chain d=4": False,
    }
    assert {r.config_label: r.speedup_ci is None for r in level.ranked} == {
        "baseline": True,
        "baseline b": False,
        "chain d=4": False,
    }
    write_sweep(tmp_path / "b", SyntheticSweep(configs=(D4, D8), concurrencies=(4,), requests_per_level=30))
    selection = _select(tmp_path / "b")
    assert selection.notes == ("no no-speculation baseline was measured: speedups are null",)
    assert selection.levels[0].baseline_label is None and selection.levels[0].baseline_objective is None
    assert all(r.speedup is None and r.speedup_ci is None for r in selection.levels[0].ranked)


def test_select_best_refuses_unfinished_or_mixed_results(small_results: Path, tmp_path: Path) -> None:
    """Jobs started but not committed: refused naming up to five (then "..."); --allow-partial ranks the
    rest with a note. Two sweeps in one directory: refused."""
    out = _copy(small_results, tmp_path)
    for i in range(6):
        write_parquet_atomic(pa.table({"a": [1]}), attempt_path(out, f"job{i}", 1, "requests"))
        if i == 4:
            with pytest.raises(ResultsError) as five:
                _select(out)
            assert five.value.problem.endswith(
                "5 job(s) started but not committed (job0, job1, job2, job3, job4)"
            )
    message = "sweep is not finished: 6 job(s) started but not committed (job0, job1, job2, job3, job4 ...)"
    with pytest.raises(ResultsError) as refused:
        _select(out)
    assert refused.value.problem == message and refused.value.where == str(out)
    assert refused.value.fix == (
        "wait for `specsweep run` to finish (or resume it), or pass --allow-partial "
        "to rank only the committed jobs"
    )
    assert _select(out, allow_partial=True).notes == (message + "; ranking covers committed jobs only",)
    write_sweep(
        out, SyntheticSweep(configs=(BASELINE,), concurrencies=(4,), requests_per_level=10, sweep_id="other")
    )
    with pytest.raises(ResultsError) as refused:
        _select(out, allow_partial=True)
    assert refused.value.problem == "holds 2 sweeps (other, synthetic); best ranks one sweep at a time"
    assert refused.value.fix == "give each sweep its own output directory"


def test_select_best_ranks_the_fixed_levels_of_a_sweep_that_also_searched_capacity(
    small_results: Path, tmp_path: Path
) -> None:
    """Capacity probes beside fixed load levels: the levels are ranked as without them."""
    out = _copy(small_results, tmp_path)
    job_id = job_id_of(SMALL, D4, 0)
    write_parquet_atomic(
        capacity_table([_probe("synthetic", job_id, 0, 4.0, True)]),
        job_part_path(out, "capacity", "synthetic", job_id),
    )
    assert [lv.winner.config_label for lv in _select(out).levels if lv.winner] == ["chain d=4", "baseline"]


def test_select_best_points_at_capacity_when_the_sweep_has_no_fixed_levels(
    small_results: Path, tmp_path: Path
) -> None:
    """Capacity searches only: the refusal names --objective capacity."""
    out = _copy(small_results, tmp_path)
    shutil.rmtree(out / "levels")
    shutil.rmtree(out / "requests")
    job_id = job_id_of(SMALL, D4, 0)
    probes = capacity_table([_probe("synthetic", job_id, 0, 4.0, True)])
    write_parquet_atomic(probes, job_part_path(out, "capacity", "synthetic", job_id))
    with pytest.raises(ResultsError) as refused:
        _select(out)
    assert refused.value.problem == "the sweep ran capacity searches only, no fixed load levels"
    assert refused.value.where == str(out)
    assert refused.value.fix == (
        "rank them with `specsweep best OUT --objective capacity`, or add load.concurrency / "
        "load.rates levels to the spec for per-level rankings and the report"
    )


def test_select_best_ranks_only_the_roles_asked_for(small_results: Path, tmp_path: Path) -> None:
    """A confirmation launch is left out by default and ranked beside the grid when asked; with no job
    of the roles asked for, the refusal says so."""
    out = _copy(small_results, tmp_path)
    path = job_part_path(out, "jobs", "synthetic", job_id_of(SMALL, D4, 0))
    rows = pq.read_table(path)
    rows = rows.set_column(rows.schema.get_field_index("role"), "role", pa.array(["confirmation"]))
    write_parquet_atomic(rows, path)
    default = _select(out).levels[0]
    assert [r.config_label for r in default.ranked] == ["chain d=8", "baseline"]
    both = _select(out, roles=("sweep", "confirmation")).levels[0]
    assert [r.config_label for r in both.ranked] == ["chain d=4", "chain d=8", "baseline"]
    with pytest.raises(ResultsError) as refused:
        _select(out, roles=("other",))
    assert refused.value.problem == "no job finished with measured load levels (every committed job failed)"
    assert refused.value.where == str(out)
    assert (
        refused.value.fix
        == 'see `specsweep sql OUT "SELECT config_label, error_class, error_message FROM jobs"`'
    )


def test_ratio_replicates_are_exact_when_every_cell_has_the_same_ratio() -> None:
    """Cells with one value / latency ratio give replicates of exactly 1; an empty cell is ignored; no
    value at all gives 1 (no spread)."""
    rng = np.random.default_rng(0)
    counts = np.array([10.0, 0.0, 30.0])
    reps = ratio_replicates(rng, counts, np.array([20.0, 0.0, 90.0]), np.array([200.0, 0.0, 900.0]), 50)
    assert reps.shape == (50,) and np.allclose(reps, 1.0, rtol=1e-12)
    zero = ratio_replicates(rng, counts, np.zeros(3), np.array([200.0, 0.0, 900.0]), 50)
    assert np.array_equal(zero, np.ones(50))


def test_ratio_replicates_spread_like_the_ratio_of_sums_of_resampled_requests() -> None:
    """Two cells, values 1 and 3 per unit latency: replicates centre on 1 with the delta method's spread."""
    rng = np.random.default_rng(1)
    counts = np.array([400.0, 400.0])
    values, latencies = np.array([400.0, 1200.0]), np.array([400.0, 400.0])
    reps = ratio_replicates(rng, counts, values, latencies, 4000)
    # ratio R = (a + 3b) / (a + b) / 2 with a, b ~ N(400, 400): sd = sqrt(2 * 400) / 800 / 2 * ... = 1/(2 sqrt(800))
    assert reps.mean() == pytest.approx(1.0, abs=0.003)
    assert reps.std() == pytest.approx(1 / (2 * math.sqrt(800)), rel=0.1)
    tiny = ratio_replicates(rng, np.array([0.01]), np.array([1.0]), np.array([1.0]), 2000)
    assert np.isfinite(tiny).all() and (tiny >= 0).all()


def test_ratio_replicates_may_draw_a_cell_empty_when_it_holds_one_request() -> None:
    """A cell's count is drawn from N(count, count) cut at 0: with one request in the cell with all the
    value, P(drawn empty) = P(N(1, 1) <= 0) = 15.9%, and those replicates are 0; with the other cell
    drawn empty instead they are 2 (all the latency was that cell's)."""
    rng = np.random.default_rng(6)
    reps = ratio_replicates(rng, np.array([1.0, 1.0]), np.array([0.0, 2.0]), np.array([1.0, 1.0]), 8000)
    assert (reps == 0).mean() == pytest.approx(0.1587, abs=0.015)
    assert (reps == 2).mean() == pytest.approx(0.1587 * 0.8413, abs=0.015)


def test_rate_replicates_resample_the_sum_over_requests() -> None:
    """Equal values: every replicate is n x value. Two values: sums on their lattice, binomial spread."""
    rng = np.random.default_rng(2)
    assert np.array_equal(rate_replicates(rng, np.array([5.0]), np.array([40.0]), 20), np.full(20, 200.0))
    reps = rate_replicates(rng, np.array([1.0, 101.0]), np.array([30.0, 10.0]), 4000)
    heavy = (reps - 40.0) / 100.0
    assert np.array_equal(heavy, np.round(heavy)) and heavy.min() >= 0 and heavy.max() <= 40
    assert heavy.mean() == pytest.approx(10.0, abs=0.2)
    assert heavy.std() == pytest.approx(math.sqrt(40 * 0.25 * 0.75), rel=0.07)


def test_rate_replicates_keep_the_mean_of_many_values() -> None:
    """More distinct values than bins: each bin is its mean, so the replicates' mean is still n x mean,
    and the top and bottom values fall in bins of their own."""
    rng = np.random.default_rng(3)
    values = np.arange(1.0, 101.0)
    counts = np.ones(100)
    reps = rate_replicates(rng, values, counts, 20000)
    assert reps.mean() == pytest.approx(values.sum(), rel=0.002)
    assert reps.std() == pytest.approx(values.std() * 10, rel=0.05)
    two = rate_replicates(rng, np.array([1.0, 1000.0]), np.array([1.0, 1.0]), 4000)
    assert set(np.unique(two)) == {2.0, 1001.0, 2000.0}


def test_rate_replicates_draw_bin_counts_over_sixteen_equal_width_bins() -> None:
    """The bins span min to max in 16 equal widths (here 1), closed below, the top value in the last
    bin; each bin is its mean and a replicate is a multinomial draw of the bins' counts."""
    values = np.array([0.0, 0.5, 1.5, 2.5, 3.0, 14.5, 15.5, 16.0])
    counts = np.array([1.0, 3.0, 1.0, 2.0, 1.0, 1.0, 2.0, 1.0])
    # bins [0, 1): 0 and 0.5; [2, 3): 2.5 alone, 3.0 opens the next; [15, 16]: 15.5 and 16
    means = np.array([(0.0 + 3 * 0.5) / 4, 1.5, 2.5, 3.0, 14.5, (2 * 15.5 + 16.0) / 3])
    shares = np.array([4, 1, 2, 1, 1, 3]) / 12
    expected = np.random.default_rng(5).multinomial(12, shares, size=300) @ means
    assert np.allclose(rate_replicates(np.random.default_rng(5), values, counts, 300), expected, rtol=1e-12)


@pytest.mark.parametrize("values", [[0.0, 10.0], [0.0, 10.0, 20.0]])
@pytest.mark.parametrize("q", [0.0, 0.5, 0.9, 1.0])
def test_quantile_replicates_interpolate_between_resampled_order_statistics(
    q: float, values: list[float]
) -> None:
    """One value: every replicate is it. Two or three values: replicates are quantile_cont of resamples
    of as many values, so points of the interpolation lattice, spread as the resamples' quantiles."""
    rng = np.random.default_rng(4)
    assert np.array_equal(quantile_replicates(rng, np.array([7.0]), q, 5), np.full(5, 7.0))
    sample = np.array(values)
    reps = quantile_replicates(rng, sample, q, 20000)
    resamples = np.sort(rng.choice(sample, (20000, sample.size)), axis=1)
    expected = np.quantile(resamples, q, axis=1)
    assert set(np.unique(reps)) <= set(np.unique(expected))
    assert reps.mean() == pytest.approx(expected.mean(), abs=0.3)
    assert reps.std() == pytest.approx(expected.std(), rel=0.05, abs=0.05)


def test_interval_reads_the_central_percentiles_of_the_replicates() -> None:
    """A 95% interval spans the 2.5th to the 97.5th percentile, a 50% one the quartiles."""
    replicates = np.arange(1001.0)
    for confidence, low, high in ((0.95, 25.0, 975.0), (0.5, 250.0, 750.0)):
        ci = _interval(replicates, confidence)
        assert (ci.low, ci.high) == pytest.approx((low, high), rel=1e-9)


def test_share_text_shows_a_percentage_or_a_dash() -> None:
    """Error rates in tables: one decimal percent, "-" when unknown."""
    assert (share_text(0.01234), share_text(0.0), share_text(None)) == ("1.2%", "0.0%", "-")
