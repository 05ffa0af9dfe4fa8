"""SGLang 0.5.23's side of the lossless check: which launches are lossy by design, and the greedy request
whose output token ids the check compares.

Speculative decoding verifies every draft token against the target, so at temperature 0 its output should
be the target's own greedy output. Two server arguments relax that verification
(``srt/arg_groups/fields/spec.py``): ``--speculative-accept-threshold-single`` accepts a draft token whose
target probability is above it, ``--speculative-accept-threshold-acc`` raises a draft token's acceptance
probability from p to min(1, p / acc); both default to 1.0, exact verification. SGLang itself demands both
at 1.0 wherever it needs exact verification (rejection sampling, the UNO tree mode:
``srt/arg_groups/speculative_hook.py``). A speculative launch with either below 1.0 is lossy by design: the
plan marks it before anything runs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from workers.sglang import api
from workers.sglang.flags import ArgvError, parse_launch_args

# Each accept threshold flag and its resolved name; 1.0 (the default) is exact verification.
ACCEPT_THRESHOLDS: tuple[tuple[str, str], ...] = (
    ("--speculative-accept-threshold-single", "speculative_accept_threshold_single"),
    ("--speculative-accept-threshold-acc", "speculative_accept_threshold_acc"),
)
EXACT_THRESHOLD = 1.0


def lossy_by_design(args: Sequence[str], *, speculative: bool) -> str | None:
    """Why a launch is lossy before it runs (an accept threshold below 1.0), or None. A launch without
    speculative decoding has no draft to accept; one SGLang's parser would refuse is judged when it starts."""
    if not speculative:
        return None
    try:
        values = parse_launch_args(list(args)).values
    except ArgvError:
        return None
    below = [
        f"{flag} {values[dest]:g}"
        for flag, dest in ACCEPT_THRESHOLDS
        if values.get(dest) is not None and values[dest] < EXACT_THRESHOLD
    ]
    if not below:
        return None
    return f"{' and '.join(below)} below {EXACT_THRESHOLD:.1f} accepts drafts the target would not pick"


def greedy_request(prompt: str, max_new_tokens: int) -> dict[str, Any]:
    """A non-streaming /generate body for ``prompt`` at temperature 0 (greedy), stopping at EOS or
    ``max_new_tokens``."""
    return {
        api.GENERATE_TEXT: prompt,
        api.GENERATE_SAMPLING_PARAMS: {
            api.SAMPLING_TEMPERATURE: 0.0,
            api.SAMPLING_MAX_NEW_TOKENS: max_new_tokens,
        },
    }


def output_ids(response: Any) -> list[int]:
    """The generated token ids of a non-streaming /generate answer; ValueError when it has none."""
    ids = response.get(api.GENERATE_OUTPUT_IDS) if isinstance(response, dict) else None
    if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
        raise ValueError(f"the /generate answer has no {api.GENERATE_OUTPUT_IDS!r} list of token ids")
    return ids
