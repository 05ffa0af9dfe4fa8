"""best --emit for a server over two nodes (one launch script per node rank) and the summary it prints,
in process (no resolver, no Ray), so that what each rank runs and what the user reads are checked word
for word."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from analysis.select import select_best
from analysis.synthetic import SyntheticSweep, write_sweep
from analysis.views import connect
from harness.emit import describe, emit

from .test_emit import CONFIGS, DRAFT, KIMI, SPEC

TWO_NODE_SPEC = SPEC.replace("engine: sglang\n", "engine: sglang\nbase_args: [--tp-size, '16']\n") + (
    "gpus_per_server: 8\nnodes_per_server: 2\n"
)
SLOT = '"${DIST_INIT_ADDR:?set DIST_INIT_ADDR to HOST:PORT of rank 0 (a free port on its node)}"'


@pytest.fixture(scope="module")
def two_node_results(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A finished sweep of a server spanning two nodes of 8 GPUs (the chains win, as in test_emit)."""
    out = tmp_path_factory.mktemp("emit-ranks") / "out"
    sweep = SyntheticSweep(
        configs=CONFIGS, concurrencies=(1, 16, 64), requests_per_level=300, seed=7, model_path=KIMI,
        draft_model_path=DRAFT,
    )  # fmt: skip
    write_sweep(out, sweep, spec_text=TWO_NODE_SPEC)
    return out


def test_emit_writes_one_script_per_node_rank_when_the_server_spans_two_nodes(
    two_node_results: Path, tmp_path: Path
) -> None:
    """nodes_per_server 2: no launch.sh but launch-rank0.sh (run on the first node, which serves HTTP)
    and launch-rank1.sh (node 2 of 2), each ``exec`` of the recommended launch with ``--nnodes 2``, its
    ``--node-rank`` and the rendezvous address read from DIST_INIT_ADDR (the script stops with a hint
    when it is unset); deploy.json lists both ranks with their scripts and argv, each validated."""
    con = connect(two_node_results)
    dest = tmp_path / "deploy"
    result = emit(con, select_best(con, two_node_results, replicates=100), dest, use_resolver=False)
    assert not (dest / "launch.sh").exists()
    assert [(r["node_rank"], r["script"]) for r in result["ranks"]] == [
        (0, "launch-rank0.sh"),
        (1, "launch-rank1.sh"),
    ]
    chosen = result[result["recommended"]]["argv"]
    for rank, where in ((0, "the first node (it serves HTTP)"), (1, "node 2 of 2")):
        lines = (dest / f"launch-rank{rank}.sh").read_text().splitlines()
        assert lines[:2] == ["#!/bin/sh", f"# node rank {rank} of 2: run on {where}"]
        assert lines[2].startswith("exec " + shlex.join(chosen) + " ") and len(lines) == 3
        argv = result["ranks"][rank]["argv"]
        assert argv[: len(chosen)] == chosen
        assert argv[argv.index("--nnodes") + 1] == "2" and argv[argv.index("--node-rank") + 1] == str(rank)
        assert argv[argv.index("--dist-init-addr") + 1] == "@DIST_INIT_ADDR@"
        assert lines[2].endswith(shlex.join(argv[len(chosen) :]).replace("@DIST_INIT_ADDR@", SLOT))
        assert result["ranks"][rank]["validation"]["status"] == "ok"
    written = json.loads((dest / "deploy.json").read_text())
    assert [r["script"] for r in written["ranks"]] == ["launch-rank0.sh", "launch-rank1.sh"]
    assert result["adaptive"] is not None and result["adaptive"]["validation"]["status"] == "ok"


def test_describe_prints_the_choice_schedule_drafter_and_launch_when_each_is_there() -> None:
    """The summary `best --emit` prints, line by line, for a result with an adaptive schedule that gives
    up a level, a drafter to publish, and one launch.sh; then without adaptive (its note instead), with
    a drafter already published (no publish command), a tie on the mix with the preference that broke it,
    and two node ranks (one line each)."""
    result = {
        "recommended": "adaptive",
        "weights": {"concurrency=1": 1.0, "concurrency=64": 1.0},
        "static": {"config_label": "chain d=4", "mix_score": 0.91234, "validation": {"status": "valid"}},
        "adaptive": {
            "steps_by_batch_size": {1: 7, 16: 3},
            "mix_score": 0.97,
            "validation": {"status": "valid", "checked_by": ["sglang 0.5.23", "launch_server"]},
            "gives_up": {"concurrency=1": "'tree' wins here"},
        },
        "drafter": {"published": "org/draft", "publish_command": ["hf", "upload", "org/draft", "/d x"]},
        "tie": [],
        "preference": [],
    }
    dest = Path("/out/deploy")
    assert describe(result, dest).splitlines() == [
        "",
        "deploy (/out/deploy): recommended adaptive; load mix weights "
        "{'concurrency=1': 1.0, 'concurrency=64': 1.0}",
        "   static: 'chain d=4', mix score 0.912 of the per-level best; validate valid",
        "   adaptive: batch >= 1: 7 steps, batch >= 16: 3 steps; expected mix score 0.970; "
        "validate valid (sglang 0.5.23, launch_server)",
        "      gives up at concurrency=1: 'tree' wins here",
        "   drafter: org/draft (publish it: hf upload org/draft '/d x')",
        "   launch: /out/deploy/launch.sh",
    ]
    result |= {
        "recommended": "static",
        "tie": ["chain d=4", "chain d=6"],
        "preference": ["'chain d=4' over 'chain d=6': tied on the mix, fewer draft tokens"],
        "adaptive": None,
        "adaptive_note": "no chain wins a level",
        "drafter": {"published": "org/draft", "publish_command": None},
        "ranks": [
            {"node_rank": 0, "script": "launch-rank0.sh", "validation": {"status": "valid"}},
            {"node_rank": 1, "script": "launch-rank1.sh", "validation": {"status": "not checked"}},
        ],
    }
    assert describe(result, dest).splitlines()[3:] == [
        "   adaptive: none (no chain wins a level)",
        "   tie on the mix: chain d=4, chain d=6",
        "   prefer: 'chain d=4' over 'chain d=6': tied on the mix, fewer draft tokens",
        "   drafter: org/draft",
        "   launch node rank 0: /out/deploy/launch-rank0.sh (DIST_INIT_ADDR=HOST:PORT of rank 0); validate valid",
        "   launch node rank 1: /out/deploy/launch-rank1.sh (DIST_INIT_ADDR=HOST:PORT of rank 0); "
        "validate not checked",
    ]
    assert "drafter" not in describe(result | {"drafter": None}, dest)


def test_emit_names_the_file_it_was_writing_and_leaves_none_when_the_disk_is_full(
    two_node_results: Path, small_disk: Path
) -> None:
    """--emit into a full disk (a real tmpfs, filled): DiskFullError naming the deployment file it was
    writing (under DIR, not a temporary name), and DIR holds no file afterwards."""
    from specsweep.errors import DiskFullError
    from tests.conftest import fill

    con = connect(two_node_results)
    selection = select_best(con, two_node_results, replicates=100)
    dest = small_disk / "deploy"
    dest.mkdir()
    fill(small_disk)
    with pytest.raises(DiskFullError) as caught:
        emit(con, selection, dest, use_resolver=False)
    assert caught.value.where is not None
    written = Path(caught.value.where)
    assert written.parent == dest.resolve() and written.name in {"adaptive.json", "launch-rank0.sh"}
    assert "the disk is full while writing the deployment files" in str(caught.value)
    assert list(dest.iterdir()) == []
