"""Telemetry: the simulated server's /metrics against SGLang's own definitions, and the node worker's
sampler cutting the server's time series into load levels (real simulated server, real sampler child)."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import ClassVar

import pytest
from prometheus_client.parser import text_string_to_metric_families

from workers.job import LoadLevel, TelemetrySpec
from workers.load.generator import run_load
from workers.load.workloads import RandomIdsWorkload
from workers.node.launcher import ServerProcess, start_sim
from workers.node.telemetry import GPU, SERVER, AttemptTelemetry, parse_metrics
from workers.sglang import api

# Quiet: the scraped running-requests mean is checked within 5% of the client's in-flight count at 1/20 of
# real time, and a busy machine's late scrapes moved it 6.6% (1.86 against 1.995 beside the Ray tests), so
# `make test` runs it alone (tests/split_run.py).
pytestmark = pytest.mark.quiet

REPO = Path(__file__).resolve().parents[2]
FAST = {"SPECSWEEP_SIM_TIME_SCALE": "0.05", "SPECSWEEP_SIM_SEED": "1"}
PROMETHEUS_TYPES = {"Gauge": "gauge", "Counter": "counter", "Histogram": "histogram", "Summary": "summary"}


def sglang_metric_definitions() -> dict[str, str]:
    """Every ``sglang:`` metric the installed SGLang 0.5.23 defines -> its type, read from its source."""
    sources = list(REPO.glob(".venv-sglang/lib/python3*/site-packages/sglang/srt/observability/*.py"))
    if not sources:
        pytest.skip("SGLang's source is not installed in .venv-sglang (make sglang-venv)")
    found: dict[str, str] = {}
    for source in sources:
        for node in ast.walk(ast.parse(source.read_text())):
            if not isinstance(node, ast.Call) or not isinstance(node.func, ast.Name):
                continue
            kind = PROMETHEUS_TYPES.get(node.func.id)
            name = next((k.value for k in node.keywords if k.arg == "name"), None)
            if kind and isinstance(name, ast.Constant) and str(name.value).startswith("sglang:"):
                found[str(name.value)] = kind
    return found


def eagle3_args(kimi_target: Path, eagle3_draft: Path) -> list[str]:
    """EAGLE3 chain of 3 with metrics on."""
    args = ["--model-path", str(kimi_target), "--tp-size", "8", "--speculative-algorithm", "EAGLE3"]
    args += ["--speculative-draft-model-path", str(eagle3_draft), "--speculative-num-steps", "3"]
    args += ["--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4", "--enable-metrics"]
    return [*args, "--max-running-requests", "64"]


@pytest.fixture(scope="module")
def sim(kimi_target: Path, eagle3_draft: Path) -> Iterator[ServerProcess]:
    """The EAGLE3 server, 20x faster than real."""
    with start_sim(eagle3_args(kimi_target, eagle3_draft), env=FAST) as handle:
        yield handle


def test_sim_metrics_match_sglang_names_and_types_when_checked_against_installed_source(
    sim: ServerProcess,
) -> None:
    """Every family the simulator exposes is one SGLang 0.5.23 defines, with the same type, and the
    quantities it models (running/queued requests, KV use, throughput, acceptance, counters) are there."""
    run_load(
        sim.url, LoadLevel(concurrency=2, requests=4), RandomIdsWorkload(input_tokens=8, output_tokens=16)
    )
    with urllib.request.urlopen(sim.url + api.METRICS, timeout=10) as reply:
        families = {f.name: f for f in text_string_to_metric_families(reply.read().decode())}
    sglang = sglang_metric_definitions()
    for name, family in families.items():
        defined = name + "_total" if family.type == "counter" else name  # the parser drops _total
        assert sglang.get(defined) == family.type, f"{defined}: SGLang defines {sglang.get(defined)}"
    samples = {s.name: s for f in families.values() for s in f.samples}
    modelled = (
        api.METRIC_NUM_RUNNING,
        api.METRIC_NUM_QUEUE,
        api.METRIC_GEN_THROUGHPUT,
        api.METRIC_TOKEN_USAGE,
        api.METRIC_NUM_USED_TOKENS,
        api.METRIC_SPEC_ACCEPT_LENGTH,
        api.METRIC_SPEC_ACCEPT_RATE,
        api.METRIC_SPEC_VERIFY_CALLS,
        api.METRIC_PROMPT_TOKENS,
        api.METRIC_GENERATION_TOKENS,
        api.METRIC_NUM_REQUESTS,
    )
    assert [name for name in modelled if name not in samples] == []
    generated = sum(
        s.value for f in families.values() for s in f.samples if s.name == api.METRIC_GENERATION_TOKENS
    )
    assert generated >= 4 * 16 and samples[api.METRIC_SPEC_VERIFY_CALLS].value > 0


def test_parse_metrics_keeps_sums_and_counts_when_histograms_have_buckets() -> None:
    """Buckets and _created stamps are left out; labels become JSON sorted by key (whatever order the
    server wrote them in); counters keep _total."""
    text = (
        "# TYPE sglang:e2e_request_latency_seconds histogram\n"
        'sglang:e2e_request_latency_seconds_bucket{model_name="m",le="1.0"} 3.0\n'
        'sglang:e2e_request_latency_seconds_sum{model_name="m"} 1.5\n'
        'sglang:e2e_request_latency_seconds_count{model_name="m"} 3.0\n'
        "# TYPE sglang:spec_verify_calls_total counter\n"
        'sglang:spec_verify_calls_total{model_name="m"} 7.0\n'
        "# TYPE sglang:spec_verify_calls_created gauge\n"
        'sglang:spec_verify_calls_created{model_name="m"} 1.7e9\n'
        "# TYPE sglang:num_running_reqs gauge\n"
        'sglang:num_running_reqs{tp_rank="0",engine_type="unified"} 2.0\n'
    )
    assert parse_metrics(text) == [
        ("sglang:e2e_request_latency_seconds_sum", "histogram", '{"model_name": "m"}', 1.5),
        ("sglang:e2e_request_latency_seconds_count", "histogram", '{"model_name": "m"}', 3.0),
        ("sglang:spec_verify_calls_total", "counter", '{"model_name": "m"}', 7.0),
        ("sglang:num_running_reqs", "gauge", '{"engine_type": "unified", "tp_rank": "0"}', 2.0),
    ]


def test_attempt_telemetry_cuts_series_into_levels_when_server_serves_metrics(
    kimi_target: Path, eagle3_draft: Path, tmp_path: Path
) -> None:
    """Two levels back to back: each gets its own running-request series on the requests' clock, and
    the mean running count over a level's measured window matches the client's in-flight count (at
    half real speed, so the client's own per-request overhead is small next to a request)."""
    spec = TelemetrySpec(server_metrics_interval_s=0.05)
    workload = RandomIdsWorkload(input_tokens=8, output_tokens=128)
    results = []
    env = {"SPECSWEEP_SIM_TIME_SCALE": "0.5", "SPECSWEEP_SIM_SEED": "1"}
    with start_sim(eagle3_args(kimi_target, eagle3_draft), env=env) as sim:
        telemetry = AttemptTelemetry.start(spec, sim.url, [], tmp_path / "telemetry.parquet")
        assert telemetry.server_off is None
        assert telemetry.gpu_off == "the slot has no GPUs (Ray assigned none)"
        for concurrency in (2, 6):
            level = LoadLevel(concurrency=concurrency, duration_s=2.0, warmup_requests=2, flush_cache=True)
            entered = time.perf_counter_ns()
            result = run_load(sim.url, level, workload, calibration_streams=4)
            telemetry.level(level.label, entered, result.t0_ns)
            results.append(result)
        tables = telemetry.stop("s", "j")
    assert tables[GPU].num_rows == 0
    rows = tables[SERVER].to_pylist()
    for result in results:

        def mean(metric: str, label: str = result.level.label, end: float = result.duration_s) -> float:
            window = [
                r["value"]
                for r in rows
                if r["metric"] == metric and r["load_level"] == label and 0 <= r["time_s"] <= end
            ]
            assert len(window) >= 10, label
            return sum(window) / len(window)

        in_flight = sum((r.end_ns or 0) - r.start_ns for r in result.records) / 1e9 / result.duration_s
        running, queued = mean(api.METRIC_NUM_RUNNING), mean(api.METRIC_NUM_QUEUE)
        assert running == pytest.approx(in_flight, rel=0.05), result.level.label
        assert running + queued == pytest.approx(in_flight, rel=0.05), result.level.label


def test_attempt_telemetry_records_why_when_server_has_no_metrics(kimi_target: Path, tmp_path: Path) -> None:
    """A server without --enable-metrics: no sampler starts, the reason names the flag, tables are empty."""
    with start_sim(["--model-path", str(kimi_target)], env=FAST) as handle:
        telemetry = AttemptTelemetry.start(TelemetrySpec(), handle.url, [], tmp_path / "t.parquet")
        tables = telemetry.stop("s", "j")
    assert telemetry.process is None
    assert telemetry.server_off == "/metrics answered 404 (SGLang serves it with --enable-metrics)"
    assert tables[SERVER].num_rows == 0 and tables[GPU].num_rows == 0


def test_telemetry_command_says_gpu_sampling_is_off_when_host_has_no_nvidia_gpu() -> None:
    """Standalone on a host without an NVIDIA driver: the reason on stderr, no samples, exit 0."""
    from workers.node.telemetry import GpuUnavailable, nvml_device_count

    try:
        nvml_device_count()
    except GpuUnavailable:
        pass
    else:
        pytest.skip("this host has an NVIDIA driver")
    done = subprocess.run(
        [sys.executable, "-m", "workers.node.telemetry", "--gpus", "all", "--seconds", "0.2"],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "GPU sampling off: NVML did not start" in done.stderr
    assert "summary (mean / max over the samples):" in done.stdout
    assert json.dumps({"gpu_off": None}) not in done.stdout


class FakeNvml:
    """NVML's library layer for two H200-like GPUs, in NVML's own units: power in milliwatts, memory in
    bytes, clocks in MHz, temperature in degrees C, utilisation in percent. GPU 1 does not report its
    temperature (NVML_ERROR_NOT_SUPPORTED, as some boards do). Installed over nvidia-ml-py's module
    functions, so everything above them (the sampler, the sampling loop) is the real code."""

    POWER_MW: ClassVar[dict[int, int]] = {0: 412_345, 1: 650_000}
    USED_BYTES: ClassVar[dict[int, int]] = {0: 85_899_345_920, 1: 1_073_741_824}  # 80 GiB, 1 GiB
    SM_MHZ: ClassVar[dict[int, int]] = {0: 1980, 1: 345}
    TEMPERATURE_C: ClassVar[dict[int, int]] = {0: 61}
    UTILIZATION: ClassVar[dict[int, tuple[int, int]]] = {0: (87, 40), 1: (0, 0)}  # (gpu, memory) percent
    CLOCKS_EVENTS: ClassVar[dict[int, int]] = {0: 0x4, 1: 0x1}  # software power cap; idle

    def __init__(self) -> None:
        self.initialised = 0

    def install(self, monkeypatch: pytest.MonkeyPatch) -> None:
        import pynvml

        def utilization(handle: int) -> pynvml.c_nvmlUtilization_t:
            rates = pynvml.c_nvmlUtilization_t()
            rates.gpu, rates.memory = self.UTILIZATION[handle]
            return rates

        def memory(handle: int) -> pynvml.c_nvmlMemory_t:
            info = pynvml.c_nvmlMemory_t()
            info.used = self.USED_BYTES[handle]
            return info

        def clock(handle: int, kind: int) -> int:
            assert kind == pynvml.NVML_CLOCK_SM
            return self.SM_MHZ[handle]

        def temperature(handle: int, sensor: int) -> int:
            assert sensor == pynvml.NVML_TEMPERATURE_GPU
            if handle not in self.TEMPERATURE_C:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_NOT_SUPPORTED)
            return self.TEMPERATURE_C[handle]

        def handle_by_index(index: int) -> int:
            if index not in self.POWER_MW:
                raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
            return index

        def init() -> None:
            self.initialised += 1

        def shutdown() -> None:
            self.initialised -= 1

        for name, function in {
            "nvmlInit": init,
            "nvmlShutdown": shutdown,
            "nvmlDeviceGetCount": lambda: len(self.POWER_MW),
            "nvmlDeviceGetHandleByIndex": handle_by_index,
            "nvmlDeviceGetUtilizationRates": utilization,
            "nvmlDeviceGetMemoryInfo": memory,
            "nvmlDeviceGetPowerUsage": lambda handle: self.POWER_MW[handle],
            "nvmlDeviceGetClockInfo": clock,
            "nvmlDeviceGetTemperature": temperature,
            "nvmlDeviceGetCurrentClocksEventReasons": lambda handle: self.CLOCKS_EVENTS[handle],
        }.items():
            monkeypatch.setattr(pynvml, name, function)


def test_gpu_sampler_reads_watts_bytes_mhz_and_celsius_when_nvml_answers_in_its_units(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Through NVML's library layer (FakeNvml): power_w is NVML's milliwatts / 1000 (412345 mW ->
    412.345 W), memory_used_bytes NVML's bytes as they are, sm_clock_mhz MHz, temperature_c degrees C,
    utilisation in percent and the clocks-event bitmask as NVML gives it; one row per GPU (label gpu =
    the NVML index) and reading, a reading the GPU does not support left out; the sampling loop stores
    the same values, and NVML is shut down as often as it was started."""
    from workers.node.telemetry import GpuSampler, SamplerLoop, sample

    nvml = FakeNvml()
    nvml.install(monkeypatch)
    sampler = GpuSampler(None)
    readings = {
        (json.loads(labels)["gpu"], metric): (kind, value) for metric, kind, labels, value in sampler.sample()
    }
    assert readings == {
        ("0", "gpu_utilization_pct"): ("gauge", 87.0),
        ("0", "memory_utilization_pct"): ("gauge", 40.0),
        ("0", "memory_used_bytes"): ("gauge", 85_899_345_920.0),
        ("0", "power_w"): ("gauge", 412.345),
        ("0", "sm_clock_mhz"): ("gauge", 1980.0),
        ("0", "temperature_c"): ("gauge", 61.0),
        ("0", "throttle_reasons"): ("gauge", 4.0),
        ("1", "gpu_utilization_pct"): ("gauge", 0.0),
        ("1", "memory_utilization_pct"): ("gauge", 0.0),
        ("1", "memory_used_bytes"): ("gauge", 1_073_741_824.0),
        ("1", "power_w"): ("gauge", 650.0),
        ("1", "sm_clock_mhz"): ("gauge", 345.0),
        ("1", "throttle_reasons"): ("gauge", 1.0),
    }
    loop = SamplerLoop(sampler, interval_s=0.01)
    raw = sample([loop], until=lambda: time.sleep(0.05))
    stored = {(row["labels"], row["metric"]): row["value"] for row in raw.to_pylist()}
    assert stored[(json.dumps({"gpu": "0"}), "power_w")] == 412.345
    assert set(raw.column("table").to_pylist()) == {GPU}
    sampler.close()
    assert nvml.initialised == 0


def test_gpu_sampler_refuses_a_gpu_nvml_does_not_see_when_asked_for_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Asking for GPU 2 of a host whose NVML sees 2 GPUs is GpuUnavailable, naming what it sees."""
    from workers.node.telemetry import GpuSampler, GpuUnavailable

    FakeNvml().install(monkeypatch)
    with pytest.raises(GpuUnavailable, match=r"NVML sees 2 GPU\(s\); asked for \[0, 2\]"):
        GpuSampler([0, 2])


def test_start_profile_writes_placeholder_trace_when_server_is_simulated(
    sim: ServerProcess, tmp_path: Path
) -> None:
    """/start_profile with a step bound: the simulator accepts it and writes its placeholder trace where
    SGLang would write the profiler's; a server that does not answer gives a reason, not an exception."""
    from workers.node.preflight import pick_free_port
    from workers.node.telemetry import start_profile

    out = tmp_path / "profile" / "concurrency=2"
    assert start_profile(sim.url, out, "concurrency-2", 5) is None
    trace = json.loads((out / "concurrency-2-sim.trace.json").read_text())
    assert trace["traceEvents"] == [] and trace[api.PROFILE_NUM_STEPS] == 5
    problem = start_profile(f"http://127.0.0.1:{pick_free_port('127.0.0.1')}", out, "x", 5)
    assert problem is not None and problem.startswith("/start_profile failed")


def test_telemetry_command_prints_each_reading_and_a_mean_max_summary_when_nvml_answers(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Standalone, in process, through NVML's library layer (FakeNvml): ``--gpus 1`` samples GPU 1 only;
    every reading is printed as ``<elapsed>s <labels> <metric> <value>``, then a summary line per GPU and
    metric with mean / max and the sample count; the loop keeps sampling every interval. GPU 1's power is a constant 650000 mW, so its summary is
    ``650.0 / 650 (n samples)`` with n the number of power_w lines printed; NVML is shut down at the end."""
    from workers.node.telemetry import main

    nvml = FakeNvml()
    nvml.install(monkeypatch)
    assert main(["--gpus", "1", "--seconds", "0.2", "--interval-s", "0.02"]) == 0
    out = capsys.readouterr().out
    readings, _, summary = out.partition("summary (mean / max over the samples):\n")
    power = [line.split() for line in readings.splitlines() if " power_w " in line]
    assert len(power) >= 3  # one sample per 0.02 s over 0.2 s (ten, fewer on a loaded machine)
    assert all(fields[-1] == "650" and fields[0].endswith("s") for fields in power)
    assert float(power[0][0].removesuffix("s")) == 0.0  # times from the first sample
    assert '"gpu": "0"' not in out
    assert f'  {{"gpu": "1"}} power_w: 650.0 / 650 ({len(power)} samples)' in summary.splitlines()
    assert f'  {{"gpu": "1"}} memory_used_bytes: 1073741824.0 / 1.07374e+09 ({len(power)} samples)' in (
        summary.splitlines()
    )
    assert nvml.initialised == 0


def test_telemetry_command_writes_both_gpus_readings_to_parquet_when_out_is_given(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--gpus all --out FILE`` writes the raw samples (no printing): both GPUs' readings, every row in
    the gpu_metrics table, power in watts (GPU 0: 412345 mW -> 412.345 W)."""
    import pyarrow.parquet as pq

    from workers.node.telemetry import main, summarize

    FakeNvml().install(monkeypatch)
    out = tmp_path / "raw.parquet"
    assert main(["--gpus", "all", "--seconds", "0.05", "--interval-s", "0.02", "--out", str(out)]) == 0
    table = pq.read_table(out)
    assert set(table.column("table").to_pylist()) == {GPU}
    means = {key: mean for key, (mean, _, _) in summarize(table).items()}
    assert means[(json.dumps({"gpu": "0"}), "power_w")] == pytest.approx(412.345)
    assert means[(json.dumps({"gpu": "1"}), "sm_clock_mhz")] == 345.0
    assert (json.dumps({"gpu": "1"}), "temperature_c") not in means


def test_summarize_gives_mean_max_and_count_per_gpu_and_metric_when_values_vary() -> None:
    """Three power samples of GPU 0 (100, 300, 200 W) and one of GPU 1 (50 W): mean 200, max 300, 3
    samples; 50, 50, 1; keys sorted by labels then metric."""
    import pyarrow as pa

    from workers.node.telemetry import RAW_SCHEMA, summarize

    gpu0, gpu1 = json.dumps({"gpu": "0"}), json.dumps({"gpu": "1"})
    rows = [(gpu1, 50.0), (gpu0, 100.0), (gpu0, 300.0), (gpu0, 200.0)]

    table = pa.Table.from_pylist(
        [
            {
                "clock_ns": i,
                "time_unix_ns": i,
                "table": GPU,
                "metric": "power_w",
                "kind": "gauge",
                "labels": labels,
                "value": value,
            }
            for i, (labels, value) in enumerate(rows)
        ],
        schema=RAW_SCHEMA,
    )
    assert list(summarize(table).items()) == [
        ((gpu0, "power_w"), (200.0, 300.0, 3)),
        ((gpu1, "power_w"), (50.0, 50.0, 1)),
    ]


def test_server_scraper_reads_metrics_and_counts_failures_when_scrapes_fail(sim: ServerProcess) -> None:
    """A scrape of the server's /metrics (base URL with or without a trailing slash) gives its gauges;
    a byte that is not UTF-8 becomes U+FFFD and the rest is read; a 404 (wrong base URL), no server at all and a 200 whose body is not Prometheus text each give no
    readings and count one failure."""
    import http.server
    import threading

    from workers.node.preflight import pick_free_port
    from workers.node.telemetry import ServerScraper

    scraper = ServerScraper(sim.url + "/", timeout_s=5.0)
    assert scraper.url == sim.url + api.METRICS
    readings = scraper.sample()
    assert (api.METRIC_NUM_RUNNING, "gauge") in {(metric, kind) for metric, kind, _, _ in readings}
    assert scraper.failures == 0

    class Garbage(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            self.end_headers()
            if self.path.startswith("/latin"):  # a label value in Latin-1, not UTF-8
                self.wfile.write(
                    b'# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="caf\xe9"} 2\n'
                )
            else:
                self.wfile.write(b"sglang:num_running_reqs{ not prometheus\n")

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Garbage)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        latin = ServerScraper(f"http://127.0.0.1:{server.server_address[1]}/latin", timeout_s=5.0)
        assert latin.sample() == [("sglang:num_running_reqs", "gauge", '{"model_name": "caf\\ufffd"}', 2.0)]
        for url in (
            sim.url + "/nothing",
            f"http://127.0.0.1:{pick_free_port('127.0.0.1')}",
            f"http://127.0.0.1:{server.server_address[1]}",
        ):
            failing = ServerScraper(url, timeout_s=5.0)
            assert failing.sample() == [] and failing.failures == 1, url
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_telemetry_child_announces_gpu_off_and_waits_out_a_slow_server_when_run_as_the_worker_runs_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """As the node worker runs it (``--until-stdin-closes``, here a stdin that ends after 0.5 s): the
    first stdout line is the JSON ready line naming why GPU sampling is off (GPU 5 of a host whose NVML
    sees 2); a server that takes 0.3 s to answer /metrics is still read with a 0.05 s scrape interval
    (the scrape timeout is at least 5 s), its gauge value 3 stored in the server_metrics rows."""
    import http.server
    import io
    import threading

    import pyarrow.parquet as pq

    from workers.node.telemetry import main

    class Slow(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            time.sleep(0.3)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(
                b'# TYPE sglang:num_running_reqs gauge\nsglang:num_running_reqs{model_name="m"} 3\n'
            )

        def log_message(self, *args: object) -> None:
            pass

    FakeNvml().install(monkeypatch)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Slow)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()

    class ClosesLater(io.StringIO):
        def read(self, size: int | None = -1) -> str:
            time.sleep(0.5)
            return ""

    monkeypatch.setattr(sys, "stdin", ClosesLater())
    out = tmp_path / "raw.parquet"
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        argv = ["--until-stdin-closes", "--gpus", "5", "--metrics-url", url, "--metrics-interval-s", "0.05"]
        assert main([*argv, "--out", str(out)]) == 0
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    printed = capsys.readouterr()
    assert printed.out.splitlines() == [json.dumps({"gpu_off": "NVML sees 2 GPU(s); asked for [5]"})]
    assert "GPU sampling off: NVML sees 2 GPU(s); asked for [5]" in printed.err
    rows = pq.read_table(out).to_pylist()
    assert rows and {(r["table"], r["metric"], r["value"]) for r in rows} == {
        (SERVER, "sglang:num_running_reqs", 3.0)
    }


def test_telemetry_command_names_itself_and_the_two_ways_to_stop_when_neither_is_given(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Without --seconds or --until-stdin-closes the command stops with argparse's usage error (exit 2),
    which names the command as it is run and both options."""
    from workers.node.telemetry import main

    with pytest.raises(SystemExit) as stopped:
        main(["--gpus", "all"])
    assert stopped.value.code == 2
    err = capsys.readouterr().err
    assert err.startswith("usage: python -m workers.node.telemetry ")
    assert "one of the arguments --seconds --until-stdin-closes is required" in err


def test_start_profile_posts_sglangs_json_body_when_it_asks_for_a_capture(tmp_path: Path) -> None:
    """What SGLang's /start_profile receives: a POST with Content-Type application/json (FastAPI reads
    the body as ProfileReqInput only then) and the output folder, step count and prefix under SGLang's
    field names; any status other than 200 is reported with the status."""
    import http.server
    import threading

    from workers.node.telemetry import start_profile

    received: list[tuple[str, str, str | None, dict[str, object]]] = []
    status = [200]

    class Recorder(http.server.BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            received.append((self.command, self.path, self.headers["Content-Type"], body))
            self.send_response(status[0])
            self.end_headers()

        def log_message(self, *args: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Recorder)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert start_profile(url, tmp_path / "p", "concurrency-8", 7) is None
        status[0] = 202
        assert start_profile(url, tmp_path / "p", "x", 1) == "/start_profile answered 202"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()
    assert received[0] == (
        "POST",
        api.START_PROFILE,
        "application/json",
        {
            api.PROFILE_OUTPUT_DIR: str(tmp_path / "p"),
            api.PROFILE_NUM_STEPS: 7,
            api.PROFILE_PREFIX: "concurrency-8",
        },
    )
