"""Fixtures the harness's driver tests share."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture
def node_dirs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Node-local dirs (pid files, port locks, drafter cache) private to this test; the embedded Ray's
    raylets and workers inherit them from this process's environment."""
    monkeypatch.setenv("SPECSWEEP_PID_DIR", str(tmp_path / "pids"))
    monkeypatch.setenv("SPECSWEEP_DRAFTER_CACHE", str(tmp_path / "drafters"))


NODE_DIR_VARS = {"SPECSWEEP_PID_DIR": "pids", "SPECSWEEP_DRAFTER_CACHE": "drafters"}


@pytest.fixture(scope="module")
def simulated_nodes(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """A head without GPUs plus two simulated 8-GPU nodes for one driver module that asks for ``cluster``.
    Module-scoped: shared across the session's modules (issue 32's attempt) the subprocess drivers of
    test_search_driver and test_capacity_driver found their named DriverLock actor dead before it ran
    ("cancelled before it started running") in a fresh-clone run; a cluster per module, as before; the root of
    its node-local dirs (pid files, drafter cache), which its raylets and workers inherit at start. No
    driver is connected between modules: ``cluster`` connects for one module, and the last module that
    uses it shuts the nodes down (an idle cluster takes about 5% of a core from the modules after it)."""
    from ray.cluster_utils import Cluster

    root = tmp_path_factory.mktemp("node-local")
    with pytest.MonkeyPatch.context() as env:
        for name, folder in NODE_DIR_VARS.items():
            env.setenv(name, str(root / folder))
        # no dashboard: no test of these modules talks to it, and it cost 3.6 s of each start (13.3 s -> 9.7 s)
        head = {"num_cpus": 1, "num_gpus": 0, "include_dashboard": False}
        nodes = Cluster(initialize_head=True, head_node_args=head)
        nodes.workers = [nodes.add_node(num_cpus=2, num_gpus=8) for _ in range(2)]
    yield nodes, root
    nodes.shutdown()  # type: ignore[no-untyped-call]


@pytest.fixture(scope="module")
def env_dirs(simulated_nodes: tuple[Any, Path]) -> Iterator[Path]:
    """The simulated nodes' node-local dirs in this process's environment while the module runs (the
    driver and the tests read the same pid files as the nodes), restored after it."""
    _, root = simulated_nodes
    with pytest.MonkeyPatch.context() as env:
        for name, folder in NODE_DIR_VARS.items():
            env.setenv(name, str(root / folder))
        yield root


@pytest.fixture(scope="module")
def cluster(
    request: pytest.FixtureRequest, simulated_nodes: tuple[Any, Path], env_dirs: Path
) -> Iterator[Any]:
    """The simulated nodes, with this process connected as one Ray job for the module. The job's end
    (``ray.shutdown``) removes its actors and placement groups, so no module sees another's; a node a
    test removes is replaced by that test (see test_driver's node-removal test)."""
    import ray

    nodes, _ = simulated_nodes
    ray.init(address=nodes.address, namespace="specsweep", log_to_driver=False)
    yield nodes
    ray.shutdown()
    if not _used_later(request.node, "cluster"):
        nodes.shutdown()  # the session fixture's own shutdown then finds no node left


def _used_later(module: pytest.Item | pytest.Collector, fixture: str) -> bool:
    """Whether a test after ``module``'s last one, in this session's order (set before the first test
    runs, shuffled or not), uses ``fixture``."""
    items = module.session.items
    last = max(i for i, item in enumerate(items) if item.getparent(pytest.Module) is module)
    return any(fixture in item.fixturenames for item in items[last + 1 :])
