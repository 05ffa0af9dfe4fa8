"""SGLang 0.5.23's checks of an adaptive speculation config file, as our rules name the problem.

Found by mutation testing: no test gave a file that is not an object, a threshold that is not an
object, an empty step list, or the step 0 (which SGLang accepts: it turns drafting off).
"""

from __future__ import annotations

from typing import Any

import pytest

from workers.sglang.rules import adaptive_config_problem


@pytest.mark.parametrize(
    ("config", "problem"),
    [
        ([1, 2], "the file holds a JSON list, not an object keyed by batch size"),
        ({"1": [1, 2]}, "key '1': candidate_steps must be a non-empty list of integers >= 0, got None"),
        (
            {"1": {"candidate_steps": []}},
            "key '1': candidate_steps must be a non-empty list of integers >= 0, got []",
        ),
        (
            {"1": {"candidate_steps": [1, True]}},
            "key '1': candidate_steps must be a non-empty list of integers >= 0, got [1, True]",
        ),
        (
            {"1": {"candidate_steps": [-1]}},
            "key '1': candidate_steps must be a non-empty list of integers >= 0, got [-1]",
        ),
        ({"ema_alpha": 0.5}, "no batch-size key (a string of digits such as \"1\"); keys are ['ema_alpha']"),
        ({"1": {"candidate_steps": [0, 3]}, "64": {"candidate_steps": [1]}, "ema_alpha": 0.5}, None),
    ],
    ids=["not_object", "entry_not_object", "empty", "bool_step", "negative", "no_threshold", "zero_ok"],
)
def test_adaptive_config_problem_names_what_sglang_refuses_and_accepts_step_zero(
    config: Any, problem: str | None
) -> None:
    assert adaptive_config_problem(config) == problem
