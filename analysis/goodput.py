"""Goodput: the requests that individually meet per-request SLOs, as a rate and as a share of a level.

Level SLOs (``analysis.slo`` over ``levels`` columns) judge a whole level by an aggregate such as a p99;
a team's users see single requests. A per-request SLO is a conjunction of limits on a request's own
``ttft_ms``, ``tpot_ms`` and ``e2e_ms`` (any subset). A request sent inside its level's measurement window
(``in_window``) is *good* when it succeeded
(``error_type`` null) and meets every limit; a limit on a value that a successful request does not have
(the TPOT of a one-token output) does not count against it. Then, per job x load level:

- ``goodput_rps`` = good requests / ``duration_s`` (the level's measured window, as every rate);
- ``goodput_share`` = good requests / requests sent inside the window.

Both are ``analysis.metrics.Metric`` s built from the SLOs, so ``best`` ranks by and resamples goodput
exactly like any other rate.
"""

from __future__ import annotations

from analysis.metrics import MEASURED, OK_MEASURED, Metric, Rate, Ratio
from analysis.slo import Slo, parse_slos

REQUEST_SLO_COLUMNS: tuple[str, ...] = ("ttft_ms", "tpot_ms", "e2e_ms")
GOODPUT_METRICS: tuple[str, ...] = ("goodput_rps", "goodput_share")


def parse_request_slos(text: str, *, where: str = "--request-slo") -> tuple[Slo, ...]:
    """Per-request limits such as ``"ttft_ms<=2000,tpot_ms<=50"`` (columns of ``requests``)."""
    return parse_slos(text, REQUEST_SLO_COLUMNS, where=where)


def meets_sql(slos: tuple[Slo, ...]) -> str:
    """A boolean SQL expression over one request row: sent inside its level's window, it succeeded and
    meets every limit."""
    limits = [f"coalesce({s.metric} {s.op} {s.threshold!r}, true)" for s in slos]
    return " AND ".join([f"({OK_MEASURED})", *limits])


def goodput_metrics(slos: tuple[Slo, ...]) -> dict[str, Metric]:
    """``goodput_rps`` and ``goodput_share`` under ``slos`` (none without SLOs: goodput needs a limit)."""
    if not slos:
        return {}
    good = f"CASE WHEN {meets_sql(slos)} THEN 1 ELSE 0 END"
    clauses = " and ".join(str(s) for s in slos)
    return {
        "goodput_rps": Metric(
            "goodput_rps",
            "requests/s",
            "higher",
            f"requests that succeeded with {clauses}, per second of the level's window",
            Rate(good),
        ),
        "goodput_share": Metric(
            "goodput_share",
            "fraction",
            "higher",
            f"share of the level's requests that succeeded with {clauses}",
            Ratio(good, f"CASE WHEN {MEASURED} THEN 1 ELSE 0 END"),
        ),
    }
