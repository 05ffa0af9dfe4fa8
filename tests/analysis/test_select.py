"""best: right config per level on known truth, SLOs honoured, intervals cover the true speedup."""

from __future__ import annotations

import math
import warnings
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from analysis.layout import attempt_path
from analysis.metrics import METRICS_BY_NAME
from analysis.schema import write_parquet_atomic
from analysis.select import SLO_METRICS, quantile_replicates, rate_replicates, select_best
from analysis.slo import parse_slos
from analysis.synthetic import SyntheticConfig, SyntheticSweep, write_sweep
from analysis.views import connect
from specsweep.errors import ResultsError

from .conftest import CLEAR_CONFIGS, as_open_loop, clear_sweep


def _select(out: Path, **kwargs):  # type: ignore[no-untyped-def]
    return select_best(connect(out), out, **kwargs)


def test_select_best_picks_true_best_when_configs_clearly_apart(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Per level the winner is the config with the highest true tok/s per GPU."""
    out, sweep = clear_results
    selection = _select(out)
    assert [lv.load_level for lv in selection.levels] == [f"concurrency={c}" for c in sweep.concurrencies]
    for level, concurrency in zip(selection.levels, sweep.concurrencies, strict=True):
        truth = max(sweep.configs, key=lambda c: sweep.true_output_tok_s_per_gpu(c, concurrency))
        assert level.winner is not None and level.winner.config_label == truth.label
        assert level.winner.launch_command is not None
        assert level.winner.launch_command.startswith("python -m sglang.launch_server")
    assert selection.levels[-1].winner.is_baseline  # at concurrency 128 speculation loses


def test_select_best_interval_covers_true_speedup_when_baseline_measured(clear_results) -> None:  # type: ignore[no-untyped-def]
    """The winners' 95% speedup intervals contain the true speedup, and nearly all others do.

    (A 95% interval misses 1 time in 20; the nominal rate is checked on 200 runs below.)
    """
    out, sweep = clear_results
    covered = []
    for level, concurrency in zip(_select(out).levels, sweep.concurrencies, strict=True):
        for ranked in level.ranked:
            if ranked.is_baseline:
                assert ranked.speedup == 1.0 and ranked.speedup_ci is None
                continue
            truth = sweep.true_speedup(ranked.config_label, concurrency)
            hit = ranked.speedup_ci.low <= truth <= ranked.speedup_ci.high
            assert hit or ranked.rank > 1, (level.load_level, ranked.speedup_ci, truth)
            covered.append(hit)
    assert len(covered) == 9 and sum(covered) >= 8


def test_select_best_honours_each_slo_when_some_configs_miss(clear_results) -> None:  # type: ignore[no-untyped-def]
    """Ranked configs meet every clause; excluded ones miss one, named with its value; truth agrees."""
    out, sweep = clear_results
    slos = parse_slos("tpot_p99_ms<=13,ttft_p99_ms<=500", SLO_METRICS)
    selection = _select(out, slos=slos)
    by_level = {lv.load_level: lv for lv in selection.levels}
    for level in selection.levels:
        for ranked in level.ranked:
            assert all(s.holds(ranked.slo_values[s.metric]) for s in slos)
        for excluded in level.excluded:
            assert excluded.reasons and all("is not" in r for r in excluded.reasons)
    expected_c1 = {c.label for c in sweep.configs if sweep.true_tpot_quantile_ms(c, 1, 0.99) <= 13}
    assert (
        {r.config_label for r in by_level["concurrency=1"].ranked}
        == expected_c1
        == {"chain d=4", "chain d=8", "tree s=3 k=4 n=8"}
    )
    assert [r.config_label for r in by_level["concurrency=16"].ranked] == ["chain d=4"]
    assert by_level["concurrency=128"].ranked == () and by_level["concurrency=128"].winner is None
    ttft_reasons = [r for e in by_level["concurrency=128"].excluded for r in e.reasons if "ttft" in r]
    assert len(ttft_reasons) == len(sweep.configs)


def test_select_best_ranks_lower_is_better_when_objective_is_latency(clear_results) -> None:  # type: ignore[no-untyped-def]
    """With tpot_p50_ms the lowest wins and speedup = baseline / config, its CI covering the truth."""
    out, sweep = clear_results
    level = _select(out, objective="tpot_p50_ms", at="concurrency=1").levels[0]
    assert level.winner.config_label == "chain d=4"
    objectives = [r.objective for r in level.ranked]
    assert objectives == sorted(objectives)
    d4 = sweep.config("chain d=4")
    base = sweep.config("baseline")
    truth = sweep.true_tpot_quantile_ms(base, 1, 0.5) / sweep.true_tpot_quantile_ms(d4, 1, 0.5)
    assert level.winner.speedup_ci.low <= truth <= level.winner.speedup_ci.high


def test_rate_replicates_cover_truth_at_nominal_rate_when_repeated() -> None:
    """Over 200 simulated runs the 95% interval of a token sum ratio covers the truth 90-99% of the time."""
    rng = np.random.default_rng(1)
    covered = 0
    trials = 200
    for _ in range(trials):
        a = rng.integers(32, 257, 300).astype(float)
        b = rng.integers(32, 257, 300).astype(float) * 1.5
        va, ca = np.unique(a, return_counts=True)
        vb, cb = np.unique(b, return_counts=True)
        ratio = rate_replicates(rng, vb, cb, 1000) / rate_replicates(rng, va, ca, 1000)
        low, high = np.percentile(ratio, [2.5, 97.5])
        covered += low <= 1.5 <= high
    assert 0.90 * trials <= covered <= 0.99 * trials


def test_quantile_replicates_cover_true_p90_when_repeated() -> None:
    """The order-statistic bootstrap of a p90 covers a lognormal's true p90 at about 95%."""
    rng = np.random.default_rng(2)
    true_p90 = math.exp(0.3 * 1.2815515655446004)
    covered = 0
    trials = 200
    for _ in range(trials):
        sample = np.sort(rng.lognormal(0.0, 0.3, 400))
        reps = quantile_replicates(rng, sample, 0.9, 1000)
        low, high = np.percentile(reps, [2.5, 97.5])
        covered += low <= true_p90 <= high
    assert 0.88 * trials <= covered <= 0.99 * trials


def test_quantile_replicates_center_on_quantile_cont_when_sample_large() -> None:
    """The replicates' median matches numpy's linear-interpolated quantile of the sample."""
    rng = np.random.default_rng(3)
    sample = np.sort(rng.normal(size=5000))
    reps = quantile_replicates(rng, sample, 0.5, 2000)
    assert np.median(reps) == pytest.approx(np.quantile(sample, 0.5), abs=0.03)


def test_select_best_reports_median_mad_and_ties_when_repeats(tmp_path: Path) -> None:
    """Repeats share a label: objective = median over repeats, MAD given; near-equal configs tie."""
    configs = (
        SyntheticConfig("baseline", repeats=3),
        SyntheticConfig("chain d=4", "EAGLE3", 3, 1, 4, accept_length=2.6, step_cost=1.1, repeats=3),
        SyntheticConfig("chain d=5", "EAGLE3", 4, 1, 5, accept_length=2.62, step_cost=1.1, repeats=3),
    )
    write_sweep(tmp_path, SyntheticSweep(configs=configs, concurrencies=(4,), requests_per_level=300))
    con = connect(tmp_path)
    level = select_best(con, tmp_path).levels[0]
    top = {r.config_label: r for r in level.ranked}
    for label in ("chain d=4", "chain d=5"):
        runs = con.sql(
            "SELECT output_tok_s_per_gpu FROM results WHERE config_label = ?", params=[label]
        ).fetchall()
        values = sorted(v for (v,) in runs)
        assert top[label].repeats == 3
        assert top[label].objective == pytest.approx(values[1])
        assert top[label].objective_mad == pytest.approx(
            float(np.median([abs(v - values[1]) for v in values]))
        )
    assert level.ranked[1].tie and level.ranked[1].config_label in ("chain d=4", "chain d=5")
    assert not level.ranked[2].tie and level.ranked[2].is_baseline


def test_select_best_nulls_speedups_with_note_when_no_baseline(tmp_path: Path) -> None:
    """Without a no-speculation run, configs still rank but speedups are null and a note says why."""
    write_sweep(tmp_path, clear_sweep(configs=CLEAR_CONFIGS[1:], requests_per_level=100))
    selection = _select(tmp_path)
    assert any("no no-speculation baseline" in n for n in selection.notes)
    assert all(r.speedup is None and r.speedup_ci is None for lv in selection.levels for r in lv.ranked)


def test_select_best_gives_finite_speedup_intervals_when_levels_have_few_requests(tmp_path: Path) -> None:
    """With 3 requests a level some resamples hold no tokens: no warning, no inf or NaN bound."""
    write_sweep(tmp_path, clear_sweep(concurrencies=(1,), requests_per_level=3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        selection = _select(tmp_path)
    intervals = [r.speedup_ci for lv in selection.levels for r in lv.ranked if not r.is_baseline]
    assert intervals
    for ci in intervals:
        assert ci is None or (math.isfinite(ci.low) and math.isfinite(ci.high))


def test_select_best_notes_failed_job_when_config_failed(tmp_path: Path) -> None:
    """A failed job is not ranked and the note names its error class."""
    failing = SyntheticConfig("chain d=16", "EAGLE3", 15, 1, 16, accept_length=4.0, fails=True)
    write_sweep(tmp_path, clear_sweep(configs=(*CLEAR_CONFIGS, failing), requests_per_level=100))
    selection = _select(tmp_path)
    assert any("chain d=16" in n and "ServerStartupError" in n for n in selection.notes)
    assert all(r.config_label != "chain d=16" for lv in selection.levels for r in lv.ranked)


def test_select_best_refuses_unfinished_sweep_unless_partial_allowed(tmp_path: Path) -> None:
    """A job with attempt files and no jobs row -> error naming it; --allow-partial ranks the rest."""
    write_sweep(tmp_path, clear_sweep(requests_per_level=100))
    write_parquet_atomic(pa.table({"a": [1]}), attempt_path(tmp_path, "deadbeefcafe0001", 1, "requests"))
    with pytest.raises(
        ResultsError, match=r"not finished: 1 job\(s\) started but not committed \(deadbeefcafe0001\)"
    ):
        _select(tmp_path)
    selection = _select(tmp_path, allow_partial=True)
    assert any("committed jobs only" in n for n in selection.notes)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"objective": "tok_s_per_gpu"}, "unknown metric 'tok_s_per_gpu'"),
        ({"objective": "num_errors"}, "cannot be an objective"),
        ({"at": "concurrency=3"}, "'concurrency=3' was not measured"),
        ({"replicates": 10}, "too few"),
    ],
)
def test_select_best_raises_clear_error_when_input_bad(clear_results, kwargs, message) -> None:  # type: ignore[no-untyped-def]
    """Each bad argument raises ResultsError with a message naming it."""
    out, _ = clear_results
    with pytest.raises(ResultsError, match=message):
        _select(out, **kwargs)


