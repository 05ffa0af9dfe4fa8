"""The speculative rules (``workers/sglang/rules.py``) against SGLang 0.5.23's own recorded verdicts.

Every case in ``sglang_rules_corpus.CASES`` is resolved by the built-in rules in this process (no SGLang:
fast enough for mutation testing) and compared with what SGLang's resolver said about it
(``tests/fixtures/sglang-rules-corpus.json``, re-checked against the live SGLang by
``test_sglang_validate.py``): a launch SGLang refuses is refused, one SGLang runs is refused only by a
documented stricter rule, and one both accept resolves to SGLang's effective config. Each case's
findings are compared in full: the code, the message with the refused or adjusted value, and the fix.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.workers.sglang_rules_corpus import (
    CASES,
    FIXTURES,
    STRICTER_RULES,
    Case,
    materialize,
    placeholders,
    recorded,
)
from workers.sglang import builtin_resolve, parse_launch_args
from workers.sglang.rules import (
    Finding,
    Resolution,
    SpecParams,
    adaptive_candidate_steps,
    normalize_algorithm,
    read_model_config,
    requested_params,
)

VERDICTS = recorded()
# SGLang refuses these on this CPU-only machine for the hardware (trtllm_mha needs an SM90+ GPU), which
# the built-in rules do not know: see docs/validation.md.
HARDWARE_REFUSALS = frozenset({"trtllm_mha_chain"})

PLACEHOLDER = "{case}"  # the case's own directory (files it wrote) in the messages below
# Each case's (errors, warnings) as (code, message, suggestion); a case not listed has none.
FINDINGS: dict[str, tuple[list[tuple[str, str, str | None]], list[tuple[str, str, str | None]]]] = {
    "flags_without_algorithm": (
        [
            (
                "speculation_without_algorithm",
                "--speculative-num-steps, --speculative-eagle-topk given without --speculative-algorithm: SGLang ignores them silently and serves without speculative decoding",
                "add --speculative-algorithm EAGLE3 (or drop the speculative flags for a baseline)",
            )
        ],
        [],
    ),
    "draft_without_algorithm": (
        [
            (
                "speculation_without_algorithm",
                "--speculative-draft-model-path given without --speculative-algorithm: SGLang ignores them silently and serves without speculative decoding",
                "add --speculative-algorithm EAGLE3 (or drop the speculative flags for a baseline)",
            )
        ],
        [],
    ),
    "all_flags_without_algorithm": (
        [
            (
                "speculation_without_algorithm",
                "--speculative-num-steps, --speculative-eagle-topk, --speculative-num-draft-tokens, --speculative-draft-model-path given without --speculative-algorithm: SGLang ignores them silently and serves without speculative decoding",
                "add --speculative-algorithm EAGLE3 (or drop the speculative flags for a baseline)",
            )
        ],
        [],
    ),
    "unknown_algorithm": (
        [
            (
                "unknown_algorithm",
                "--speculative-algorithm 'MEDUSA' is not a speculative algorithm SGLang 0.5.23 knows (it fails at startup with ValueError)",
                "use one of EAGLE3, EAGLE, NEXTN, DFLASH, UNO, ...",
            )
        ],
        [],
    ),
    "ngram_chain": (
        [],
        [
            (
                "ngram_topk_is_breadth",
                "NGRAM: --speculative-eagle-topk 1 is replaced by --speculative-ngram-max-bfs-breadth (10)",
                "set the n-gram tree's breadth with --speculative-ngram-max-bfs-breadth",
            )
        ],
    ),
    "ngram_breadth_zero": (
        [
            (
                "ngram_breadth",
                "--speculative-ngram-max-bfs-breadth 0: SGLang 0.5.23 divides the draft tokens by it "
                "(ZeroDivisionError: integer division or modulo by zero)",
                "use --speculative-ngram-max-bfs-breadth >= 1",
            )
        ],
        [],
    ),
    "ngram_dp_attention": (
        [
            (
                "dp_attention_unsupported",
                "Currently ngram speculative decoding does not support dp attention.",
                "drop --enable-dp-attention (or use EAGLE3 / NEXTN)",
            )
        ],
        [],
    ),
    "ngram_paged_tree": (
        [
            (
                "ngram_page_tree",
                "speculative_eagle_topk(10) > 1 with page_size(16) > 1 is unstable and produces incorrect "
                "results for paged attention backends. This combination is only supported for the "
                "'flashinfer' backend.",
                "use --page-size 1, --attention-backend flashinfer or --speculative-ngram-max-bfs-breadth 1",
            )
        ],
        [],
    ),
    "standalone_dp_attention": (
        [
            (
                "dp_attention_unsupported",
                "Currently standalone speculative decoding does not support dp attention.",
                "drop --enable-dp-attention (or use EAGLE3 / NEXTN)",
            )
        ],
        [],
    ),
    "eagle3_topk_without_steps": (
        [
            (
                "incomplete_triple",
                "--speculative-num-steps is unset while --speculative-eagle-topk or --speculative-num-draft-tokens is given: SGLang 0.5.23 stops with a bare AssertionError (it only picks defaults when all three are unset)",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_draft_tokens_without_steps": (
        [
            (
                "incomplete_triple",
                "--speculative-num-steps is unset while --speculative-eagle-topk or --speculative-num-draft-tokens is given: SGLang 0.5.23 stops with a bare AssertionError (it only picks defaults when all three are unset)",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_steps_without_topk": (
        [
            (
                "incomplete_triple",
                "--speculative-num-steps without --speculative-eagle-topk: SGLang 0.5.23 fails with TypeError ('>' not supported between 'NoneType' and 'int')",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_tree_without_draft_tokens": (
        [
            (
                "incomplete_triple",
                "--speculative-eagle-topk 4 without --speculative-num-draft-tokens: SGLang resolves it and crashes later while sizing the verify tree",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_steps_zero": (
        [
            (
                "nonpositive",
                "--speculative-num-steps 0 and --speculative-eagle-topk 1 must both be >= 1",
                "use steps >= 1 and topk >= 1 (steps 0 means no speculation: drop the speculative flags instead)",
            )
        ],
        [],
    ),
    "eagle3_topk_zero": (
        [
            (
                "nonpositive",
                "--speculative-num-steps 3 and --speculative-eagle-topk 0 must both be >= 1",
                "use steps >= 1 and topk >= 1 (steps 0 means no speculation: drop the speculative flags instead)",
            )
        ],
        [],
    ),
    "eagle3_tree_too_many_draft_tokens": (
        [
            (
                "draft_tokens_exceed_tree",
                "--speculative-num-draft-tokens 8 is more than the draft tree has nodes (steps * topk + 1 = 2 * 3 + 1 = 7)",
                "use at most 7 draft tokens, or more steps/topk",
            )
        ],
        [],
    ),
    "eagle3_tree_one_draft_token": (
        [
            (
                "draft_tokens_too_few",
                "--speculative-num-draft-tokens 1 verifies no draft token",
                "use at least 2 draft tokens",
            )
        ],
        [],
    ),
    "eagle3_without_draft_kimi": (
        [
            (
                "eagle3_without_draft",
                "--speculative-algorithm EAGLE3 without --speculative-draft-model-path on a target with no built-in MTP draft layer (DeepseekV3ForCausalLM): the server fails at load",
                "add --speculative-draft-model-path DIR pointing at the converted EAGLE3 drafter",
            )
        ],
        [],
    ),
    "eagle3_without_draft_llama": (
        [
            (
                "eagle3_without_draft",
                "--speculative-algorithm EAGLE3 without --speculative-draft-model-path on a target with no built-in MTP draft layer (LlamaForCausalLM): the server fails at load",
                "add --speculative-draft-model-path DIR pointing at the converted EAGLE3 drafter",
            )
        ],
        [],
    ),
    "eagle3_uses_mtp_layer": (
        [],
        [
            (
                "eagle3_uses_mtp_layer",
                "EAGLE3 without --speculative-draft-model-path: SGLang uses the target's own MTP layer",
                None,
            )
        ],
    ),
    "eagle3_plain_llama_draft": (
        [
            (
                "draft_architecture",
                "the draft's config says architectures ['LlamaForCausalLM']; SGLang's EAGLE3 loader needs LlamaForCausalLMEagle3 (a plain LlamaForCausalLM is built as the wrong class and crashes at load)",
                "convert the drafter with `specsweep convert` (it writes the architecture SGLang loads)",
            )
        ],
        [],
    ),
    "eagle3_draft_without_architectures": (
        [
            (
                "draft_architecture",
                "the draft's config says architectures missing; SGLang's EAGLE3 loader needs LlamaForCausalLMEagle3 (a plain LlamaForCausalLM is built as the wrong class and crashes at load)",
                "convert the drafter with `specsweep convert` (it writes the architecture SGLang loads)",
            )
        ],
        [],
    ),
    "eagle3_draft_vocab_mismatch": (
        [
            (
                "draft_vocab_mismatch",
                "the draft's vocab_size is 163840 but the target's is 128256; an EAGLE3 draft config's vocab_size must be the TARGET vocab (draft_vocab_size is the small one)",
                "set vocab_size to the target's vocab_size (specsweep convert --target-config does this)",
            )
        ],
        [],
    ),
    "eagle_with_eagle3_draft": (
        [
            (
                "eagle3_draft_with_eagle",
                "the draft's config says LlamaForCausalLMEagle3 (an EAGLE3 draft) but the algorithm is EAGLE: SGLang runs it without error and every draft is rejected (acceptance length exactly 1.0)",
                "use --speculative-algorithm EAGLE3",
            )
        ],
        [],
    ),
    "eagle_target_without_mtp_layer": (
        [],
        [
            (
                "target_has_no_mtp",
                "no draft path: SGLang drafts with the target's MTP layers, but its config has num_nextn_predict_layers=0",
                "add --speculative-draft-model-path",
            )
        ],
    ),
    "eagle_without_draft_llama": (
        [
            (
                "missing_draft",
                "--speculative-algorithm EAGLE without --speculative-draft-model-path on a LlamaForCausalLM target: SGLang accepts it and crashes at load",
                "add --speculative-draft-model-path DIR",
            )
        ],
        [],
    ),
    "adaptive_steps_not_candidate": (
        [
            (
                "adaptive_steps",
                "--speculative-num-steps=5 is not among the adaptive config's candidate steps [0, 3, 7]",
                "pass one of [0, 3, 7]",
            )
        ],
        [],
    ),
    "adaptive_tree_falls_back": (
        [],
        [
            (
                "adaptive_fallback",
                "--speculative-adaptive is turned off by SGLang 0.5.23: speculative_eagle_topk=4 (only topk=1 is supported); it only logs 'Falling back to static speculative params' and serves the static steps",
                "use --speculative-eagle-topk 1 without the listed feature, or drop --speculative-adaptive",
            )
        ],
    ),
    "adaptive_tree_falls_back_config": (
        [],
        [
            (
                "adaptive_fallback",
                "--speculative-adaptive is turned off by SGLang 0.5.23: speculative_eagle_topk=4 (only topk=1 is supported); it only logs 'Falling back to static speculative params' and serves the static steps",
                "use --speculative-eagle-topk 1 without the listed feature, or drop --speculative-adaptive",
            )
        ],
    ),
    "adaptive_standalone_falls_back": (
        [],
        [
            (
                "adaptive_fallback",
                "--speculative-adaptive is turned off by SGLang 0.5.23: speculative_algorithm=STANDALONE (only EAGLE/EAGLE3 are supported); it only logs 'Falling back to static speculative params' and serves the static steps",
                "use --speculative-eagle-topk 1 without the listed feature, or drop --speculative-adaptive",
            )
        ],
    ),
    "adaptive_two_batch_overlap_falls_back": (
        [],
        [
            (
                "adaptive_fallback",
                "--speculative-adaptive is turned off by SGLang 0.5.23: enable_two_batch_overlap=True is not supported (adaptive state swap would discard the TboAttnBackend wrapper); it only logs 'Falling back to static speculative params' and serves the static steps",
                "use --speculative-eagle-topk 1 without the listed feature, or drop --speculative-adaptive",
            )
        ],
    ),
    "adaptive_pdmux_falls_back": (
        [],
        [
            (
                "adaptive_fallback",
                "--speculative-adaptive is turned off by SGLang 0.5.23: enable_pdmux=True is not supported (adaptive state swap does not update decode_attn_backend_group); it only logs 'Falling back to static speculative params' and serves the static steps",
                "use --speculative-eagle-topk 1 without the listed feature, or drop --speculative-adaptive",
            )
        ],
    ),
    "adaptive_config_missing": (
        [
            (
                "adaptive_config",
                "--speculative-adaptive-config /nonexistent/adaptive.json: [Errno 2] No such file or directory: '/nonexistent/adaptive.json'",
                "give a readable JSON file",
            )
        ],
        [],
    ),
    "adaptive_config_not_json": (
        [
            (
                "adaptive_config",
                "--speculative-adaptive-config {case}/adaptive.txt: Expecting value: line 1 column 1 (char 0)",
                "give a readable JSON file",
            )
        ],
        [],
    ),
    "adaptive_config_malformed": (
        [
            (
                "adaptive_config",
                "--speculative-adaptive-config {case}/bad.json: key '16': candidate_steps must be a non-empty list of integers >= 0, got [-1, 3] (SGLang 0.5.23 raises ValueError at startup)",
                'write {"<batch size>": {"candidate_steps": [<steps>, ...]}, ...}',
            )
        ],
        [],
    ),
    "trtllm_mha_tree": (
        [
            (
                "backend_needs_chain",
                "the trtllm_mha attention backend only supports --speculative-eagle-topk 1",
                "use topk 1 or another attention backend",
            )
        ],
        [],
    ),
    "trtllm_mha_decode_tree": (
        [
            (
                "backend_needs_chain",
                "the trtllm_mha attention backend only supports --speculative-eagle-topk 1",
                "use topk 1 or another attention backend",
            )
        ],
        [],
    ),
    "trtllm_mha_prefill_tree": (
        [
            (
                "backend_needs_chain",
                "the trtllm_mha attention backend only supports --speculative-eagle-topk 1",
                "use topk 1 or another attention backend",
            )
        ],
        [],
    ),
    "tree_paged_torch_native": (
        [
            (
                "backend_page_tree",
                "--speculative-eagle-topk 4 with --page-size 16 is only supported on flashinfer, fa3, triton; got --attention-backend torch_native",
                "use --page-size 1 or one of those backends",
            )
        ],
        [],
    ),
    "flex_attention": (
        [
            (
                "backend_no_spec",
                "the flex_attention backend rejects speculative decoding",
                "use another --attention-backend",
            )
        ],
        [],
    ),
    "flex_attention_prefill_and_decode": (
        [
            (
                "backend_no_spec",
                "the flex_attention backend rejects speculative decoding",
                "use another --attention-backend",
            )
        ],
        [],
    ),
    "tree_paged_torch_native_prefill_and_decode": (
        [
            (
                "backend_page_tree",
                "--speculative-eagle-topk 4 with --page-size 16 is only supported on flashinfer, fa3, triton; got --attention-backend torch_native",
                "use --page-size 1 or one of those backends",
            )
        ],
        [],
    ),
    "eagle3_topk_without_steps_trtllm_mha": (
        [
            (
                "incomplete_triple",
                "--speculative-num-steps is unset while --speculative-eagle-topk or --speculative-num-draft-tokens is given: SGLang 0.5.23 stops with a bare AssertionError (it only picks defaults when all three are unset)",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_steps_without_topk_rejection_sampling": (
        [
            (
                "incomplete_triple",
                "--speculative-num-steps without --speculative-eagle-topk: SGLang 0.5.23 fails with TypeError ('>' not supported between 'NoneType' and 'int')",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_steps_zero_rejection_sampling": (
        [
            (
                "nonpositive",
                "--speculative-num-steps 0 and --speculative-eagle-topk 1 must both be >= 1",
                "use steps >= 1 and topk >= 1 (steps 0 means no speculation: drop the speculative flags instead)",
            )
        ],
        [],
    ),
    "eagle3_tree_without_draft_tokens_trtllm_mha": (
        [
            (
                "incomplete_triple",
                "--speculative-eagle-topk 4 without --speculative-num-draft-tokens: SGLang resolves it and crashes later while sizing the verify tree",
                "give --speculative-num-steps, --speculative-eagle-topk and --speculative-num-draft-tokens together",
            )
        ],
        [],
    ),
    "eagle3_without_draft_tree_too_many": (
        [
            (
                "eagle3_without_draft",
                "--speculative-algorithm EAGLE3 without --speculative-draft-model-path on a target with no built-in MTP draft layer (DeepseekV3ForCausalLM): the server fails at load",
                "add --speculative-draft-model-path DIR pointing at the converted EAGLE3 drafter",
            )
        ],
        [],
    ),
    "eagle_without_draft_llama_tree_too_many": (
        [
            (
                "missing_draft",
                "--speculative-algorithm EAGLE without --speculative-draft-model-path on a LlamaForCausalLM target: SGLang accepts it and crashes at load",
                "add --speculative-draft-model-path DIR",
            )
        ],
        [],
    ),
    "eagle_with_eagle3_draft_tree_too_many": (
        [
            (
                "eagle3_draft_with_eagle",
                "the draft's config says LlamaForCausalLMEagle3 (an EAGLE3 draft) but the algorithm is EAGLE: SGLang runs it without error and every draft is rejected (acceptance length exactly 1.0)",
                "use --speculative-algorithm EAGLE3",
            ),
            (
                "draft_tokens_exceed_tree",
                "--speculative-num-draft-tokens 8 is more than the draft tree has nodes (steps * topk + 1 = 2 * 3 + 1 = 7)",
                "use at most 7 draft tokens, or more steps/topk",
            ),
        ],
        [],
    ),
    "trtllm_mha_topk2": (
        [
            (
                "backend_needs_chain",
                "the trtllm_mha attention backend only supports --speculative-eagle-topk 1",
                "use topk 1 or another attention backend",
            )
        ],
        [],
    ),
    "tree_topk2_paged_torch_native": (
        [
            (
                "backend_page_tree",
                "--speculative-eagle-topk 2 with --page-size 16 is only supported on flashinfer, fa3, triton; got --attention-backend torch_native",
                "use --page-size 1 or one of those backends",
            )
        ],
        [],
    ),
    "tree_page2_torch_native": (
        [
            (
                "backend_page_tree",
                "--speculative-eagle-topk 4 with --page-size 2 is only supported on flashinfer, fa3, triton; got --attention-backend torch_native",
                "use --page-size 1 or one of those backends",
            )
        ],
        [],
    ),
    "rejection_sampling_tree_threshold": (
        [
            (
                "rejection_sampling",
                "--speculative-use-rejection-sampling: it needs --speculative-eagle-topk 1; it ignores the accept thresholds, which must stay 1.0",
                "drop --speculative-use-rejection-sampling or meet its conditions",
            ),
            (
                "rejection_sampling_draft_vocab",
                "--speculative-use-rejection-sampling needs draft vocab == target vocab (32000 != 163840)",
                "drop --speculative-use-rejection-sampling, or use a draft with the target's full vocab",
            ),
        ],
        [],
    ),
    "rejection_sampling_tree": (
        [
            (
                "rejection_sampling",
                "--speculative-use-rejection-sampling: it needs --speculative-eagle-topk 1",
                "drop --speculative-use-rejection-sampling or meet its conditions",
            ),
            (
                "rejection_sampling_draft_vocab",
                "--speculative-use-rejection-sampling needs draft vocab == target vocab (32000 != 163840)",
                "drop --speculative-use-rejection-sampling, or use a draft with the target's full vocab",
            ),
        ],
        [],
    ),
    "rejection_sampling_reduced_vocab": (
        [
            (
                "rejection_sampling_draft_vocab",
                "--speculative-use-rejection-sampling needs draft vocab == target vocab (32000 != 163840)",
                "drop --speculative-use-rejection-sampling, or use a draft with the target's full vocab",
            )
        ],
        [],
    ),
    "rejection_sampling_threshold": (
        [
            (
                "rejection_sampling",
                "--speculative-use-rejection-sampling: it ignores the accept thresholds, which must stay 1.0",
                "drop --speculative-use-rejection-sampling or meet its conditions",
            )
        ],
        [],
    ),
    "rejection_sampling_acc_threshold": (
        [
            (
                "rejection_sampling",
                "--speculative-use-rejection-sampling: it ignores the accept thresholds, which must stay 1.0",
                "drop --speculative-use-rejection-sampling or meet its conditions",
            )
        ],
        [],
    ),
    "rejection_sampling_standalone": (
        [
            (
                "rejection_sampling",
                "--speculative-use-rejection-sampling: it supports EAGLE/EAGLE3 only",
                "drop --speculative-use-rejection-sampling or meet its conditions",
            )
        ],
        [],
    ),
}


def _resolve(case: Case, tmp_path: Path) -> tuple[Resolution, dict[str, list[Finding]]]:
    res = builtin_resolve(parse_launch_args(materialize(case, tmp_path)))
    return res, {"errors": res.errors, "warnings": res.warnings}


def _expected(case: Case, tmp_path: Path) -> dict[str, list[Finding]]:
    errors, warnings = FINDINGS.get(case.id, ([], []))
    return {
        kind: [
            Finding(code, message.replace(PLACEHOLDER, str(tmp_path)), suggestion)
            for code, message, suggestion in found
        ]
        for kind, found in (("errors", errors), ("warnings", warnings))
    }


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_rules_give_sglangs_verdict_and_the_documented_findings_when_case_resolved(
    case: Case, tmp_path: Path
) -> None:
    """SGLang refuses -> refused; SGLang runs -> refused only by a stricter rule, or the same effective
    config (the adjusted values and the draft model it loads included); and the findings read exactly as documented."""
    res, found = _resolve(case, tmp_path)
    assert found == _expected(case, tmp_path)
    sglang = VERDICTS[case.id]
    codes = {f.code for f in res.errors}
    if "refused" in sglang:
        assert codes or case.id in HARDWARE_REFUSALS, f"SGLang refused {case.id} ({sglang['refused']})"
    elif codes:
        assert codes <= STRICTER_RULES, f"SGLang runs {case.id}; refused by {codes}"
    elif not any(w.code == "not_modelled" for w in res.warnings):
        assert res.effective.as_dict() == sglang["effective"]
        assert placeholders(res.draft_path, tmp_path) == sglang["draft_path"]
        reason = sglang["adaptive_fallback_reason"]
        fallback = [w.message for w in res.warnings if w.code == "adaptive_fallback"]
        assert [f": {reason};" in m for m in fallback] == ([] if reason is None else [True])


def test_corpus_has_each_kind_of_verdict_when_recorded() -> None:
    """The recorded verdicts mix refusals, stricter-rule refusals and agreements (no empty branch)."""
    refused = [k for k, v in VERDICTS.items() if "refused" in v]
    stricter = [k for k, v in VERDICTS.items() if "refused" not in v and FINDINGS.get(k, ([], []))[0]]
    agreed = [k for k, v in VERDICTS.items() if "refused" not in v and not FINDINGS.get(k, ([], []))[0]]
    assert sorted(VERDICTS) == sorted(case.id for case in CASES)
    assert min(len(refused), len(stricter), len(agreed)) >= 10, (refused, stricter, agreed)
    assert len([v for v in VERDICTS.values() if v.get("adaptive_fallback_reason")]) >= 4


def test_requested_params_are_the_given_flags_only_when_defaults_exist() -> None:
    """A default SGLang would pick is not a request; NEXTN and lower case are one algorithm, not an
    adjustment; --speculative-adaptive unset is off."""
    launch = parse_launch_args(["--model-path", "dummy", "--speculative-algorithm", "nextn",
                                "--speculative-num-steps", "2"])  # fmt: skip
    assert requested_params(launch) == SpecParams(speculative_algorithm="nextn", speculative_num_steps=2)
    assert requested_params(launch).as_dict() == {
        "speculative_algorithm": "nextn", "speculative_num_steps": 2, "speculative_eagle_topk": None,
        "speculative_num_draft_tokens": None, "max_running_requests": None, "speculative_adaptive": False,
    }  # fmt: skip
    assert SpecParams.from_mapping({"speculative_adaptive": 1}).speculative_adaptive is True
    assert [normalize_algorithm(n) for n in (None, "nextn", "Eagle3", "ngram")] == [
        None,
        "EAGLE",
        "EAGLE3",
        "NGRAM",
    ]


def test_read_model_config_is_none_when_not_a_readable_config_dir(tmp_path: Path) -> None:
    """Only a directory with a parseable config.json counts; anything else skips the target's rules."""
    assert read_model_config(str(FIXTURES / "llama-target"))["vocab_size"] == 128256
    (tmp_path / "config.json").write_text("{not json")
    assert [read_model_config(p) for p in (None, "", str(tmp_path), str(tmp_path / "missing"))] == [None] * 4


