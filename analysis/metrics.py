"""Every level metric, defined once: its formula, its unit, which way is better, and its SQL.

The node worker summarises a load level with these definitions (``analysis.levels``), the views and
``best`` read the stored results by the same names, and the bootstrap in ``analysis.select``
resamples requests with the same per-request value expressions. A metric is one of a few aggregate
kinds over the non-warmup request rows of one job x load level, restricted to the level's steady-state
measurement window: counts, latencies and acceptance over the requests sent inside it (``in_window``),
output tokens over those that arrived inside it (``window_tokens``), rates over its length ``duration_s``:

- ``Count`` and ``Sum``: rows matching a condition, and a sum of a per-request value.
- ``Rate``: ``sum(value) / duration_s`` (optionally ``/ gpus``); resampled by the value's counts.
- ``Quantile``: ``quantile_cont(value, q)`` (linear interpolation between order statistics, numpy's
  default); resampled exactly through the order statistics of uniforms.
- ``Mean`` and ``Ratio``: ``avg(value)`` and ``sum(num) / sum(den)``; SLO-able, not objectives.
- ``FlatQuantile`` / ``FlatMean``: over the flattened elements of a list column (inter-token gaps).

A successful request is one whose ``error_type`` is null. Unknown values are null, never 0.
"""

from __future__ import annotations

from dataclasses import dataclass

from analysis.schema import ACCEPT_LENGTH_BIN_WIDTH, LEVEL_PERCENTILES

OK = "error_type IS NULL"
MEASURED = "in_window"  # sent inside the level's measurement window (ramp-up and drain left out)
OK_MEASURED = f"{OK} AND {MEASURED}"
# completion_tokens / spec_verify_ct of one request: tokens per verify step, bonus token included.
ACCEPT_LENGTH_SQL = (
    f"CASE WHEN {OK} AND spec_verify_ct > 0 THEN completion_tokens::DOUBLE / spec_verify_ct END"
)


@dataclass(frozen=True)
class Count:
    """Rows matching ``where``."""

    where: str

    def sql(self) -> str:
        return f"count(*) FILTER (WHERE {self.where})"


@dataclass(frozen=True)
class Rate:
    """``sum(value) / duration_s``, and ``/ gpus`` when ``per_gpu``; value null counts as 0."""

    value: str
    per_gpu: bool = False

    def sql(self) -> str:
        per = " / any_value(gpus)" if self.per_gpu else ""
        return f"coalesce(sum({self.value}), 0) / any_value(duration_s){per}"


@dataclass(frozen=True)
class Sum:
    """``sum(value)``; 0 when there are no rows."""

    value: str

    def sql(self) -> str:
        return f"coalesce(sum({self.value}), 0)::BIGINT"


@dataclass(frozen=True)
class Quantile:
    """``quantile_cont(value, q)`` over rows where value is not null."""

    value: str
    q: float

    def sql(self) -> str:
        return f"quantile_cont({self.value}, {self.q})"


@dataclass(frozen=True)
class Mean:
    """``avg(value)`` over rows where value is not null."""

    value: str

    def sql(self) -> str:
        return f"avg({self.value})"


@dataclass(frozen=True)
class Ratio:
    """``sum(numerator) / sum(denominator)``; null when the denominator sums to 0 or null."""

    numerator: str
    denominator: str

    def sql(self) -> str:
        return f"sum({self.numerator})::DOUBLE / nullif(sum({self.denominator}), 0)"


@dataclass(frozen=True)
class FlatQuantile:
    """``quantile_cont`` over all elements of list column ``values`` of successful requests."""

    values: str
    q: float

    def sql(self) -> str:
        return (
            f"(SELECT quantile_cont(x, {self.q}) FROM (SELECT unnest({self.values}) AS x "
            f"FROM req WHERE {OK_MEASURED}))"
        )


