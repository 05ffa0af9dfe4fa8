"""The simulated SGLang 0.5.23 server's HTTP app: SGLang's routes, bodies and streaming shapes.

Speed and acceptance come from ``workers.sim.model`` run in real time by ``workers.sim.engine``; every
endpoint path and field name comes from ``workers.sglang.api``; the OpenAI-shaped bodies from
``workers.sim.responses``. The process entry point is ``python -m workers.sim`` (``workers/sim/__main__.py``),
with the same arguments as ``python -m sglang.launch_server``; the launch is resolved by ``workers.sim.launch``.

Every streamed chunk carries two extra fields real clients ignore (in ``meta_info`` on ``/generate``, at
the top level on the OpenAI routes): ``sim_scheduled_ns``, the deadline of the iteration that produced it,
and ``sim_send_ns``, when the server wrote it, both on ``time.perf_counter_ns()``'s clock (shared by all
processes of the machine), so a benchmark can split delay into server lateness and client overhead.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import orjson
from aiohttp import web

from workers.sglang import SGLANG_VERSION, api, multinode
from workers.sim.adaptive import AdaptiveSchedule
from workers.sim.algorithms import prompt_repetition
from workers.sim.engine import Progress, SimEngine, SimRequest
from workers.sim.faults import READY_LINE, log_line
from workers.sim.launch import ServedConfig
from workers.sim.metrics import SimMetrics
from workers.sim.model import content_category
from workers.sim.responses import (
    OpenAIForm,
    error_response,
    json_response,
    token_texts,
    write_event,
)
from workers.sim.settings import FaultMode, SimSettings

logger = logging.getLogger(__name__)


DEFAULT_MAX_NEW_TOKENS = 128  # SGLang's sampling_params default
COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI completions default, as SGLang's CompletionRequest
_SSE_DONE = api.SSE_DATA_PREFIX + api.SSE_DONE + b"\n\n"
_SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


# --- request parsing ------------------------------------------------------------------------------------
class BadRequest(Exception):
    """A request body SGLang answers with HTTP 400."""


def _count_prompt_tokens(prompt: Any) -> tuple[int, bytes]:
    """Prompt length in simulator tokens (words, or given ids) and the bytes that seed its draws."""
    if isinstance(prompt, str):
        return len(prompt.split()), prompt.encode()
    if isinstance(prompt, list) and all(isinstance(t, int) for t in prompt):
        return len(prompt), orjson.dumps(prompt)
    if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):  # chat messages
        text = " ".join(str(m.get("content") or "") for m in prompt)
        return len(text.split()) + 4 * len(prompt), orjson.dumps(prompt)
    raise BadRequest("prompt must be a string, a list of token ids, or a list of chat messages")


def _as_stop(value: Any) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if isinstance(value, list) and all(isinstance(s, str) for s in value):
        return tuple(value)
    raise BadRequest("stop must be a string or a list of strings")


@dataclass(frozen=True)
class GenerationParams:
    """The sampling parameters the simulator honours."""

    max_new_tokens: int
    temperature: float
    ignore_eos: bool
    stop: tuple[str, ...]

    @classmethod
    def parse(
        cls, raw: Mapping[str, Any], *, default_max: int, max_key: str = "max_new_tokens"
    ) -> GenerationParams:
        max_new = raw.get(max_key)
        temperature = raw.get("temperature")
        try:
            return cls(
                max_new_tokens=default_max if max_new is None else int(max_new),
                temperature=1.0 if temperature is None else float(temperature),
                ignore_eos=bool(raw.get("ignore_eos", False)),
                stop=_as_stop(raw.get("stop")),
            )
        except (TypeError, ValueError) as exc:
            raise BadRequest(f"invalid sampling parameters: {exc}") from exc


# --- the app --------------------------------------------------------------------------------------------
class SimServer:
    """The HTTP front of one simulated server; ``app`` is its aiohttp application."""

    def __init__(self, config: ServedConfig, settings: SimSettings) -> None:
        self.config = config
        self.settings = settings
        self.loaded = False
        self.metrics = SimMetrics(
            config.served_model_name, config.spec, config.resolved_args.get("max_total_tokens")
        )
        self.engine: SimEngine | None = None
        self._engine_task: asyncio.Task[None] | None = None
        self._loader: asyncio.Task[None] | None = None
        self._startup_time = time.time()
        self._http_requests = itertools.count(1)
        self.app = web.Application(client_max_size=64 * 1024**2)
        self.app.on_startup.append(self._start)
        self.app.on_cleanup.append(self._stop)
        self._add_routes()

    def _add_routes(self) -> None:
        r = self.app.router
        r.add_get(api.HEALTH, self.health)
        r.add_get(api.HEALTH_GENERATE, self.health)
        r.add_get(api.READY, self.ready)
        r.add_get(api.MODEL_INFO, self.model_info)
        r.add_get(api.MODEL_INFO_OLD, self.model_info)
        r.add_get(api.SERVER_INFO, self.server_info)
        r.add_get(api.SERVER_INFO_OLD, self.server_info)
        r.add_route("*", api.FLUSH_CACHE, self.flush_cache)
        r.add_get(api.MODELS, self.models)
        r.add_route("*", api.START_PROFILE, self.start_profile)
        r.add_route("*", api.STOP_PROFILE, self.stop_profile)
        r.add_route("POST", api.GENERATE, self.generate)
        r.add_route("PUT", api.GENERATE, self.generate)
        r.add_post(api.COMPLETIONS, self.completions)
        r.add_post(api.CHAT_COMPLETIONS, self.chat_completions)
        if self.config.resolved_args.get("enable_metrics"):
            r.add_get(api.METRICS, self.prometheus)

    async def _start(self, app: web.Application) -> None:
        shape = self.config.shape
        adaptive = None
        if shape is not None and self.config.spec.speculative_adaptive:
            adaptive = AdaptiveSchedule.from_file(shape.num_steps, self.config.adaptive_config_path)
        self.engine = SimEngine(
            self.settings,
            shape,
            self.config.spec.max_running_requests,
            on_finish=self.metrics.observe_finished,
            drafts_always_rejected=self.config.drafts_always_rejected,
            drafting=self.config.drafting,
            adaptive=adaptive,
            nnodes=int(self.config.resolved_args.get(multinode.NNODES) or 1),
            launch=str(self.config.resolved_args.get(api.LAUNCH_TAG) or ""),
        )
        self._engine_task = asyncio.create_task(self.engine.run(), name="sim-scheduler")

    def begin_loading(self) -> None:
        """Start the (simulated) weight loading; called once the port listens."""
        self._loader = asyncio.create_task(self._load(), name="sim-load")

    async def _stop(self, app: web.Application) -> None:
        for task in (self._engine_task, self._loader):
            if task is not None:
                task.cancel()

    async def _load(self) -> None:
        """Weight loading: the load delay, then SGLang's ready line (never, under hang_before_ready)."""
        logger.info(log_line("Load weight begin. avail mem=139.12 GB", rank="TP0"))
        await asyncio.sleep(self.settings.load_delay_s)
        if self.settings.fault is FaultMode.HANG_BEFORE_READY:
            logger.info(
                log_line("Capture cuda graph begin. This can take up to several minutes.", rank="TP0")
            )
            return
        logger.info(log_line("Load weight end. type=DeepseekV3ForCausalLM, mem usage=119.47 GB.", rank="TP0"))
        self.loaded = True
        logger.info(log_line(READY_LINE))

    # --- health and info --------------------------------------------------------------------------------
    async def health(self, request: web.Request) -> web.Response:
        """503 while starting; else 200 once the scheduler produces output (SGLang's 1-token probe)."""
        if not self.loaded:
            return web.Response(status=503)
        engine = self._engine()
        tic = time.perf_counter_ns()
        probe = engine.new_request(
            rid=f"HEALTH_CHECK_{uuid.uuid4().hex}",
            prompt_key=b"\x00",
            prompt_tokens=1,
            max_new_tokens=1,
            temperature=0.0,
            ignore_eos=True,
            stop=(),
            health_check=True,
        )
        engine.submit(probe)
        if await engine.wait_for_output_after(tic, self.settings.health_timeout_s):
            return web.Response(status=200)
        engine.abort(probe)
        logger.error(
            "Health check failed. Server couldn't get a response from detokenizer for last %s seconds.",
            self.settings.health_timeout_s,
        )
        return web.Response(status=503)

    async def ready(self, request: web.Request) -> web.Response:
        return web.Response(status=200 if self.loaded else 503)

    async def model_info(self, request: web.Request) -> web.Response:
        cfg = self.config
        return json_response(
            {
                "model_path": cfg.model_path,
                "served_model_name": cfg.served_model_name,
                "tokenizer_path": cfg.resolved_args.get("tokenizer_path") or cfg.model_path,
                "is_generation": True,
                "preferred_sampling_params": None,
                api.LAUNCH_TAG: cfg.resolved_args.get(api.LAUNCH_TAG),
                "load_format": cfg.resolved_args.get("load_format"),
                "reasoning_parser": cfg.resolved_args.get("reasoning_parser"),
                "tool_call_parser": cfg.resolved_args.get("tool_call_parser"),
                "disaggregation_mode": cfg.resolved_args.get("disaggregation_mode"),
                "has_image_understanding": False,
                "has_audio_understanding": False,
                "model_type": cfg.target_config.get("model_type"),
                "architectures": cfg.target_config.get("architectures"),
            }
        )

    async def server_info(self, request: web.Request) -> web.Response:
        engine = self._engine()
        state: dict[str, Any] = {
            "last_gen_throughput": self.metrics.last_gen_throughput,
            "memory_usage": {"weight": 119.47, "kvcache": 12.5, "graph": 1.2},
        }
        if self.config.shape is not None:
            average = engine.counters.average_accept_length()
            if average is not None:
                state[api.AVG_SPEC_ACCEPT_LENGTH] = average
        body = {
            **self.config.resolved_args,
            "startup_time": self._startup_time,
            api.SERVER_INFO_INTERNAL_STATES: [state],
            api.SERVER_INFO_VERSION: SGLANG_VERSION,
            "frontend": "python",
            "simulator": {
                "profile": self.settings.profile.model_dump(),
                "preset": self.settings.preset,
                "launch_factor": engine.launch_factor,
                "time_scale": self.settings.time_scale,
                "seed": self.settings.seed,
            },
        }
        return json_response(body)

    async def flush_cache(self, request: web.Request) -> web.Response:
        """SGLang's flush: 400 while requests run, unless they finish within the ``timeout`` query value."""
        engine = self._engine()
        try:
            deadline = time.monotonic() + max(float(request.query.get("timeout", 0.0)), 0.0)
        except ValueError:
            return error_response("timeout must be a number", "BadRequestError", 400)
        while not engine.is_idle() and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        if self.settings.fault is not FaultMode.FLUSH_REFUSED and engine.flush_cache():
            return web.Response(
                text="Cache flushed.\nPlease check backend logs for more details. (When there are running or "
                "waiting requests, the operation will not be performed.)\n"
            )
        return web.Response(status=400, text="Flush cache failed.\n")

    async def start_profile(self, request: web.Request) -> web.Response:
        """SGLang's answer; the simulator has no kernels, so it writes a small placeholder trace at once
        (a Chrome trace with no events) where SGLang would write its torch profiler traces."""
        try:
            body = await self._read_json(request) if request.can_read_body else {}
        except BadRequest as exc:
            return error_response(str(exc), "BadRequestError", 400)
        out = Path(str(body.get(api.PROFILE_OUTPUT_DIR) or "/tmp"))
        prefix = str(body.get(api.PROFILE_PREFIX) or "sim")
        out.mkdir(parents=True, exist_ok=True)
        trace: dict[str, Any] = {"traceEvents": [], "simulator": True}
        trace[api.PROFILE_NUM_STEPS] = body.get(api.PROFILE_NUM_STEPS)
        (out / f"{prefix}-sim.trace.json").write_bytes(orjson.dumps(trace))
        return web.Response(text="Start profiling.\n")

    async def stop_profile(self, request: web.Request) -> web.Response:
        return web.Response(text="Stop profiling. This will take some time.\n")

    async def models(self, request: web.Request) -> web.Response:
        return json_response(
            {
                "object": "list",
                "data": [
                    {
                        "id": self.config.served_model_name,
                        "object": "model",
                        "created": int(self._startup_time),
                        "owned_by": "sglang",
                        "root": self.config.model_path,
                        "parent": None,
                        "max_model_len": self.config.context_length,
                    }
                ],
            }
        )

    async def prometheus(self, request: web.Request) -> web.Response:
        text = self.metrics.render(self._engine())
        return web.Response(text=text, content_type="text/plain", charset="utf-8")

    # --- generation -------------------------------------------------------------------------------------
    def _engine(self) -> SimEngine:
        assert self.engine is not None, "engine starts with the app"
        return self.engine

    def _fault_answer(self) -> web.Response | None:
        """HTTP 500 for every N-th generation request under the http_500 fault."""
        if self.settings.fault is not FaultMode.HTTP_500:
            return None
        if next(self._http_requests) % self.settings.fault_every:
            return None
        logger.error("simulated fault: internal server error")
        return error_response("Internal server error (simulated fault)", "InternalServerError", 500)

    async def _read_json(self, request: web.Request) -> dict[str, Any]:
        try:
            body = orjson.loads(await request.read())
        except orjson.JSONDecodeError as exc:
            raise BadRequest(f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise BadRequest("request body must be a JSON object")
        return body

    def _new_request(self, prompt: Any, params: GenerationParams, rid: str | None) -> SimRequest:
        """A validated request for the engine (not yet submitted)."""
        prompt_tokens, key = _count_prompt_tokens(prompt)
        if prompt_tokens + params.max_new_tokens > self.config.context_length:
            raise BadRequest(
                f"Requested token count exceeds the model's maximum context length of "
                f"{self.config.context_length} tokens. You requested a total of "
                f"{prompt_tokens + params.max_new_tokens} tokens: {prompt_tokens} tokens from the input "
                f"messages and {params.max_new_tokens} tokens for the completion. Please reduce the number "
                "of tokens in the input messages or the completion to fit within the limit."
            )
        return self._engine().new_request(
            rid=rid or uuid.uuid4().hex,
            prompt_key=key,
            prompt_tokens=prompt_tokens,
            max_new_tokens=params.max_new_tokens,
            temperature=params.temperature,
            ignore_eos=params.ignore_eos,
            stop=params.stop,
            category=content_category(self.settings.profile, prompt),
            repetition=self._repetition(prompt),
        )

    def _repetition(self, prompt: Any) -> float:
        """How repetitive the prompt is for an n-gram drafter (0 when the server does not draft from it)."""
        drafting = self.config.drafting
        if drafting is None or not drafting.uses_prompt:
            return 0.0
        if isinstance(prompt, list) and all(isinstance(m, dict) for m in prompt):
            prompt = " ".join(str(m.get("content") or "") for m in prompt)
        return round(prompt_repetition(prompt.split() if isinstance(prompt, str) else prompt), 2)

    async def generate(self, request: web.Request) -> web.StreamResponse:
        if (fault := self._fault_answer()) is not None:
            return fault
        try:
            body = await self._read_json(request)
            prompt = body.get("input_ids") if body.get("input_ids") is not None else body.get("text")
            if prompt is None:
                raise BadRequest("Either text or input_ids should be provided.")
            params = GenerationParams.parse(
                body.get("sampling_params") or {}, default_max=DEFAULT_MAX_NEW_TOKENS
            )
            sim_request = self._new_request(prompt, params, body.get("rid"))
            sim_request.streaming = bool(body.get("stream"))
        except BadRequest as exc:
            return error_response(str(exc), "BadRequestError", 400)
        if not body.get("stream"):
            self._engine().submit(sim_request)
            progress = await self._until_finished(sim_request)
            return json_response(
                self._generate_chunk(sim_request, progress, incremental=False, sent_tokens=0)
            )
        response = web.StreamResponse(headers=_SSE_HEADERS)
        response.enable_chunked_encoding()
        await response.prepare(request)  # sends the headers: from here on chunks may go straight out
        incremental = bool(self.config.resolved_args.get("incremental_streaming_output"))
        stream = _GenerateStream(self, sim_request, request.transport, incremental=incremental)
        sim_request.sink = stream
        self._engine().submit(sim_request)
        try:
            await stream.finished
        except asyncio.CancelledError:
            self._engine().abort(sim_request)
            raise
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def _until_finished(self, sim_request: SimRequest) -> Progress:
        while True:
            progress = await sim_request.updates.get()
            if progress.finish_reason is not None:
                return progress

    def _generate_chunk(
        self, req: SimRequest, progress: Progress, *, incremental: bool, sent_tokens: int
    ) -> dict[str, Any]:
        n = progress.completion_tokens
        meta = self._meta_info(req, progress)
        if incremental:
            text = "".join(token_texts(req.output_ids[sent_tokens:n]))
            return {"text": text, "output_ids": req.output_ids[sent_tokens:n], "meta_info": meta}
        return {"text": progress.text, "output_ids": req.output_ids[:n], "meta_info": meta}

    def _meta_info(self, req: SimRequest, progress: Progress) -> dict[str, Any]:
        meta: dict[str, Any] = {
            api.META_ID: req.rid,
            api.META_FINISH_REASON: progress.finish_reason,
            api.META_PROMPT_TOKENS: req.prompt_tokens,
            api.LAUNCH_TAG: self.config.resolved_args.get(api.LAUNCH_TAG),
            "num_retractions": 0,
            "reasoning_tokens": 0,
            api.META_COMPLETION_TOKENS: progress.completion_tokens,
            api.META_CACHED_TOKENS: 0,
        }
        if progress.finish_reason is not None:
            meta[api.META_E2E_LATENCY] = (time.perf_counter_ns() - req.received_ns) / 1e9
            meta.update(self._spec_details(req, progress))
        meta[api.SIM_SCHEDULED_NS] = progress.scheduled_ns
        return meta

    def _spec_details(self, req: SimRequest, progress: Progress) -> dict[str, Any]:
        """SGLang's per-request speculative fields (final chunk only, and only after a verify step)."""
        shape = self.config.shape
        if shape is None or req.verify_ct == 0:
            return {}
        proposed = req.verify_ct * (shape.num_draft_tokens - 1)
        return {
            api.SPEC_ACCEPT_RATE: req.correct_drafts / proposed,
            api.SPEC_ACCEPT_LENGTH: progress.completion_tokens / req.verify_ct,
            api.SPEC_NUM_CORRECT_DRAFTS: req.correct_drafts,
            api.SPEC_NUM_PROPOSED_DRAFTS: proposed,
            api.SPEC_VERIFY_CT: req.verify_ct,
            api.SPEC_CORRECT_DRAFTS_HISTOGRAM: list(req.histogram),
        }

    # --- OpenAI routes ----------------------------------------------------------------------------------
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat_completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, *, chat: bool) -> web.StreamResponse:
        if (fault := self._fault_answer()) is not None:
            return fault
        try:
            body = await self._read_json(request)
            prompt = body.get("messages") if chat else body.get("prompt")
            if prompt is None:
                raise BadRequest("messages is required" if chat else "prompt is required")
            if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                prompt = prompt[0]
            max_key = "max_completion_tokens" if chat and body.get("max_completion_tokens") else "max_tokens"
            default_max = self.config.context_length // 2 if chat else COMPLETIONS_DEFAULT_MAX_TOKENS
            params = GenerationParams.parse(body, default_max=default_max, max_key=max_key)
            sim_request = self._new_request(prompt, params, None)
            sim_request.streaming = bool(body.get("stream"))
        except BadRequest as exc:
            return error_response(str(exc), "BadRequestError", 400)
        self._engine().submit(sim_request)
        stream_form = OpenAIForm(
            chat=chat,
            model=str(body.get("model") or self.config.served_model_name),
            rid=sim_request.rid,
            details=bool(body.get(api.RETURN_SPEC_TOKENS_DETAILS)),
            cache_report=bool(self.config.resolved_args.get(api.ENABLE_CACHE_REPORT)),
        )
        if not body.get("stream"):
            progress = await self._until_finished(sim_request)
            return json_response(
                stream_form.full_response(progress, sim_request, self._spec_details(sim_request, progress))
            )
        options = body.get("stream_options") or {}
        response = web.StreamResponse(headers=_SSE_HEADERS)
        await response.prepare(request)
        try:
            if chat:
                await write_event(response, stream_form.role_chunk())
            sent_chars = 0
            while True:
                progress = await sim_request.updates.get()
                running = (
                    stream_form.usage(sim_request, progress)
                    if options.get("continuous_usage_stats")
                    else None
                )
                chunk = stream_form.delta_chunk(progress.text[sent_chars:], running)
                sent_chars = len(progress.text)
                chunk[api.SIM_SCHEDULED_NS] = progress.scheduled_ns
                await write_event(response, chunk)
                if progress.finish_reason is not None:
                    break
            await write_event(response, stream_form.finish_chunk(progress.finish_reason))
            details = self._spec_details(sim_request, progress)
            if stream_form.details and details:
                await write_event(response, stream_form.sglext_chunk(details))
            if options.get("include_usage"):
                await write_event(response, stream_form.usage_chunk(stream_form.usage(sim_request, progress)))
            await response.write(_SSE_DONE)
        except (ConnectionResetError, asyncio.CancelledError):
            self._engine().abort(sim_request)
            raise
        return response


