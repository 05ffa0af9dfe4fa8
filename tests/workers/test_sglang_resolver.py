"""The bridge to SGLang's resolver costs only what it must: SGLang starts when a launch is for it to judge,
and ends as soon as its caller is done with it."""

from __future__ import annotations

import time
from pathlib import Path

from workers.sglang import SGLangResolver, validate_many

FIXTURES = Path(__file__).parent.parent / "fixtures"
CLOSE_BOUND_S = 2.0
# Importing SGLang took 14-34 s on this 2-core box at load averages of 9 to 11; reading its package
# metadata 0.3 s.
NOT_STARTED_BOUND_S = 5.0


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


def test_validate_many_answers_without_starting_sglang_when_no_launch_has_a_local_target(
    sglang_python: str,
) -> None:
    """Launches whose --model-path has no config.json here (paths on the GPU nodes) are judged by the
    built-in rules alone, so SGLang is not started for them: the answer comes in under 5 s, each report
    still labelled with SGLang's installed version and saying its resolver was not run."""
    launches = [["--model-path", f"/models/Kimi-K2.5-{n}", "--tp-size", "8"] for n in range(2)]
    started = time.monotonic()
    reports = validate_many(launches, sglang_python=sglang_python)
    took_s = time.monotonic() - started
    assert [r.status for r in reports] == ["ok", "ok"]
    assert all(r.layers["sglang 0.5.23"].startswith("not run") for r in reports), reports
    assert took_s < NOT_STARTED_BOUND_S
