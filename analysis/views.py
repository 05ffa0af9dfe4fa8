"""DuckDB views over a sweep's Parquet results: what ``sql``, ``best`` and ``report`` query.

An in-memory DuckDB connection reads the committed Parquet files directly; it opens no database
file and takes no lock, so it is safe next to a running sweep (it never touches ``queue.sqlite``).
Results in an object store (``analysis.store``) are read through pyarrow: the commit objects (``jobs``)
are listed first, then every table's files, and only files of jobs committed at that first listing
become the Arrow datasets DuckDB scans, so a sweep that commits while a query runs shows a consistent
set of jobs; DuckDB itself touches no file or network there (its file access stays off).

Views (columns as documented in ``docs/results.md``):

- ``sweep``, ``jobs``: the committed rows as written.
- ``job_inputs``: per committed job, ``stale_inputs``: the input kinds (``jobs.input_digests``) it was
  measured on that differ from the sweep's current ones (``sweep.input_digests``); empty when none do.
- ``current_jobs``: the done jobs with no stale input, the one definition of the jobs that may be ranked
  together. Every view that ranks or compares configs (``results``, ``category_results``,
  ``capacity_results``) and every reader of ``best``, ``report``, ``--emit`` and the confirmation reads
  jobs through it; ``check_current_inputs`` adds the note on the others and refuses current jobs that
  still disagree on an input.
- ``levels``, ``requests``: rows of committed jobs only (semi-join on ``jobs``), so a crash between
  the driver's renames never shows partial data. ``requests`` gains ``sweep_id`` and ``job_id``
  from its hive partition directories.
- ``results``: ``levels`` of ``current_jobs``, joined with their config (label, role, repeat,
  effective speculative settings, launch command): one row per config run x load level. ``role`` is
  ``sweep`` for grid points and ``confirmation`` for the adaptive schedule's confirmation launch.
- ``job_axes``: one row per job x server axis (``axis``, ``value``, with ``config_label``), from
  ``jobs.axes`` (a JSON object, so a sweep with new axes needs no new columns); ``results`` carries
  ``axes`` too, so ``results.axes->>'$.NAME'`` reads one axis's value per row.
- ``request_metrics``: ``requests`` plus ``ok`` (error_type is null) and ``accept_length``
  (completion_tokens / spec_verify_ct).
- ``acceptance_by_position``: per job x level x draft position k >= 1, the fraction of verify steps
  that accepted at least k drafts: ``sum_{j>=k} h[j] / sum_j h[j]`` over ``correct_drafts_histogram``
  h (index j = steps that accepted exactly j drafts). Position 1 is the first draft token.
- ``category_results``: per config x level x request category (``(none)`` when uncategorised), over the
  successful requests of ``current_jobs`` sent inside their level's measurement window: ``num_ok``, token-weighted ``accept_length_mean``, mean
  ``tpot_ms``, and ``speedup``: the baseline's mean TPOT over this config's for the same level and
  category (the per-user decode speedup where the drafter is strong or weak); null without a baseline.
- ``capacity``: the probes of capacity searches (``load.capacity``) of committed jobs: each probe's
  levels columns plus ``capacity_kind``, ``capacity_slo``, ``probe_index``, ``probe_load``, ``passed``
  and ``margin``.
- ``capacity_results``: per current job with a capacity search: its config, ``capacity`` (the highest
  passing probe's load; null when none passed), ``bound`` (``bracketed``: a higher probe failed;
  ``at_least``: none failed; ``below``: none passed, capacity is under ``lowest_fail``), ``lowest_fail``
  and ``probes``.
- ``lossless``: the lossless check's rows of committed jobs (``lossless_check: true``): per job x ``mode``
  (``serial``: one prompt at a time; ``batched``: all at once) x ``prompt_index``, the greedy
  ``output_ids`` (null with ``error`` when the request failed).
- ``lossless_floor``: per sweep x server-axis setting (``axes``), the noise floor: the reference baseline
  job's (the first repeat of the baseline run at those axis values) serial outputs against its batched
  ones: ``prompts`` compared, ``diverged`` (ids differ), ``floor_rate`` = diverged / prompts.
- ``lossless_divergence``: per current speculative job x mode x prompt, its outputs against the reference
  baseline's in the same mode: ``first_diverging_position`` (0-based index of the first differing token id,
  or the shorter length when one output is a prefix of the other; null when equal).
- ``lossless_results``: per current speculative job: ``compared`` (mode x prompt pairs), ``diverged``,
  ``divergence_rate`` = diverged / compared, the setting's ``floor_rate``, ``first_diverging_positions``
  (of the diverged pairs, by mode then prompt), ``lossy_by_design`` (an accept threshold below 1.0) and
  ``lossy``: lossy by design, or checked with ``divergence_rate > floor_rate``.
- ``server_metrics``, ``gpu_metrics``: the time series of committed jobs (the server's Prometheus
  samples; NVML readings of the slot's GPUs), ``time_s`` on the requests' clock.
- ``server_metrics_by_level``, ``gpu_metrics_by_level``: per job x level x metric x label set, over
  the samples of the level's measurement window (``window_start_s <= time_s <= window_end_s``): sample count, mean, min,
  max, first and last value, and for counters (and histogram ``_sum``/``_count``) the ``delta``
  (last - first) and ``rate_per_s`` (delta over the time between those samples).
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from itertools import pairwise
from pathlib import Path
from typing import TYPE_CHECKING

from analysis.layout import (
    JOB_TABLES,
    attempted_job_ids,
    committed_job_ids,
    job_table_glob,
    part_ids,
    sweep_table_glob,
)
from analysis.metrics import ACCEPT_LENGTH_SQL, OK, OK_MEASURED
from analysis.schema import (
    CAPACITY_SCHEMA,
    JOBS_SCHEMA,
    LEVELS_SCHEMA,
    LOSSLESS_SCHEMA,
    REQUESTS_SCHEMA,
    SWEEP_SCHEMA,
    TELEMETRY_SCHEMA,
    TELEMETRY_TABLES,
)
from analysis.store import ResultStore, as_store
from specsweep.errors import ResultsError

if TYPE_CHECKING:
    import duckdb
    import pyarrow as pa

VIEW_NAMES: tuple[str, ...] = (
    "sweep",
    "jobs",
    "job_inputs",
    "current_jobs",
    "levels",
    "requests",
    "results",
    "request_metrics",
    "acceptance_by_position",
    "category_results",
    "capacity",
    "capacity_results",
    "job_axes",
    "lossless",
    "lossless_floor",
    "lossless_divergence",
    "lossless_results",
    *TELEMETRY_TABLES,
    *(f"{name}_by_level" for name in TELEMETRY_TABLES),
)

# A stored JSON object of input digests as a map; empty for rows written before the column existed.
_DIGESTS = "coalesce(TRY_CAST(TRY_CAST({} AS JSON) AS MAP(VARCHAR, VARCHAR)), MAP())"

# A kind only one side records is not compared (the driver cannot see an input only the nodes hold).
_JOB_INPUTS_SQL = f"""
SELECT sweep_id, job_id,
       list_sort(list_filter(map_keys(job), lambda k: sweep[k] IS NOT NULL AND sweep[k] <> job[k]))
         AS stale_inputs
