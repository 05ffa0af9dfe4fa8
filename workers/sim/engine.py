"""The simulated server's scheduler: continuous batching in real time, driven by ``workers.sim.model``.

One asyncio task runs the loop SGLang's scheduler runs: admit waiting requests (one prefill iteration,
which yields each one's first token), otherwise run one decode iteration over every running request (one
verify step each, accepting a sampled prefix of the draft plus the bonus token). Each iteration ends at an
absolute deadline on ``time.perf_counter_ns()``'s clock (``previous deadline + cost x time scale``), so lateness never
accumulates into drift. The tokens of an iteration are handed to each request's stream at its deadline:
one ``Progress`` per verify step, carrying every token accepted in that step.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import queue
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from workers.sim.adaptive import AdaptiveSchedule
from workers.sim.faults import RUNTIME_CRASH_TRACEBACK, die_like_sglang, log_line, lossy_from
from workers.sim.model import (
    DraftShape,
    SimProfile,
    admissions,
    cross_node_seconds,
    decode_step_seconds,
    depth_accept_probs,
    prefill_seconds,
    sample_accepted_drafts,
)
from workers.sim.physics import launch_factor
from workers.sim.presets import PRESETS
from workers.sim.settings import FaultMode, SimSettings

logger = logging.getLogger(__name__)

DECODE_LOG_INTERVAL = 40  # SGLang folds its speculative window into the lifetime average this often

# The simulator's "vocabulary": token id i is the word TOKEN_WORDS[i]; a word-level tokenizer over the same
# list (see tests) round-trips prompts and outputs exactly, so token counts agree on both sides.
_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"
_SYLLABLES = [c + v for c in _CONSONANTS for v in _VOWELS]
TOKEN_WORDS: tuple[str, ...] = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES)
EOS_TOKEN_ID = len(TOKEN_WORDS)
_TOKEN_TEXT = tuple(" " + word for word in TOKEN_WORDS)
_TOKEN_STRIDE = 7919  # successive output ids walk the vocabulary with a prime stride


@dataclass(frozen=True, slots=True)
class Progress:
    """What one iteration did for one request: the stream turns it into one chunk."""

    completion_tokens: int
    text: str  # cumulative
    finish_reason: dict[str, Any] | None
    scheduled_ns: int  # the iteration's deadline, on time.perf_counter_ns()'s clock


@dataclass(slots=True)
class SimRequest:
    """One generation request inside the scheduler."""

    rid: str
    prompt_tokens: int
    max_new_tokens: int
    natural_len: int | None  # where an EOS would end it (None: ignore_eos)
    stop: tuple[str, ...]
    probs: tuple[float, ...]
    rng: random.Random
    token_base: int  # where the output walks the vocabulary from: same prompt, same text (as greedy)
    lossy_from: int | None = None  # a lossy fault: output position from which the token ids are wrong
    health_check: bool = False
    streaming: bool = False  # the client asked for a stream (SGLang's is_streaming metric label)
    seq_no: int = 0  # 1-based order among generation requests (0: health check)
    received_ns: int = field(default_factory=time.perf_counter_ns)
    output_ids: list[int] = field(default_factory=list)
    text: str = ""
    finish_reason: dict[str, Any] | None = None
    verify_ct: int = 0
    correct_drafts: int = 0
    histogram: list[int] = field(default_factory=list)
    first_token_ns: int = 0
    last_token_ns: int = 0
    updates: asyncio.Queue[Progress] = field(default_factory=asyncio.Queue)
    # Called with each Progress as its iteration ends; by default it queues onto ``updates``. A streaming
    # handler may replace it with a writer that puts the chunk on the connection at once.
    sink: Callable[[Progress], None] | None = None

    def __post_init__(self) -> None:
        if self.sink is None:
            self.sink = self.updates.put_nowait

    def append(self, count: int) -> None:
        """Add ``count`` output tokens, stopping early at a stop string, EOS or the length limit."""
        for _ in range(count):
            position = len(self.output_ids)
            if position + 1 == self.natural_len and self.natural_len < self.max_new_tokens:
                self.output_ids.append(EOS_TOKEN_ID)
                self.finish_reason = {"type": "stop", "matched": EOS_TOKEN_ID}
                return
            token = (self.token_base + position * _TOKEN_STRIDE) % EOS_TOKEN_ID
            if self.lossy_from is not None and position >= self.lossy_from:
                token = (token + 1) % EOS_TOKEN_ID
            self.output_ids.append(token)
            self.text += _TOKEN_TEXT[token]
            if self.stop and self._hit_stop():
                return
            if len(self.output_ids) >= self.max_new_tokens:
                self.finish_reason = {"type": "length", "length": self.max_new_tokens}
                return

    def _hit_stop(self) -> bool:
        for stop in self.stop:
            at = self.text.find(stop)
            if at >= 0:
                self.text = self.text[:at]
                self.finish_reason = {"type": "stop", "matched": stop}
                return True
        return False


@dataclass(slots=True)
class SpecCounters:
    """SGLang's speculative counters: a window folded into lifetime totals every 40 decode iterations."""

    window_accept_tokens: int = 0
    window_correct_drafts: int = 0
    window_forward_ct: int = 0
    window_proposed_drafts: int = 0
    total_accept_tokens: int = 0
    total_forward_ct: int = 0
    verify_calls_total: int = 0
    last_accept_length: float = 0.0
    last_accept_rate: float = 0.0

    def average_accept_length(self) -> float | None:
        """/server_info's avg_spec_accept_length: None until the first fold."""
        return self.total_accept_tokens / self.total_forward_ct if self.total_forward_ct else None


