"""Summarise one load level of one job from its request rows: the row the worker writes to ``levels``.

The numbers come from the metric definitions in ``analysis.metrics`` run by DuckDB over the
in-memory Arrow table, so the stored summary and every later query agree by construction.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import pyarrow as pa

from analysis.metrics import level_summary_sql
from analysis.schema import REQUESTS_SCHEMA, LevelRecord

if TYPE_CHECKING:
    import duckdb


def summarize_level(
    requests: pa.Table,
    *,
    sweep_id: str,
    job_id: str,
    load_level: str,
    window_start_s: float,
    window_end_s: float,
    gpus: int,
    server_accept_length: float | None,
    client_delay_p50_us: float | None = None,
    client_delay_p99_us: float | None = None,
    run_index: int | None = None,
    cache_flushed: bool | None = None,
    stop_reason: str | None = None,
) -> LevelRecord:
    """The ``levels`` row for ``load_level`` from ``requests`` (REQUESTS_SCHEMA rows of one job).

    Rows of other levels and warmup rows are ignored; the rows carry ``in_window`` and ``window_tokens``
    for the level's measurement window ``window_start_s``..``window_end_s`` (seconds on the records'
    clock, ``workers.load.generator.measurement_window``), whose length is the ``duration_s`` that rates
    divide by; ``gpus`` the GPUs the
    server used; ``server_accept_length`` SGLang's own ``avg_spec_accept_length`` (null if absent);
    ``client_delay_*_us`` the load generator's calibration before the level (null if not measured);
    ``run_index`` the level's position in the job's run order; ``cache_flushed`` the flush's outcome.
    ``stop_reason`` why the level ended (``precision`` or ``limit``).
    """
    import duckdb

    duration_s = window_end_s - window_start_s
    if duration_s <= 0:
        raise ValueError(
            f"level {load_level} has an empty measurement window ({window_start_s:g} s to {window_end_s:g} s): "
            "nothing was sent after its ramp-up"
        )
    if gpus <= 0:
        raise ValueError(f"gpus must be > 0, got {gpus}")
    missing = set(REQUESTS_SCHEMA.names) - set(requests.column_names)
    if missing:
        raise ValueError(f"requests table lacks columns {sorted(missing)}")
    con = duckdb.connect()
    con.execute("SET enable_progress_bar = false")  # the worker's log is not a terminal
    try:
        con.register("requests_in", requests)
        level_rows = con.sql(
            "SELECT *, ?::DOUBLE AS duration_s, ?::INTEGER AS gpus "
            "FROM requests_in WHERE load_level = ? AND NOT warmup",
            params=[duration_s, gpus, load_level],
        ).to_arrow_table()
        con.register("req", level_rows)
        summary = con.sql(level_summary_sql()).to_arrow_table().to_pylist()[0]
        concurrency, rate_rps = _level_load(con)
    finally:
        con.close()
    summary["error_counts"] = tuple((e["error_type"], e["count"]) for e in summary["error_counts"])
    for name in ("accept_length_hist", "correct_drafts_histogram"):
        if summary[name] is not None:
            summary[name] = tuple(summary[name])
    return LevelRecord(
        sweep_id=sweep_id,
        job_id=job_id,
        load_level=load_level,
        concurrency=concurrency,
        rate_rps=rate_rps,
        duration_s=float(duration_s),
        gpus=int(gpus),
        server_accept_length=server_accept_length,
        client_delay_p50_us=client_delay_p50_us,
        client_delay_p99_us=client_delay_p99_us,
        run_index=run_index,
        cache_flushed=cache_flushed,
        stop_reason=stop_reason,
        window_start_s=float(window_start_s),
        window_end_s=float(window_end_s),
        **summary,
    )


def _level_load(con: duckdb.DuckDBPyConnection) -> tuple[int | None, float | None]:
    """The level's target concurrency and rate, as its requests recorded them."""
    row = con.sql("SELECT any_value(concurrency), any_value(rate_rps) FROM req").fetchall()[0]
    return row[0], row[1]
