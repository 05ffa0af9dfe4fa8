"""The bridge to SGLang's resolver ends as soon as its caller is done with it."""

from __future__ import annotations

import time
from pathlib import Path

from workers.sglang import SGLangResolver

FIXTURES = Path(__file__).parent.parent / "fixtures"
CLOSE_BOUND_S = 2.0


def test_resolver_close_returns_at_once_when_sglang_has_answered(sglang_python: str) -> None:
    """Once its last answer is read, closing the bridge takes under 2 s: SGLang's interpreter exits
    without its own teardown of SGLang's and torch's modules, which took 5.8-10.6 s on this 2-core box
    (at load averages of 9 to 11) and was paid by every `plan`, `run`, `validate` and `best --emit`."""
    with SGLangResolver(sglang_python) as resolver:
        result = resolver.resolve(["--model-path", str(FIXTURES / "kimi-k2"), "--tp-size", "8"])
        started = time.monotonic()
        resolver.close()
        closed_s = time.monotonic() - started
    assert result.ok, result
    assert closed_s < CLOSE_BOUND_S
