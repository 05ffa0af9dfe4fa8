"""Sequential levels: when a closed-loop level has measured its throughput precisely enough to stop.

A closed loop of ``N`` streams delivers ``N x sum(tokens) / sum(latency)`` output tokens per second
(Little's law), so the uncertainty of its throughput is that of a ratio of two sums over requests. The
delta method gives the ratio's relative standard error as ``sd(t_i / mean(t) - e_i / mean(e)) / sqrt(n)``;
the level may stop once the 95% interval, ``2 x 1.96`` of that, is narrower than the target fraction.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z95 = 1.96
MIN_REQUESTS = 10  # and at least MIN_ROUNDS requests per stream, so every stream has cycled a few times
MIN_ROUNDS = 3


def relative_width(tokens: Sequence[float], latencies: Sequence[float]) -> float:
    """Width of the 95% interval of a closed loop's throughput, as a fraction of it (inf: too few)."""
    n = len(tokens)
    if n < 2:
        return math.inf
    mean_t, mean_e = sum(tokens) / n, sum(latencies) / n
    if mean_t <= 0 or mean_e <= 0:
        return math.inf
    d = [t / mean_t - e / mean_e for t, e in zip(tokens, latencies, strict=True)]
    mean_d = sum(d) / n
    sd = math.sqrt(sum((x - mean_d) ** 2 for x in d) / (n - 1))
    return 2 * Z95 * sd / math.sqrt(n)


def precise_enough(tokens: Sequence[float], latencies: Sequence[float], streams: int, target: float) -> bool:
    """Whether a closed loop of ``streams`` may stop: enough requests, and a narrow enough interval."""
    if len(tokens) < max(MIN_REQUESTS, MIN_ROUNDS * streams):
        return False
    return relative_width(tokens, latencies) <= target