FROM (SELECT j.sweep_id, j.job_id, {_DIGESTS.format("j.input_digests")} AS job,
             {_DIGESTS.format("s.input_digests")} AS sweep
      FROM jobs j LEFT JOIN sweep s USING (sweep_id))
"""

_CURRENT_JOBS_SQL = """
SELECT j.* FROM jobs j JOIN job_inputs i USING (sweep_id, job_id)
WHERE j.status = 'done' AND len(i.stale_inputs) = 0
"""

_RESULTS_SQL = """
SELECT l.*, j.config_label, j.role, j.repeat_index, j.status,
       j.effective_speculative_algorithm, j.effective_speculative_num_steps,
       j.effective_speculative_eagle_topk, j.effective_speculative_num_draft_tokens,
       j.effective_max_running_requests, j.launch_command, j.axes
FROM levels l JOIN current_jobs j USING (sweep_id, job_id)
"""

# One row per job x server axis: what ``GROUP BY axis, value`` needs (jobs.axes is a JSON object).
_JOB_AXES_SQL = """
SELECT sweep_id, job_id, config_label, axis, json_extract_string(axes, '$."' || axis || '"') AS value
FROM (SELECT sweep_id, job_id, config_label, axes, unnest(json_keys(axes)) AS axis
      FROM jobs WHERE axes IS NOT NULL)
