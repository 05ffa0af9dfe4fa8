"""SGLang 0.5.23's launch-server flag set, as data, and a parser that reads argv the way SGLang does.

``flags.json`` is generated from SGLang's own argparse parser by ``dump_flags.py`` (a test regenerates it
from the installed SGLang and fails on drift). Parsing mirrors Python 3.11 argparse as SGLang configures
it: ``--flag value`` and ``--flag=value``, unique prefixes accepted, ambiguous prefixes refused, unknown
flags refused with SGLang's usage text and exit code 2. On top of argparse it knows flags SGLang
removed or other engines spell differently, so the error can name the flag to use instead.
"""

from __future__ import annotations

import difflib
import functools
import json
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

from specsweep.errors import InvalidArgumentsError

# Flags SGLang itself used to accept, with what replaces them (exit 2 in 0.5.23).
REMOVED_FLAGS: dict[str, tuple[str, str]] = {
    "--cuda-graph-max-bs": (
        "--cuda-graph-max-bs-decode",
        "removed in SGLang 0.5.x; split into --cuda-graph-max-bs-decode and --cuda-graph-max-bs-prefill",
    ),
    "--speculative-draft": (
        "--speculative-draft-model-path",
        "old spelling; now an ambiguous prefix of several --speculative-draft-* flags",
    ),
}
# Other engines' names (vLLM, TensorRT-LLM) for SGLang settings: the usual source of "unrecognized".
FOREIGN_FLAGS: dict[str, tuple[str, str]] = {
    "--num-speculative-tokens": (
        "--speculative-num-draft-tokens",
        "vLLM's name; SGLang also needs --speculative-num-steps and --speculative-eagle-topk",
    ),
    "--speculative-model": ("--speculative-draft-model-path", "vLLM's name for the draft model"),
    "--speculative-num-tokens": ("--speculative-num-draft-tokens", "not an SGLang flag"),
    "--speculative-topk": ("--speculative-eagle-topk", "not an SGLang flag"),
    "--num-speculative-steps": ("--speculative-num-steps", "not an SGLang flag"),
    "--tensor-parallel-size": ("--tp-size", "vLLM's name; SGLang spells it --tp-size (or --tp)"),
    "--max-num-seqs": ("--max-running-requests", "vLLM's name"),
    "--gpu-memory-utilization": ("--mem-fraction-static", "vLLM's name"),
    "--model": ("--model-path", "vLLM's name"),
}
KNOWN_REPLACEMENTS = {**FOREIGN_FLAGS, **REMOVED_FLAGS}


@dataclass(frozen=True, slots=True)
class Flag:
    """One SGLang option as its argparse action declares it."""

    options: tuple[str, ...]
    dest: str
    kind: str  # "value" (takes arguments), "switch" (store_true/false), "bool_optional" (--x/--no-x)
    nargs: int | str | None
    type: str | None  # "int", "float", "str", or a converter name (treated as str)
    choices: tuple[Any, ...] | None
    default: Any
    deprecated: bool
    help: str

    @property
    def name(self) -> str:
        return self.options[0]


@dataclass(frozen=True)
class FlagTable:
    """All flags of one SGLang version, indexed by option string."""

    sglang_version: str
    prog: str
    flags: tuple[Flag, ...]
    by_option: dict[str, Flag] = field(repr=False)
    by_dest: dict[str, Flag] = field(repr=False)

    def prefix_matches(self, prefix: str) -> list[str]:
        """Option strings starting with ``prefix``, as argparse's abbreviation search finds them."""
        return [opt for opt in self.by_option if opt.startswith(prefix)]

    def suggest(self, option: str, limit: int = 3) -> list[str]:
        """Closest real flags to a misspelt one: known replacements first, then word-set similarity.

        Plain edit distance misses reordered words (``--num-speculative-tokens``), so candidates are
        scored by the overlap of their dash-separated words plus difflib's character ratio.
        """
        if option in KNOWN_REPLACEMENTS:
            return [KNOWN_REPLACEMENTS[option][0]]
        words = set(option.lstrip("-").split("-"))
        scored: list[tuple[float, str]] = []
        for opt in self.by_option:
            if opt.startswith("--no-"):
                continue
            other = set(opt.lstrip("-").split("-"))
            jaccard = len(words & other) / len(words | other)
            ratio = difflib.SequenceMatcher(None, option, opt).ratio()
            score = 0.6 * jaccard + 0.4 * ratio
            if score >= 0.5:
                scored.append((score, opt))
        scored.sort(key=lambda pair: (-pair[0], pair[1]))
        return [opt for _, opt in scored[:limit]]


