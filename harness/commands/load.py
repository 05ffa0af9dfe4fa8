"""``specsweep load``: one load level against any running SGLang (or simulated) server, to a Parquet file.

The file holds one row per measured request (``analysis.schema.REQUESTS_SCHEMA``); its metadata keeps
the level, the workload and the client-added delay measured before the run. While the level runs, the
rows of finished requests are written every second to ``OUT.partial/`` (``spill_dir``), so a load that
is killed keeps what it measured; the finished file replaces that directory. A summary (rates, latency
medians, error counts) is printed from the same rows the analysis reads.

Exit codes: 0 when at least one measured request succeeded (partial failure included: the summary
counts the errors by class), ``EXIT_NO_SUCCESS`` when none did (a dead or broken server, told apart
from a good run by scripts), 130 when interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import ValidationError

from harness.commands.base import Command
from specsweep.errors import ResultsError, WorkloadError

if TYPE_CHECKING:
    from workers.job import LoadLevel
    from workers.load.generator import LoadResult
    from workers.load.workloads import Workload

METADATA_LEVEL = b"specsweep.load_level"
METADATA_WORKLOAD = b"specsweep.workload"
METADATA_RUN = b"specsweep.load_run"  # client delay, achieved rate, duration, processes, cache flushed
EXIT_NO_SUCCESS = 4  # the level ran, but not one measured request succeeded


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    loop = parser.add_mutually_exclusive_group(required=True)
    loop.add_argument("--concurrency", type=int, metavar="N", help="closed loop: N requests in flight")
    loop.add_argument("--rate", type=float, metavar="R", help="open loop: R requests per second")
    stop = parser.add_mutually_exclusive_group(required=True)
    stop.add_argument("--requests", type=int, metavar="N", help="measured requests to send")
    stop.add_argument("--duration", type=float, metavar="S", help="seconds to keep sending")
    parser.add_argument(
        "--arrival", choices=("poisson", "constant"), default="poisson", help="open loop arrivals"
    )
    parser.add_argument(
        "--max-concurrency", type=int, metavar="N", help="open loop: cap on requests in flight"
    )
    parser.add_argument("--warmup", type=int, default=0, metavar="N", help="unrecorded requests sent first")
    parser.add_argument(
        "--ramp-up",
        type=float,
        default=0.0,
        metavar="S",
        help="closed loop: start the streams evenly over S seconds; the measurement window opens at S",
    )
    parser.add_argument("--flush-cache", action="store_true", help="POST /flush_cache after the warmup")
    parser.add_argument("--timeout", type=float, default=600.0, metavar="S", help="per-request timeout")
    parser.add_argument(
        "--processes", type=int, metavar="N", help="client processes (default: by concurrency)"
    )
    parser.add_argument("--seed", type=int, default=0, help="seed of the schedule and the workload")
    work = parser.add_argument_group("workload (random token ids on /generate unless --prompts)")
    work.add_argument(
        "--prompts", metavar="FILE", help="prompt set (.jsonl, .parquet, .csv): chat requests, not random ids"
    )
    work.add_argument("--input-tokens", type=int, default=128, metavar="N", help="random ids: prompt length")
    work.add_argument("--input-tokens-max", type=int, metavar="N", help="random ids: prompt length range top")
    work.add_argument(
        "--output-tokens", type=int, default=256, metavar="N", help="output length / max_tokens"
    )
    work.add_argument(
        "--output-tokens-max", type=int, metavar="N", help="random ids: output length range top"
    )
    work.add_argument("--temperature", type=float, default=0.0, help="sampling temperature")
    work.add_argument("--model", default="default", help="prompts: model name sent to the chat route")
    parser.add_argument("--out", required=True, metavar="FILE.parquet", help="where to write the records")


def _level_and_workload(args: argparse.Namespace) -> tuple[LoadLevel, Workload]:
    """The LoadLevel and Workload the arguments describe; bad values become one WorkloadError."""
    from workers.job import LoadLevel
    from workers.load.workloads import PromptSetWorkload, RandomIdsWorkload

    try:
        level = LoadLevel(
            concurrency=args.concurrency,
            rate_rps=args.rate,
            arrival=args.arrival,
            max_concurrency=args.max_concurrency,
            requests=args.requests,
            duration_s=args.duration,
            warmup_requests=args.warmup,
            ramp_up_s=args.ramp_up,
            flush_cache=args.flush_cache,
            request_timeout_s=args.timeout,
            processes=args.processes,
            seed=args.seed,
        )
        workload: Workload
        if args.prompts:
            workload = PromptSetWorkload(
                path=args.prompts,
                max_tokens=args.output_tokens,
                temperature=args.temperature,
                model=args.model,
                seed=args.seed,
            )
        else:
            workload = RandomIdsWorkload(
                input_tokens=args.input_tokens,
                input_tokens_max=args.input_tokens_max,
                output_tokens=args.output_tokens,
                output_tokens_max=args.output_tokens_max,
                temperature=args.temperature,
                seed=args.seed,
            )
    except ValidationError as err:
        problems = "; ".join(f"{'.'.join(map(str, e['loc'])) or 'level'}: {e['msg']}" for e in err.errors())
        raise WorkloadError(f"bad load arguments: {problems}", fix="see `specsweep load --help`") from None
    return level, workload


def run(args: argparse.Namespace) -> int:
    from analysis.schema import requests_table, write_parquet_atomic
    from harness.progress import ticking
    from workers.load.generator import LoadTally, run_load
    from workers.load.workloads import PromptSetWorkload

    level, workload = _level_and_workload(args)
    if isinstance(workload, PromptSetWorkload):
        workload.prompts()  # a bad prompts file fails here, before any request is sent
    out = Path(args.out)
    check_output_file(out)  # before the load, not after it
    spill = spill_dir(out)
    spill.mkdir()
    tally = LoadTally()
    try:
        with ticking(tally.describe):  # on stderr: stdout keeps the summary
            result = run_load(args.url, level, workload, spill=spill, tally=tally)
    except BaseException:
        with contextlib.suppress(OSError):
            spill.rmdir()  # kept only when it holds measured rows
        raise
    table = requests_table(result.records)
    run_info = {
        "client_delay": result.client_delay.to_json_dict(),
        "duration_s": result.duration_s,
        "window_s": [result.window_start_s, result.window_end_s],
        "achieved_rate_rps": result.achieved_rate_rps,
        "processes": result.processes,
        "cache_flushed": result.cache_flushed,
        "warmup_requests": len(result.warmup_records),
        "interrupted": result.interrupted,
    }
    table = table.replace_schema_metadata(
        {
            **(table.schema.metadata or {}),
            METADATA_LEVEL: level.model_dump_json().encode(),
            METADATA_WORKLOAD: workload.model_dump_json().encode(),
            METADATA_RUN: json.dumps(run_info).encode(),
        }
    )
    write_parquet_atomic(table, out)
    shutil.rmtree(spill)  # its rows are all in OUT now
    _print_summary(result, out)
    if result.interrupted:
        print("interrupted: the records made until then were written", file=sys.stderr)
        return 130
    if not any(record.error_type is None for record in result.records):
        print(f"no request succeeded ({_error_classes(result)}); the rows were written", file=sys.stderr)
        return EXIT_NO_SUCCESS
    return 0


def spill_dir(out: Path) -> Path:
    """Where the rows go while the level runs (``OUT.partial/``, one Parquet part a second): a killed
    load leaves its measured rows there; a finished one replaces it with OUT."""
    return out.with_name(out.name + ".partial")


def check_output_file(out: Path) -> None:
    """Refuse, before any request is sent, an --out that is a directory or cannot be written, or whose
    spill directory still holds the rows of a killed run."""
    from harness.results import check_output_dir

    if out.is_dir():
        raise ResultsError(
            "--out is a directory", where=str(out), fix="pass a file name, e.g. --out records.parquet"
        )
    check_output_dir(out.parent)
    spill = spill_dir(out)
    if spill.exists():
        raise ResultsError(
            "holds the rows of an earlier load that was killed before it finished",
            where=str(spill),
            fix=f"keep them elsewhere (they are Parquet parts: pyarrow.parquet.read_table('{spill}')) or delete "
            "the directory, then run again",
        )


def _error_classes(result: LoadResult) -> str:
    """``connect_error x4, timeout x1``: the failure classes of a run, most frequent first."""
    from collections import Counter

    counts = Counter(record.error_type or "ok" for record in result.records)
    return ", ".join(f"{name} x{count}" for name, count in counts.most_common()) or "no requests were sent"


def _print_summary(result: LoadResult, out: Path) -> None:
    """One screen: what ran, rates, medians, errors, the client's own delay."""
    from analysis.levels import summarize_level
    from analysis.schema import requests_table

    delay = result.client_delay
    print(f"{len(result.records)} requests ({result.level.label}) -> {out}")
    print(f"client-added delay per chunk: p50 {delay.p50_us:.0f} us, p99 {delay.p99_us:.0f} us (loopback)")
    if result.window_end_s <= result.window_start_s:
        return
    summary = summarize_level(
        requests_table(result.records),
        sweep_id="load",
        job_id="load",
        load_level=result.level.label,
        window_start_s=result.window_start_s,
        window_end_s=result.window_end_s,
        gpus=1,
        server_accept_length=None,
    )

    def ms(value: float | None) -> str:
        return "-" if value is None else f"{value:.1f} ms"

    rate = f"{summary.achieved_rate_rps:.2f} req/s" if summary.achieved_rate_rps else "-"
    print(
        f"ok {summary.num_ok}, errors {summary.num_errors}; {rate}; {summary.output_tok_s or 0:.0f} output tok/s"
    )
    print(
        f"TTFT p50 {ms(summary.ttft_p50_ms)}, TPOT p50 {ms(summary.tpot_p50_ms)}, E2E p50 {ms(summary.e2e_p50_ms)}"
    )
    if summary.accept_length_mean is not None:
        print(f"accept length (completion tokens / verify steps): {summary.accept_length_mean:.3f}")
    for error_type, count in summary.error_counts:
        print(f"  {error_type}: {count}")


COMMAND = Command(
    name="load",
    help="run one load level against a running server and write per-request records",
    add_arguments=add_arguments,
    run=run,
)
