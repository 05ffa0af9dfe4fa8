"""SGLang launch arguments the tests start simulated servers with (one copy for every test module)."""

from __future__ import annotations

from pathlib import Path


def chain_launch_args(target: Path, draft: Path, steps: int, *extra: str) -> list[str]:
    """An EAGLE3 chain launch: topk 1, ``steps`` draft steps, ``steps + 1`` draft tokens (as SGLang runs it)."""
    return [
        "--model-path", str(target),
        "--speculative-algorithm", "EAGLE3",
        "--speculative-draft-model-path", str(draft),
        "--speculative-num-steps", str(steps),
        "--speculative-eagle-topk", "1",
        "--speculative-num-draft-tokens", str(steps + 1),
        *extra,
    ]  # fmt: skip
