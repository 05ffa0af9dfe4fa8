"""Prometheus ``/metrics`` of the simulated server, with SGLang's ``sglang:`` metric names.

Gauges mirror SGLang's scheduler stats (running and queued requests, KV-pool use, generation
throughput, the last 40-iteration speculative window); counters and histograms follow SGLang's
tokenizer-manager collector (prompt, generation and request totals by ``is_streaming``, verify calls;
TTFT, inter-token and end-to-end latency of each finished request). Names and types are SGLang's own
(``workers.sglang.api``; a test checks them against the installed SGLang source). The simulator has no
memory model: its KV pool holds ``--max-total-tokens`` tokens, or ``DEFAULT_KV_POOL_TOKENS``.
"""

from __future__ import annotations

import bisect
import time
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from workers.sglang import SpecParams, api

if TYPE_CHECKING:
    from workers.sim.engine import SimEngine, SimRequest

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 120, 160)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.8, 1, 2, 5, 10, 20, 40, 60, 80, 100, 150, 200, 250, 300, 500, 1000)
_THROUGHPUT_WINDOW_S = 10.0
DEFAULT_KV_POOL_TOKENS = 1_000_000  # the pool size when --max-total-tokens is not given


@dataclass
class Histogram:
    """A cumulative Prometheus histogram."""

    buckets: tuple[float, ...]
    counts: list[int] = field(default_factory=list)
    total: float = 0.0
    count: int = 0

    def __post_init__(self) -> None:
        self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float, times: int = 1) -> None:
        self.counts[bisect.bisect_left(self.buckets, value)] += times
        self.total += value * times
        self.count += times

    def render(self, name: str, labels: str) -> list[str]:
        lines = [f"# TYPE {name} histogram"]
        running = 0
        for bound, n in zip((*self.buckets, float("inf")), self.counts, strict=True):
            running += n
            le = "+Inf" if bound == float("inf") else repr(float(bound))
            lines.append(f'{name}_bucket{{{labels},le="{le}"}} {running}')
        lines += [f"{name}_sum{{{labels}}} {self.total}", f"{name}_count{{{labels}}} {self.count}"]
        return lines


class SimMetrics:
    """Request-level observations plus a render of the engine's live state."""

    def __init__(self, model_name: str, spec: SpecParams, kv_pool_tokens: int | None = None) -> None:
        self.labels = f'model_name="{model_name}"'
        self.spec = spec
        self.kv_pool_tokens = kv_pool_tokens or DEFAULT_KV_POOL_TOKENS
        self.ttft = Histogram(TTFT_BUCKETS)
        self.itl = Histogram(ITL_BUCKETS)
        self.e2e = Histogram(E2E_BUCKETS)
        # is_streaming ("true"/"false") -> [prompt tokens, generation tokens, requests] of finished requests
        self.totals: dict[str, list[int]] = {"false": [0, 0, 0], "true": [0, 0, 0]}
        self._finished_tokens: deque[tuple[float, int]] = deque()

    def observe_finished(self, request: SimRequest) -> None:
        """Record one finished generation request (health probes are not counted, as in SGLang)."""
        if request.health_check:
            return
        tokens = len(request.output_ids)
        totals = self.totals["true" if request.streaming else "false"]
        totals[0] += request.prompt_tokens
        totals[1] += tokens
        totals[2] += 1
        self.ttft.observe((request.first_token_ns - request.received_ns) / 1e9)
        self.e2e.observe((request.last_token_ns - request.received_ns) / 1e9)
        if tokens > 1:
            self.itl.observe(
                (request.last_token_ns - request.first_token_ns) / 1e9 / (tokens - 1), tokens - 1
            )
        now = time.monotonic()
        self._finished_tokens.append((now, tokens))
        while self._finished_tokens and self._finished_tokens[0][0] < now - _THROUGHPUT_WINDOW_S:
            self._finished_tokens.popleft()

    @property
    def last_gen_throughput(self) -> float:
        """Output tokens per second over the last few seconds of finished requests."""
        return sum(tokens for _, tokens in self._finished_tokens) / _THROUGHPUT_WINDOW_S

    def render(self, engine: SimEngine) -> str:
        counters = engine.counters
        spec = self.spec
        used_tokens = sum(r.prompt_tokens + len(r.output_ids) for r in engine.running)
        gauges = {
            api.METRIC_NUM_RUNNING: len(engine.running),
            api.METRIC_NUM_QUEUE: len(engine.waiting),
            api.METRIC_GEN_THROUGHPUT: self.last_gen_throughput,
            api.METRIC_NUM_USED_TOKENS: used_tokens,
            api.METRIC_TOKEN_USAGE: used_tokens / self.kv_pool_tokens,
            api.METRIC_SPEC_ACCEPT_LENGTH: counters.last_accept_length,
            api.METRIC_SPEC_ACCEPT_RATE: counters.last_accept_rate,
            api.METRIC_SPEC_NUM_STEPS: spec.speculative_num_steps or 0,
            api.METRIC_SPEC_NUM_DRAFT_TOKENS: spec.speculative_num_draft_tokens or 0,
        }
        lines: list[str] = []
        for name, value in gauges.items():
            lines += [f"# TYPE {name} gauge", f"{name}{{{self.labels}}} {float(value)}"]
        lines += _counter(api.METRIC_SPEC_VERIFY_CALLS, {self.labels: counters.verify_calls_total})
        for column, name in enumerate(
            (api.METRIC_PROMPT_TOKENS, api.METRIC_GENERATION_TOKENS, api.METRIC_NUM_REQUESTS)
        ):
            values = {
                f'{self.labels},{api.METRIC_LABEL_IS_STREAMING}="{streaming}"': totals[column]
                for streaming, totals in self.totals.items()
            }
            lines += _counter(name, values)
        lines += self.ttft.render(api.METRIC_TTFT, self.labels)
        lines += self.itl.render(api.METRIC_ITL, self.labels)
        lines += self.e2e.render(api.METRIC_E2E, self.labels)
        return "\n".join(lines) + "\n"


def _counter(sample_name: str, values: dict[str, int]) -> list[str]:
    """A counter family as prometheus_client's text format writes it (TYPE names the ``_total``)."""
    lines = [f"# TYPE {sample_name} counter"]
    return lines + [f"{sample_name}{{{labels}}} {float(value)}" for labels, value in values.items()]