@dataclass(frozen=True)
class FlatMean:
    """``avg`` over all elements of list column ``values`` of successful requests."""

    values: str

    def sql(self) -> str:
        return f"(SELECT avg(x) FROM (SELECT unnest({self.values}) AS x FROM req WHERE {OK_MEASURED}))"


Aggregate = Count | Sum | Rate | Quantile | Mean | Ratio | FlatQuantile | FlatMean


@dataclass(frozen=True)
class Metric:
    """A scalar level metric: the ``levels`` column ``name``, what it means, and how it is computed.

    ``better`` is "higher" or "lower" for metrics that make sense to rank by, else None.
    """

    name: str
    unit: str
    better: str | None
    formula: str
    aggregate: Aggregate

    @property
    def can_be_objective(self) -> bool:
        """Rankable and resamplable: the bootstrap handles Rate and Quantile aggregates."""
        return self.better is not None and isinstance(self.aggregate, Rate | Quantile)


def _ok_value(column: str) -> str:
    return f"CASE WHEN {OK_MEASURED} THEN {column} END"


def _latency_metrics(name: str, column: str, what: str) -> list[Metric]:
    value = _ok_value(column)
    metrics = [Metric(f"{name}_mean_ms", "ms", "lower", f"mean {what} of successful requests", Mean(value))]
    for p in LEVEL_PERCENTILES:
        metrics.append(
            Metric(
                f"{name}_p{p}_ms",
                "ms",
                "lower",
                f"p{p} {what} of successful requests (linear interpolation)",
                Quantile(value, p / 100),
            )
        )
    return metrics


def _itl_metrics() -> list[Metric]:
    column = "itl_per_token_ms"
    what = "inter-token latency over every token gap of successful requests (chunk gap / its tokens)"
    metrics = [Metric("itl_mean_ms", "ms", None, f"mean {what}", FlatMean(column))]
    for p in LEVEL_PERCENTILES:
        metrics.append(Metric(f"itl_p{p}_ms", "ms", None, f"p{p} {what}", FlatQuantile(column, p / 100)))
    return metrics


# Tokens of successful requests that arrived inside the window, whenever the request was sent: a level
# shorter than a request's latency still measures its steady throughput.
_OUTPUT_TOKENS = f"CASE WHEN {OK} THEN coalesce(window_tokens, 0) ELSE 0 END"

METRICS: tuple[Metric, ...] = (
    Metric("num_requests", "requests", None, "non-warmup requests sent inside the window", Count(MEASURED)),
    Metric("num_ok", "requests", None, "of those, requests with error_type null", Count(OK_MEASURED)),
    Metric(
        "num_errors",
        "requests",
        None,
        "of those, requests with an error_type",
        Count(f"{MEASURED} AND NOT ({OK})"),
    ),
    Metric(
        "error_rate",
        "fraction",
        None,
        "num_errors / num_requests",
        Ratio(
            f"CASE WHEN {MEASURED} AND NOT ({OK}) THEN 1 ELSE 0 END",
            f"CASE WHEN {MEASURED} THEN 1 ELSE 0 END",
        ),
    ),
    Metric(
        "achieved_rate_rps",
        "requests/s",
        "higher",
        "num_ok / duration_s",
        Rate(f"CASE WHEN {OK_MEASURED} THEN 1 ELSE 0 END"),
    ),
    Metric(
        "output_tokens",
        "tokens",
        None,
        "output tokens of successful requests that arrived inside the window (window_tokens)",
        Sum(_OUTPUT_TOKENS),
    ),
    Metric(
        "output_tok_s",
        "tokens/s",
        "higher",
        "output_tokens / duration_s",
        Rate(_OUTPUT_TOKENS),
    ),
    Metric(
        "output_tok_s_per_gpu",
        "tokens/s/GPU",
        "higher",
        "output_tok_s / gpus",
        Rate(_OUTPUT_TOKENS, per_gpu=True),
    ),
    Metric(
        "output_tok_s_per_user",
        "tokens/s",
        "higher",
        "median over successful requests of 1000 / tpot_ms (one user's decode speed)",
        Quantile(f"CASE WHEN {OK_MEASURED} AND tpot_ms > 0 THEN 1000.0 / tpot_ms END", 0.5),
    ),
    *_latency_metrics("ttft", "ttft_ms", "time to first token"),
    *_latency_metrics("tpot", "tpot_ms", "time per output token ((e2e - ttft) / (tokens - 1))"),
    *_itl_metrics(),
    *_latency_metrics("e2e", "e2e_ms", "end-to-end latency"),
    Metric(
        "accept_length_mean",
        "tokens/step",
        "higher",
        "sum(completion_tokens) / sum(spec_verify_ct) over successful requests with spec_verify_ct > 0",
        Ratio(
            f"CASE WHEN {OK_MEASURED} AND spec_verify_ct > 0 THEN completion_tokens END",
            f"CASE WHEN {OK_MEASURED} AND spec_verify_ct > 0 THEN spec_verify_ct END",
        ),
    ),
    *(
        Metric(
            f"accept_length_p{p}",
            "tokens/step",
            "higher",
            f"p{p} over requests of completion_tokens / spec_verify_ct",
            Quantile(f"CASE WHEN {MEASURED} THEN {ACCEPT_LENGTH_SQL} END", p / 100),
        )
        for p in (10, 50, 90)
    ),
)

