"""The sweep spec: strict, every field described, errors with dotted paths before anything is written."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from harness.cli import main
from harness.spec import SweepSpec, load_spec, parse_spec, spec_json_schema
from specsweep.errors import SpecError


def minimal(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "engine": "sim",
        "model_path": "/models/target",
        "load": {"concurrency": [1, 8], "requests_per_level": 16},
    }
    data.update(changes)
    return data


def error_of(data: Any) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="sweep.yaml")
    return str(caught.value)


def test_spec_accepts_minimal_and_fills_defaults_when_valid() -> None:
    """A minimal spec gets the documented defaults (8 GPUs per server, baseline on, 2 retries)."""
    spec = parse_spec(minimal())
    assert spec.gpus_per_server == 8 and spec.baseline and spec.retries == 2 and spec.repeats == 1
    assert spec.load.workload.kind == "random_ids"


def test_spec_names_every_bad_field_with_dotted_path_when_invalid() -> None:
    """Each problem is reported with its dotted path and what is expected."""
    data = minimal(
        load={"concurrency": [0], "requests_per_level": 4},
        env={"NCCL_IB_DISABLE": 1},
        gpus_per_serverr=8,
    )
    message = error_of(data)
    assert "load.concurrency.0: Input should be greater than or equal to 1" in message
    assert "env.NCCL_IB_DISABLE: Input should be a valid string (quote it: '1')" in message
    assert "gpus_per_serverr: unknown key" in message
    assert message.startswith("sweep.yaml: ")


def test_spec_refuses_partial_grid_when_a_list_is_missing() -> None:
    """steps, topk and draft tokens go together (SGLang crashes on a partial triple)."""
    message = error_of(minimal(speculative={"num_steps": [3], "topk": [1]}))
    assert "speculative: num_steps, topk given without num_draft_tokens" in message


def test_spec_refuses_flags_the_sweep_owns_when_in_base_args() -> None:
    """--port, --model-path and the speculative flags come from the sweep, not base_args."""
    assert "base_args: --speculative-num-steps is set by the sweep" in error_of(
        minimal(base_args=["--tp-size", "8", "--speculative-num-steps=3"])
    )


def test_spec_refuses_load_plan_when_size_is_ambiguous() -> None:
    """Exactly one of requests_per_level and duration_s."""
    message = error_of(minimal(load={"concurrency": [1], "requests_per_level": 4, "duration_s": 10}))
    assert "load: give exactly one of `requests_per_level` and `duration_s`" in message


def test_spec_refuses_empty_sweep_when_no_grid_and_no_baseline() -> None:
    """A sweep with nothing to run is refused."""
    assert "nothing to run" in error_of(minimal(baseline=False))


def test_spec_loader_reports_yaml_errors_when_file_is_malformed(tmp_path: Path) -> None:
    """Broken YAML is a SpecError naming the file, not a traceback."""
    path = tmp_path / "sweep.yaml"
    path.write_text("engine: sim\nload: [unclosed\n")
    with pytest.raises(SpecError) as caught:
        load_spec(path)
    assert str(path) in str(caught.value) and "not valid YAML" in str(caught.value)


def test_spec_sweep_id_ignores_output_dir_when_hashing() -> None:
    """The sweep id names what is measured: same spec, other output dir, same id; other load, other id."""
    a = parse_spec(minimal(output_dir="a"))
    assert a.sweep_id() == parse_spec(minimal(output_dir="b")).sweep_id()
    assert a.sweep_id() != parse_spec(minimal(load={"concurrency": [2], "requests_per_level": 16})).sweep_id()


def _fields_without_description(schema: dict[str, Any]) -> list[str]:
    missing = []
    for name, definition in [("SweepSpec", schema), *schema.get("$defs", {}).items()]:
        for field, body in definition.get("properties", {}).items():
            if not body.get("description"):
                missing.append(f"{name}.{field}")
    return missing


def test_spec_schema_describes_every_field_when_printed(capsys: pytest.CaptureFixture[str]) -> None:
    """`specsweep schema` prints the JSON Schema; every field of every model has a description."""
    assert main(["schema"]) == 0
    schema = json.loads(capsys.readouterr().out)
    assert schema == spec_json_schema()
    assert _fields_without_description(schema) == []
    assert set(SweepSpec.model_fields) <= set(schema["properties"])


def test_spec_is_frozen_when_built() -> None:
    """Specs cannot be changed after validation."""
    spec = parse_spec(minimal())
    with pytest.raises(Exception, match="frozen"):
        spec.retries = 5  # type: ignore[misc]
