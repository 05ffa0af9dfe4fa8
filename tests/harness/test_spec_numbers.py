"""Numbers a sweep cannot use are refused when the spec is read: non-finite floats anywhere (a NaN mix
weight once passed `plan` and failed every job mid-sweep), integers beyond 64 bits and nesting too deep
for the parser, each in one line naming where, with exit 2."""

from __future__ import annotations

import math
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any, Union, get_args, get_origin

import pytest
from pydantic import BaseModel, ValidationError

from harness.cli import main
from harness.spec import SweepSpec

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
HEAD = "engine: sim\nmodel_path: /models/target\n"
LOAD = "load:\n  concurrency: [1]\n  requests_per_level: 2\n"


def _plan(spec: Path) -> list[str]:
    """`specsweep plan` that validates with the built-in rules against a local target config."""
    return ["plan", str(spec), "--builtin-only", "--target-config", str(FIXTURES / "llama-target")]


def _models_in(annotation: Any) -> Iterator[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        yield annotation
    for arg in get_args(annotation):
        yield from _models_in(arg)


def _spec_models() -> set[type[BaseModel]]:
    """Every model a sweep spec is built from, nested and inside unions, lists and dicts."""
    seen: set[type[BaseModel]] = set()
    todo: list[type[BaseModel]] = [SweepSpec]
    while todo:
        model = todo.pop()
        if model not in seen:
            seen.add(model)
            todo.extend(m for f in model.model_fields.values() for m in _models_in(f.annotation))
    return seen


def _non_finite_value(annotation: Any) -> Any:
    """A value of ``annotation``'s shape holding an infinity where a float goes; None if it has no float."""
    origin, args = get_origin(annotation), get_args(annotation)
    if annotation is float:
        return math.inf
    if origin is Annotated:
        return _non_finite_value(args[0])
    if origin in (Union, types.UnionType):
        return next((v for v in map(_non_finite_value, args) if v is not None), None)
    if origin in (list, tuple) and args:
        inner = _non_finite_value(args[0])
        return None if inner is None else [inner]
    if origin is dict:
        inner = _non_finite_value(args[1])
        return None if inner is None else {"key": inner}
    return None


def test_spec_models_refuse_non_finite_numbers_when_any_float_field_holds_one() -> None:
    """Every float field of every spec model (nested, optional, in a list or as a dict value) refuses an
    infinity as not finite, whatever its bounds say (``gt=0`` alone lets ``inf`` through)."""
    checked = []
    for model in _spec_models():
        for name, field in model.model_fields.items():
            value = _non_finite_value(field.annotation)
            if value is None:
                continue
            with pytest.raises(ValidationError) as caught:
                model.model_validate({name: value})
            kinds = {e["type"] for e in caught.value.errors() if e["loc"][:1] == (name,)}
            assert kinds == {"finite_number"}, f"{model.__name__}.{name}: {kinds}"
            checked.append(f"{model.__name__}.{name}")
    assert len(checked) >= 20 and "PromptSetWorkload.mix" in checked and "SweepSpec.deploy_weights" in checked


@pytest.mark.parametrize(
    ("yaml_text", "path"),
    [
        (
            "load:\n  concurrency: [1]\n  requests_per_level: 2\n  workload:\n    kind: prompt_set\n"
            "    path: PROMPTS\n    max_tokens: 8\n    mix: {chat: NaN, code: 1}\n",
            "load.workload.prompt_set.mix.chat",
        ),
        ("load:\n  rates: [.inf]\n  requests_per_level: 2\n", "load.rates.0"),
        (LOAD + "deploy_weights: {concurrency=1: .nan}\n", "deploy_weights.concurrency=1"),
        (LOAD + "timeouts: {startup_s: .inf}\n", "timeouts.startup_s"),
    ],
    ids=["mix_nan", "rate_inf", "deploy_weight_nan", "startup_inf"],
)
def test_plan_refuses_a_non_finite_number_naming_its_path_when_the_spec_holds_one(
    yaml_text: str, path: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A NaN or infinity (YAML ``.nan``/``.inf``, or the strings ``NaN``/``Infinity``) is refused by `plan`
    with exit 2 and the field's dotted path, before any job exists."""
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text('{"prompt": "hi", "category": "chat"}\n{"prompt": "code", "category": "code"}\n')
    spec = tmp_path / "sweep.yaml"
    spec.write_text(HEAD + yaml_text.replace("PROMPTS", str(prompts)))
    assert main(_plan(spec)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and f"{path}: Input should be a finite number" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["prompts.jsonl", "sweep.yaml"]


@pytest.mark.parametrize(
    ("tail", "line"),
    [
        ("seed: " + "9" * 5000 + "\n", 6),
        ("seed: " + ":".join(["1"] * 3000) + "\n", 6),  # YAML 1.1 base 60: a huge int from few digits
        ("seed: 9223372036854775808\n", 6),
        ("base_args: " + "[" * 5000 + "]" * 5000 + "\n", 6),
    ],
    ids=["5000_digits", "sexagesimal", "just_past_int64", "deep_nesting"],
)
def test_plan_names_the_line_when_the_spec_holds_a_huge_integer_or_deep_nesting(
    tail: str, line: int, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """An integer beyond 64 bits or nesting past the parser's depth is a YAML error naming the file and the
    line (exit 2), not a ValueError or RecursionError traceback."""
    spec = tmp_path / "sweep.yaml"
    spec.write_text(HEAD + LOAD + tail)
    assert main(_plan(spec)) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and str(spec) in err and f"(line {line}, column " in err
    assert len(err.splitlines()) == 2  # the problem, then the fix
