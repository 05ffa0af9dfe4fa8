"""The launch rules read a multimodal target's language model from ``text_config`` (Kimi-K2.5).

KimiK25ForConditionalGeneration keeps vocab_size and the layer count under text_config; a rule that
read the top level would see no vocab and silently skip the draft/target vocab check.
"""

from __future__ import annotations

import json
from pathlib import Path

from workers.sglang import builtin_resolve, parse_launch_args

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
KIMI_K25 = FIXTURES / "kimi-k25"


def _resolve(draft: Path) -> list[str]:
    argv = [
        "--model-path",
        "/models/Kimi-K2.5",
        "--tp-size",
        "8",
        "--trust-remote-code",
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        "/models/drafter",
        "--speculative-num-steps",
        "3",
        "--speculative-eagle-topk",
        "1",
        "--speculative-num-draft-tokens",
        "4",
    ]
    res = builtin_resolve(
        parse_launch_args(argv), target_config_dir=str(KIMI_K25), draft_config_dir=str(draft)
    )
    return [finding.code for finding in res.errors]


def test_kimi_k25_fixture_is_a_multimodal_wrapper_when_read() -> None:
    """The fixture is shaped like Kimi-K2.5: the wrapper architecture, the text model under text_config."""
    config = json.loads((KIMI_K25 / "config.json").read_text())
    assert config["architectures"] == ["KimiK25ForConditionalGeneration"]
    assert "vocab_size" not in config and config["text_config"]["vocab_size"] == 163840


def test_rules_refuse_draft_vocab_mismatch_when_target_vocab_sits_in_text_config(tmp_path: Path) -> None:
    """A draft whose vocab_size is not the wrapped target's is refused; the matching draft passes."""
    draft = json.loads((FIXTURES / "eagle3-draft" / "config.json").read_text())
    assert "draft_vocab_mismatch" not in _resolve(FIXTURES / "eagle3-draft")
    (tmp_path / "config.json").write_text(json.dumps(draft | {"vocab_size": 128256}))
    assert "draft_vocab_mismatch" in _resolve(tmp_path)