"""

_REQUEST_METRICS_SQL = f"""
SELECT *, {OK} AS ok, {ACCEPT_LENGTH_SQL} AS accept_length FROM requests
"""

_ACCEPTANCE_BY_POSITION_SQL = """
WITH h AS (
    SELECT sweep_id, job_id, load_level,
           unnest(correct_drafts_histogram) AS steps,
           generate_subscripts(correct_drafts_histogram, 1) - 1 AS accepted
    FROM levels WHERE correct_drafts_histogram IS NOT NULL
), tail AS (
    SELECT sweep_id, job_id, load_level, accepted AS position,
           sum(steps) OVER (PARTITION BY sweep_id, job_id, load_level ORDER BY accepted DESC)
             / nullif(sum(steps) OVER (PARTITION BY sweep_id, job_id, load_level), 0) AS acceptance
    FROM h
)
SELECT * FROM tail WHERE position >= 1
"""


_CATEGORY_RESULTS_SQL = f"""
WITH per AS (
    SELECT r.sweep_id, j.config_label, j.effective_speculative_algorithm IS NULL AS is_baseline,
           r.load_level, coalesce(r.category, '(none)') AS category,
           count(*) AS num_ok,
           sum(r.completion_tokens) / nullif(sum(r.spec_verify_ct), 0) AS accept_length_mean,
           avg(r.tpot_ms) AS tpot_ms
    FROM requests r JOIN current_jobs j USING (sweep_id, job_id)
    WHERE r.{OK_MEASURED}
    GROUP BY ALL
), base AS (
    SELECT sweep_id, load_level, category, avg(tpot_ms) AS baseline_tpot_ms FROM per WHERE is_baseline
    GROUP BY ALL
)
SELECT per.*, base.baseline_tpot_ms / nullif(per.tpot_ms, 0) AS speedup
FROM per LEFT JOIN base USING (sweep_id, load_level, category)
"""

_CAPACITY_RESULTS_SQL = """
SELECT c.sweep_id, c.job_id, j.config_label, j.repeat_index, j.launch_command,
       any_value(c.capacity_kind) AS capacity_kind, any_value(c.capacity_slo) AS capacity_slo,
       max(c.probe_load) FILTER (WHERE c.passed) AS capacity,
       min(c.probe_load) FILTER (WHERE NOT c.passed) AS lowest_fail,
       CASE WHEN count(*) FILTER (WHERE c.passed) = 0 THEN 'below'
            WHEN count(*) FILTER (WHERE NOT c.passed) = 0 THEN 'at_least'
            ELSE 'bracketed' END AS bound,
       count(*) AS probes
FROM capacity c JOIN current_jobs j USING (sweep_id, job_id)
GROUP BY ALL
"""

# The lossless check's reference per sweep x axis setting: the baseline's first sweep job with outputs.
_LOSSLESS_RUNS_SQL = """
runs AS (
    SELECT o.sweep_id, o.job_id, j.config_label, j.repeat_index, j.axes, j.lossy_by_design,
           j.effective_speculative_algorithm IS NULL AS is_baseline, j.role, o.mode, o.prompt_index,
           o.output_ids
    FROM lossless o JOIN current_jobs j USING (sweep_id, job_id)
    WHERE o.output_ids IS NOT NULL
), reference AS (
    SELECT * FROM runs WHERE is_baseline AND role = 'sweep'
    QUALIFY dense_rank() OVER (PARTITION BY sweep_id, axes ORDER BY repeat_index, job_id) = 1
)"""

# 0-based index of the first token id where two outputs differ; the shorter length when one is a prefix
# of the other; null when they are equal.
_FIRST_DIVERGING_SQL = """CASE WHEN {a} = {b} THEN NULL ELSE coalesce(
    list_position(list_transform(range(1, least(len({a}), len({b})) + 1), lambda i: {a}[i] <> {b}[i]), true)
      - 1,
    least(len({a}), len({b}))) END"""

_LOSSLESS_FLOOR_SQL = f"""
WITH {_LOSSLESS_RUNS_SQL}
SELECT s.sweep_id, s.axes, s.job_id AS reference_job_id, count(*) AS prompts,
       count(*) FILTER (WHERE s.output_ids <> t.output_ids) AS diverged,
       count(*) FILTER (WHERE s.output_ids <> t.output_ids) / count(*) AS floor_rate
