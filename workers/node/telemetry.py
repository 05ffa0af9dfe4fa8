"""Time series of a server slot while each load level runs: the server's Prometheus ``/metrics`` and
the slot's GPUs through NVML (utilisation, memory, power, SM clock, temperature, throttle reasons).

Sampling runs in a child process (``python -m workers.node.telemetry``), not in the node worker: the
worker runs the load generator, whose chunk stamps a scrape-and-parse holding the GIL would delay.
The child samples on ``time.perf_counter_ns``'s clock (CLOCK_MONOTONIC, shared by every process of
the host, as the load generator's shards rely on) until its stdin closes, then writes its samples to
one Parquet file. The worker cuts them into levels by the windows it recorded, with times relative to
each level's measured start (the requests' clock), and writes the ``server_metrics`` and
``gpu_metrics`` tables (``analysis.schema.TELEMETRY_SCHEMA``).

Standalone, e.g. to check NVML on a GPU machine::

    python -m workers.node.telemetry --gpus all --seconds 10 [--interval-s 0.5]

prints every GPU reading and a mean/max summary per GPU and metric.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

import pyarrow as pa

from analysis.schema import GPU_POWER_W, GPU_SM_CLOCK_MHZ, TelemetryRecord, telemetry_table

if TYPE_CHECKING:
    from workers.job import TelemetrySpec

# The GPU sampler's path imports only pyarrow and nvidia-ml-py (not pydantic), so the standalone command
# runs with a bare CUDA image's python; workers.sglang (its paths) is imported where the server is read.

SERVER = "server_metrics"
GPU = "gpu_metrics"
SKIPPED_SUFFIXES = ("_bucket", "_created")  # histogram buckets and creation stamps: _sum/_count stay
STOP_WAIT_S = 30.0

RAW_SCHEMA = pa.schema(
    [
        pa.field("clock_ns", pa.int64(), nullable=False),  # perf_counter_ns when the sample was taken
        pa.field("time_unix_ns", pa.int64(), nullable=False),
        pa.field("table", pa.string(), nullable=False),  # SERVER or GPU
        pa.field("metric", pa.string(), nullable=False),
        pa.field("kind", pa.string(), nullable=False),
        pa.field("labels", pa.string(), nullable=False),
        pa.field("value", pa.float64(), nullable=False),
    ]
)

Reading = tuple[str, str, str, float]  # metric, kind, labels (JSON), value


def labels_json(labels: dict[str, str]) -> str:
    """The one spelling of a label set: JSON with sorted keys."""
    return json.dumps(labels, sort_keys=True)


def parse_metrics(text: str) -> list[Reading]:
    """Samples of a Prometheus text exposition (prometheus_client's parser), buckets left out."""
    from prometheus_client.parser import text_string_to_metric_families

    readings = []
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name.endswith(SKIPPED_SUFFIXES):
                continue
            readings.append((sample.name, family.type, labels_json(sample.labels), float(sample.value)))
    return readings


class ServerScraper:
    """GET ``/metrics`` and parse it; a failed or unparsable scrape yields no readings."""

    table = SERVER

    def __init__(self, base_url: str, timeout_s: float) -> None:
        from workers.sglang import api

        self.url = base_url.rstrip("/") + api.METRICS
        self.timeout_s = timeout_s
        self.failures = 0

    def sample(self) -> list[Reading]:
        from workers.node.launcher import http_get

        status, body = http_get(self.url, timeout_s=self.timeout_s)
        try:
            if status == 200:
                return parse_metrics(body.decode("utf-8", "replace"))
        except ValueError:
            pass
        self.failures += 1
        return []


class GpuUnavailable(Exception):
    """NVML cannot sample the GPUs asked for; the message is the reason recorded."""


def nvml_device_count() -> int:
    """GPUs NVML sees (NVML left initialised); GpuUnavailable when there is no NVIDIA driver."""
    import pynvml

    try:
        pynvml.nvmlInit()
        return int(pynvml.nvmlDeviceGetCount())
    except pynvml.NVMLError as err:
        raise GpuUnavailable(f"NVML did not start: {err} (no NVIDIA driver on this host?)") from None


class GpuSampler:
    """NVML readings of some GPUs (NVML indices); raises ``GpuUnavailable`` when NVML cannot start."""

    table = GPU

    def __init__(self, indices: list[int] | None) -> None:
        import pynvml

        self.nvml = pynvml
        count = nvml_device_count()
        wanted = list(range(count)) if indices is None else indices
        missing = [i for i in wanted if not 0 <= i < count]
        if not wanted or missing:
            raise GpuUnavailable(f"NVML sees {count} GPU(s); asked for {wanted or 'all'}")
        self.handles = [(i, pynvml.nvmlDeviceGetHandleByIndex(i)) for i in wanted]

    def _readers(self, handle: Any) -> dict[str, Callable[[], float]]:
        nv = self.nvml
        return {
            "gpu_utilization_pct": lambda: nv.nvmlDeviceGetUtilizationRates(handle).gpu,
            "memory_utilization_pct": lambda: nv.nvmlDeviceGetUtilizationRates(handle).memory,
            "memory_used_bytes": lambda: nv.nvmlDeviceGetMemoryInfo(handle).used,
            GPU_POWER_W: lambda: nv.nvmlDeviceGetPowerUsage(handle) / 1000.0,
            GPU_SM_CLOCK_MHZ: lambda: nv.nvmlDeviceGetClockInfo(handle, nv.NVML_CLOCK_SM),
            "temperature_c": lambda: nv.nvmlDeviceGetTemperature(handle, nv.NVML_TEMPERATURE_GPU),
            # NVML's clocks-event (throttle) reason bitmask: 0 none, 0x1 idle, 0x4 power cap, 0x20 SW thermal, ...
            "throttle_reasons": lambda: nv.nvmlDeviceGetCurrentClocksEventReasons(handle),
        }

    def sample(self) -> list[Reading]:
        readings = []
        for index, handle in self.handles:
            labels = labels_json({"gpu": str(index)})
            for metric, read in self._readers(handle).items():
                try:
                    readings.append((metric, "gauge", labels, float(read())))
                except self.nvml.NVMLError:  # not supported on this GPU: that metric is left out
                    continue
        return readings

    def close(self) -> None:
        self.nvml.nvmlShutdown()


@dataclass
class SamplerLoop:
    """One sampler on its own thread, at fixed absolute times (lateness does not accumulate)."""

    sampler: ServerScraper | GpuSampler
    interval_s: float
    rows: list[tuple[int, int, str, str, str, str, float]] = field(default_factory=list)

    def run(self, stop: threading.Event) -> None:
        interval_ns = int(self.interval_s * 1e9)
        due = time.perf_counter_ns()
        while not stop.is_set():
            clock_ns, unix_ns = time.perf_counter_ns(), time.time_ns()
            for metric, kind, labels, value in self.sampler.sample():
                self.rows.append((clock_ns, unix_ns, self.sampler.table, metric, kind, labels, value))
            due += interval_ns
            stop.wait(max(0.0, (due - time.perf_counter_ns()) / 1e9))


def sample(loops: list[SamplerLoop], until: Callable[[], None]) -> pa.Table:
    """Run every loop on its thread until ``until`` returns; their samples as one RAW_SCHEMA table."""
    stop = threading.Event()
    threads = [threading.Thread(target=loop.run, args=(stop,), daemon=True) for loop in loops]
    for thread in threads:
        thread.start()
    try:
        until()
    finally:
        stop.set()
        for thread in threads:
            thread.join()
    rows = sorted(row for loop in loops for row in loop.rows)
    columns = {f.name: [row[i] for row in rows] for i, f in enumerate(RAW_SCHEMA)}
    return pa.Table.from_pydict(columns, schema=RAW_SCHEMA)


# --------------------------------------------------------------------------------------------------
# The node worker's side
# --------------------------------------------------------------------------------------------------


def start_profile(server_url: str, out_dir: Path, prefix: str, steps: int) -> str | None:
    """Ask the server to capture ``steps`` forward steps of its profiler into ``out_dir`` (it stops by
    itself); None when it agreed, else what went wrong (a failed capture never fails the level)."""
    import urllib.error
    import urllib.request

    from workers.sglang import api

    body = {api.PROFILE_OUTPUT_DIR: str(out_dir), api.PROFILE_NUM_STEPS: steps, api.PROFILE_PREFIX: prefix}
    request = urllib.request.Request(
        server_url + api.START_PROFILE,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    try:
        with urllib.request.urlopen(request, timeout=60.0) as reply:
            return None if reply.status == 200 else f"{api.START_PROFILE} answered {reply.status}"
    except (urllib.error.URLError, OSError) as err:
        return f"{api.START_PROFILE} failed: {err}"


@dataclass(frozen=True, slots=True)
class LevelWindow:
    """When one level ran: samples between ``entered_ns`` and ``left_ns`` belong to it."""

    label: str
    entered_ns: int  # perf_counter_ns when the worker started the level (calibration, warmup first)
    t0_ns: int  # perf_counter_ns of the level's measured start: the requests' time origin
    left_ns: int


@dataclass
class AttemptTelemetry:
    """The sampling child of one attempt and the level windows its samples are cut into."""

    process: subprocess.Popen[str] | None
    out: Path
    server_off: str | None
    gpu_off: str | None
    windows: list[LevelWindow] = field(default_factory=list)

    @classmethod
    def start(cls, spec: TelemetrySpec, server_url: str, gpus: list[int], out: Path) -> AttemptTelemetry:
        """Start sampling what can be sampled; the reasons for what cannot are kept for the jobs row."""
        from workers.node.launcher import http_get
        from workers.sglang import api

        server_off = gpu_off = None
        argv = [sys.executable, "-m", "workers.node.telemetry", "--until-stdin-closes", "--out", str(out)]
        if spec.server_metrics_interval_s is None:
            server_off = "off in the spec (telemetry.server_metrics_interval_s is null)"
        elif (status := http_get(server_url + api.METRICS, timeout_s=10.0)[0]) != 200:
            server_off = (
                f"{api.METRICS} answered {status or 'nothing'} (SGLang serves it with --enable-metrics)"
            )
        else:
            argv += ["--metrics-url", server_url, "--metrics-interval-s", str(spec.server_metrics_interval_s)]
        if spec.gpu_interval_s is None:
            gpu_off = "off in the spec (telemetry.gpu_interval_s is null)"
        elif not gpus:
            gpu_off = "the slot has no GPUs (Ray assigned none)"
        elif (gpu_off := _nvml_problem()) is None:
            argv += ["--gpus", ",".join(map(str, gpus)), "--interval-s", str(spec.gpu_interval_s)]
        if server_off and gpu_off:
            return cls(None, out, server_off, gpu_off)
        out.parent.mkdir(parents=True, exist_ok=True)
        process = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        assert process.stdout is not None
        ready = json.loads(process.stdout.readline() or '{"gpu_off": "the sampler did not start"}')
        return cls(process, out, server_off, gpu_off or ready.get("gpu_off"))

    def level(self, label: str, entered_ns: int, t0_ns: int) -> None:
        """Record that ``label`` ran from ``entered_ns`` until now, measured from ``t0_ns``."""
        self.windows.append(LevelWindow(label, entered_ns, t0_ns, time.perf_counter_ns()))

    def stop(self, sweep_id: str, job_id: str) -> dict[str, pa.Table]:
        """Stop the child and cut its samples into levels: the ``server_metrics`` and ``gpu_metrics`` tables."""
        import pyarrow.parquet as pq

        raw = RAW_SCHEMA.empty_table()
        if self.process is not None:
            assert self.process.stdin is not None
            self.process.stdin.close()
            try:
                self.process.wait(timeout=STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
            if self.out.exists():
                raw = pq.read_table(self.out)
        return {name: telemetry_table(self._records(raw, name, sweep_id, job_id)) for name in (SERVER, GPU)}

    def _records(self, raw: pa.Table, name: str, sweep_id: str, job_id: str) -> list[TelemetryRecord]:
        records = []
        import pyarrow.compute as pc

        for row in raw.filter(pc.equal(raw["table"], name)).to_pylist():
            window = next((w for w in self.windows if w.entered_ns <= row["clock_ns"] <= w.left_ns), None)
            if window is None:  # between levels (cache flush, /server_info): no level's sample
                continue
            records.append(
                TelemetryRecord(
                    sweep_id=sweep_id,
                    job_id=job_id,
                    load_level=window.label,
                    time_s=(row["clock_ns"] - window.t0_ns) / 1e9,
                    time_unix_ns=row["time_unix_ns"],
                    metric=row["metric"],
                    kind=row["kind"],
                    labels=row["labels"],
                    value=row["value"],
                )
            )
        return records


def _nvml_problem() -> str | None:
    """Why NVML cannot sample on this host (checked here, so no child starts just to find out)."""
    import pynvml

    try:
        nvml_device_count()
    except GpuUnavailable as err:
        return str(err)
    pynvml.nvmlShutdown()
    return None


# --------------------------------------------------------------------------------------------------
# The child process, and the standalone command
# --------------------------------------------------------------------------------------------------


def _gpu_indices(text: str) -> list[int] | None:
    return None if text == "all" else [int(part) for part in text.split(",") if part]


def summarize(table: pa.Table) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(labels, metric) -> (mean, max, samples) over a RAW_SCHEMA table."""
    by_key: dict[tuple[str, str], list[float]] = {}
    for labels, metric, value in zip(
        table["labels"].to_pylist(), table["metric"].to_pylist(), table["value"].to_pylist(), strict=True
    ):
        by_key.setdefault((labels, metric), []).append(value)
    return {key: (sum(v) / len(v), max(v), len(v)) for key, v in sorted(by_key.items())}


def _print_samples(table: pa.Table, out: IO[str]) -> None:
    """Each reading, then mean and max per GPU and metric."""
    rows = table.to_pylist()
    start = rows[0]["clock_ns"] if rows else 0
    for row in rows:
        elapsed = (row["clock_ns"] - start) / 1e9
        print(f"{elapsed:8.3f}s {row['labels']} {row['metric']} {row['value']:g}", file=out)
    print("summary (mean / max over the samples):", file=out)
    for (labels, metric), (mean, top, count) in summarize(table).items():
        print(f"  {labels} {metric}: {mean:.1f} / {top:g} ({count} samples)", file=out)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workers.node.telemetry", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--gpus", metavar="0,1|all", help="NVML indices of the GPUs to sample")
    parser.add_argument("--interval-s", type=float, default=1.0, help="seconds between GPU samples")
    parser.add_argument("--metrics-url", metavar="URL", help="server base URL whose /metrics to scrape")
    parser.add_argument("--metrics-interval-s", type=float, default=1.0, help="seconds between scrapes")
    until = parser.add_mutually_exclusive_group(required=True)
    until.add_argument("--seconds", type=float, help="sample this long, then stop")
    until.add_argument("--until-stdin-closes", action="store_true", help="sample until stdin closes")
    parser.add_argument("--out", metavar="FILE.parquet", help="write the samples here instead of printing")
    args = parser.parse_args(argv)

    loops = []
    gpu_off = None
    if args.gpus:
        try:
            loops.append(SamplerLoop(GpuSampler(_gpu_indices(args.gpus)), args.interval_s))
        except GpuUnavailable as err:
            gpu_off = str(err)
            print(f"GPU sampling off: {gpu_off}", file=sys.stderr)
    if args.metrics_url:
        loops.append(
            SamplerLoop(
                ServerScraper(args.metrics_url, timeout_s=max(args.metrics_interval_s, 5.0)),
                args.metrics_interval_s,
            )
        )
    if args.until_stdin_closes:  # the node worker reads this line before the first level
        print(json.dumps({"gpu_off": gpu_off}), flush=True)

    def wait() -> None:
        if args.seconds is not None:
            time.sleep(args.seconds)
        else:
            sys.stdin.read()

    table = sample(loops, wait)
    for loop in loops:
        if isinstance(loop.sampler, GpuSampler):
            loop.sampler.close()
    if args.out:
        from analysis.schema import write_parquet_atomic

        write_parquet_atomic(table, args.out)
    else:
        _print_samples(table, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
