"""Each level metric on a three-row table, computed by hand (summarize_level runs the definitions)."""

from __future__ import annotations

import numpy as np
import pytest

from analysis.levels import summarize_level
from analysis.metrics import METRICS_BY_NAME
from analysis.schema import LEVEL_PERCENTILES, RequestRecord, requests_table
from analysis.select import OBJECTIVE_METRICS


def _request(i: int, **changes: object) -> RequestRecord:
    values: dict[str, object] = dict(
        request_id=str(i),
        load_level="concurrency=2",
        concurrency=2,
        rate_rps=None,
        endpoint="/generate",
        warmup=False,
        scheduled_ns=0,
        start_ns=0,
        end_ns=1,
        ttft_ms=100.0,
        e2e_ms=190.0,
        tpot_ms=10.0,
        prompt_tokens=5,
        completion_tokens=10,
        chunk_arrival_ns=None,
        chunk_tokens=None,
        server_chunk_ns=None,
        itl_per_token_ms=[10.0, 10.0],
        itl_per_step_ms=None,
        finish_reason="length",
        spec_verify_ct=4,
        spec_accept_length=2.5,
        spec_accept_rate=None,
        spec_num_correct_drafts=None,
        spec_num_proposed_drafts=None,
        spec_correct_drafts_histogram=[1, 2, 1],
        http_status=200,
        error_type=None,
        error_message=None,
    )
    values.update(changes)
    values.setdefault("in_window", not values["warmup"])  # the window holds every measured row here
    values.setdefault("window_tokens", values["completion_tokens"])
    return RequestRecord(**values)  # type: ignore[arg-type]


THREE_ROWS = [
    _request(1),
    _request(
        2,
        completion_tokens=20,
        spec_verify_ct=5,
        ttft_ms=200.0,
        tpot_ms=20.0,
        e2e_ms=580.0,
        itl_per_token_ms=[30.0],
        spec_correct_drafts_histogram=[0, 1, 2, 3],
    ),
    _request(3, error_type="http_500", http_status=500, completion_tokens=7),
]
NOISE = [_request(4, warmup=True, completion_tokens=1000), _request(5, load_level="concurrency=4")]


@pytest.fixture
def level():  # type: ignore[no-untyped-def]
    """Per test, not per module: mutation testing credits each test with the code it runs."""
    table = requests_table(THREE_ROWS + NOISE)
    return summarize_level(
        table,
        sweep_id="s",
        job_id="j",
        load_level="concurrency=2",
        window_start_s=0.5,
        window_end_s=2.5,
        gpus=2,
        server_accept_length=3.1,
    )


def test_summarize_level_counts_requests_when_one_failed_and_noise_present(level) -> None:  # type: ignore[no-untyped-def]
    """Warmup rows and other levels are ignored; a row with error_type is an error."""
    assert (level.num_requests, level.num_ok, level.num_errors) == (3, 2, 1)
    assert level.error_rate == pytest.approx(1 / 3)
    assert level.error_counts == (("http_500", 1),)


def test_summarize_level_computes_throughput_when_three_rows(level) -> None:  # type: ignore[no-untyped-def]
    """output_tokens sums successful requests only; rates divide by duration_s and gpus."""
    assert level.output_tokens == 30
    assert level.output_tok_s == pytest.approx(15.0)
    assert level.output_tok_s_per_gpu == pytest.approx(7.5)
    assert level.achieved_rate_rps == pytest.approx(1.0)
    assert level.output_tok_s_per_user == pytest.approx((100.0 + 50.0) / 2)  # median of 1000/tpot


def test_summarize_level_interpolates_percentiles_when_two_values(level) -> None:  # type: ignore[no-untyped-def]
    """Percentiles interpolate linearly between order statistics (numpy's default)."""
    assert level.ttft_p50_ms == pytest.approx(150.0)
    assert level.ttft_p90_ms == pytest.approx(190.0)
    assert level.tpot_p99_ms == pytest.approx(19.9)
    assert level.e2e_mean_ms == pytest.approx(385.0)
    assert level.itl_mean_ms == pytest.approx(50.0 / 3)  # every token gap: 10, 10, 30
    assert level.itl_p50_ms == pytest.approx(10.0)