@pytest.mark.parametrize("poison", ["9" * 5000, "[" * 100_000 + "]" * 100_000], ids=["5000_digits", "deep"])
def test_rules_treat_a_config_as_unreadable_when_it_holds_a_huge_integer_or_deep_nesting(
    poison: str, tmp_path: Path
) -> None:
    """A target config.json or adaptive config that Python's parser cannot hold (an integer past its digit
    limit, nesting past its depth) is unreadable like malformed JSON: the target's rules are skipped with a
    warning and the adaptive config is refused naming its line; no ValueError or RecursionError escapes."""
    (tmp_path / "config.json").write_text('{"hostile": ' + poison + "}")
    adaptive = tmp_path / "adaptive.json"
    adaptive.write_text('{"1": {"candidate_steps": [1, ' + poison + "]}}")
    argv = ["--model-path", str(tmp_path), "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "/models/drafter", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1", "--speculative-adaptive",
            "--speculative-adaptive-config", str(adaptive)]  # fmt: skip
    res = builtin_resolve(parse_launch_args(argv))
    assert [w.code for w in res.warnings] == ["target_config_unreadable"]
    assert [e.code for e in res.errors] == ["adaptive_config"]
    assert f"{adaptive}: " in res.errors[0].message and "line 1 column" in res.errors[0].message


