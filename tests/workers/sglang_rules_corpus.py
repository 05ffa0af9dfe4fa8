"""Launch cases for the speculative rules, with SGLang 0.5.23's own verdict on each recorded.

``tests/fixtures/sglang-rules-corpus.json`` holds, per case, what SGLang's resolver said: refused (and
with which exception) or accepted (and the speculative config it resolved). ``test_sglang_rules.py``
holds ``workers/sglang/rules.py`` to those verdicts without starting SGLang (fast enough for mutation
testing); ``test_sglang_validate.py`` re-resolves every case with the live SGLang so the file cannot go
stale. Regenerate it after changing a case:

    PYTHONPATH=$PWD .venv/bin/python -m tests.workers.sglang_rules_corpus

Paths are written as ``{name}`` placeholders: a fixture directory under tests/fixtures, or a file the
case writes itself (``files``: a model directory's config.json, or an adaptive config).
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workers.sglang import SGLangResolver, default_sglang_python
from workers.sglang.resolver import ResolverResult
from workers.sglang.rules import SpecParams

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
CORPUS_FILE = FIXTURES / "sglang-rules-corpus.json"
MODEL_FIXTURES = (
    "kimi-k2",
    "kimi-k2-mtp",
    "kimi-k25",
    "llama-target",
    "eagle3-draft",
    "eagle3-draft-llama-arch",
)

EAGLE3_KIMI = (
    "--model-path {kimi-k2} --speculative-algorithm EAGLE3 --speculative-draft-model-path {eagle3-draft}"
)
EAGLE3_LLAMA = (
    "--model-path {llama-target} --speculative-algorithm EAGLE3 --speculative-draft-model-path {llama-draft}"
)
CHAIN = "--speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 4"
TREE = "--speculative-num-steps 3 --speculative-eagle-topk 4 --speculative-num-draft-tokens 8"
LLAMA_DRAFT = {
    "architectures": ["LlamaForCausalLMEagle3"],
    "model_type": "llama",
    "hidden_size": 4096,
    "vocab_size": 128256,
    "draft_vocab_size": 32000,
    "num_hidden_layers": 1,
}
# The project's rules that refuse launches SGLang accepts: the table "Rules SGLang does not enforce" in
# docs/validation.md, written out here so that a new refusal of a launch SGLang runs fails the agreement
# tests until it is documented and listed.
STRICTER_RULES = frozenset(
    {
        "speculation_without_algorithm",
        "incomplete_triple",
        "draft_tokens_exceed_tree",
        "draft_tokens_too_few",
        "nonpositive",
        "eagle3_draft_with_eagle",
        "eagle3_without_draft",
        "missing_draft",
        "draft_architecture",
        "draft_vocab_mismatch",
        "rejection_sampling_draft_vocab",
    }
)

# A drafter over the target's whole vocabulary (no d2t map): what rejection sampling needs.
FULL_VOCAB_DRAFT = {
    "full-vocab-draft": {
        "architectures": ["LlamaForCausalLMEagle3"],
        "model_type": "llama",
        "hidden_size": 7168,
        "vocab_size": 163840,
        "num_hidden_layers": 1,
    }
}
ADAPTIVE = {"1": {"candidate_steps": [3, 7]}, "16": {"candidate_steps": [0, 3]}}


@dataclass(frozen=True)
class Case:
    """One launch: its argv (placeholders in ``{}``) and the files it writes (name -> JSON content)."""

    id: str
    argv: str
    files: dict[str, Any] = field(default_factory=dict)


CASES = (
    Case("baseline", "--model-path {kimi-k2}"),
    Case("baseline_tp", "--model-path {kimi-k2} --tp-size 8 --max-running-requests 128"),
    Case(
        "flags_without_algorithm",
        "--model-path {kimi-k2} --speculative-num-steps 3 --speculative-eagle-topk 1",
    ),
    Case("draft_without_algorithm", "--model-path {kimi-k2} --speculative-draft-model-path {eagle3-draft}"),
    Case(
        "all_flags_without_algorithm",
        f"--model-path {{kimi-k2}} {TREE} --speculative-draft-model-path {{eagle3-draft}}",
    ),
    Case("unknown_algorithm", "--model-path {kimi-k2} --speculative-algorithm MEDUSA"),
    Case("ngram", "--model-path {kimi-k2} --speculative-algorithm NGRAM"),
    Case("ngram_chain", f"--model-path {{kimi-k2}} --speculative-algorithm NGRAM {CHAIN}"),
    Case(
        "ngram_breadth_one",
        "--model-path {kimi-k2} --speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 1 "
        "--speculative-num-draft-tokens 6",
    ),
    Case(
        "ngram_breadth_zero",
        "--model-path {kimi-k2} --speculative-algorithm NGRAM --speculative-ngram-max-bfs-breadth 0",
    ),
    Case(
        "ngram_dp_attention",
        "--model-path {kimi-k2} --speculative-algorithm NGRAM --enable-dp-attention --tp-size 2 --dp-size 2",
    ),
    Case(
        "ngram_paged_tree",
        "--model-path {kimi-k2} --speculative-algorithm NGRAM --page-size 16 --attention-backend fa3",
    ),
    Case(
        "standalone_dp_attention",
        "--model-path {kimi-k2} --speculative-algorithm STANDALONE --speculative-draft-model-path {llama-target} "
        "--enable-dp-attention --tp-size 2 --dp-size 2",
    ),
    Case("nextn_mtp_chain", f"--model-path {{kimi-k2-mtp}} --speculative-algorithm NEXTN {CHAIN}"),
    Case("eagle3_chain", f"{EAGLE3_KIMI} {CHAIN}"),
    Case(
        "eagle3_chain_lowercase",
        f"--model-path {{kimi-k2}} --speculative-algorithm eagle3 "
        f"--speculative-draft-model-path {{eagle3-draft}} {CHAIN}",
    ),
    Case("eagle3_tree", f"{EAGLE3_KIMI} {TREE} --max-running-requests 64"),
    Case("eagle3_defaults_kimi", EAGLE3_KIMI),
    Case("eagle3_defaults_llama", EAGLE3_LLAMA, {"llama-draft": LLAMA_DRAFT}),
    Case(
        "eagle3_llama_tree_full",
        f"{EAGLE3_LLAMA} --speculative-num-steps 2 --speculative-eagle-topk 3 "
        "--speculative-num-draft-tokens 7",
        {"llama-draft": LLAMA_DRAFT},
    ),
    Case(
        "eagle3_topk1_rewrites_draft_tokens",
        f"{EAGLE3_KIMI} --speculative-num-steps 1 "
        "--speculative-eagle-topk 1 --speculative-num-draft-tokens 16",
    ),
    Case(
        "eagle3_topk1_fills_draft_tokens",
        f"{EAGLE3_KIMI} --speculative-num-steps 5 --speculative-eagle-topk 1",
    ),
    Case("eagle3_topk_without_steps", f"{EAGLE3_KIMI} --speculative-eagle-topk 1"),
    Case("eagle3_draft_tokens_without_steps", f"{EAGLE3_KIMI} --speculative-num-draft-tokens 16"),
    Case("eagle3_steps_without_topk", f"{EAGLE3_KIMI} --speculative-num-steps 3"),
    Case(
        "eagle3_tree_without_draft_tokens",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-eagle-topk 4",
    ),
    Case(
        "eagle3_steps_zero",
        f"{EAGLE3_KIMI} --speculative-num-steps 0 --speculative-eagle-topk 1 "
        "--speculative-num-draft-tokens 1",
    ),
    Case(
        "eagle3_topk_zero",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-eagle-topk 0 "
        "--speculative-num-draft-tokens 4",
    ),
    Case(
        "eagle3_tree_too_many_draft_tokens",
        f"{EAGLE3_KIMI} --speculative-num-steps 2 "
        "--speculative-eagle-topk 3 --speculative-num-draft-tokens 8",
    ),
    Case(
        "eagle3_tree_one_draft_token",
        f"{EAGLE3_KIMI} --speculative-num-steps 2 --speculative-eagle-topk 3 "
        "--speculative-num-draft-tokens 1",
    ),
    Case(
        "eagle3_tree_two_draft_tokens",
        f"{EAGLE3_KIMI} --speculative-num-steps 2 --speculative-eagle-topk 3 "
        "--speculative-num-draft-tokens 2",
    ),
    Case("eagle3_without_draft_kimi", "--model-path {kimi-k2} --speculative-algorithm EAGLE3"),
    Case("eagle3_without_draft_llama", "--model-path {llama-target} --speculative-algorithm EAGLE3"),
    Case("eagle3_uses_mtp_layer", f"--model-path {{kimi-k2-mtp}} --speculative-algorithm EAGLE3 {CHAIN}"),
    Case(
        "eagle3_plain_llama_draft",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{eagle3-draft-llama-arch}} {CHAIN}",
    ),
    Case(
        "eagle3_draft_without_architectures",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{bare-draft}} {CHAIN}",
        {"bare-draft": {"model_type": "llama", "vocab_size": 163840, "hidden_size": 7168}},
    ),
    Case(
        "eagle3_draft_vocab_mismatch",
        "--model-path {llama-target} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{eagle3-draft}} {CHAIN}",
    ),
    Case(
        "eagle3_kimi_k25_target",
        "--model-path {kimi-k25} --trust-remote-code --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{eagle3-draft}} {CHAIN}",
    ),
    Case(
        "eagle_with_eagle3_draft",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE "
        f"--speculative-draft-model-path {{eagle3-draft}} {CHAIN}",
    ),
    Case(
        "eagle_with_plain_draft",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE "
        f"--speculative-draft-model-path {{eagle3-draft-llama-arch}} {CHAIN}",
    ),
    Case("nextn_mtp_target", "--model-path {kimi-k2-mtp} --speculative-algorithm NEXTN"),
    Case(
        "nextn_mtp_target_draft_is_target",
        "--model-path {kimi-k2-mtp} --speculative-algorithm EAGLE "
        f"--speculative-draft-model-path {{kimi-k2-mtp}} {CHAIN}",
    ),
    Case("eagle_target_without_mtp_layer", f"--model-path {{kimi-k2}} --speculative-algorithm EAGLE {CHAIN}"),
    Case("eagle_without_draft_llama", f"--model-path {{llama-target}} --speculative-algorithm EAGLE {CHAIN}"),
    Case(
        "standalone_defaults_llama",
        "--model-path {llama-target} --speculative-algorithm STANDALONE "
        "--speculative-draft-model-path {llama-target}",
    ),
    Case("adaptive_chain", f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive"),
    Case(
        "adaptive_chain_config",
        f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive --speculative-adaptive-config {{adaptive.json}}",
        {"adaptive.json": ADAPTIVE},
    ),
    Case(
        "adaptive_steps_not_candidate",
        f"{EAGLE3_KIMI} --speculative-num-steps 5 --speculative-eagle-topk 1 "
        "--speculative-adaptive --speculative-adaptive-config {adaptive.json}",
        {"adaptive.json": ADAPTIVE},
    ),
    Case("adaptive_tree_falls_back", f"{EAGLE3_KIMI} {TREE} --speculative-adaptive"),
    Case(
        "adaptive_tree_falls_back_config",
        f"{EAGLE3_KIMI} {TREE} --speculative-adaptive --speculative-adaptive-config {{adaptive.json}}",
        {"adaptive.json": ADAPTIVE},
    ),
    Case(
        "adaptive_standalone_falls_back",
        "--model-path {llama-target} --speculative-algorithm STANDALONE "
        f"--speculative-draft-model-path {{llama-target}} {CHAIN} --speculative-adaptive",
    ),
    Case(
        "adaptive_two_batch_overlap_falls_back",
        f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive --enable-two-batch-overlap",
    ),
    Case("adaptive_pdmux_falls_back", f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive --enable-pdmux"),
    Case(
        "adaptive_config_missing",
        f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive "
        "--speculative-adaptive-config /nonexistent/adaptive.json",
    ),
    Case(
        "adaptive_config_not_json",
        f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive --speculative-adaptive-config {{adaptive.txt}}",
        {"adaptive.txt": "not json"},
    ),
    Case(
        "adaptive_config_malformed",
        f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive --speculative-adaptive-config {{bad.json}}",
        {"bad.json": {"16": {"candidate_steps": [-1, 3]}}},
    ),
    Case(
        "adaptive_config_without_adaptive",
        f"{EAGLE3_KIMI} {CHAIN} --speculative-adaptive-config {{bad.json}}",
        {"bad.json": {"16": {"candidate_steps": [-1]}}},
    ),
    Case("trtllm_mha_tree", f"{EAGLE3_KIMI} {TREE} --attention-backend trtllm_mha"),
    Case("trtllm_mha_decode_tree", f"{EAGLE3_KIMI} {TREE} --decode-attention-backend trtllm_mha"),
    Case("trtllm_mha_prefill_tree", f"{EAGLE3_KIMI} {TREE} --prefill-attention-backend trtllm_mha"),
    Case("trtllm_mha_chain", f"{EAGLE3_KIMI} {CHAIN} --attention-backend trtllm_mha"),
    Case("tree_paged_torch_native", f"{EAGLE3_KIMI} {TREE} --page-size 16 --attention-backend torch_native"),
    Case("tree_paged_fa3", f"{EAGLE3_KIMI} {TREE} --page-size 16 --attention-backend fa3"),
    Case("tree_paged_flashinfer", f"{EAGLE3_KIMI} {TREE} --page-size 16 --attention-backend flashinfer"),
    Case("tree_paged_triton", f"{EAGLE3_KIMI} {TREE} --page-size 16 --attention-backend triton"),
    Case("tree_unpaged_torch_native", f"{EAGLE3_KIMI} {TREE} --attention-backend torch_native"),
    Case("tree_paged_default_backend", f"{EAGLE3_KIMI} {TREE} --page-size 16"),
    Case(
        "chain_paged_torch_native", f"{EAGLE3_KIMI} {CHAIN} --page-size 16 --attention-backend torch_native"
    ),
    Case("flex_attention", f"{EAGLE3_KIMI} {CHAIN} --attention-backend flex_attention"),
    Case("flex_attention_prefill", f"{EAGLE3_KIMI} {CHAIN} --prefill-attention-backend flex_attention"),
    Case(
        "flex_attention_prefill_and_decode",
        f"{EAGLE3_KIMI} {CHAIN} --prefill-attention-backend "
        "flex_attention --decode-attention-backend flex_attention",
    ),
    Case(
        "tree_paged_torch_native_prefill_and_decode",
        f"{EAGLE3_KIMI} {TREE} --page-size 16 "
        "--prefill-attention-backend torch_native --decode-attention-backend torch_native",
    ),
    Case(
        "tree_paged_torch_native_prefill_only",
        f"{EAGLE3_KIMI} {TREE} --page-size 16 "
        "--attention-backend fa3 --prefill-attention-backend torch_native",
    ),
    Case(
        "eagle3_topk_without_steps_trtllm_mha",
        f"{EAGLE3_KIMI} --speculative-eagle-topk 4 --attention-backend trtllm_mha",
    ),
    Case(
        "eagle3_steps_without_topk_rejection_sampling",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-use-rejection-sampling",
    ),
    Case(
        "eagle3_steps_zero_rejection_sampling",
        f"{EAGLE3_KIMI} --speculative-num-steps 0 --speculative-eagle-topk 1 --speculative-use-rejection-sampling",
    ),
    Case(
        "eagle3_tree_without_draft_tokens_trtllm_mha",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-eagle-topk 4 --attention-backend trtllm_mha",
    ),
    Case(
        "eagle3_without_draft_tree_too_many",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE3 --speculative-num-steps 2 --speculative-eagle-topk 3 --speculative-num-draft-tokens 8",
    ),
    Case(
        "eagle_without_draft_llama_tree_too_many",
        "--model-path {llama-target} --speculative-algorithm EAGLE --speculative-num-steps 2 --speculative-eagle-topk 3 --speculative-num-draft-tokens 8",
    ),
    Case(
        "eagle_with_eagle3_draft_tree_too_many",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE --speculative-draft-model-path {eagle3-draft} --speculative-num-steps 2 --speculative-eagle-topk 3 --speculative-num-draft-tokens 8",
    ),
    Case(
        "eagle3_topk1_draft_tokens_below_steps",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-eagle-topk 1 --speculative-num-draft-tokens 2",
    ),
    Case(
        "trtllm_mha_topk2",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4 --attention-backend trtllm_mha",
    ),
    Case(
        "tree_topk2_paged_torch_native",
        f"{EAGLE3_KIMI} --speculative-num-steps 3 --speculative-eagle-topk 2 --speculative-num-draft-tokens 4 --page-size 16 --attention-backend torch_native",
    ),
    Case("tree_page2_torch_native", f"{EAGLE3_KIMI} {TREE} --page-size 2 --attention-backend torch_native"),
    Case(
        "rejection_sampling_nextn",
        f"--model-path {{kimi-k2-mtp}} --speculative-algorithm NEXTN {CHAIN} --speculative-use-rejection-sampling",
    ),
    Case(
        "rejection_sampling_tree_threshold",
        f"{EAGLE3_KIMI} {TREE} --speculative-use-rejection-sampling --speculative-accept-threshold-single 0.9",
    ),
    Case("rejection_sampling_tree", f"{EAGLE3_KIMI} {TREE} --speculative-use-rejection-sampling"),
    Case("rejection_sampling_reduced_vocab", f"{EAGLE3_KIMI} {CHAIN} --speculative-use-rejection-sampling"),
    Case(
        "rejection_sampling_full_vocab",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{full-vocab-draft}} {CHAIN} --speculative-use-rejection-sampling",
        FULL_VOCAB_DRAFT,
    ),
    Case(
        "rejection_sampling_threshold",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{full-vocab-draft}} {CHAIN} --speculative-use-rejection-sampling "
        "--speculative-accept-threshold-single 0.9",
        FULL_VOCAB_DRAFT,
    ),
    Case(
        "rejection_sampling_acc_threshold",
        "--model-path {kimi-k2} --speculative-algorithm EAGLE3 "
        f"--speculative-draft-model-path {{full-vocab-draft}} {CHAIN} --speculative-use-rejection-sampling "
        "--speculative-accept-threshold-acc 0.5",
        FULL_VOCAB_DRAFT,
    ),
    Case(
        "rejection_sampling_standalone",
        "--model-path {llama-target} --speculative-algorithm STANDALONE "
        f"--speculative-draft-model-path {{llama-target}} {CHAIN} --speculative-use-rejection-sampling",
    ),
)


def materialize(case: Case, root: Path) -> list[str]:
    """The case's argv with placeholders filled: fixture directories, and the case's files under root."""
    root.mkdir(parents=True, exist_ok=True)
    paths = {name: str(FIXTURES / name) for name in MODEL_FIXTURES}
    for name, content in case.files.items():
        text = content if isinstance(content, str) else json.dumps(content)
        if name.endswith((".json", ".txt")):
            path = root / name
        else:
            (root / name).mkdir(parents=True, exist_ok=True)
            path = root / name / "config.json"
        path.write_text(text)
        paths[name] = str(path.parent if path.name == "config.json" else path)
    return [re.sub(r"\{([^}]+)\}", lambda m: paths[m[1]], token) for token in case.argv.split()]


def placeholders(path: str | None, root: Path) -> str | None:
    """A path as the corpus writes it: the fixtures and the case's own directory as placeholders."""
    return None if path is None else path.replace(str(root), "{case}").replace(str(FIXTURES), "{fixtures}")