def test_summarize_level_computes_acceptance_when_speculative(level) -> None:  # type: ignore[no-untyped-def]
    """Accept length = completion_tokens / spec_verify_ct; mean is token weighted; histograms sum."""
    assert level.accept_length_mean == pytest.approx(30 / 9)
    assert level.accept_length_p50 == pytest.approx((2.5 + 4.0) / 2)
    hist = level.accept_length_hist
    assert hist is not None and len(hist) == 17 and hist[10] == 1 and hist[16] == 1 and sum(hist) == 2
    assert level.correct_drafts_histogram == (1, 3, 3, 3)
    assert level.server_accept_length == 3.1


def test_summarize_level_returns_nulls_when_no_successful_request() -> None:
    """With every request failed, latencies and accept lengths are null, counts are still counts."""
    table = requests_table([_request(1, error_type="timeout"), _request(2, error_type="timeout")])
    level = summarize_level(
        table,
        sweep_id="s",
        job_id="j",
        load_level="concurrency=2",
        window_start_s=0.0,
        window_end_s=1.0,
        gpus=1,
        server_accept_length=None,
    )
    assert level.num_errors == 2 and level.output_tokens == 0 and level.output_tok_s == 0.0
    assert level.ttft_p50_ms is None and level.accept_length_mean is None and level.itl_p99_ms is None
    assert level.accept_length_hist is None and level.correct_drafts_histogram is None


def test_summarize_level_rejects_empty_window_when_nothing_was_sent_after_ramp() -> None:
    """Rates need a positive window."""
    with pytest.raises(ValueError, match="empty measurement window"):
        summarize_level(
            requests_table(THREE_ROWS),
            sweep_id="s",
            job_id="j",
            load_level="concurrency=2",
            window_start_s=1.0,
            window_end_s=1.0,
            gpus=1,
            server_accept_length=None,
        )


def test_summarize_level_leaves_out_ramp_and_drain_when_rows_are_outside_window() -> None:
    """Requests sent outside the window (the ramp-up) count nowhere but in the tokens they streamed inside
    it; latencies, counts and acceptance are over the window's requests; rates divide by its length and
    the window is stored."""
    ramp = _request(7, ttft_ms=900.0, completion_tokens=10, window_tokens=4, in_window=False)
    table = requests_table([*THREE_ROWS, ramp])
    level = summarize_level(
        table,
        sweep_id="s",
        job_id="j",
        load_level="concurrency=2",
        window_start_s=0.5,
        window_end_s=2.5,
        gpus=2,
        server_accept_length=None,
    )
    assert (level.num_requests, level.num_ok) == (3, 2)
    assert level.ttft_p90_ms == pytest.approx(190.0)  # the ramp's 900 ms is not in it
    assert level.accept_length_mean == pytest.approx(30 / 9)
    assert level.output_tokens == 34 and level.output_tok_s == pytest.approx(17.0)
    assert (level.window_start_s, level.window_end_s, level.duration_s) == (0.5, 2.5, 2.0)


