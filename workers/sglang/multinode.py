"""One SGLang server over several nodes: the flags each rank gets, and SGLang's rules about them.

SGLang 0.5.23 runs one server across N nodes by launching the same command on every node with
``--nnodes N --node-rank R --dist-init-addr HOST:PORT`` (``sglang/srt/arg_groups/fields/parallel.py``;
``--nccl-init-addr`` is an alias of ``--dist-init-addr``). Rank 0 hosts the torch.distributed rendezvous
at that address and is the only rank that serves HTTP. ``check_server_args``
(``sglang/srt/arg_groups/validation_hook.py``, run by the engine before it starts) asserts
``(tp_size * pp_size) % nnodes == 0`` ("tp_size must be divisible by number of nodes") and refuses
``dp_size > 1`` with ``nnodes != 1``; each node then runs ``tp_size * pp_size / nnodes`` GPU workers.
"""

from __future__ import annotations

from collections.abc import Sequence

from workers.sglang.flags import ArgvError, parse_launch_args

NNODES_FLAG = "--nnodes"
NODE_RANK_FLAG = "--node-rank"
DIST_INIT_ADDR_FLAG = "--dist-init-addr"
DIST_INIT_ADDR_FLAGS: tuple[str, ...] = (DIST_INIT_ADDR_FLAG, "--nccl-init-addr")  # the flag and its alias
# The harness sets these for every rank (one address per launch); a user value would point the ranks of
# two servers at one rendezvous.
RANK_FLAGS: tuple[str, ...] = (NNODES_FLAG, NODE_RANK_FLAG, *DIST_INIT_ADDR_FLAGS)
# What the planner validates with (rank 0; the real address is only known once rank 0 is placed).
VALIDATION_DIST_INIT_ADDR = "127.0.0.1:29500"
# Resolved-arg names (resolved_dict() keys and ServerArgs fields).
NNODES = "nnodes"
NODE_RANK = "node_rank"
DIST_INIT_ADDR = "dist_init_addr"


def rank_args(nnodes: int, node_rank: int, dist_init_addr: str) -> list[str]:
    """The flags that make a launch rank ``node_rank`` of an ``nnodes``-node server (none for one node)."""
    if nnodes == 1:
        return []
    return [
        NNODES_FLAG,
        str(nnodes),
        NODE_RANK_FLAG,
        str(node_rank),
        DIST_INIT_ADDR_FLAG,
        dist_init_addr,
    ]


def server_layout_problem(base_args: Sequence[str], gpus_per_node: int, nnodes: int) -> str | None:
    """Why ``base_args`` cannot run as one server over ``nnodes`` nodes of ``gpus_per_node`` GPUs, or None.

    SGLang's own rules (``check_server_args``): tp x pp divisible by the nodes, no DP replicas across
    nodes. The harness's: tp x pp equals the GPUs it reserves (``gpus_per_node`` on each node), since
    SGLang starts ``tp x pp / nnodes`` workers per node whatever the placement holds. An argv the flag
    table refuses is left to the validator, which reports it with SGLang's parser message."""
    try:
        launch = parse_launch_args([*base_args, "--model-path", "-"])
    except ArgvError:
        return None
    tp, pp, dp = int(launch.get("tp_size")), int(launch.get("pp_size")), int(launch.get("dp_size"))
    workers, held = tp * pp, gpus_per_node * nnodes
    if dp > 1:
        return (
            f"--dp-size {dp} over {nnodes} nodes: SGLang refuses data-parallel replicas across nodes (use "
            "--attn-dp-size, or one-node servers)"
        )
    if workers % nnodes:
        return (
            f"--tp-size {tp} x --pp-size {pp} = {workers} is not divisible by {nnodes} nodes (SGLang: "
            '"tp_size must be divisible by number of nodes")'
        )
    if workers != held:
        return (
            f"--tp-size {tp} x --pp-size {pp} = {workers} GPU workers, but a server holds {gpus_per_node} "
            f"GPUs on each of {nnodes} nodes = {held} (set --tp-size x --pp-size to {held})"
        )
    return None