FROM reference s JOIN reference t USING (sweep_id, job_id, prompt_index)
WHERE s.mode = 'serial' AND t.mode = 'batched'
GROUP BY ALL
"""

_LOSSLESS_DIVERGENCE_SQL = f"""
WITH {_LOSSLESS_RUNS_SQL}
SELECT r.sweep_id, r.job_id, r.config_label, r.repeat_index, r.axes, r.mode, r.prompt_index,
       b.job_id AS reference_job_id,
       {_FIRST_DIVERGING_SQL.format(a="r.output_ids", b="b.output_ids")} AS first_diverging_position
FROM runs r JOIN reference b
  ON r.sweep_id = b.sweep_id AND r.axes IS NOT DISTINCT FROM b.axes AND r.mode = b.mode
     AND r.prompt_index = b.prompt_index
WHERE NOT r.is_baseline
"""

_LOSSLESS_RESULTS_SQL = """
WITH per AS (
    SELECT j.sweep_id, j.job_id, j.config_label, j.repeat_index, j.axes, j.lossy_by_design,
           count(d.prompt_index) AS compared,
           count(d.first_diverging_position) AS diverged,
           count(d.first_diverging_position) / nullif(count(d.prompt_index), 0) AS divergence_rate,
           coalesce(list(d.first_diverging_position ORDER BY d.mode DESC, d.prompt_index)
                      FILTER (WHERE d.first_diverging_position IS NOT NULL), []) AS first_diverging_positions
    FROM current_jobs j LEFT JOIN lossless_divergence d USING (sweep_id, job_id)
    WHERE j.effective_speculative_algorithm IS NOT NULL
    GROUP BY ALL
)
SELECT per.*, f.floor_rate, f.prompts AS floor_prompts, f.diverged AS floor_diverged,
       per.lossy_by_design IS NOT NULL
         OR (per.compared > 0 AND per.divergence_rate > coalesce(f.floor_rate, 0)) AS lossy
FROM per LEFT JOIN lossless_floor f ON per.sweep_id = f.sweep_id AND per.axes IS NOT DISTINCT FROM f.axes
"""

# Counters only grow, so a level's delta is its last sample minus its first; a gauge's level figure is its
# mean over evenly spaced samples (a time average).
_BY_LEVEL_SQL = """
WITH w AS (
    SELECT t.* FROM {table} t JOIN levels l USING (sweep_id, job_id, load_level)
    WHERE t.time_s >= l.window_start_s AND t.time_s <= l.window_end_s
)
SELECT sweep_id, job_id, load_level, metric, kind, labels,
       count(*) AS samples, avg(value) AS mean, min(value) AS min, max(value) AS max,
       arg_min(value, time_s) AS first, arg_max(value, time_s) AS last,
       CASE WHEN kind IN ('counter', 'histogram', 'summary')
            THEN arg_max(value, time_s) - arg_min(value, time_s) END AS delta,
       CASE WHEN kind IN ('counter', 'histogram', 'summary') AND max(time_s) > min(time_s)
            THEN (arg_max(value, time_s) - arg_min(value, time_s)) / (max(time_s) - min(time_s)) END
         AS rate_per_s
