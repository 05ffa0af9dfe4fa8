"""SGLang 0.5.23's HTTP API: endpoint paths, response field names, metric names.

The simulated server serves these, the load generator and launcher read them; neither spells a path or
a field name of its own. Semantics are in ``shared/reference/sglang-0.5.23.md`` (HTTP API section).
"""

from __future__ import annotations

SGLANG_VERSION = "0.5.23"

# --- endpoints --------------------------------------------------------------------------------------
HEALTH = "/health"
HEALTH_GENERATE = "/health_generate"
READY = "/ready"
MODEL_INFO = "/model_info"
MODEL_INFO_OLD = "/get_model_info"
SERVER_INFO = "/server_info"
SERVER_INFO_OLD = "/get_server_info"
FLUSH_CACHE = "/flush_cache"
MODELS = "/v1/models"
GENERATE = "/generate"
COMPLETIONS = "/v1/completions"
CHAT_COMPLETIONS = "/v1/chat/completions"
METRICS = "/metrics"
START_PROFILE = "/start_profile"  # POST ProfileReq JSON; with num_steps it stops by itself
STOP_PROFILE = "/stop_profile"
PROFILE_OUTPUT_DIR = "output_dir"  # ProfileReq fields: where the server writes its traces
PROFILE_NUM_STEPS = "num_steps"  # forward steps to capture
PROFILE_PREFIX = "profile_prefix"  # trace file name prefix

# --- streaming ---------------------------------------------------------------------------------------
SSE_DATA_PREFIX = b"data: "
SSE_DONE = b"[DONE]"

# --- /generate request and response bodies (``GenerateReqInput``, srt/managers/io_struct.py) ----------
GENERATE_TEXT = "text"  # request: the prompt as text (tokenized by the server)
GENERATE_SAMPLING_PARAMS = "sampling_params"  # request: {"temperature", "max_new_tokens", ...}
SAMPLING_TEMPERATURE = "temperature"  # 0: greedy
SAMPLING_MAX_NEW_TOKENS = "max_new_tokens"
# Response: the generated token ids, cumulative (every output id of the request on the final, and the
# only, chunk of a non-streaming request): TokenizerManager._handle_batch_output's ``state.output_ids``
# (srt/managers/tokenizer_manager.py), filled with or without skip_tokenizer_init.
GENERATE_OUTPUT_IDS = "output_ids"

# --- /generate meta_info -----------------------------------------------------------------------------
META_ID = "id"
META_FINISH_REASON = "finish_reason"
META_PROMPT_TOKENS = "prompt_tokens"
META_COMPLETION_TOKENS = "completion_tokens"
META_CACHED_TOKENS = "cached_tokens"
# Chat usage: {"prompt_tokens_details": {"cached_tokens": N}}, filled only with --enable-cache-report.
USAGE_PROMPT_TOKENS_DETAILS = "prompt_tokens_details"
ENABLE_CACHE_REPORT = "enable_cache_report"  # the server argument (resolved name) that fills it
META_E2E_LATENCY = "e2e_latency"
# Speculative stats, on the final chunk only (speculative decoding on).
SPEC_VERIFY_CT = "spec_verify_ct"  # verify steps
SPEC_ACCEPT_LENGTH = "spec_accept_length"  # completion_tokens / spec_verify_ct (bonus token included)
SPEC_ACCEPT_RATE = "spec_accept_rate"  # correct drafts / (verify_ct * (num_draft_tokens - 1))
SPEC_NUM_CORRECT_DRAFTS = "spec_num_correct_drafts"
SPEC_NUM_PROPOSED_DRAFTS = "spec_num_proposed_drafts"
SPEC_CORRECT_DRAFTS_HISTOGRAM = "spec_correct_drafts_histogram"  # index k: verify steps accepting k drafts
SPEC_META_FIELDS = (
    SPEC_VERIFY_CT,
    SPEC_ACCEPT_LENGTH,
    SPEC_ACCEPT_RATE,
    SPEC_NUM_CORRECT_DRAFTS,
    SPEC_NUM_PROPOSED_DRAFTS,
    SPEC_CORRECT_DRAFTS_HISTOGRAM,
)

# --- OpenAI routes -------------------------------------------------------------------------------------
RETURN_SPEC_TOKENS_DETAILS = "return_spec_tokens_details"  # request flag
SGLEXT = "sglext"  # response extension object
SPEC_TOKENS_DETAILS = "spec_tokens_details"  # inside sglext
STREAM_OPTIONS = "stream_options"  # request: {"include_usage": true, "continuous_usage_stats": true}
CONTINUOUS_USAGE_STATS = "continuous_usage_stats"  # usage (completion_tokens) on every chunk

