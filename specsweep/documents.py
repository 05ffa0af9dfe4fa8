"""JSON and YAML from outside the project (specs, model configs, shard indexes, prompt files), parsed so
that every problem comes out as the parser's own syntax error, with a position.

The standard parsers let two kinds of input escape as other exceptions: an integer longer than Python's
int-to-string limit (``ValueError``, 4300 digits by default) and nesting deeper than the interpreter's
stack (``RecursionError``). Every caller already turns a syntax error into a one-line ``SpecsweepError``
naming the file, so these are raised as that same error type (``json.JSONDecodeError``, a
``yaml.MarkedYAMLError``) and need no handling of their own. YAML is also held to integers that fit 64
bits (what SQLite, Arrow and the job payloads store; a YAML 1.1 sexagesimal ``1:2:3:...`` builds a huge
integer without a long digit string) and to ``MAX_DEPTH`` levels of nesting.
"""

from __future__ import annotations

import functools
import json
import re
import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import yaml

MAX_DEPTH = 100  # a sweep spec nests 5 levels; YAML's composer recurses twice per level, 1000 at most
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def load_json(data: str | bytes) -> Any:
    """``json.loads``, with an over-long integer or too-deep nesting raised as ``json.JSONDecodeError``."""
    try:
        return json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError):  # callers report these as they always have
        raise
    except ValueError as err:  # the int-to-string limit: nothing else in the decoder raises ValueError
        text, limit = _text(data), sys.get_int_max_str_digits()
        digits = re.search(rf"\d{{{limit + 1},}}", text)
        raise json.JSONDecodeError(
            f"an integer longer than {limit} digits",
            text,
            digits.start() if digits else 0,
        ) from err
    except RecursionError:
        text = _text(data)
        raise json.JSONDecodeError(
            f"arrays or objects nested too deep to read (past {MAX_DEPTH} levels here)",
            text,
            _depth_passed(text, MAX_DEPTH),
        ) from None


def _text(data: str | bytes) -> str:
    """The text ``json.loads`` decoded (only on the error path: for the error's line and column)."""
    if isinstance(data, str):
        return data
    return data.decode(json.detect_encoding(data), "surrogatepass")


def _depth_passed(text: str, limit: int) -> int:
    """Index of the bracket that first nests arrays and objects deeper than ``limit`` (strings skipped)."""
    depth = 0
    in_string = escaped = False
    for index, char in enumerate(text):
        if in_string:
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = True
            elif char == '"':
                in_string = False
        elif char == '"':
            in_string = True
        elif char in "[{":
            depth += 1
            if depth > limit:
                return index
        elif char in "]}":
            depth -= 1
    return 0


def load_yaml(text: str) -> Any:
    """``yaml.safe_load``, with an integer beyond 64 bits or nesting deeper than ``MAX_DEPTH`` raised
    as a ``yaml.MarkedYAMLError`` at the offending node."""
    import yaml

    return yaml.load(text, Loader=_bounded_loader())  # a SafeLoader subclass


def yaml_problem(err: yaml.YAMLError) -> str:
    """A YAML error as one line: the problem and where it is (PyYAML's own text spans several lines)."""
    import yaml

    if not isinstance(err, yaml.MarkedYAMLError) or err.problem is None:
        return " ".join(str(err).split())
    mark = err.problem_mark
    where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else ""
    return f"{err.problem}{where}"


@functools.cache
def _bounded_loader() -> type[yaml.SafeLoader]:
    """A SafeLoader that refuses what would break later: huge integers and nesting near the stack limit."""
    import yaml
    from yaml.composer import ComposerError
    from yaml.constructor import ConstructorError

    class BoundedLoader(yaml.SafeLoader):
        depth = 0

        def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
            if self.depth >= MAX_DEPTH:
                mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
                raise ComposerError(None, None, f"nested deeper than {MAX_DEPTH} levels", mark)
            self.depth += 1
            try:
                return super().compose_node(parent, index)
            finally:
                self.depth -= 1

        def construct_yaml_int(self, node: yaml.ScalarNode) -> int:
            try:
                value: int = super().construct_yaml_int(node)
            except ValueError:  # more digits than Python converts
                value = INT64_MAX + 1
            if not INT64_MIN <= value <= INT64_MAX:
                raise ConstructorError(None, None, "an integer that does not fit 64 bits", node.start_mark)
            return value

    BoundedLoader.add_constructor("tag:yaml.org,2002:int", BoundedLoader.construct_yaml_int)
    return BoundedLoader
