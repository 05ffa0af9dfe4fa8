"""SGLang 0.5.23's speculative-decoding resolution, re-implemented, plus the rules SGLang does not enforce.

Two kinds of rule live here, each a small function run in one ordered list (as SGLang's own
``arg_groups/pipeline.py`` does):

* Mirrors of ``arg_groups/speculative_hook.py::_handle_eagle_family``: NEXTN -> EAGLE, the default
  (steps, topk, draft tokens) by target architecture, ``max_running_requests`` 48, the silent rewrite
  of num-draft-tokens to steps + 1 under topk 1, the bare ``AssertionError`` when steps is unset but
  topk or draft tokens are given. They give the built-in layer its *effective* config without SGLang.
* Mirrors of ``speculative/adaptive_spec_params.py``: ``--speculative-adaptive`` silently turned off
  (``adaptive_unsupported_reason``: SGLang only logs "Falling back to static speculative params") and
  the adaptive config file's checks (``_load_adaptive_config``), which SGLang raises on.
* Project rules for launches SGLang accepts but that waste a GPU hour: an incomplete triple that
  crashes later, more draft tokens than the tree has nodes, speculative flags without an algorithm
  (ignored silently), an EAGLE3 draft run as EAGLE (acceptance exactly 1.0), EAGLE3 without a draft on
  a target with no built-in MTP layer, a draft whose architecture SGLang cannot build.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from specsweep.documents import load_json
from workers.sglang import api
from workers.sglang.flags import LaunchArgs

EAGLE_FAMILY = ("EAGLE", "EAGLE3", "STANDALONE")
KNOWN_ALGORITHMS = ("DFLASH", "UNO", "DSPARK", "EAGLE", "EAGLE3", "FROZEN_KV_MTP", "STANDALONE", "NGRAM")
ALGORITHM_ALIASES = {"NEXTN": "EAGLE"}
EAGLE3_DRAFT_ARCHITECTURES = ("LlamaForCausalLMEagle3", "Eagle3DeepseekV2ForCausalLM")
# The algorithms a sweep can compare (docs/algorithms.md), as the user writes them, and which of them load
# a trained drafter (the spec's ``drafter``, converted on every node); NEXTN drafts with the target's own
# MTP layers, STANDALONE with a plain small model, NGRAM with no model at all.
SWEEP_ALGORITHMS = ("EAGLE3", "EAGLE", "NEXTN", "STANDALONE", "NGRAM")
TRAINED_DRAFTER_ALGORITHMS = ("EAGLE3", "EAGLE")
# _handle_ngram: --speculative-eagle-topk becomes --speculative-ngram-max-bfs-breadth; draft tokens 12.
NGRAM_DEFAULT_DRAFT_TOKENS = 12

# _auto_choose_speculative_params: (steps, topk, draft tokens) when all three are unset.
WIDE_TREE_DEFAULT_ARCHITECTURES = ("LlamaForCausalLM", "Grok1ForCausalLM", "Grok1VForCausalLM")
WIDE_TREE_DEFAULTS = (5, 4, 8)
CHAIN_DEFAULTS = (3, 1, 4)
# _handle_eagle_family: targets whose missing draft path defaults to the target itself (built-in MTP).
MTP_TARGET_ARCHITECTURES = (
    "DeepseekV32ForCausalLM",
    "DeepseekV3ForCausalLM",
    "DeepseekV4ForCausalLM",
    "Glm4MoeForCausalLM",
    "Glm4MoeLiteForCausalLM",
    "GlmMoeDsaForCausalLM",
    "BailingMoeForCausalLM",
    "BailingMoeV2ForCausalLM",
    "BailingMoeV2_5ForCausalLM",
    "MistralLarge3ForCausalLM",
    "PixtralForConditionalGeneration",
    "HYV3ForCausalLM",
    "HYV4ForCausalLM",
    "Qwen4ExpForConditionalGeneration",
)
SPEC_MAX_RUNNING_REQUESTS = 48
PAGE_TREE_SPEC_BACKENDS = ("flashinfer", "fa3", "triton")

SPEC_FLAGS = {
    api.SPEC_ALGORITHM: "--speculative-algorithm",
    api.SPEC_NUM_STEPS: "--speculative-num-steps",
    api.SPEC_EAGLE_TOPK: "--speculative-eagle-topk",
    api.SPEC_NUM_DRAFT_TOKENS: "--speculative-num-draft-tokens",
    api.MAX_RUNNING_REQUESTS: "--max-running-requests",
    api.SPEC_ADAPTIVE: "--speculative-adaptive",
}
ADAPTIVE_ALGORITHMS = ("EAGLE", "EAGLE3")
# adaptive_unsupported_reason's flag-visible causes: the server arg and SGLang's words for it.
ADAPTIVE_UNSUPPORTED_FLAGS = {
    "enable_dp_attention": "attention DP is not supported "
    "(adaptive tier decisions are not synchronized across DP ranks)",
    "enable_multi_layer_eagle": "enable_multi_layer_eagle=True is not supported "
    "(MultiLayerEagleWorkerV2 does not implement adaptive)",
    "enable_two_batch_overlap": "enable_two_batch_overlap=True is not supported "
    "(adaptive state swap would discard the TboAttnBackend wrapper)",
    "enable_pdmux": "enable_pdmux=True is not supported "
    "(adaptive state swap does not update decode_attn_backend_group)",
}
SPEC_PARAM_DESTS = (api.SPEC_NUM_STEPS, api.SPEC_EAGLE_TOPK, api.SPEC_NUM_DRAFT_TOKENS)


@dataclass(frozen=True, slots=True)
class SpecParams:
    """The speculative settings a launch asks for or runs with (None: unset / not applicable)."""

    speculative_algorithm: str | None = None
    speculative_num_steps: int | None = None
    speculative_eagle_topk: int | None = None
    speculative_num_draft_tokens: int | None = None
    max_running_requests: int | None = None
    speculative_adaptive: bool = False  # per-batch-size steps; unset and off are the same

    @classmethod
    def from_mapping(cls, values: dict[str, Any]) -> SpecParams:
        fields: dict[str, Any] = {name: values.get(name) for name in cls.__slots__}
        fields[api.SPEC_ADAPTIVE] = bool(fields[api.SPEC_ADAPTIVE])
        return cls(**fields)

    def as_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.__slots__}


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem or note: a stable ``code``, what is wrong, and what to do instead."""

    code: str
    message: str
    suggestion: str | None = None