# --- simulated server only (workers.sim.server): ignored by real clients ---------------------------
SIM_SCHEDULED_NS = "sim_scheduled_ns"  # simulated server only: when its schedule meant to send the chunk
SIM_SEND_NS = "sim_send_ns"  # in meta_info / each chat chunk: server monotonic ns when the chunk was sent

# --- /server_info ---------------------------------------------------------------------------------------
SERVER_INFO_VERSION = "version"
SERVER_INFO_INTERNAL_STATES = "internal_states"
AVG_SPEC_ACCEPT_LENGTH = "avg_spec_accept_length"  # lifetime average, reset by /flush_cache

# --- the launch tag: which process answers on the port ---------------------------------------------------
# A label that changes nothing but what the server reports, so each launch can carry a unique one and
# the launcher can tell its own server from any other that answers on the port. SGLang 0.5.23's
# ``--weight-version`` (``sglang/srt/arg_groups/fields/serving.py``, "Version identifier for the model
# weights", default "default") is such a label: ``GET /server_info`` returns ``build_server_info``
# (``sglang/srt/utils/common.py``), i.e. ``server_args.resolved_dict()``, which holds it as
# ``weight_version`` (checked by running SGLang's resolver); ``/model_info`` and every response's
# ``meta_info`` echo it too (``TokenizerManager.config_value("weight_version")``). It is otherwise read
# only by weight-update bookkeeping (``update_weights_*`` requests, never sent by the harness): no
# scheduling, kernel or API the load generator uses depends on it.
LAUNCH_TAG_FLAG = "--weight-version"
LAUNCH_TAG = "weight_version"  # resolved_dict() key in /server_info, also in /model_info and meta_info

# --- /metrics (Prometheus, needs --enable-metrics) -------------------------------------------------------
# Names as SGLang 0.5.23 defines them (srt/observability/metrics_collector.py); counters carry their
# ``_total`` sample suffix. Scheduler gauges are the state at the scheduler's last stats log.
METRIC_NUM_RUNNING = "sglang:num_running_reqs"  # gauge: requests in the running batch
METRIC_NUM_QUEUE = "sglang:num_queue_reqs"  # gauge: requests in the waiting queue
METRIC_GEN_THROUGHPUT = "sglang:gen_throughput"  # gauge: generation tokens per second
METRIC_TOKEN_USAGE = "sglang:token_usage"  # gauge: KV-cache pool tokens in use / pool size
METRIC_NUM_USED_TOKENS = "sglang:num_used_tokens"  # gauge: KV-cache pool tokens in use
METRIC_SPEC_ACCEPT_LENGTH = "sglang:spec_accept_length"  # gauge: last window's accept length
METRIC_SPEC_ACCEPT_RATE = "sglang:spec_accept_rate"  # gauge: last window's accept rate
METRIC_SPEC_NUM_STEPS = "sglang:spec_num_steps"
METRIC_SPEC_NUM_DRAFT_TOKENS = "sglang:spec_num_draft_tokens"
METRIC_SPEC_VERIFY_CALLS = "sglang:spec_verify_calls_total"  # counter: verify steps of finished requests
METRIC_PROMPT_TOKENS = "sglang:prompt_tokens_total"  # counter, label is_streaming
METRIC_GENERATION_TOKENS = "sglang:generation_tokens_total"  # counter, label is_streaming
METRIC_NUM_REQUESTS = "sglang:num_requests_total"  # counter, label is_streaming
METRIC_TTFT = "sglang:time_to_first_token_seconds"
METRIC_ITL = "sglang:inter_token_latency_seconds"
METRIC_E2E = "sglang:e2e_request_latency_seconds"
METRIC_LABEL_IS_STREAMING = "is_streaming"

# --- effective speculative config: the resolved_dict() keys the project compares ----------------------
SPEC_ALGORITHM = "speculative_algorithm"
SPEC_NUM_STEPS = "speculative_num_steps"
SPEC_EAGLE_TOPK = "speculative_eagle_topk"
SPEC_NUM_DRAFT_TOKENS = "speculative_num_draft_tokens"
SPEC_DRAFT_MODEL_PATH = "speculative_draft_model_path"
SPEC_ADAPTIVE = "speculative_adaptive"  # per-batch-size draft depth (false after a silent fallback)
SPEC_ADAPTIVE_CONFIG = "speculative_adaptive_config"  # its JSON file
MAX_RUNNING_REQUESTS = "max_running_requests"