def test_every_latency_metric_is_numpys_statistic_of_successful_requests_when_five_rows() -> None:
    """Each ``<name>_mean_ms`` and ``<name>_pNN_ms`` (TTFT, TPOT, end-to-end; inter-token over every gap)
    is numpy's mean or linear-interpolated percentile of the successful requests' values; a failed
    request's values count nowhere. All are in ms; the request latencies can be objectives, lowest first,
    the inter-token gaps cannot."""
    ttft = [120.0, 80.0, 300.0, 95.0, 210.0]
    tpot = [12.0, 9.0, 30.0, 11.0, 15.0]
    e2e = [900.0, 400.0, 2500.0, 700.0, 1300.0]
    itl = [[10.0, 14.0], [8.0], [40.0, 20.0, 31.0], [11.0], [16.0, 9.0]]
    rows = [
        _request(i, ttft_ms=ttft[i], tpot_ms=tpot[i], e2e_ms=e2e[i], itl_per_token_ms=itl[i])
        for i in range(5)
    ]
    failed = _request(5, error_type="timeout", ttft_ms=1e6, tpot_ms=1e6, e2e_ms=1e6, itl_per_token_ms=[1e6])
    level = summarize_level(
        requests_table([*rows, failed]),
        sweep_id="s",
        job_id="j",
        load_level="concurrency=2",
        window_start_s=0.0,
        window_end_s=1.0,
        gpus=1,
        server_accept_length=None,
    )
    gaps = [gap for request in itl for gap in request]
    for name, values in (("ttft", ttft), ("tpot", tpot), ("e2e", e2e), ("itl", gaps)):
        assert getattr(level, f"{name}_mean_ms") == pytest.approx(np.mean(values)), name
        assert METRICS_BY_NAME[f"{name}_mean_ms"].unit == "ms"
        for p in LEVEL_PERCENTILES:
            assert getattr(level, f"{name}_p{p}_ms") == pytest.approx(np.percentile(values, p)), (name, p)
            assert METRICS_BY_NAME[f"{name}_p{p}_ms"].unit == "ms"
    for name in ("ttft", "tpot", "e2e"):
        for p in LEVEL_PERCENTILES:
            metric = METRICS_BY_NAME[f"{name}_p{p}_ms"]
            assert metric.better == "lower" and metric.name in OBJECTIVE_METRICS, metric
        assert METRICS_BY_NAME[f"{name}_mean_ms"].better == "lower"
    assert all(METRICS_BY_NAME[f"itl_p{p}_ms"].name not in OBJECTIVE_METRICS for p in LEVEL_PERCENTILES)


def test_summarize_level_changes_no_metric_when_warmup_and_ramp_rows_differ_from_measured_ones() -> None:
    """Warmup and ramp-up rows (sent outside the window, nothing streamed inside it) whose every value is
    far from the measured rows' (TTFT 900 s, TPOT 9 s, 999 tokens, one verify step, a 9 s gap) change no
    metric of the level: its summary equals the one of THREE_ROWS alone, which counts n = 3 requests,
    2 ok and 1 failed, a TPOT p50 of 15 ms (10 and 20) and an inter-token p50 of 10 ms (10, 10, 30)."""
    extreme: dict[str, object] = dict(
        ttft_ms=9e5,
        e2e_ms=9e5,
        tpot_ms=9e3,
        completion_tokens=999,
        window_tokens=0,
        spec_verify_ct=1,
        spec_accept_length=999.0,
        itl_per_token_ms=[9e3],
        spec_correct_drafts_histogram=[0, 0, 0, 0, 0, 0, 0, 1],
    )
    excluded = [
        _request(8, warmup=True, **extreme),
        _request(9, in_window=False, **extreme),
        _request(10, in_window=False, error_type="timeout", **extreme),
    ]
    kwargs: dict[str, object] = dict(
        sweep_id="s", job_id="j", load_level="concurrency=2", window_start_s=0.5, window_end_s=2.5, gpus=2,
        server_accept_length=None,
    )  # fmt: skip
    alone = summarize_level(requests_table(THREE_ROWS), **kwargs)  # type: ignore[arg-type]
    mixed = summarize_level(requests_table([*excluded, *THREE_ROWS]), **kwargs)  # type: ignore[arg-type]
    assert mixed == alone
    assert (mixed.num_requests, mixed.num_ok, mixed.num_errors) == (3, 2, 1)
    assert mixed.tpot_p50_ms == pytest.approx(15.0) and mixed.itl_p50_ms == pytest.approx(10.0)
    assert mixed.error_counts == (("http_500", 1),)