FROM w GROUP BY sweep_id, job_id, load_level, metric, kind, labels
"""


Location = ResultStore | str | os.PathLike[str]


def check_results_dir(out: Location) -> None:
    """Raise ResultsError unless ``out`` holds at least one committed job of a sweep."""
    store = as_store(out)
    if store.local_dir is not None:
        if not store.local_dir.exists():
            raise ResultsError(
                "no such directory", where=store.location, fix="pass the output directory of `specsweep run`"
            )
        if not store.local_dir.is_dir():
            raise ResultsError(
                "not a directory", where=store.location, fix="pass the output directory of `specsweep run`"
            )
    else:
        store.check(write=False)
    if committed_job_ids(store):
        return
    in_progress = attempted_job_ids(store)
    detail = (
        f"; {len(in_progress)} job(s) have attempts in progress but none has committed yet"
        if in_progress
        else ""
    )
    raise ResultsError(
        f"holds no sweep results: no committed jobs (OUT/jobs/sweep=<id>/job=<id>/part-0.parquet){detail}",
        where=store.location,
        fix="point at a sweep's output directory (the --out of `specsweep run`), "
        "or wait until its first job commits",
    )


def connect(out: Location, *, read_only: bool = False) -> duckdb.DuckDBPyConnection:
    """In-memory DuckDB with the views above registered over ``out``'s committed results. With
    ``read_only`` DuckDB can touch no file at all (``_lock_down``): whatever statement runs on it, it can
    read the results only through the views and can write nothing."""
    import duckdb

    store = as_store(out)
    check_results_dir(store)
    con = duckdb.connect(":memory:")
    con.execute("SET enable_progress_bar = false")
    local = store.local_dir is not None and not read_only
    sources = _local_sources(store) if local else _arrow_sources(con, store)
    _register_table(con, "sweep", sources["sweep"], SWEEP_SCHEMA, partitions=("sweep",))
    _register_table(con, "jobs", sources["jobs"], JOBS_SCHEMA, partitions=("sweep", "job"))
    con.execute(f"CREATE VIEW job_inputs AS {_JOB_INPUTS_SQL}")
    con.execute(f"CREATE VIEW current_jobs AS {_CURRENT_JOBS_SQL}")
    _register_table(con, "levels_all", sources["levels"], LEVELS_SCHEMA, partitions=("sweep", "job"))
    con.execute(
        "CREATE VIEW levels AS SELECT * FROM levels_all l "
        "WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.sweep_id = l.sweep_id AND j.job_id = l.job_id)"
    )
    _register_requests(con, sources["requests"])
    _register_table(con, "capacity_all", sources["capacity"], CAPACITY_SCHEMA, partitions=("sweep", "job"))
    con.execute(
        "CREATE VIEW capacity AS SELECT * FROM capacity_all c "
        "WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.sweep_id = c.sweep_id AND j.job_id = c.job_id)"
    )
    _register_table(con, "lossless_all", sources["lossless"], LOSSLESS_SCHEMA, partitions=("sweep", "job"))
    con.execute(
        "CREATE VIEW lossless AS SELECT * FROM lossless_all o "
        "WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.sweep_id = o.sweep_id AND j.job_id = o.job_id)"
    )
    con.execute(f"CREATE VIEW lossless_floor AS {_LOSSLESS_FLOOR_SQL}")
    con.execute(f"CREATE VIEW lossless_divergence AS {_LOSSLESS_DIVERGENCE_SQL}")
    con.execute(f"CREATE VIEW lossless_results AS {_LOSSLESS_RESULTS_SQL}")
    for name in TELEMETRY_TABLES:
        _register_table(con, f"{name}_all", sources[name], TELEMETRY_SCHEMA, partitions=("sweep", "job"))
        con.execute(
            f"CREATE VIEW {name} AS SELECT * FROM {name}_all t "
            "WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.sweep_id = t.sweep_id AND j.job_id = t.job_id)"
        )
        con.execute(f"CREATE VIEW {name}_by_level AS {_BY_LEVEL_SQL.format(table=name)}")
    con.execute(f"CREATE VIEW results AS {_RESULTS_SQL}")
    con.execute(f"CREATE VIEW request_metrics AS {_REQUEST_METRICS_SQL}")
    con.execute(f"CREATE VIEW acceptance_by_position AS {_ACCEPTANCE_BY_POSITION_SQL}")
    con.execute(f"CREATE VIEW category_results AS {_CATEGORY_RESULTS_SQL}")
    con.execute(f"CREATE VIEW capacity_results AS {_CAPACITY_RESULTS_SQL}")
    con.execute(f"CREATE VIEW job_axes AS {_JOB_AXES_SQL}")
    if read_only:
        _lock_down(con)
    return con


def check_current_inputs(con: duckdb.DuckDBPyConnection, where: str) -> list[str]:
    """What ranking ``current_jobs`` leaves out, as notes: done jobs measured on inputs the sweep has since
    replaced (``run --resume --accept-changed-inputs`` measures the new ones under new job ids). The
    current jobs must agree on every input they record; a difference (an input only the nodes can see,
    which the sweep row lacks) is a ``ResultsError``: they are not repeats of one experiment."""
    stale = con.sql(
        "SELECT i.stale_inputs FROM job_inputs i JOIN jobs j USING (sweep_id, job_id) "
        "WHERE j.status = 'done' AND len(i.stale_inputs) > 0"
    ).fetchall()
    first: dict[str, tuple[str, str, str]] = {}  # kind -> (digest, job, label) of the first job with it
    for job_id, label, text in con.sql(
        "SELECT job_id, config_label, input_digests FROM current_jobs ORDER BY config_label, repeat_index, job_id"
    ).fetchall():
        value = json.loads(text) if text else {}
        for kind, digest in value.items() if isinstance(value, dict) else ():
            other = first.setdefault(kind, (digest, job_id, label))
            if other[0] != digest:
                raise ResultsError(
                    f"jobs measured on different inputs cannot be ranked together: the {kind} input of job "
                    f"{job_id} ({label!r}) differs from job {other[1]}'s ({other[2]!r})",
                    where=where,
                    fix="rank each set of inputs from its own --out; "
                    '`specsweep sql OUT "SELECT job_id, config_label, input_digests FROM jobs"` shows '
                    "which job ran on what",
                )
    if not stale:
        return []
    kinds = sorted({kind for (row,) in stale for kind in row})
    return [
        f"{len(stale)} job(s) measured on other inputs than the sweep's current ones "
        f"({', '.join(kinds)} differ; see jobs.input_digests): not ranked"
    ]


def _local_sources(store: ResultStore) -> dict[str, str | None]:
    """Per table the relation DuckDB reads (read_parquet over its glob), None when it has no file."""
    assert store.local_dir is not None
    out = store.local_dir
    globs = {"sweep": sweep_table_glob(out), **{t: job_table_glob(out, t) for t in JOB_TABLES}}
    return {table: _read_parquet(glob) if _has_files(glob) else None for table, glob in globs.items()}


def _arrow_sources(con: duckdb.DuckDBPyConnection, store: ResultStore) -> dict[str, str | None]:
    """Per table an Arrow dataset over the files of the jobs committed when the commits were listed
    (listed before the data, which is published before its commit), registered as ``_<table>_files``.
    pyarrow reads these files, not DuckDB: how an object store is read, and how a read-only connection
    reads a local directory while DuckDB's own file system stays switched off."""
    import pyarrow as pa
    import pyarrow.dataset as ds

    committed = {ids for key in store.list_files("jobs") if (ids := part_ids(key, "jobs"))}
    schemas = {
        "sweep": SWEEP_SCHEMA,
        "jobs": JOBS_SCHEMA,
        "levels": LEVELS_SCHEMA,
        "requests": REQUESTS_SCHEMA,
        "capacity": CAPACITY_SCHEMA,
        "lossless": LOSSLESS_SCHEMA,
    }
    schemas |= dict.fromkeys(TELEMETRY_TABLES, TELEMETRY_SCHEMA)
    sources: dict[str, str | None] = {}
    for table, schema in schemas.items():
        keys = store.list_files(table)
        if table == "sweep":
            files = [k for k in keys if k.count("/") == 2 and k.split("/")[1].startswith("sweep=")]
            partitions = [pa.field("sweep", pa.string())]
        else:
            files = [k for k in keys if part_ids(k, table) in committed]
            partitions = [pa.field("sweep", pa.string()), pa.field("job", pa.string())]
        full = pa.schema(list(schema) + partitions)
        name = f"_{table}_files"
        if files:
            con.register(
                name,
                ds.dataset(
                    [store.key(f) for f in files],
                    schema=full,
                    format="parquet",
                    filesystem=store.fs,
                    partitioning=ds.partitioning(pa.schema(partitions), flavor="hive"),
                    partition_base_dir=store.key(table),
                ),
            )
            sources[table] = name
        elif table == "requests":  # requests_of_jobs reads it even when empty
            con.register(name, full.empty_table())
            sources[table] = None
        else:
            sources[table] = None
    return sources