def verdict(result: ResolverResult, root: Path) -> dict[str, Any]:
    """What the corpus records of SGLang's answer: the exception's type, or the resolved spec config
    (with the draft model path it loads)."""
    if not result.ok:
        return {"refused": result.error_type if result.parser_exit is None else "parser"}
    assert result.resolved is not None
    return {
        "effective": SpecParams.from_mapping(result.resolved).as_dict(),
        "draft_path": placeholders(result.resolved["speculative_draft_model_path"], root),
        "adaptive_fallback_reason": result.adaptive_fallback_reason,
    }


def live_verdicts(resolver: SGLangResolver, root: Path) -> Iterator[tuple[str, dict[str, Any]]]:
    """Each case's id and the verdict the running SGLang gives it."""
    for case in CASES:
        yield case.id, verdict(resolver.resolve(materialize(case, root / case.id)), root / case.id)


def recorded() -> dict[str, dict[str, Any]]:
    """The committed verdicts, by case id."""
    verdicts: dict[str, dict[str, Any]] = json.loads(CORPUS_FILE.read_text())["verdicts"]
    return verdicts


def main() -> None:
    import tempfile

    python = default_sglang_python()
    if python is None:
        raise SystemExit("no SGLang interpreter: run `make sglang-venv`")
    with tempfile.TemporaryDirectory() as tmp, SGLangResolver(python) as resolver:
        verdicts = dict(live_verdicts(resolver, Path(tmp)))
        out = {"sglang_version": resolver.version, "verdicts": verdicts}
    CORPUS_FILE.write_text(json.dumps(out, indent=1, sort_keys=True) + "\n")
    print(f"wrote {len(verdicts)} verdicts to {CORPUS_FILE}")


if __name__ == "__main__":
    main()