@dataclass
class Resolution:
    """The state the rule list works on; ``effective`` starts as what was requested."""

    launch: LaunchArgs
    target: dict[str, Any] | None
    draft: dict[str, Any] | None
    effective: SpecParams
    draft_path: str | None
    errors: list[Finding] = field(default_factory=list)
    warnings: list[Finding] = field(default_factory=list)
    stopped: bool = False  # a rule SGLang would crash on; later rules would read garbage

    @property
    def target_architecture(self) -> str | None:
        archs = (self.target or {}).get("architectures") or []
        return archs[0] if archs else None

    @property
    def target_text(self) -> dict[str, Any]:
        """The target's language-model config: a multimodal wrapper's ``text_config`` (Kimi-K2.5's
        KimiK25ForConditionalGeneration keeps vocab and layers there), else the config itself."""
        target = self.target or {}
        text = target.get("text_config")
        return text if isinstance(text, dict) else target

    def fail(self, code: str, message: str, suggestion: str | None = None, *, stop: bool = False) -> None:
        self.errors.append(Finding(code, message, suggestion))
        self.stopped = self.stopped or stop


def requested_params(launch: LaunchArgs) -> SpecParams:
    """What the user asked for: explicit values only (defaults SGLang would pick are not requests)."""
    return SpecParams.from_mapping({dest: launch.get(dest) for dest in SPEC_FLAGS if dest in launch.given})


def normalize_algorithm(name: str | None) -> str | None:
    """SGLang upper-cases the name and treats NEXTN as EAGLE; neither is an adjustment."""
    if name is None:
        return None
    upper = name.upper()
    return ALGORITHM_ALIASES.get(upper, upper)