def test_unreadable_target_is_a_warning_and_dummy_is_not_when_model_path_has_no_config() -> None:
    """A real path without config.json names the path and the fix; SGLang's ``dummy`` model is silent;
    target_config_dir stands in for a path that exists only on the GPU nodes."""
    tail = [
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
    ]
    res = builtin_resolve(parse_launch_args(["--model-path", "/models/Kimi-K2", *tail]))
    assert res.warnings == [
        Finding(
            "target_config_unreadable",
            "no config.json under '/models/Kimi-K2': rules that depend on the target's architecture are skipped",
            "pass the directory holding the target's config.json (weights are not needed)",
        )
    ]
    assert res.errors[0].code == "eagle3_without_draft" and "(unknown architecture)" in res.errors[0].message
    assert builtin_resolve(parse_launch_args(["--model-path", "dummy"])).warnings == []
    stand_in = builtin_resolve(
        parse_launch_args(["--model-path", "/models/Kimi-K2", *tail]),
        target_config_dir=str(FIXTURES / "kimi-k2-mtp"),
    )
    assert (stand_in.errors, [w.code for w in stand_in.warnings]) == ([], ["eagle3_uses_mtp_layer"])


def test_adaptive_candidate_steps_are_every_thresholds_steps_when_merged() -> None:
    """SGLang sizes its buffers by every threshold's steps together; shared defaults are not thresholds."""
    config = {"1": {"candidate_steps": [7, 3]}, "16": {"candidate_steps": [0, 3]}, "ema_alpha": 0.2}
    assert adaptive_candidate_steps(config) == [0, 3, 7]


def test_draft_rules_are_skipped_when_draft_config_exists_only_on_the_gpu_nodes() -> None:
    """A plan names the drafter's path on the nodes: with the target's config given locally and no
    local draft config, the launch passes (the draft's architecture and vocab are not guessed)."""
    argv = ["--model-path", "/models/Kimi-K2", "--speculative-algorithm", "EAGLE3",
            "--speculative-draft-model-path", "/models/drafter", "--speculative-num-steps", "3",
            "--speculative-eagle-topk", "1"]  # fmt: skip
    res = builtin_resolve(parse_launch_args(argv), target_config_dir=str(FIXTURES / "kimi-k2"))
    assert (res.errors, res.warnings, res.draft_path) == ([], [], "/models/drafter")
    assert res.effective.speculative_num_draft_tokens == 4