@functools.cache
def flag_table() -> FlagTable:
    """The packaged flag table (generated from SGLang's parser; see ``dump_flags.py``)."""
    raw = json.loads(resources.files("workers.sglang").joinpath("flags.json").read_text())
    flags = tuple(
        Flag(
            options=tuple(f["options"]),
            dest=f["dest"],
            kind=f["kind"],
            nargs=f["nargs"],
            type=f["type"],
            choices=tuple(f["choices"]) if f["choices"] is not None else None,
            default=f["default"],
            deprecated=f["deprecated"],
            help=f["help"],
        )
        for f in raw["flags"]
    )
    by_option = {opt: flag for flag in flags for opt in flag.options}
    by_dest = {flag.dest: flag for flag in flags}
    return FlagTable(raw["sglang_version"], raw["prog"], flags, by_option, by_dest)


# ---------------------------------------------------------------------------------------------------
# Parsing
# ---------------------------------------------------------------------------------------------------


class ArgvError(InvalidArgumentsError):
    """A launch command SGLang's argparse refuses (exit code 2 before anything loads)."""

    def __init__(self, code: str, problem: str, *, fix: str | None = None, flag: str | None = None):
        super().__init__(problem, fix=fix)
        self.code = code
        self.flag = flag

    def usage_text(self) -> str:
        """What SGLang itself prints on stderr for this mistake (argparse's usage + error lines)."""
        prog = flag_table().prog
        return f"usage: {prog} [-h] [options ...]\n{prog}: error: {self.problem}\n"


@dataclass(frozen=True)
class LaunchArgs:
    """A parsed launch command: every flag's value (defaults filled in) and which ones were given."""

    argv: tuple[str, ...]
    values: dict[str, Any]
    given: frozenset[str]

    def get(self, dest: str) -> Any:
        return self.values[dest]


def _convert(flag: Flag, option: str, raw: str) -> Any:
    converters = {"int": int, "float": float}
    convert = converters.get(flag.type or "", str)
    try:
        value = convert(raw)
    except ValueError:
        raise ArgvError(
            "bad_value",
            f"argument {option}: invalid {flag.type} value: {raw!r}",
            fix=f"give {option} a {flag.type}",
            flag=option,
        ) from None
    if flag.choices is not None and value not in flag.choices:
        choices = ", ".join(repr(c) for c in flag.choices)
        raise ArgvError(
            "bad_value",
            f"argument {option}: invalid choice: {value!r} (choose from {choices})",
            fix=f"use one of the listed values for {option}",
            flag=option,
        )
    return value


def _resolve_option(table: FlagTable, token: str) -> tuple[Flag, str, str | None] | None:
    """argparse's ``_parse_optional``: exact, ``--x=v``, or unique prefix. None means unknown."""
    if token in table.by_option:
        return table.by_option[token], token, None
    option, eq, explicit = token.partition("=")
    if eq and option in table.by_option:
        return table.by_option[option], option, explicit
    matches = table.prefix_matches(option)
    if len(matches) > 1:
        hint = KNOWN_REPLACEMENTS.get(option)
        raise ArgvError(
            "ambiguous_flag",
            f"ambiguous option: {option} could match {', '.join(matches)}",
            fix=f"use {hint[0]} ({hint[1]})" if hint else f"spell the flag out in full: one of {matches[:4]}",
            flag=option,
        )
    if len(matches) == 1:
        return table.by_option[matches[0]], matches[0], explicit if eq else None
    return None


