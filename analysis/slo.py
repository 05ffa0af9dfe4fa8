"""Service-level objectives: ``"ttft_p99_ms<=2000,tpot_p99_ms<=50"`` parsed into checked clauses.

A malformed SLO names the character where parsing stopped and points at it, so a typo in a long
list is found at a glance; an unknown metric lists the close names.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

from specsweep.errors import ResultsError

OPERATORS: dict[str, str] = {"<=": "at most", ">=": "at least", "<": "below", ">": "above"}
_WHITESPACE = re.compile(r"\s*")
_METRIC = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPERATOR = re.compile(r"<=|>=|<|>")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+)?")


@dataclass(frozen=True)
class Slo:
    """One clause: ``metric op threshold`` must hold at a load level for a config to qualify."""

    metric: str
    op: str
    threshold: float

    def holds(self, value: float | None) -> bool:
        """Whether ``value`` meets the clause; an unknown (null) value never does."""
        if value is None:
            return False
        return {
            "<=": value <= self.threshold,
            ">=": value >= self.threshold,
            "<": value < self.threshold,
            ">": value > self.threshold,
        }[self.op]

    def __str__(self) -> str:
        return f"{self.metric}{self.op}{self.threshold:g}"


def _malformed(text: str, position: int, expected: str, where: str) -> ResultsError:
    pointer = " " * position + "^"
    return ResultsError(
        f"malformed SLO at character {position + 1}: expected {expected}\n  {text}\n  {pointer}",
        where=where,
        fix='write comma-separated clauses METRIC OP NUMBER, e.g. "ttft_p99_ms<=2000,tpot_p99_ms<=50"',
    )


def parse_slos(text: str, known_metrics: tuple[str, ...], *, where: str = "--slo") -> tuple[Slo, ...]:
    """Parse ``text``; raise ResultsError showing the position of the first problem (``where`` names the
    flag or spec field it came from)."""
    if not text.strip():
        return ()
    slos: list[Slo] = []
    pos = 0
    while True:
        metric, pos = _expect(text, pos, _METRIC, "a metric name", where)
        op, pos = _expect(text, pos, _OPERATOR, "one of <=, >=, <, >", where)
        number, pos = _expect(text, pos, _NUMBER, "a number", where)
        check_metric(metric, known_metrics, where=where)
        slos.append(Slo(metric, op, float(number)))
        pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
        if pos == len(text):
            return tuple(slos)
        if text[pos] != ",":
            raise _malformed(text, pos, "',' or the end", where)
        pos += 1


def _expect(text: str, pos: int, token: re.Pattern[str], what: str, where: str) -> tuple[str, int]:
    """The token at ``pos`` (after whitespace) and the position after it, or a positioned error."""
    pos = _WHITESPACE.match(text, pos).end()  # type: ignore[union-attr]
    match = token.match(text, pos)
    if match is None:
        raise _malformed(text, pos, what, where)
    return match.group(), match.end()


def check_metric(name: str, known: tuple[str, ...], *, where: str) -> None:
    """Raise ResultsError naming close matches when ``name`` is not a known metric."""
    if name in known:
        return
    close = difflib.get_close_matches(name, known, n=3, cutoff=0.5)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise ResultsError(
        f"unknown metric {name!r}",
        where=where,
        fix=f"{hint}known metrics: {', '.join(known)}",
    )
