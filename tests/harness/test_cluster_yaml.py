"""cluster.yaml passes the Ray cluster launcher's own validation (offline, no cloud calls)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

CLUSTER_YAML = Path(__file__).resolve().parents[2] / "cluster.yaml"


def _validate(config: dict) -> dict:
    from ray.autoscaler._private.util import prepare_config, validate_config

    prepared = prepare_config(copy.deepcopy(config))
    validate_config(prepared)
    return prepared


def test_cluster_yaml_passes_ray_validator_when_loaded() -> None:
    """Ray 2.60's schema and checks accept the file; GPU nodes declare 8 GPUs as integers."""
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    prepared = _validate(config)
    gpu_nodes = [t for t in prepared["available_node_types"].values() if t["resources"].get("GPU")]
    assert gpu_nodes and all(t["resources"]["GPU"] == 8 for t in gpu_nodes)
    assert any("sglang" in command for command in prepared["setup_commands"])
    assert any("specsweep" in command for command in prepared["setup_commands"])


def test_cluster_yaml_validator_refuses_unknown_key_when_misspelt() -> None:
    """The same validator refuses a misspelt top-level key (so the test above can fail)."""
    config = yaml.safe_load(CLUSTER_YAML.read_text())
    config["setup_comands"] = config.pop("setup_commands")
    with pytest.raises(Exception, match="setup_comands"):
        _validate(config)


def test_cluster_yaml_sets_up_token_auth_when_the_cluster_is_fresh() -> None:
    """On a fresh cluster every node starts with token auth on and holds the head's token: the head
    creates it before Ray starts, the launcher ships that file to each worker, every `ray start` sets
    RAY_AUTH_MODE=token, and docs/cluster.md hands the same token to the submitting client."""
    prepared = _validate(yaml.safe_load(CLUSTER_YAML.read_text()))
    assert any("ray get-auth-token --generate" in command for command in prepared["head_setup_commands"])
    assert "~/.ray/auth_token" in prepared["cluster_synced_files"]
    starts = [
        command
        for key in ("head_start_ray_commands", "worker_start_ray_commands")
        for command in prepared[key]
        if "ray start" in command
    ]
    assert len(starts) == 2 and all(command.startswith("RAY_AUTH_MODE=token ") for command in starts)
    guide = (CLUSTER_YAML.parent / "docs" / "cluster.md").read_text()
    assert "ray rsync-down cluster.yaml /home/ubuntu/.ray/auth_token" in guide
    assert "RAY_AUTH_TOKEN_PATH=" in guide