@contextmanager
def readable_results(out: Location) -> Iterator[None]:
    """Turn DuckDB's error on a damaged result file (truncated, not Parquet, wrong schema) into one
    line naming it; the other files are untouched."""
    import duckdb

    try:
        yield
    except (duckdb.IOException, duckdb.InvalidInputException) as err:
        raise damaged_results(err, out.location if isinstance(out, ResultStore) else str(out)) from None


def damaged_results(err: Exception, where: str) -> ResultsError:
    """The one-line error for a result file DuckDB (or pyarrow, for an object store) could not read."""
    first = str(err).strip().splitlines()[0]
    return ResultsError(
        f"cannot read the results: {first}",
        where=where,
        fix="a result file is damaged: restore that file from a copy (the other files are intact)",
    )


def is_damaged_object(err: Exception) -> bool:
    """True when a query failed because a dataset ``connect`` registered over an object store could not
    read one of its files (they are read at query time there, not when the views are made)."""
    return "reading the stream registered as '_" in str(err)


# The statements a read-only connection runs: queries (SELECT, FROM, WITH, VALUES, DESCRIBE, SHOW,
# SUMMARIZE) and EXPLAIN [ANALYZE] of a query.
READ_ONLY_STATEMENTS: tuple[str, ...] = ("SELECT", "EXPLAIN")