def read_model_config(path: str | None) -> dict[str, Any] | None:
    """A model directory's config.json, or None when the path is not a local directory with one."""
    if not path:
        return None
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    try:
        data: dict[str, Any] | None = load_json(config.read_text())
        return data
    except (OSError, json.JSONDecodeError):
        return None


# ---------------------------------------------------------------------------------------------------
# The rules, in the order SGLang applies its own (project rules slotted where they can first be seen).
# ---------------------------------------------------------------------------------------------------


def check_algorithm(res: Resolution) -> None:
    algo = res.effective.speculative_algorithm
    if algo is None:
        given = [SPEC_FLAGS[d] for d in SPEC_PARAM_DESTS if d in res.launch.given]
        if api.SPEC_DRAFT_MODEL_PATH in res.launch.given:
            given.append("--speculative-draft-model-path")
        if given:
            res.fail(
                "speculation_without_algorithm",
                f"{', '.join(given)} given without --speculative-algorithm: SGLang ignores them silently "
                "and serves without speculative decoding",
                "add --speculative-algorithm EAGLE3 (or drop the speculative flags for a baseline)",
            )
        res.stopped = True
        return
    if algo not in KNOWN_ALGORITHMS:
        res.fail(
            "unknown_algorithm",
            f"--speculative-algorithm {res.launch.get(api.SPEC_ALGORITHM)!r} is not a speculative algorithm "
            "SGLang 0.5.23 knows (it fails at startup with ValueError)",
            f"use one of {', '.join(('EAGLE3', 'EAGLE', 'NEXTN', *KNOWN_ALGORITHMS[:2]))}, ...",
            stop=True,
        )
        return
    if algo == "NGRAM":
        resolve_ngram(res)
        res.stopped = True
        return
    if algo == "STANDALONE" and attention_dp(res.launch):
        res.fail(
            "dp_attention_unsupported",
            "Currently standalone speculative decoding does not support dp attention.",
            "drop --enable-dp-attention (or use EAGLE3 / NEXTN)",
            stop=True,
        )
        return
    if algo not in EAGLE_FAMILY:
        res.warnings.append(
            Finding(
                "not_modelled",
                f"the built-in rules model the EAGLE family only; {algo} is checked by SGLang's resolver alone",
            )
        )
        res.stopped = True


def attention_dp(launch: LaunchArgs) -> bool:
    """SGLang's ``attn_dp_enabled_of``: attention DP over more than one rank."""
    return bool(launch.get("enable_dp_attention")) and (launch.get("dp_size") or 1) > 1


def resolve_ngram(res: Resolution) -> None:
    """Mirror of ``arg_groups/speculative_hook.py::_handle_ngram``: no draft model; topk is always the
    n-gram tree's --speculative-ngram-max-bfs-breadth (a given --speculative-eagle-topk is overwritten),
    draft tokens default to 12, steps to draft tokens // breadth; DP attention and an unstable paged tree
    are refused. (Mixed chunked prefill is turned off too; the overlap scheduler stays on in 0.5.23.)"""
    launch = res.launch
    if attention_dp(launch):
        res.fail(
            "dp_attention_unsupported",
            "Currently ngram speculative decoding does not support dp attention.",
            "drop --enable-dp-attention (or use EAGLE3 / NEXTN)",
            stop=True,
        )
        return
    breadth = launch.get("speculative_ngram_max_bfs_breadth")
    eff = res.effective
    asked_topk = eff.speculative_eagle_topk
    if asked_topk is not None and asked_topk != breadth:
        res.warnings.append(
            Finding(
                "ngram_topk_is_breadth",
                f"NGRAM: --speculative-eagle-topk {asked_topk} is replaced by "
                f"--speculative-ngram-max-bfs-breadth ({breadth})",
                "set the n-gram tree's breadth with --speculative-ngram-max-bfs-breadth",
            )
        )
    draft = eff.speculative_num_draft_tokens or NGRAM_DEFAULT_DRAFT_TOKENS
    steps = eff.speculative_num_steps
    if steps is None:
        if breadth == 0:
            res.fail(
                "ngram_breadth",
                "--speculative-ngram-max-bfs-breadth 0: SGLang 0.5.23 divides the draft tokens by it "
                "(ZeroDivisionError: integer division or modulo by zero)",
                "use --speculative-ngram-max-bfs-breadth >= 1",
                stop=True,
            )
            return
        steps = draft // breadth
    res.effective = replace(
        eff,
        speculative_num_steps=steps,
        speculative_eagle_topk=breadth,
        speculative_num_draft_tokens=draft,
        max_running_requests=eff.max_running_requests or SPEC_MAX_RUNNING_REQUESTS,
    )
    page_size = launch.get("page_size") or 1
    backend = launch.get("attention_backend")
    if breadth > 1 and page_size > 1 and backend is not None and backend != "flashinfer":
        res.fail(
            "ngram_page_tree",
            f"speculative_eagle_topk({breadth}) > 1 with page_size({page_size}) > 1 is unstable and produces "
            "incorrect results for paged attention backends. This combination is only supported for the "
            "'flashinfer' backend.",
            "use --page-size 1, --attention-backend flashinfer or --speculative-ngram-max-bfs-breadth 1",
        )
    check_rejection_sampling(res)


