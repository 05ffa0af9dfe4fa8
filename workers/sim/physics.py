"""A real SGLang server's physics: roofline step costs, CUDA-graph padding, running-request caps, acceptance.

The server (``SPECSWEEP_SIM_PRESET``) and any offline truth (``bench/sim_calibration.py``) call these pure
functions; ``harness/search/`` never imports them (the search learns from measurements only). Sources and
every fitted number are in ``docs/sim_server.md``; SGLang's own defaults come from ``workers.sglang.capacity``.

- A forward pass over ``T`` tokens on one GPU of a ``--tp-size`` group reads its weight shard and the KV of
  its batch once, and does ``2 x active params x T`` FLOPs plus attention: it costs
  ``max(bytes / (HBM bandwidth x mem_eff), flops / (peak x flop_eff)) + forward_fixed_s`` (+
  ``target_token_s`` per token for the target's sampling, routing and all-reduce volume), memory-bound
  until ``T`` crosses the roofline knee. A MoE layer reads only the experts its tokens touch:
  ``E x (1 - (1 - k/E) ** T)`` of ``E`` experts with ``k`` per token (uniform routing), where a request's
  draft tokens count ``expert_novelty`` each (consecutive tokens of one sequence share experts).
- CUDA graphs: a decode batch pads up to the next size SGLang captured; above the largest it runs eagerly
  and every forward pays ``eager_s`` more. The verify pass is captured at ``bs x num_draft_tokens`` tokens.
- A speculative iteration: ``overhead`` (scheduler CPU; the overlap scheduler, ``SGLANG_ENABLE_SPEC_V2``
  with topk 1, hides ``overlap_hidden`` of it), ``steps`` draft forwards (the first over ``bs`` tokens, the
  rest over ``bs x topk``), the target's verify over ``bs x num_draft_tokens`` tokens whose attention spans
  the context plus the tree, and the draft-extend pass over the same tokens.
- Acceptance is data: per category, the top-1 draft's acceptance at each depth given its parent was
  accepted (``positions``; past the end the last value repeats), so a profile can plateau or fall off a
  cliff. A sibling of rank ``r`` (2, 3, ...) is right with ``sibling_recall[r - 2]`` of the cases all
  higher-ranked ones missed. The tree's ``num_draft_tokens - 1`` nodes are the chain plus the siblings
  that add most to the expected accept length (SGLang keeps the highest-scoring nodes of the draft tree).
- Launch-to-launch variation is one factor per launch (``launch_factor``), shared by every level it runs.
"""

from __future__ import annotations

import functools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from workers.sglang import capacity
from workers.sglang.rules import SPEC_MAX_RUNNING_REQUESTS
from workers.sim.model import DraftShape, expected_accept_length

GIB = 1024**3


@dataclass(frozen=True, slots=True)
class Gpu:
    """One accelerator, from its vendor datasheet (dense bf16, no sparsity)."""

    name: str
    peak_flops: float  # bf16 dense FLOP/s
    hbm_bytes_per_s: float
    memory_bytes: int


H100 = Gpu("H100-SXM-80GB", 989e12, 3.35e12, 80 * GIB)
H200 = Gpu("H200-SXM-141GB", 989e12, 4.8e12, 141 * GIB)
B200 = Gpu("B200-180GB", 2250e12, 8.0e12, 180 * GIB)
GPUS: dict[str, Gpu] = {g.name: g for g in (H100, H200, B200)}