def _unknown_flag_error(table: FlagTable, unknown: list[str]) -> ArgvError:
    option = next((tok.partition("=")[0] for tok in unknown if tok.startswith("-")), None)
    if option is None:
        return ArgvError(
            "unexpected_value",
            f"unrecognized arguments: {' '.join(unknown)}",
            fix="every value must follow its flag; check for a missing flag name or a stray word",
        )
    if option in KNOWN_REPLACEMENTS:
        replacement, why = KNOWN_REPLACEMENTS[option]
        fix = f"use {replacement} ({why})"
        code = "removed_flag" if option in REMOVED_FLAGS else "unknown_flag"
    else:
        suggestions = table.suggest(option)
        fix = f"did you mean {' or '.join(suggestions)}?" if suggestions else "see `sglang serve --help`"
        code = "unknown_flag"
    return ArgvError(code, f"unrecognized arguments: {' '.join(unknown)}", fix=fix, flag=option)


def _take_values(flag: Flag, option: str, argv: list[str], i: int) -> tuple[list[str], int]:
    """Consume the arguments of ``flag`` from argv[i:]; returns (values, next index)."""

    def is_option(tok: str) -> bool:
        return tok.startswith("-") and len(tok) > 1 and not _looks_negative_number(tok)

    nargs = flag.nargs
    if nargs is None or nargs == "?":
        if i < len(argv) and not is_option(argv[i]):
            return [argv[i]], i + 1
        if nargs == "?":
            return [], i
        raise ArgvError(
            "missing_value", f"argument {option}: expected one argument", fix=f"give {option} a value"
        )
    if isinstance(nargs, int):
        values = argv[i : i + nargs]
        if len(values) < nargs or any(is_option(v) for v in values):
            raise ArgvError(
                "missing_value", f"argument {option}: expected {nargs} arguments", fix=f"give {option} values"
            )
        return values, i + nargs
    j = i
    while j < len(argv) and not is_option(argv[j]):
        j += 1
    if nargs == "+" and j == i:
        raise ArgvError(
            "missing_value",
            f"argument {option}: expected at least one argument",
            fix=f"give {option} a value",
        )
    return argv[i:j], j


def _looks_negative_number(token: str) -> bool:
    try:
        float(token)
    except ValueError:
        return False
    return True


def parse_launch_args(argv: list[str] | tuple[str, ...]) -> LaunchArgs:
    """Parse ``python -m sglang.launch_server`` arguments as SGLang 0.5.23 does, without SGLang.

    Raises ``ArgvError`` for everything SGLang's parser exits 2 on.
    """
    table = flag_table()
    argv = list(argv)
    values = {flag.dest: flag.default for flag in table.flags}
    given: set[str] = set()
    unknown: list[str] = []
    i = 0
    while i < len(argv):
        token = argv[i]
        i += 1
        if not (token.startswith("-") and len(token) > 1) or _looks_negative_number(token):
            unknown.append(token)
            continue
        found = _resolve_option(table, token)
        if found is None:
            unknown.append(token)
            continue
        flag, option, explicit = found
        if flag.kind in ("switch", "bool_optional"):
            if explicit is not None:
                raise ArgvError(
                    "bad_value", f"argument {option}: ignored explicit argument {explicit!r}", flag=option
                )
            values[flag.dest] = not option.startswith("--no-") if flag.kind == "bool_optional" else True
            given.add(flag.dest)
            continue
        if explicit is not None:
            raw = [explicit]
        else:
            raw, i = _take_values(flag, option, argv, i)
        converted = [_convert(flag, option, r) for r in raw]
        values[flag.dest] = (
            converted
            if flag.nargs in ("+", "*") or isinstance(flag.nargs, int)
            else (converted[0] if converted else flag.default)
        )
        given.add(flag.dest)
    if unknown:
        raise _unknown_flag_error(table, unknown)
    return LaunchArgs(tuple(argv), values, frozenset(given))