def check_max_running_requests(res: Resolution) -> None:
    if res.effective.max_running_requests is None:
        res.effective = replace(res.effective, max_running_requests=SPEC_MAX_RUNNING_REQUESTS)


def check_draft_path(res: Resolution) -> None:
    if res.draft_path is not None:
        return
    arch = res.target_architecture
    has_mtp = bool(res.target_text.get("num_nextn_predict_layers"))
    if arch in MTP_TARGET_ARCHITECTURES:
        res.draft_path = res.launch.get("model_path")  # SGLang's default: the target's MTP layers
    if res.effective.speculative_algorithm == "EAGLE3":
        if arch in MTP_TARGET_ARCHITECTURES and has_mtp:
            res.warnings.append(
                Finding(
                    "eagle3_uses_mtp_layer",
                    "EAGLE3 without --speculative-draft-model-path: SGLang uses the target's own MTP layer",
                )
            )
        else:
            res.fail(
                "eagle3_without_draft",
                "--speculative-algorithm EAGLE3 without --speculative-draft-model-path on a target with no "
                f"built-in MTP draft layer ({arch or 'unknown architecture'}): the server fails at load",
                "add --speculative-draft-model-path DIR pointing at the converted EAGLE3 drafter",
                stop=True,
            )
        return
    if arch in MTP_TARGET_ARCHITECTURES:
        if not has_mtp:
            res.warnings.append(
                Finding(
                    "target_has_no_mtp",
                    f"no draft path: SGLang drafts with the target's MTP layers, but its config has "
                    f"num_nextn_predict_layers={res.target_text.get('num_nextn_predict_layers')}",
                    "add --speculative-draft-model-path",
                )
            )
        return
    if res.target is not None:
        res.fail(
            "missing_draft",
            f"--speculative-algorithm {res.effective.speculative_algorithm} without "
            f"--speculative-draft-model-path on a {arch} target: SGLang accepts it and crashes at load",
            "add --speculative-draft-model-path DIR",
            stop=True,
        )


def check_draft_architecture(res: Resolution) -> None:
    archs = (res.draft or {}).get("architectures") or []
    if res.draft is None or res.draft_path == res.launch.get("model_path"):
        return
    is_eagle3 = any(a in EAGLE3_DRAFT_ARCHITECTURES for a in archs)
    algo = res.effective.speculative_algorithm
    if algo == "EAGLE" and is_eagle3:
        res.fail(
            "eagle3_draft_with_eagle",
            f"the draft's config says {archs[0]} (an EAGLE3 draft) but the algorithm is EAGLE: SGLang runs "
            "it without error and every draft is rejected (acceptance length exactly 1.0)",
            "use --speculative-algorithm EAGLE3",
        )
    if algo == "EAGLE3" and not is_eagle3:
        res.fail(
            "draft_architecture",
            f"the draft's config says architectures {archs or 'missing'}; SGLang's EAGLE3 loader needs "
            "LlamaForCausalLMEagle3 (a plain LlamaForCausalLM is built as the wrong class and crashes at load)",
            "convert the drafter with `specsweep convert` (it writes the architecture SGLang loads)",
        )
    target_vocab = res.target_text.get("vocab_size")
    if target_vocab is not None and res.draft.get("vocab_size") not in (None, target_vocab):
        res.fail(
            "draft_vocab_mismatch",
            f"the draft's vocab_size is {res.draft.get('vocab_size')} but the target's is {target_vocab}; "
            "an EAGLE3 draft config's vocab_size must be the TARGET vocab (draft_vocab_size is the small one)",
            "set vocab_size to the target's vocab_size (specsweep convert --target-config does this)",
        )