@dataclass(frozen=True, slots=True)
class ModelShape:
    """Per-layer sizes read from a model's ``config.json`` (dense, or MoE with routed experts)."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    dense_intermediate: int  # MLP width of dense layers (0: none)
    dense_layers: int  # layers with a dense MLP (the rest are MoE)
    experts: int = 0  # routed experts per MoE layer
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_experts: int = 0
    weight_bytes: float = 2.0  # bytes per parameter (bf16 2, fp8 1)
    kv_bytes: float = 2.0  # bytes per KV element
    # Multi-head latent attention (DeepSeek-V3, Kimi-K2): a layer caches one latent of kv_lora_rank plus the
    # shared rope key (qk_rope_head_dim) per token, the same on every TP rank; 0: grouped-query attention.
    kv_lora_rank: int = 0
    qk_rope_head_dim: int = 0
    q_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    v_head_dim: int = 0

    @classmethod
    def from_config(cls, config: Mapping[str, Any], *, weight_bytes: float = 2.0) -> ModelShape:
        """The shape of a Hugging Face ``config.json`` (Llama, Qwen3-MoE, GLM-4.x MoE, DeepSeek-V3 / Kimi-K2
        MLA field names; a Kimi-K2.5 wrapper's language model is under ``text_config``)."""
        config = config.get("text_config") or config
        hidden = int(config["hidden_size"])
        heads = int(config["num_attention_heads"])
        layers = int(config["num_hidden_layers"])
        experts = int(config.get("n_routed_experts") or config.get("num_experts") or 0)
        dense_layers = int(config.get("first_k_dense_replace", 0)) if experts else layers
        return cls(
            hidden=hidden,
            layers=layers,
            heads=heads,
            kv_heads=int(config.get("num_key_value_heads") or heads),
            head_dim=int(config.get("head_dim") or hidden // heads),
            vocab=int(config.get("draft_vocab_size") or config["vocab_size"]),
            dense_intermediate=int(config.get("intermediate_size", 0)),
            dense_layers=dense_layers,
            experts=experts,
            experts_per_token=int(config.get("num_experts_per_tok", 0)),
            expert_intermediate=int(config.get("moe_intermediate_size", 0)),
            shared_experts=int(config.get("n_shared_experts", 0)),
            weight_bytes=weight_bytes,
            kv_lora_rank=int(config.get("kv_lora_rank") or 0),
            qk_rope_head_dim=int(config.get("qk_rope_head_dim") or 0),
            q_lora_rank=int(config.get("q_lora_rank") or 0),
            qk_nope_head_dim=int(config.get("qk_nope_head_dim") or 0),
            v_head_dim=int(config.get("v_head_dim") or 0),
        )

    @property
    def mla(self) -> bool:
        return self.kv_lora_rank > 0

    @property
    def attention_params(self) -> int:
        """q, k, v and o projections of one layer (MLA: the low-rank q and kv down/up projections)."""
        if self.mla:
            qk = self.qk_nope_head_dim + self.qk_rope_head_dim
            q = (
                self.hidden * self.q_lora_rank + self.q_lora_rank * self.heads * qk
                if self.q_lora_rank
                else self.hidden * self.heads * qk
            )
            kv = self.hidden * (
                self.kv_lora_rank + self.qk_rope_head_dim
            ) + self.kv_lora_rank * self.heads * (self.qk_nope_head_dim + self.v_head_dim)
            return q + kv + self.heads * self.v_head_dim * self.hidden
        q = self.heads * self.head_dim
        return 2 * self.hidden * q + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def attention_width(self) -> int:
        """Per head, the width a query's attention multiplies against each cached token (scores plus values);
        MLA attends in the latent (absorbed weights): the latent and rope key for scores, the latent for values."""
        if self.mla:
            return (2 * self.kv_lora_rank + self.qk_rope_head_dim + 1) // 2
        return self.head_dim

    @property
    def expert_params(self) -> int:
        """One expert's gate, up and down projections."""
        return 3 * self.hidden * self.expert_intermediate

    @property
    def moe_layers(self) -> int:
        return self.layers - self.dense_layers if self.experts else 0

    def always_read_params(self) -> int:
        """Parameters every forward reads whatever its tokens: attention, dense MLPs, shared experts, lm_head."""
        return _always_read_params(self)

    def _always_read_params(self) -> int:
        return (
            self.layers * self.attention_params
            + self.dense_layers * 3 * self.hidden * self.dense_intermediate
            + self.moe_layers * self.shared_experts * self.expert_params
            + self.vocab * self.hidden
        )

    def total_params(self) -> int:
        return self.always_read_params() + self.moe_layers * self.experts * self.expert_params

    def experts_touched(self, tokens: float) -> float:
        """Distinct experts one MoE layer reads for ``tokens`` tokens (each picks k of E uniformly)."""
        if not self.experts:
            return 0.0
        missed: float = (1.0 - self.experts_per_token / self.experts) ** tokens
        return self.experts * (1.0 - missed)

    def kv_bytes_per_token(self) -> float:
        """KV cache bytes one token occupies across all layers (before tensor parallelism)."""
        if self.mla:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.kv_bytes
        return self.layers * 2 * self.kv_heads * self.head_dim * self.kv_bytes

    def kv_bytes_per_token_per_gpu(self, tp_size: int) -> float:
        """What one GPU of a ``tp_size`` group caches per token: heads split across ranks, but an MLA latent
        is shared by all heads, so every rank keeps all of it."""
        return self.kv_bytes_per_token() / (1 if self.mla else tp_size)


@dataclass(frozen=True, slots=True)
class Acceptance:
    """One content category's draft quality: top-1 acceptance per depth (given the parent was accepted)."""

    positions: tuple[float, ...]

    def at(self, depth: int) -> float:
        return self.positions[min(depth, len(self.positions) - 1)]


@dataclass(frozen=True, slots=True)
class Preset:
    """A (GPU, --tp-size, target, draft) combination with its calibrated efficiencies and acceptance."""

    name: str
    gpu: Gpu
    tp_size: int
    target: ModelShape
    draft: ModelShape
    acceptance: Mapping[str, Acceptance]  # by content category (the default profile's names)
    sibling_recall: tuple[float, ...]
    mem_eff: float  # achieved fraction of HBM bandwidth
    flop_eff: float  # achieved fraction of peak FLOP/s
    forward_fixed_s: float  # per target forward: kernel latencies, all-reduces
    draft_fixed_s: float  # per draft forward
    overhead_s: float  # scheduler CPU per iteration
    target_token_s: float = (
        0.0  # per token of a target forward beyond the roofline (sampling, routing, comms)
    )
    overlap_hidden: float = 0.0  # share of overhead_s the overlap scheduler hides (topk 1, spec v2)
    eager_s: float = 0.0  # extra per forward without a CUDA graph
    expert_novelty: float = 1.0  # share of a request's extra tokens (drafts) that route like a new request
    temperature_penalty: float = 0.1  # acceptance lost at temperature 1 (linear)
    mem_fraction_static: float = 0.85
    context_len: int = 8192
    graph_max_bs: int | None = None  # --cuda-graph-max-bs-decode; None: SGLang's default for the GPU
    launch_sigma: float = 0.0  # launch-to-launch variation (log-normal sigma) of every cost
    sources: tuple[str, ...] = field(default=())

    # --- memory and caps -------------------------------------------------------------------------------
    def weight_bytes_per_gpu(self) -> float:
        return (
            self.target.total_params() * self.target.weight_bytes
            + self.draft.total_params() * self.draft.weight_bytes
        ) / self.tp_size

    def kv_token_capacity(self) -> int:
        """KV tokens per GPU: the static memory fraction left after weights, over target + draft KV per
        token (``mem_fraction_static`` bounds weights + KV pool, as SGLang defines it)."""
        free = self.gpu.memory_bytes * self.mem_fraction_static - self.weight_bytes_per_gpu()
        per_token = self.target.kv_bytes_per_token_per_gpu(
            self.tp_size
        ) + self.draft.kv_bytes_per_token_per_gpu(self.tp_size)
        return max(0, int(free / per_token))

    def running_cap(
        self, shape: DraftShape | None, requested: int | None, tokens_per_request: int | None = None
    ) -> int:
        """Requests that decode together: SGLang's cap (48 under speculation when unset) bounded by the KV
        pool (``resolve_max_num_reqs``), then by whole requests' tokens (prompt + output + the draft tokens
        each verify step reserves) fitting in the pool, whichever binds."""
        if requested is None and shape is not None:
            requested = SPEC_MAX_RUNNING_REQUESTS
        tokens = self.kv_token_capacity()
        cap = capacity.kv_running_request_cap(tokens, self.context_len, requested)
        if tokens_per_request:
            reserve = shape.num_draft_tokens if shape is not None else 0
            cap = min(cap, tokens // (tokens_per_request + reserve))
        return max(1, cap)

    def launch_factor(self, launch: str) -> float:
        """The cost factor of the launch keyed ``launch`` (see the module function)."""
        return launch_factor(launch, self.launch_sigma)

    def captured_batches(self, shape: DraftShape | None, max_running: int) -> tuple[int, ...]:
        """The decode batch sizes this launch has CUDA graphs for."""
        max_bs = self.graph_max_bs or capacity.default_decode_graph_max_bs(
            self.gpu.memory_bytes // capacity.MIB, self.tp_size
        )
        return _captured_batches(max_bs, shape is not None, max_running)

    # --- costs ----------------------------------------------------------------------------------------
    def forward_seconds(
        self,
        model: ModelShape,
        tokens: int,
        batch: int,
        context: int,
        *,
        fixed_s: float,
        eager: bool,
        token_s: float = 0.0,
    ) -> float:
        """One forward of ``model`` over ``tokens`` tokens from ``batch`` requests of ``context`` KV tokens
        each, on one GPU of the TP group (the roofline, plus fixed, per-token and eager costs)."""
        routed = batch + (tokens - batch) * self.expert_novelty if tokens > batch else tokens
        moe_bytes = model.moe_layers * model.experts_touched(routed) * model.expert_params
        weight_bytes = (model.always_read_params() + moe_bytes) * model.weight_bytes
        kv_read = batch * context * model.kv_bytes_per_token_per_gpu(self.tp_size)
        active = model.always_read_params() + model.moe_layers * model.experts_per_token * model.expert_params
        attention = 4 * tokens * context * model.heads * model.attention_width * model.layers
        flops = 2 * tokens * active + attention
        memory_s = (weight_bytes / self.tp_size + kv_read) / (self.gpu.hbm_bytes_per_s * self.mem_eff)
        compute_s = flops / self.tp_size / (self.gpu.peak_flops * self.flop_eff)
        return max(memory_s, compute_s) + fixed_s + token_s * tokens + (self.eager_s if eager else 0.0)

    def decode_step_seconds(
        self,
        shape: DraftShape | None,
        batch: int,
        context: int,
        *,
        max_running: int,
        spec_v2: bool = False,
        factor: float = 1.0,
        draft_scale: float = 1.0,
    ) -> float:
        """One decode iteration of ``batch`` running requests (padded to a captured size, or eager);
        ``draft_scale`` multiplies the draft forwards (another draft model's size; 0: no draft model)."""
        padded = capacity.padded_batch(self.captured_batches(shape, max_running), batch)
        eager = padded is None
        bs = batch if padded is None else padded
        hidden = self.overlap_hidden if spec_v2 and shape is not None and shape.topk == 1 else 0.0
        total = self.overhead_s * (1.0 - hidden)
        if shape is None:
            total += self.forward_seconds(
                self.target,
                bs,
                bs,
                context,
                fixed_s=self.forward_fixed_s,
                eager=eager,
                token_s=self.target_token_s,
            )
            return total * factor
        n = shape.num_draft_tokens
        drafting = 0.0
        for step in range(shape.num_steps):
            tokens = bs if step == 0 else bs * shape.topk
            drafting += self.forward_seconds(
                self.draft, tokens, bs, context, fixed_s=self.draft_fixed_s, eager=eager
            )
        total += self.forward_seconds(
            self.target,
            bs * n,
            bs,
            context + n,
            fixed_s=self.forward_fixed_s,
            eager=eager,
            token_s=self.target_token_s,
        )
        drafting += self.forward_seconds(
            self.draft, bs * n, bs, context, fixed_s=self.draft_fixed_s, eager=eager
        )
        return (total + drafting * draft_scale) * factor

    def prefill_seconds(self, prompt_tokens: int, *, factor: float = 1.0) -> float:
        """One prefill over ``prompt_tokens`` tokens (target and draft; compute-bound for long prompts)."""
        tokens = max(1, prompt_tokens)
        return factor * (
            self.forward_seconds(
                self.target, tokens, 1, tokens // 2, fixed_s=self.forward_fixed_s, eager=False
            )
            + self.forward_seconds(
                self.draft, tokens, 1, tokens // 2, fixed_s=self.draft_fixed_s, eager=False
            )
        )

    # --- acceptance -----------------------------------------------------------------------------------
    def depth_accept_probs(self, shape: DraftShape, temperature: float, category: str) -> tuple[float, ...]:
        """Chance each depth of the tree is accepted given the one before was (see the module docstring)."""
        profile = self.acceptance.get(category) or self.acceptance["chat"]
        heat = 1.0 - self.temperature_penalty * min(max(temperature, 0.0), 1.0)
        depth = min(shape.num_steps, shape.num_draft_tokens - 1)
        tops = [profile.at(d) * heat for d in range(depth)]
        counts = [1] * depth
        for _ in range(shape.num_draft_tokens - 1 - depth):
            best, gain = None, 0.0
            base = expected_accept_length(self._with_siblings(tops, counts))
            for d in range(depth):
                if counts[d] >= shape.topk:
                    continue
                counts[d] += 1
                trial = expected_accept_length(self._with_siblings(tops, counts)) - base
                counts[d] -= 1
                if best is None or trial > gain + 1e-12:
                    best, gain = d, trial
            if best is None:
                break
            counts[best] += 1
        return self._with_siblings(tops, counts)

    def _with_siblings(self, tops: list[float], counts: list[int]) -> tuple[float, ...]:
        probs = []
        for top, count in zip(tops, counts, strict=True):
            miss = 1.0 - top
            for rank in range(2, count + 1):
                miss *= 1.0 - self.sibling_recall[min(rank - 2, len(self.sibling_recall) - 1)]
            probs.append(1.0 - miss)
        return tuple(probs)

    def accept_length(
        self, shape: DraftShape | None, temperature: float = 0.0, category: str = "chat"
    ) -> float:
        """Expected tokens per verify step (bonus included); 1 without speculation."""
        if shape is None:
            return 1.0
        return expected_accept_length(self.depth_accept_probs(shape, temperature, category))

    def decode_throughput(
        self,
        shape: DraftShape | None,
        batch: int,
        context: int,
        *,
        mix: tuple[tuple[str, float], ...] = (("chat", 1.0),),
        temperature: float = 0.0,
        requested_max_running: int | None = None,
        spec_v2: bool = False,
    ) -> float:
        """Output tokens per second of ``batch`` requests decoding together in steady state (capped by the
        running-request limit); each category's requests take ``1 / accept length`` steps per token."""
        running = min(batch, self.running_cap(shape, requested_max_running))
        total = sum(w for _, w in mix)
        steps_per_token = sum(w / self.accept_length(shape, temperature, c) for c, w in mix) / total
        step = self.decode_step_seconds(shape, running, context, max_running=running, spec_v2=spec_v2)
        return running / (steps_per_token * step)


# The server prices every iteration with these (and the truths millions of times): both depend only on
# hashable, frozen inputs, so each is computed once.
@functools.lru_cache(maxsize=64)
def _always_read_params(model: ModelShape) -> int:
    return model._always_read_params()


@functools.lru_cache(maxsize=1024)
def _captured_batches(max_bs: int, speculative: bool, max_running: int) -> tuple[int, ...]:
    sizes = capacity.decode_graph_batch_sizes(max_bs, speculative=speculative)
    return capacity.captured_batch_sizes(sizes, max_running)


def launch_factor(seed: int | str, sigma: float) -> float:
    """The cost factor of one launch (clocks, NCCL topology, memory layout): log-normal, drawn once from the
    launch's seed and applied to every iteration of every level that launch runs."""
    if sigma <= 0:
        return 1.0
    return math.exp(random.Random(f"launch:{seed}").gauss(0.0, sigma))