# Table functions a query may call that change the connection's state (logging, profiling, checkpoints,
# external resources) or run SQL handed to them as text, which no check of the query's own text sees.
STATEFUL_FUNCTIONS: frozenset[str] = frozenset(
    {
        "enable_logging",
        "disable_logging",
        "truncate_duckdb_logs",
        "enable_profiling",
        "disable_profiling",
        "checkpoint",
        "force_checkpoint",
        "create_external_resource",
        "destroy_external_resource",
        "register_external_resource",
        "register_external_resource_type",
        "deregister_external_resource",
        "query",
        "json_execute_serialized_sql",
    }
)

_READ_ONLY_FIX = (
    "use SELECT queries (or EXPLAIN of one), or pass --unsafe for a full DuckDB (it can then read, write "
    "and install anything the user can)"
)


def _lock_down(con: duckdb.DuckDBPyConnection) -> None:
    """Leave a connection that reads the registered Arrow datasets no way to reach a file: DuckDB's local
    file system and external access off (no COPY, ATTACH, EXPORT, read_csv or read_parquet, to any path),
    no extension installed or loaded, and the configuration locked so no statement can undo it. This
    holds on its own, whatever statement ``split_statements`` lets through."""
    con.execute("SET temp_directory = ''")  # no spill files: a query beyond memory fails as out of memory
    con.execute("SET enable_external_access = false")
    # after external access: setting that once the file system is off fails
    con.execute("SET disabled_filesystems = 'LocalFileSystem'")
    con.execute("SET autoinstall_known_extensions = false")
    con.execute("SET autoload_known_extensions = false")
    con.execute("SET lock_configuration = true")


def split_statements(query: str, *, read_only: bool) -> list[str]:
    """``query``'s statements by DuckDB's own parser, each as text to run. With ``read_only`` each must be
    a query or an EXPLAIN of a query (checked inside the EXPLAIN too: EXPLAIN ANALYZE runs its statement);
    any other statement (COPY, ATTACH, INSTALL, LOAD, SET, PRAGMA, CALL, CREATE, ...) or a call of one of
    ``STATEFUL_FUNCTIONS`` refuses the whole query before any of it runs."""
    import duckdb

    statements = duckdb.extract_statements(query)
    if read_only:
        for statement in statements:
            _check_query(statement)
    return [statement.query.strip().removesuffix(";").strip() for statement in statements]


def _kind(statement: duckdb.Statement) -> str:
    """The statement's type name; one DuckDB's Python enum lacks (UPDATE EXTENSIONS) is ``OTHER``."""
    try:
        return statement.type.name
    except ValueError:
        return "OTHER"


def _check_query(statement: duckdb.Statement) -> None:
    """Refuse ``statement`` unless it only reads (see ``split_statements``)."""
    import duckdb

    kind = _kind(statement)
    if kind not in READ_ONLY_STATEMENTS:
        raise ResultsError(
            f"{kind} statements are not allowed: `specsweep sql` only reads the results",
            where="QUERY",
            fix=_READ_ONLY_FIX,
        )
    text = statement.query
    if kind == "EXPLAIN":
        inner = [_kind(s) for s in duckdb.extract_statements(_explained(text))]
        if inner != ["SELECT"]:
            raise ResultsError(
                f"EXPLAIN of {', '.join(inner) or 'nothing'} is not allowed: EXPLAIN ANALYZE runs the "
                "statement it explains",
                where="QUERY",
                fix=_READ_ONLY_FIX,
            )
    called = _called_functions(text) & STATEFUL_FUNCTIONS
    if called:
        raise ResultsError(
            f"{', '.join(sorted(called))}() changes DuckDB's state: `specsweep sql` only reads the results",
            where="QUERY",
            fix=_READ_ONLY_FIX,
        )


def _tokens(text: str) -> list[tuple[int, str, str]]:
    """``text``'s tokens by DuckDB's tokenizer as (start, kind, text), comments left out."""
    import duckdb

    found = duckdb.tokenize(text)
    ends = [start for start, _ in found[1:]] + [len(text)]
    return [
        (start, kind.name, text[start:end].strip())
        for (start, kind), end in zip(found, ends, strict=True)
        if kind.name != "comment"
    ]