def check_triple(res: Resolution) -> None:
    """Mirror of the steps/topk/draft-tokens defaults, plus the incomplete-triple rule."""
    eff = res.effective
    steps, topk, draft = (
        eff.speculative_num_steps,
        eff.speculative_eagle_topk,
        eff.speculative_num_draft_tokens,
    )
    together = (
        "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together"
    )
    if steps is None:
        if topk is not None or draft is not None:
            res.fail(
                "incomplete_triple",
                "--speculative-num-steps is unset while --speculative-eagle-topk or "
                "--speculative-num-draft-tokens is given: SGLang 0.5.23 stops with a bare AssertionError "
                "(it only picks defaults when all three are unset)",
                together,
                stop=True,
            )
            return
        arch = res.target_architecture
        defaults = WIDE_TREE_DEFAULTS if arch in WIDE_TREE_DEFAULT_ARCHITECTURES else CHAIN_DEFAULTS
        if eff.speculative_algorithm == "STANDALONE":
            defaults = CHAIN_DEFAULTS
        res.effective = replace(
            eff,
            speculative_num_steps=defaults[0],
            speculative_eagle_topk=defaults[1],
            speculative_num_draft_tokens=defaults[2],
        )
        return
    if topk is None:
        res.fail(
            "incomplete_triple",
            "--speculative-num-steps without --speculative-eagle-topk: SGLang 0.5.23 fails with "
            "TypeError ('>' not supported between 'NoneType' and 'int')",
            together,
            stop=True,
        )
        return
    if steps < 1 or topk < 1:
        res.fail(
            "nonpositive",
            f"--speculative-num-steps {steps} and --speculative-eagle-topk {topk} must both be >= 1",
            "use steps >= 1 and topk >= 1 (steps 0 means no speculation: drop the speculative flags instead)",
            stop=True,
        )
        return
    if topk == 1:
        res.effective = replace(eff, speculative_num_draft_tokens=steps + 1)
        return
    if draft is None:
        res.fail(
            "incomplete_triple",
            f"--speculative-eagle-topk {topk} without --speculative-num-draft-tokens: SGLang resolves it and "
            "crashes later while sizing the verify tree",
            together,
            stop=True,
        )
        return
    if draft > steps * topk + 1:
        res.fail(
            "draft_tokens_exceed_tree",
            f"--speculative-num-draft-tokens {draft} is more than the draft tree has nodes "
            f"(steps * topk + 1 = {steps} * {topk} + 1 = {steps * topk + 1})",
            f"use at most {steps * topk + 1} draft tokens, or more steps/topk",
        )
    if draft < 2:
        res.fail(
            "draft_tokens_too_few",
            f"--speculative-num-draft-tokens {draft} verifies no draft token",
            "use at least 2 draft tokens",
        )


def adaptive_config_problem(config: Any) -> str | None:
    """What SGLang's ``_load_adaptive_config`` raises on for this parsed JSON, naming the key; None if fine.

    Keys of digits are batch-size thresholds, each with ``candidate_steps``: a non-empty list of ints >= 0
    (0 turns drafting off); other keys are defaults shared by every threshold (``ema_alpha``, ...).
    """
    if not isinstance(config, dict):
        return f"the file holds a JSON {type(config).__name__}, not an object keyed by batch size"
    thresholds = [key for key in config if key.isdigit()]
    for key in thresholds:
        entry = config[key]
        steps = entry.get("candidate_steps") if isinstance(entry, dict) else None
        if (
            not isinstance(steps, list)
            or not steps
            or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in steps)
        ):
            return f"key {key!r}: candidate_steps must be a non-empty list of integers >= 0, got {steps!r}"
    if not thresholds:
        return f'no batch-size key (a string of digits such as "1"); keys are {sorted(config)}'
    return None