METRICS_BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}

# Level columns that are not scalar metrics over request rows: list-valued summaries.
ACCEPT_LENGTH_HIST_SQL = f"""(
    SELECT list_transform(range(b + 1), lambda i: list_count(list_filter(bins, lambda x: x = i)))
    FROM (SELECT list(floor(al / {ACCEPT_LENGTH_BIN_WIDTH})::BIGINT) AS bins,
                 max(floor(al / {ACCEPT_LENGTH_BIN_WIDTH})::BIGINT) AS b
          FROM (SELECT {ACCEPT_LENGTH_SQL} AS al FROM req WHERE {MEASURED}) WHERE al IS NOT NULL)
)"""
ACCEPT_LENGTH_HIST_FORMULA = (
    f"bin i counts successful requests whose completion_tokens / spec_verify_ct lies in "
    f"[i*{ACCEPT_LENGTH_BIN_WIDTH}, (i+1)*{ACCEPT_LENGTH_BIN_WIDTH}); null without speculative stats"
)

CORRECT_DRAFTS_HISTOGRAM_SQL = f"""(
    SELECT list(n ORDER BY k)
    FROM (SELECT k, sum(v)::BIGINT AS n
          FROM (SELECT unnest(spec_correct_drafts_histogram) AS v,
                       generate_subscripts(spec_correct_drafts_histogram, 1) - 1 AS k
                FROM req WHERE {OK_MEASURED})
          GROUP BY k)
)"""
CORRECT_DRAFTS_HISTOGRAM_FORMULA = (
    "element-wise sum of spec_correct_drafts_histogram over successful requests: "
    "index k = verify steps that accepted exactly k drafts"
)

ERROR_COUNTS_SQL = f"""(
    SELECT coalesce(list({{'error_type': error_type, 'count': n}} ORDER BY n DESC, error_type), [])
    FROM (SELECT error_type, count(*) AS n FROM req WHERE {MEASURED} AND NOT ({OK}) GROUP BY error_type)
)"""


def level_summary_sql() -> str:
    """One SELECT over relation ``req`` (one level's non-warmup rows with ``duration_s`` and
    ``gpus`` columns) that yields every computed levels column."""
    columns = [f"{m.aggregate.sql()} AS {m.name}" for m in METRICS]
    columns.append(f"{ACCEPT_LENGTH_HIST_SQL} AS accept_length_hist")
    columns.append(f"{CORRECT_DRAFTS_HISTOGRAM_SQL} AS correct_drafts_histogram")
    columns.append(f"{ERROR_COUNTS_SQL} AS error_counts")
    return "SELECT " + ",\n       ".join(columns) + "\nFROM req"