def _explained(text: str) -> str:
    """The statement an ``EXPLAIN [ANALYZE] stmt`` or ``EXPLAIN (options) stmt`` wraps, as text."""
    tokens = _tokens(text)
    at = 1  # tokens[0] is EXPLAIN
    if at < len(tokens) and tokens[at][2].upper() == "ANALYZE":
        at += 1
    elif at < len(tokens) and tokens[at][2].startswith("("):
        depth = 0
        while at < len(tokens):
            depth += tokens[at][2].count("(") - tokens[at][2].count(")")
            at += 1
            if depth <= 0:
                break
    return text[tokens[at][0] :] if at < len(tokens) else ""


def _called_functions(text: str) -> set[str]:
    """Lower-case names of the functions ``text`` calls: each name followed by '(' (schema-qualified or
    quoted names too)."""
    tokens = _tokens(text)
    return {
        word.strip('"').lower()
        for (_, kind, word), (_, _, after) in pairwise(tokens)
        if kind in ("identifier", "keyword") and after.startswith("(")
    }


def _has_files(glob: str) -> bool:
    path = Path(glob)
    anchor = next(p for p in path.parents if "*" not in str(p))
    return any(anchor.glob(str(path.relative_to(anchor))))


def _read_parquet(glob: str) -> str:
    escaped = glob.replace("'", "''")
    # union_by_name: files written before a column existed read it as null (e.g. jobs.input_digests)
    return (
        f"read_parquet('{escaped}', hive_partitioning = true, hive_types_autocast = false, "
        "union_by_name = true)"
    )


def _register_table(
    con: duckdb.DuckDBPyConnection,
    name: str,
    source: str | None,
    schema: pa.Schema,
    partitions: tuple[str, ...],
) -> None:
    """A view over the files (``source``: the relation that reads them), without the hive partition
    columns (the files carry the ids). A column the schema gained after some files were written reads as
    null in those files (union by name with the schema's empty table), even when no file has it yet."""
    if source is None:
        _register_empty(con, name, schema)
        return
    exclude = ", ".join(partitions)
    con.register(f"_{name}_schema", schema.empty_table())
    con.execute(
        f"CREATE VIEW {name} AS SELECT * EXCLUDE ({exclude}) FROM {source} "
        f"UNION ALL BY NAME SELECT * FROM _{name}_schema"
    )


def _register_requests(con: duckdb.DuckDBPyConnection, source: str | None) -> None:
    """Requests carry no ids in the file: they come from the sweep=/job= directories."""
    if source is None:
        import pyarrow as pa

        ids = [pa.field("sweep_id", pa.string()), pa.field("job_id", pa.string())]
        _register_empty(con, "requests", pa.schema(ids + list(REQUESTS_SCHEMA)))
        return
    con.execute(
        "CREATE VIEW requests AS "
        "SELECT r.sweep AS sweep_id, r.job AS job_id, r.* EXCLUDE (sweep, job) "
        f"FROM {source} r "
        "WHERE EXISTS (SELECT 1 FROM jobs j WHERE j.sweep_id = r.sweep AND j.job_id = r.job)"
    )


def requests_of_jobs(out: Location, job_ids: set[str]) -> str:
    """A relation (for FROM) over the request rows of these committed jobs only, as the ``requests`` view
    shows them: the job list prunes partitions by directory, so a scan reads no other job's files and
    needs no semi-join with ``jobs`` (the view's way, which a one-shot ranking does not need). Over an
    object store it reads the dataset ``connect`` registered on the same connection."""
    ids = ", ".join("'" + job.replace("'", "''") + "'" for job in sorted(job_ids)) or "NULL"
    local = as_store(out).local_dir
    source = _read_parquet(job_table_glob(local, "requests")) if local is not None else "_requests_files"
    return (
        "(SELECT r.sweep AS sweep_id, r.job AS job_id, r.* EXCLUDE (sweep, job) "
        f"FROM {source} r WHERE r.job IN ({ids}))"
    )


def _register_empty(con: duckdb.DuckDBPyConnection, name: str, schema: pa.Schema) -> None:
    """A view with the table's columns and no rows (e.g. every job failed: no levels files)."""
    con.register(f"_{name}_empty", schema.empty_table())
    con.execute(f"CREATE VIEW {name} AS SELECT * FROM _{name}_empty")