def adaptive_candidate_steps(config: dict[str, Any]) -> list[int]:
    """Every threshold's candidate steps together (SGLang sizes its buffers by them)."""
    return sorted({s for key, entry in config.items() if key.isdigit() for s in entry["candidate_steps"]})


def adaptive_fallback_reason(res: Resolution) -> str | None:
    """Mirror of ``adaptive_unsupported_reason`` for what the flags show, in SGLang's words."""
    eff = res.effective
    if eff.speculative_algorithm not in ADAPTIVE_ALGORITHMS:
        return f"speculative_algorithm={eff.speculative_algorithm} (only EAGLE/EAGLE3 are supported)"
    if eff.speculative_eagle_topk is not None and eff.speculative_eagle_topk != 1:
        return f"speculative_eagle_topk={eff.speculative_eagle_topk} (only topk=1 is supported)"
    for dest, reason in ADAPTIVE_UNSUPPORTED_FLAGS.items():
        if res.launch.get(dest):
            return reason
    return None


def check_adaptive(res: Resolution) -> None:
    """--speculative-adaptive: a config file SGLang refuses is an error; an unsupported launch runs static."""
    if not res.effective.speculative_adaptive:
        return
    path = res.launch.get(api.SPEC_ADAPTIVE_CONFIG)
    config: Any = None
    if path is not None:
        try:
            config = load_json(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as err:
            res.fail(
                "adaptive_config", f"--speculative-adaptive-config {path}: {err}", "give a readable JSON file"
            )
            return
        problem = adaptive_config_problem(config)
        if problem is not None:
            res.fail(
                "adaptive_config",
                f"--speculative-adaptive-config {path}: {problem} (SGLang 0.5.23 raises ValueError at startup)",
                'write {"<batch size>": {"candidate_steps": [<steps>, ...]}, ...}',
            )
            return
    reason = adaptive_fallback_reason(res)
    if reason is not None:
        res.warnings.append(adaptive_fallback_finding(reason))
        res.effective = replace(res.effective, speculative_adaptive=False)
        return
    steps = res.effective.speculative_num_steps
    candidates = adaptive_candidate_steps(config) if config is not None else None
    if candidates is not None and steps is not None and steps not in candidates:
        res.fail(
            "adaptive_steps",
            f"--speculative-num-steps={steps} is not among the adaptive config's candidate steps {candidates}",
            f"pass one of {candidates}",
        )


def adaptive_fallback_finding(reason: str) -> Finding:
    """The note for a launch that asked for adaptive speculation and will run static params."""
    return Finding(
        "adaptive_fallback",
        f"--speculative-adaptive is turned off by SGLang 0.5.23: {reason}; it only logs "
        "'Falling back to static speculative params' and serves the static steps",
        "use --speculative-eagle-topk 1 without the listed feature, or drop --speculative-adaptive",
    )


def _base_attention_backend(launch: LaunchArgs) -> str | None:
    """SGLang's ``_attention_backend_default`` without the hardware default: equal prefill and decode
    backends override ``--attention-backend``. The flex and paged-tree checks read this one only."""
    prefill = launch.get("prefill_attention_backend")
    if prefill is not None and prefill == launch.get("decode_attention_backend"):
        return str(prefill)
    backend: str | None = launch.get("attention_backend")
    return backend


def check_backends(res: Resolution) -> None:
    topk = res.effective.speculative_eagle_topk or 1
    launch = res.launch
    backends = {
        launch.get("attention_backend"),
        launch.get("decode_attention_backend"),
        launch.get("prefill_attention_backend"),
    } - {None}
    if "trtllm_mha" in backends and topk > 1:
        res.fail(
            "backend_needs_chain",
            "the trtllm_mha attention backend only supports --speculative-eagle-topk 1",
            "use topk 1 or another attention backend",
        )
    backend = _base_attention_backend(launch)
    page_size = launch.get("page_size") or 1
    if topk > 1 and page_size > 1 and backend is not None and backend not in PAGE_TREE_SPEC_BACKENDS:
        res.fail(
            "backend_page_tree",
            f"--speculative-eagle-topk {topk} with --page-size {page_size} is only supported on "
            f"{', '.join(PAGE_TREE_SPEC_BACKENDS)}; got --attention-backend {backend}",
            "use --page-size 1 or one of those backends",
        )
    if backend == "flex_attention":
        res.fail(
            "backend_no_spec",
            "the flex_attention backend rejects speculative decoding",
            "use another --attention-backend",
        )


def check_rejection_sampling(res: Resolution) -> None:
    launch = res.launch
    if not launch.get("speculative_use_rejection_sampling"):
        return
    problems = []
    if res.effective.speculative_algorithm not in ("EAGLE", "EAGLE3"):
        problems.append("it supports EAGLE/EAGLE3 only")
    if res.effective.speculative_eagle_topk != 1:
        problems.append("it needs --speculative-eagle-topk 1")
    if (
        launch.get("speculative_accept_threshold_single"),
        launch.get("speculative_accept_threshold_acc"),
    ) != (
        1.0,
        1.0,
    ):
        problems.append("it ignores the accept thresholds, which must stay 1.0")
    if problems:
        res.fail(
            "rejection_sampling",
            "--speculative-use-rejection-sampling: " + "; ".join(problems),
            "drop --speculative-use-rejection-sampling or meet its conditions",
        )
    # Not checked by SGLang's resolver: its verify kernel cannot consume a reduced draft vocab (the FIXME
    # in speculative_hook._should_auto_enable_hip_rejection_sampling), so the project refuses it.
    draft_vocab = (res.draft or {}).get("draft_vocab_size")
    target_vocab = res.target_text.get("vocab_size")
    if draft_vocab is not None and target_vocab is not None and draft_vocab != target_vocab:
        res.fail(
            "rejection_sampling_draft_vocab",
            "--speculative-use-rejection-sampling needs draft vocab == target vocab "
            f"({draft_vocab} != {target_vocab})",
            "drop --speculative-use-rejection-sampling, or use a draft with the target's full vocab",
        )


RULES: tuple[Callable[[Resolution], None], ...] = (
    check_algorithm,
    check_max_running_requests,
    check_draft_path,
    check_draft_architecture,
    check_triple,
    check_adaptive,
    check_backends,
    check_rejection_sampling,
)


def builtin_resolve(
    launch: LaunchArgs, *, target_config_dir: str | None = None, draft_config_dir: str | None = None
) -> Resolution:
    """Run the rule list on a parsed launch; ``effective`` is what SGLang 0.5.23 would run.

    ``target_config_dir`` / ``draft_config_dir`` stand in for the model paths when the launch names
    paths that exist only on the GPU nodes (only their config.json is read).
    """
    draft_path = launch.get(api.SPEC_DRAFT_MODEL_PATH)
    requested = SpecParams.from_mapping({dest: launch.get(dest) for dest in SPEC_FLAGS})
    res = Resolution(
        launch=launch,
        target=read_model_config(target_config_dir or launch.get("model_path")),
        draft=read_model_config(draft_config_dir or draft_path),
        effective=replace(
            requested, speculative_algorithm=normalize_algorithm(requested.speculative_algorithm)
        ),
        draft_path=draft_path,
    )
    if res.target is None and launch.get("model_path") not in (None, "dummy"):
        res.warnings.append(
            Finding(
                "target_config_unreadable",
                f"no config.json under {target_config_dir or launch.get('model_path')!r}: rules that depend on "
                "the target's architecture are skipped",
                "pass the directory holding the target's config.json (weights are not needed)",
            )
        )
    for rule in RULES:
        if res.stopped:
            break
        rule(res)
    return res
