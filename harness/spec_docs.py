"""``docs/config.md``, generated from the sweep spec's JSON Schema so the reference cannot drift.

``specsweep schema --markdown > docs/config.md`` regenerates it; a test fails when the file differs.
"""

from __future__ import annotations

import json
from typing import Any

from harness.spec import spec_json_schema

HEADER = """# The sweep spec

Generated from the spec's JSON Schema by `specsweep schema --markdown` (a test fails when this file
drifts from the code). `specsweep schema` prints the JSON Schema itself. Unknown keys are errors; a bad
spec is refused with each field's dotted path before anything is written. Examples: `examples/sweep.yaml`
(a one-minute simulated sweep: the README's tour), `examples/demo.yaml` (what `make demo` runs) and
`examples/kimi-k25-eagle3.yaml` (a real cluster).
"""


def _type(prop: dict[str, Any]) -> str:
    """A short type name: refs by model name, unions joined with |, lists as list[...]."""
    if "$ref" in prop:
        return str(prop["$ref"]).rsplit("/", 1)[-1]
    if "anyOf" in prop or "oneOf" in prop:
        return " \\| ".join(_type(p) for p in prop.get("anyOf", prop.get("oneOf", [])))
    if prop.get("type") == "array":
        return f"list[{_type(prop.get('items', {}))}]"
    if prop.get("type") == "object":
        values = prop.get("additionalProperties")
        return f"map[str, {_type(values)}]" if isinstance(values, dict) else "map"
    if "enum" in prop:
        return " \\| ".join(json.dumps(v) for v in prop["enum"])
    if "const" in prop:
        return json.dumps(prop["const"])
    return str(prop.get("type", "any"))


def _default(prop: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    if "default" in prop:
        return f"`{json.dumps(prop['default'])}`"
    kind = _type(prop)
    if kind.startswith("list["):
        return "`[]`"
    if kind.startswith("map"):
        return "`{}`"
    return f"{kind}'s defaults"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _model_section(title: str, model: dict[str, Any]) -> list[str]:
    required = set(model.get("required", []))
    lines = [f"## `{title}`", "", _cell(model.get("description", "")), "", "| field | type | default | meaning |",
             "|---|---|---|---|"]  # fmt: skip
    for name, prop in model.get("properties", {}).items():
        lines.append(
            f"| `{name}` | {_type(prop)} | {_default(prop, name in required)} | {_cell(prop.get('description', ''))} |"
        )
    return [*lines, ""]


def spec_markdown() -> str:
    """The whole reference: the top-level spec, then every nested model in name order."""
    schema = spec_json_schema()
    lines = [HEADER, *_model_section("SweepSpec (top level)", schema)]
    for name, model in sorted(schema.get("$defs", {}).items()):
        lines += _model_section(name, model)
    return "\n".join(lines).rstrip() + "\n"
