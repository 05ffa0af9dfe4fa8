"""The simulated server over two nodes: rank 0 serves once every rank joined, and dies like SGLang when
one goes; the performance model charges the cross-node all-reduce."""

from __future__ import annotations

import contextlib
import signal
from collections.abc import Iterator
from pathlib import Path

from specsweep.error_classes import ErrorClass
from tests.launch_args import chain_launch_args
from workers.node.launcher import ServerProcess, classify_exit, http_get, start_sim
from workers.node.ports import reserved_port
from workers.sglang import api, multinode
from workers.sim.model import DEFAULT_PROFILE, cross_node_seconds

FAST = {"SPECSWEEP_SIM_TIME_SCALE": "0.05"}


@contextlib.contextmanager
def two_ranks(target: Path, draft: Path) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Rank 1 started first (it retries until rank 0's rendezvous is up), then rank 0, healthy."""
    with reserved_port("127.0.0.1") as dist_port:
        address = f"127.0.0.1:{dist_port}"
        args = chain_launch_args(target, draft, 3, "--tp-size", "16")
        with (
            start_sim([*args, *multinode.rank_args(2, 1, address)], env=FAST, healthy_within_s=None) as one,
            start_sim([*args, *multinode.rank_args(2, 0, address)], env=FAST) as zero,
        ):
            yield zero, one


def test_sim_rank_zero_serves_and_other_rank_stays_alive_when_both_joined(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """Only rank 0 serves HTTP; rank 1 is a process that stays up while the server runs."""
    with two_ranks(kimi_target, eagle3_draft) as (zero, one):
        assert http_get(zero.url + api.HEALTH, timeout_s=5)[0] == 200
        assert one.poll() is None
        assert http_get(one.url + api.HEALTH, timeout_s=2)[0] == 0  # nothing listens on rank 1's port
        assert "no HTTP server on this rank" in one.log_text()


def test_sim_rank_zero_dies_with_nccl_error_when_other_rank_is_killed(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """Killing rank 1 ends the server: rank 0 dies as SGLang's scheduler does on NCCL's remote error
    (SIGKILL of its tree), and the launcher classifies it nccl_error (retried as transient)."""
    with two_ranks(kimi_target, eagle3_draft) as (zero, one):
        one.popen.send_signal(signal.SIGKILL)
        assert zero.popen.wait(timeout=20) == -signal.SIGKILL
        log = zero.log_text()
    assert "ncclRemoteError: A call failed possibly due to a network error" in log
    assert classify_exit(log, -signal.SIGKILL)[0] == ErrorClass.NCCL_ERROR


def test_sim_rank_zero_times_out_like_torch_store_when_other_rank_never_joins(
    kimi_target: Path, eagle3_draft: Path
) -> None:
    """A rank that never comes: rank 0 gives up after --dist-timeout with torch's store message."""
    with reserved_port("127.0.0.1") as dist_port:
        args = chain_launch_args(kimi_target, eagle3_draft, 3, "--tp-size", "16", "--dist-timeout", "1")
        launch = [*args, *multinode.rank_args(2, 0, f"127.0.0.1:{dist_port}")]
        with start_sim(launch, env=FAST, healthy_within_s=None) as zero:
            assert zero.popen.wait(timeout=20) == -signal.SIGKILL
            assert "Timed out after 1 seconds waiting for clients. 1/2 clients joined." in zero.log_text()


def test_sim_model_adds_cross_node_allreduce_when_tp_spans_nodes() -> None:
    """One node costs nothing extra; two nodes pay 122 all-reduce latencies plus the ring's traffic at
    the profile's inter-node bandwidth, more for more tokens and for less bandwidth."""
    assert cross_node_seconds(DEFAULT_PROFILE, 1, 256) == 0.0
    small, big = cross_node_seconds(DEFAULT_PROFILE, 2, 1), cross_node_seconds(DEFAULT_PROFILE, 2, 256)
    assert small == 122 * (20e-6 + 14336 / 400e9)
    assert big > small
    slow = DEFAULT_PROFILE.model_copy(update={"internode_bytes_per_s": 50e9})
    assert cross_node_seconds(slow, 2, 256) > big