class SimEngine:
    """Continuous-batching scheduler; ``submit`` a request, then read its ``updates`` (or set its sink)."""

    def __init__(
        self,
        settings: SimSettings,
        shape: DraftShape | None,
        max_running_requests: int | None,
        on_finish: Callable[[SimRequest], None] | None = None,
        *,
        drafts_always_rejected: bool = False,
        adaptive: AdaptiveSchedule | None = None,
        nnodes: int = 1,
    ) -> None:
        self.settings = settings
        self.nnodes = nnodes  # nodes the server's tensor parallelism spans (model.cross_node_seconds)
        self.profile: SimProfile = settings.profile
        # A physics preset (SPECSWEEP_SIM_PRESET) replaces the profile's costs and acceptance; its launch
        # factor scales every iteration of this launch alike.
        self.physics = PRESETS[settings.preset] if settings.preset else None
        self.launch_factor = launch_factor(settings.seed, self.physics.launch_sigma) if self.physics else 1.0
        if self.physics is not None:
            max_running_requests = self.physics.running_cap(shape, max_running_requests)
        self.shape = shape  # the launch's shape; an adaptive server drafts a prefix of its chain per batch
        self.adaptive = adaptive
        self.max_running = max_running_requests
        self.on_finish = on_finish
        self.drafts_always_rejected = drafts_always_rejected
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []
        self.counters = SpecCounters()
        self.decode_iterations = 0
        self.generation_requests = 0
        self.last_output_ns = 0
        self._work = asyncio.Event()
        self._output = asyncio.Event()
        self._seen_prompts: dict[bytes, int] = {}
        self._probs_by_content: dict[tuple[str, float], tuple[float, ...]] = {}

    # --- requests --------------------------------------------------------------------------------------
    def new_request(
        self,
        *,
        rid: str,
        prompt_key: bytes,
        prompt_tokens: int,
        max_new_tokens: int,
        temperature: float,
        ignore_eos: bool,
        stop: tuple[str, ...],
        category: str | None = None,
        health_check: bool = False,
    ) -> SimRequest:
        """A request seeded by (seed, prompt, how often this prompt was seen): reproducible per request.
        At temperature 0 the output (ids and where EOS ends it) depends on the prompt alone, as a greedy
        decode does: the same in every batch and on every resend."""
        digest = hashlib.blake2b(prompt_key, digest_size=16).digest()
        occurrence = self._seen_prompts.get(digest, 0)
        self._seen_prompts[digest] = occurrence + 1
        rng = random.Random(f"{self.settings.seed}:{digest.hex()}:{occurrence}")
        length_rng = random.Random(f"{self.settings.seed}:{digest.hex()}") if temperature == 0 else rng
        natural = (
            None if ignore_eos else 1 + int(length_rng.expovariate(1.0 / self.profile.natural_output_tokens))
        )
        return SimRequest(
            rid=rid,
            prompt_tokens=max(prompt_tokens, 1),
            max_new_tokens=max_new_tokens,
            natural_len=natural,
            stop=stop,
            probs=self._probs(category or self.profile.default_category, temperature),
            rng=rng,
            token_base=int.from_bytes(digest[:8], "little") % EOS_TOKEN_ID,
            lossy_from=None if health_check else lossy_from(self.settings, self.shape),
            health_check=health_check,
        )

    def submit(self, request: SimRequest) -> None:
        """Queue a request; crash here when the crash_after fault says this one is too many."""
        if not request.health_check:
            self.generation_requests += 1
            request.seq_no = self.generation_requests
            if (
                self.settings.fault is FaultMode.CRASH_AFTER
                and self.generation_requests > self.settings.fault_after
            ):
                die_like_sglang(RUNTIME_CRASH_TRACEBACK, starting=False)
        if request.max_new_tokens <= 0:
            request.finish_reason = {"type": "length", "length": 0}
            self._publish(request, time.perf_counter_ns())
            return
        self.waiting.append(request)
        self._work.set()

    def abort(self, request: SimRequest) -> None:
        """Drop a request whose client went away (SGLang aborts it too)."""
        if request in self.running:
            self.running.remove(request)
        elif request in self.waiting:
            self.waiting.remove(request)

    def is_idle(self) -> bool:
        return not self.running and not self.waiting

    def flush_cache(self) -> bool:
        """Reset the speculative counters when idle, as SGLang's flush_cache does; False when busy."""
        if not self.is_idle():
            logger.warning(
                "Cache not flushed because there are pending requests. #queue-req: %d, #running-req: %d",
                len(self.waiting),
                len(self.running),
            )
            return False
        self.counters = SpecCounters()
        logger.info("Cache flushed successfully!")
        return True

    async def wait_for_output_after(self, since_ns: int, timeout_s: float) -> bool:
        """True once any request produced output after ``since_ns`` (how SGLang's /health decides)."""
        deadline = time.monotonic() + timeout_s
        while self.last_output_ns <= since_ns:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return False
            self._output.clear()
            try:
                await asyncio.wait_for(self._output.wait(), remaining)
            except TimeoutError:
                return False
        return True

    # --- the loop ---------------------------------------------------------------------------------------
    async def run(self) -> None:
        """The scheduler loop; runs until cancelled."""
        scale_ns = self.settings.time_scale * 1e9
        deadline = time.perf_counter_ns()
        timer = DeadlineTimer(asyncio.get_running_loop())
        try:
            await self._loop_forever(timer, scale_ns, deadline)
        finally:
            timer.close()

    async def _loop_forever(self, timer: DeadlineTimer, scale_ns: float, deadline: int) -> None:
        while True:
            if self.is_idle():
                self._work.clear()
                await self._work.wait()
                deadline = max(deadline, time.perf_counter_ns())
            admitted_count = admissions(len(self.waiting), len(self.running), self.max_running)
            if admitted_count:
                admitted = [self.waiting.popleft() for _ in range(admitted_count)]
                tokens = sum(r.prompt_tokens for r in admitted)
                seconds = self._prefill_seconds(tokens) + cross_node_seconds(
                    self.profile, self.nnodes, tokens
                )
                deadline += round(seconds * scale_ns)
                await timer.sleep_until(deadline)
                self._finish_prefill(admitted, deadline)
            else:
                shape = self._decode_shape(len(self.running))
                verified = len(self.running) * (shape.num_draft_tokens if shape else 1)
                seconds = self._decode_seconds(shape) + cross_node_seconds(
                    self.profile, self.nnodes, verified
                )
                deadline += round(seconds * scale_ns)
                await timer.sleep_until(deadline)
                await self._finish_decode(deadline, shape)

    def _prefill_seconds(self, tokens: int) -> float:
        if self.physics is None:
            return prefill_seconds(self.profile, tokens)
        return self.physics.prefill_seconds(tokens) * self.launch_factor

    def _decode_seconds(self, shape: DraftShape | None) -> float:
        """One decode iteration over the running batch (physics: at the batch's mean context)."""
        batch = len(self.running)
        if self.physics is None:
            return decode_step_seconds(self.profile, shape, batch)
        context = sum(r.prompt_tokens + len(r.output_ids) for r in self.running) // max(batch, 1)
        step = self.physics.decode_step_seconds(shape, batch, context, max_running=self.max_running or batch)
        return step * self.launch_factor

    def _decode_shape(self, batch: int) -> DraftShape | None:
        """The shape this decode iteration drafts: the launch's, or the adaptive slot's depth as a topk-1
        chain (SGLang's activate_step_by_batch); depth 0 decodes without drafting."""
        if self.adaptive is None or self.shape is None:
            return self.shape
        steps = self.adaptive.steps_for_batch(batch)
        return DraftShape(steps, 1, steps + 1) if steps > 0 else None

    def _finish_prefill(self, admitted: list[SimRequest], scheduled_ns: int) -> None:
        for request in admitted:
            request.append(1)
            request.first_token_ns = scheduled_ns
            self._publish(request, scheduled_ns)
            if request.finish_reason is None:
                self.running.append(request)

    async def _finish_decode(self, scheduled_ns: int, shape: DraftShape | None) -> None:
        """Every running request gets one verify step of ``shape``. As in SGLang, the speculative counters
        (per request and server-wide) count the whole accepted run, even where max_new_tokens or a stop
        cuts the output short; completion_tokens counts what was kept. An adaptive server then feeds
        the step's accepted drafts per request to the batch's slot."""
        batch = self.running
        counters = self.counters
        depth = shape.num_steps if shape is not None else 0
        proposed = shape.num_draft_tokens - 1 if shape is not None else 0
        accepted: list[int] = []
        for request in batch:
            drafts = sample_accepted_drafts(request.probs[:depth], request.rng) if shape else 0
            accepted.append(drafts)
            request.append(1 + drafts)
            if self.shape:
                request.verify_ct += 1
                request.correct_drafts += drafts
                histogram = request.histogram
                if len(histogram) <= drafts:
                    histogram.extend([0] * (drafts + 1 - len(histogram)))
                histogram[drafts] += 1
                if not request.health_check:
                    counters.window_accept_tokens += 1 + drafts
                    counters.window_correct_drafts += drafts
                    counters.window_forward_ct += 1
                    counters.window_proposed_drafts += proposed
                    counters.verify_calls_total += 1
            self._publish(request, scheduled_ns)
        if self.adaptive is not None and self.shape is not None:
            self.adaptive.on_verify_complete(accepted, len(batch))
        self.running = [r for r in batch if r.finish_reason is None]
        self.decode_iterations += 1
        if self.shape and self.decode_iterations % DECODE_LOG_INTERVAL == 0:
            self._fold_window()
        if self._should_hang():
            logger.info("simulated fault: scheduler hangs mid-stream")
            await asyncio.get_running_loop().create_future()  # never resolves: the scheduler is stuck

    def _publish(self, request: SimRequest, scheduled_ns: int) -> None:
        request.last_token_ns = scheduled_ns
        self.last_output_ns = scheduled_ns
        self._output.set()
        assert request.sink is not None  # set in __post_init__
        request.sink(Progress(len(request.output_ids), request.text, request.finish_reason, scheduled_ns))
        if request.finish_reason is not None and self.on_finish is not None:
            self.on_finish(request)

    def _fold_window(self) -> None:
        """Every 40 decode iterations: log SGLang's decode line and fold the window into the totals."""
        c = self.counters
        if not c.window_forward_ct:
            return
        c.last_accept_length = c.window_accept_tokens / c.window_forward_ct
        drafts = c.window_proposed_drafts
        c.last_accept_rate = c.window_correct_drafts / drafts if drafts else 0.0
        c.total_accept_tokens += c.window_accept_tokens
        c.total_forward_ct += c.window_forward_ct
        c.window_accept_tokens = c.window_correct_drafts = c.window_forward_ct = c.window_proposed_drafts = 0
        logger.info(
            log_line(
                f"Decode batch, #running-req: {len(self.running)}, #queue-req: {len(self.waiting)}, "
                f"accept len: {c.last_accept_length:.2f}, accept rate: {c.last_accept_rate:.2f}",
                rank="TP0",
            )
        )

    def _should_hang(self) -> bool:
        if self.settings.fault is not FaultMode.HANG_MID_STREAM:
            return False
        return any(
            r.seq_no > self.settings.fault_after and 2 * len(r.output_ids) >= r.max_new_tokens
            for r in self.running
        )

    def _probs(self, category: str, temperature: float) -> tuple[float, ...]:
        if self.shape is None:
            return ()
        probs = self._probs_by_content.get((category, temperature))
        if probs is None:
            if self.physics is not None:
                probs = self.physics.depth_accept_probs(self.shape, temperature, category)
            else:
                probs = depth_accept_probs(self.profile, self.shape, temperature, category)
            if self.drafts_always_rejected:
                probs = tuple(0.0 for _ in probs)
            self._probs_by_content[category, temperature] = probs
        return probs


class DeadlineTimer:
    """Wakes the event loop at absolute ``perf_counter_ns()`` deadlines, to a tenth of a millisecond.

    The loop's own timers round to whole milliseconds (epoll and libuv timeouts), which alone would make
    chunks up to 1 ms late. A helper thread sleeps with the kernel's nanosleep and wakes the loop through
    ``call_soon_threadsafe``; it holds no lock while sleeping, so the loop runs freely meanwhile.
    """

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._requests: queue.SimpleQueue[tuple[int, asyncio.Future[None]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sim-deadline-timer", daemon=True)
        self._thread.start()

    async def sleep_until(self, deadline_ns: int) -> None:
        if deadline_ns <= time.perf_counter_ns():
            return
        wake = self._loop.create_future()
        self._requests.put((deadline_ns, wake))
        await wake

    def close(self) -> None:
        self._requests.put(None)

    def _run(self) -> None:
        while (request := self._requests.get()) is not None:
            deadline_ns, wake = request
            while (remaining := deadline_ns - time.perf_counter_ns()) > 0:
                time.sleep(remaining / 1e9)
            try:
                self._loop.call_soon_threadsafe(_resolve, wake)
            except RuntimeError:  # the loop closed while we slept
                return


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)
