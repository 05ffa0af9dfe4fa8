"""What a hand-written world's per-depth chances give: the accept length and the histogram a launch of
that world reports. Shared by the search tests' independent truths (each writes its own chances); no
code of harness/search is used, so a bug there cannot hide in the truth."""

from __future__ import annotations

from collections.abc import Sequence


def accept_length_of(chances: Sequence[float]) -> float:
    """Tokens per verify step: 1 (the bonus token) plus the chance of reaching each depth."""
    length, reach = 1.0, 1.0
    for chance in chances:
        reach *= chance
        length += reach
    return length


def histogram_of(chances: Sequence[float], steps: int = 20_000) -> tuple[int, ...]:
    """Verify steps that accepted exactly j drafts, j = 0 .. depth, of ``steps`` steps."""
    reach, counts = 1.0, []
    for chance in chances:
        counts.append(round(steps * reach * (1.0 - chance)))
        reach *= chance
    return (*counts, round(steps * reach))