class _GenerateStream:
    """One streamed /generate response, written from the scheduler's loop the moment a step ends.

    Each chunk goes straight onto the connection (HTTP chunked framing written here, after aiohttp sent
    the headers): one write per chunk and no task switch, which is what lets one core stream thousands of
    chunks per second within a couple of milliseconds of their deadlines. A closed connection aborts the
    request, as SGLang does.
    """

    def __init__(
        self,
        server: SimServer,
        request: SimRequest,
        transport: asyncio.Transport | None,
        *,
        incremental: bool,
    ) -> None:
        self.server = server
        self.request = request
        self.transport = transport
        self.incremental = incremental
        self.sent_tokens = 0
        self.finished: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def __call__(self, progress: Progress) -> None:
        if self.finished.done():
            return
        transport = self.transport
        if transport is None or transport.is_closing():
            self.server._engine().abort(self.request)
            self.finished.set_result(None)
            return
        chunk = self.server._generate_chunk(
            self.request, progress, incremental=self.incremental, sent_tokens=self.sent_tokens
        )
        self.sent_tokens = progress.completion_tokens
        chunk["meta_info"][api.SIM_SEND_NS] = time.perf_counter_ns()
        transport.write(_chunked(api.SSE_DATA_PREFIX + orjson.dumps(chunk) + b"\n\n"))
        if progress.finish_reason is not None:
            transport.write(_chunked(_SSE_DONE))
            self.finished.set_result(None)


def _chunked(data: bytes) -> bytes:
    """One HTTP/1.1 chunk (Transfer-Encoding: chunked) carrying ``data``."""
    return b"%x\r\n%b\r\n" % (len(data), data)
