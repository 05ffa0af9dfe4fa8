"""A tiny word-level tokenizer over the simulator's vocabulary, for SGLang's own benchmark client.

``sglang.benchmark.serving`` needs a Hugging Face tokenizer directory. This one maps token id i to
``workers.sim.engine.TOKEN_WORDS[i]`` and splits on whitespace, so prompts it builds from random ids and
the text the simulator streams back tokenize to exactly the counts both sides report. Written at test time
with the stdlib (the format is plain JSON), so it can never drift from the simulator's word list.
"""

from __future__ import annotations

import json
from pathlib import Path

from workers.sim.engine import EOS_TOKEN_ID, TOKEN_WORDS


def write_word_tokenizer(directory: Path) -> Path:
    """Write tokenizer.json + tokenizer_config.json into ``directory``; return it."""
    directory.mkdir(parents=True, exist_ok=True)
    specials = {"[EOS]": EOS_TOKEN_ID, "[UNK]": EOS_TOKEN_ID + 1}
    vocab = {word: i for i, word in enumerate(TOKEN_WORDS)} | specials
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {
                "id": token_id,
                "content": content,
                "single_word": False,
                "lstrip": False,
                "rstrip": False,
                "normalized": False,
                "special": True,
            }
            for content, token_id in specials.items()
        ],
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "[UNK]"},
    }
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "eos_token": "[EOS]",
        "unk_token": "[UNK]",
        "model_max_length": 262144,
    }
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer), encoding="utf-8")
    (directory / "tokenizer_config.json").write_text(json.dumps(config), encoding="utf-8")
    return directory
