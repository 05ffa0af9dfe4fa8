"""Servers over several nodes, before anything runs: the spec's rules and the validator's (SGLang's own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harness.plan import grid_points, plan_sweep, point_argv
from harness.spec import parse_spec
from specsweep.errors import SpecError
from workers.sglang import validate


def two_node(**changes: Any) -> dict[str, Any]:
    data: dict[str, Any] = {
        "engine": "sim",
        "model_path": "/models/target",
        "base_args": ["--tp-size", "16"],
        "gpus_per_server": 8,
        "nodes_per_server": 2,
        "load": {"concurrency": [1, 8], "requests_per_level": 16},
    }
    data.update(changes)
    return data


def error_of(data: Any) -> str:
    with pytest.raises(SpecError) as caught:
        parse_spec(data, source="sweep.yaml")
    return str(caught.value)


@pytest.mark.parametrize("flag", ["--nnodes", "--node-rank", "--dist-init-addr", "--nccl-init-addr"])
def test_spec_refuses_rank_flags_when_base_args_set_them(flag: str) -> None:
    """Every rank's --nnodes/--node-rank/--dist-init-addr come from the sweep: a user value would point
    the ranks of two servers at one rendezvous."""
    message = error_of(two_node(base_args=["--tp-size", "16", flag, "1"]))
    assert f"base_args: {flag} is set by the sweep" in message


@pytest.mark.parametrize(
    ("base_args", "expected"),
    [
        (
            ["--tp-size", "8"],
            "--tp-size 8 x --pp-size 1 = 8 GPU workers, but a server holds 8 GPUs on each of 2",
        ),
        (["--tp-size", "3"], "= 3 is not divisible by 2 nodes"),
        (["--tp-size", "16", "--dp-size", "2"], "SGLang refuses data-parallel replicas across nodes"),
    ],
)
def test_spec_refuses_layout_when_server_does_not_fill_its_nodes(base_args: list[str], expected: str) -> None:
    """tp x pp must equal gpus_per_server x nodes_per_server (SGLang starts tp x pp / nnodes workers on
    each node, whatever the placement holds), be divisible by the nodes, and DP replicas stay on one node."""
    assert expected in error_of(two_node(base_args=base_args))


def test_spec_accepts_two_node_server_when_tp_and_pp_fill_the_nodes() -> None:
    """TP8 x PP2 over two 8-GPU nodes is 16 GPU workers: accepted, like TP16."""
    assert parse_spec(two_node(base_args=["--tp-size", "8", "--pp-size", "2"])).nodes_per_server == 2
    assert parse_spec(two_node()).nodes_per_server == 2


def test_spec_keeps_sweep_id_when_nodes_per_server_is_one() -> None:
    """One node per server is the default and leaves the sweep id as before the field existed, so a
    resume of an older one-node sweep finds its own queue."""
    one = two_node(base_args=["--tp-size", "8"])
    del one["nodes_per_server"]
    assert parse_spec(one).sweep_id() == parse_spec({**one, "nodes_per_server": 1}).sweep_id()
    assert parse_spec(one).sweep_id() != parse_spec(two_node()).sweep_id()


def test_validate_refuses_launch_with_sglangs_words_when_tp_not_divisible_by_nodes(
    sglang_python: str, kimi_target: Path
) -> None:
    """SGLang's own multi-node checks (check_server_args, which the engine runs before it starts) judge
    multi-node launches: TP8 over 3 nodes is refused with SGLang's message."""
    report = validate(
        ["--model-path", str(kimi_target), "--tp-size", "8", "--nnodes", "3", "--node-rank", "0",
         "--dist-init-addr", "127.0.0.1:29500"],
        sglang_python=sglang_python,
    )  # fmt: skip
    assert report.status == "invalid"
    assert "tp_size must be divisible by number of nodes" in report.errors[0].message


def test_plan_validates_rank_zero_launch_and_counts_all_gpus_when_two_nodes(
    sglang_python: str, kimi_target: Path, eagle3_draft: Path
) -> None:
    """The planner has SGLang resolve rank 0's launch (rank flags included); each job holds the whole
    server's GPUs (per-GPU throughput divides by 16) and its node count."""
    spec = parse_spec(
        two_node(
            model_path=str(kimi_target),
            drafter={"path": str(eagle3_draft), "format": "sglang"},
            speculative={"chain_depths": [3]},
        )
    )
    plan = plan_sweep(spec, sglang_python=sglang_python)
    assert [v.status for v in plan.verdicts] == ["ok", "ok"]
    assert {(job.gpus, job.nodes) for job in plan.jobs} == {(16, 2)}

    argv = point_argv(spec, grid_points(spec)[1])
    assert argv[-6:] == ["--nnodes", "2", "--node-rank", "0", "--dist-init-addr", "127.0.0.1:29500"]
