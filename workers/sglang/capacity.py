"""SGLang 0.5.23's capacity defaults: the CUDA-graph batch sizes it captures and its running-request cap.

Replayed from the installed source (paths under ``sglang/srt/``) so the simulator's physics can pad and
cap batches as SGLang does without importing SGLang:

- ``arg_groups/memory_hook.py``, ``handle_gpu_memory_settings``: the decode graph ``max_bs`` by GPU memory
  and ``--tp-size``. It runs before the speculative hook, so a speculative launch keeps the plain default
  here and is clamped later by its request pool (``get_batch_sizes_to_capture``).
- ``arg_groups/cuda_graph_hook.py``, ``generate_decode_cuda_graph_batch_sizes``: the captured list, denser
  at small batches when speculative decoding is on.
- ``model_executor/runner/base_cuda_graph_runner.py``, ``get_batch_sizes_to_capture``: the list clamped to
  the request pool; a batch pads up to the next captured size and runs eagerly above the largest.
- ``arg_groups/speculative_hook.py``: ``max_running_requests`` 48 when speculation is on and it is unset
  (``workers.sglang.rules.SPEC_MAX_RUNNING_REQUESTS``).
- ``mem_cache/kv_cache_configurator.py``, ``resolve_max_num_reqs``: the cap is at most half the KV pool's
  token capacity; without a requested cap, ``token_capacity / context_len * 512`` clamped to 2048..4096.
"""

from __future__ import annotations

import bisect

from workers.sglang import api

MIB = 1024 * 1024


def default_decode_graph_max_bs(gpu_memory_mib: int, tp_size: int) -> int:
    """``--cuda-graph-max-bs-decode`` when unset, by GPU memory (``handle_gpu_memory_settings``)."""
    if gpu_memory_mib < 20 * 1024:
        return 8
    if gpu_memory_mib < 35 * 1024:
        return 48 if tp_size < 4 else 160
    if gpu_memory_mib < 60 * 1024:
        return 32 if tp_size < 4 else 160
    if gpu_memory_mib < 160 * 1024:  # H100/A100 and H20/H200 share one rule
        return 256 if tp_size < 4 else 512
    return 512  # B200, MI300


def decode_graph_batch_sizes(max_bs: int, *, speculative: bool) -> tuple[int, ...]:
    """The decode batch sizes SGLang captures up to ``max_bs`` (``generate_decode_cuda_graph_batch_sizes``)."""
    if speculative:
        sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8)]
        sizes += range(272, max_bs + 1, 16)
    else:
        sizes = [1, 2, 4, 8, 12, *range(16, 257, 8), *range(272, 512, 16), *range(512, max_bs + 1, 32)]
    kept = [bs for bs in sizes if bs <= max_bs]
    if max_bs not in kept:
        kept.append(max_bs)
    return tuple(kept)


def captured_batch_sizes(sizes: tuple[int, ...], max_running_requests: int) -> tuple[int, ...]:
    """The list clamped to the request pool, which is always captured (``get_batch_sizes_to_capture``)."""
    kept = {bs for bs in sizes if bs <= max_running_requests}
    if max(sizes) > max_running_requests:
        kept.add(max_running_requests)
    return tuple(sorted(kept))


def padded_batch(captured: tuple[int, ...], batch: int) -> int | None:
    """The captured size a batch of ``batch`` requests replays (the next one up); None above the largest,
    where SGLang runs the forward eagerly."""
    at = bisect.bisect_left(captured, batch)
    return captured[at] if at < len(captured) else None


def kv_running_request_cap(token_capacity: int, context_len: int, requested: int | None) -> int:
    """``resolve_max_num_reqs``: the running-request cap the KV pool allows (per DP worker)."""
    if requested is not None:
        return max(1, min(requested, token_capacity // 2))
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    return min(estimated, token_capacity // 2)


# ``managers/schedule_policy.py``: ``CLIP_MAX_NEW_TOKENS`` (``SGLANG_CLIP_MAX_NEW_TOKENS_ESTIMATION``, 4096)
# bounds what admission reserves for a request's output; ``PrefillAdder.per_req_token_overhead`` is one
# page (``--page-size``, default 1) per request for allocation rounding.
CLIP_MAX_NEW_TOKENS = 4096
PAGE_SIZE = 1


def request_token_reserve(prompt_tokens: int, max_new_tokens: int, draft_tokens: int) -> int:
    """KV tokens admission holds for one request for its whole life (``PrefillAdder.add_one_req`` /
    ``add_one_req_ignore_eos`` with ``new_token_ratio`` 1, what an ``ignore_eos`` request gets): its prompt,
    its output up to the clip, a page of rounding, and the ``draft_tokens`` slots each verify step
    allocates for the draft tree (0 without speculation)."""
    return prompt_tokens + min(max_new_tokens, CLIP_MAX_NEW_TOKENS) + PAGE_SIZE + draft_tokens


# /server_info fields (resolved server args) that say what a launch captured and how many requests it runs
CUDA_GRAPH_BS_DECODE = "cuda_graph_bs_decode"  # the captured list when set explicitly
CUDA_GRAPH_MAX_BS_DECODE = "cuda_graph_max_bs_decode"  # the list's top when it is generated
DISABLE_CUDA_GRAPH = "disable_cuda_graph"
SPECULATIVE_ALGORITHM = "speculative_algorithm"


def reported_capacity(server_info: dict[str, object]) -> tuple[tuple[int, ...], int | None]:
    """What one launch's ``/server_info`` says about its batches: (captured decode sizes, ascending; empty
    when it runs eagerly or the fields are missing) and its running-request cap (None: not reported)."""
    cap = server_info.get(api.MAX_RUNNING_REQUESTS)
    running = cap if isinstance(cap, int) and cap > 0 else None
    if server_info.get(DISABLE_CUDA_GRAPH):
        return (), running
    listed = server_info.get(CUDA_GRAPH_BS_DECODE)
    top = server_info.get(CUDA_GRAPH_MAX_BS_DECODE)
    if isinstance(listed, list) and listed and all(isinstance(bs, int) for bs in listed):
        sizes = tuple(sorted(set(listed)))
    elif isinstance(top, int) and top > 0:
        sizes = decode_graph_batch_sizes(top, speculative=bool(server_info.get(SPECULATIVE_ALGORITHM)))
    else:
        return (), running
    return (captured_batch_sizes(sizes, running) if running is not None else sizes), running