def test_select_best_ranks_a_rate_objective_at_an_open_loop_level_with_the_multinomial_interval(
    tmp_path: Path,
) -> None:
    """At an open-loop level a rate objective is resampled per request (no latency cells): the winner is
    the true best, the speedup intervals cover the truth, and each config's interval is the bootstrap of
    a sum over its n requests: centred on the objective, half-width z * sd(value) * sqrt(n) / duration
    (with no launch noise assumed, so the interval is the request-level one alone)."""
    sweep = clear_sweep(concurrencies=(16,), requests_per_level=600)
    write_sweep(tmp_path, sweep)
    level_name = as_open_loop(tmp_path, 8.0)
    con = connect(tmp_path)
    (level,) = select_best(con, tmp_path, launch_noise=0.0).levels
    assert level.load_level == level_name
    truth = max(sweep.configs, key=lambda c: sweep.true_output_tok_s_per_gpu(c, 16))
    assert level.winner is not None and level.winner.config_label == truth.label
    value = METRICS_BY_NAME["output_tok_s_per_gpu"].aggregate.value  # type: ignore[union-attr]
    for ranked in level.ranked:
        if not ranked.is_baseline:
            true_speedup = sweep.true_speedup(ranked.config_label, 16)
            speedup_ci = ranked.speedup_ci
            assert speedup_ci is not None and speedup_ci.low <= true_speedup <= speedup_ci.high, ranked
        (job_id,) = ranked.job_ids
        values = np.array(
            con.sql(
                f"SELECT ({value})::DOUBLE FROM requests WHERE NOT warmup AND job_id = ?", params=[job_id]
            )
            .fetchnumpy()
            .popitem()[1]
        )
        half_width = 1.96 * values.std() * math.sqrt(values.size) / values.sum() * ranked.objective
        ci = ranked.objective_ci
        assert ci is not None and ci.low < ranked.objective < ci.high
        assert (ci.high - ci.low) / 2 == pytest.approx(half_width, rel=0.2), (ranked.config_label, ci)
        assert (ci.high + ci.low) / 2 == pytest.approx(ranked.objective, rel=0.01)
