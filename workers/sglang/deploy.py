"""SGLang 0.5.23 launch commands to deploy: a measured launch made portable, and an adaptive schedule.

A measured launch names where the sweep ran it (``--host``, ``--port``, a node-local converted drafter)
and carries the launcher's per-launch tag (``api.LAUNCH_TAG_FLAG``); the command a team deploys names the
model and drafter where the team keeps them, no listen address and no tag.
``--speculative-adaptive`` with ``--speculative-adaptive-config FILE`` serves a different draft depth per
batch size from one launch: the JSON maps batch-size thresholds (strings of digits) to
``{"candidate_steps": [...]}``, step 0 meaning no drafting; SGLang routes a batch to the largest
threshold at or below its size (``AdaptiveSpeculativeParams._find_closest_bs``), and a slot with one
candidate keeps that depth (its EMA has nowhere to move). It needs a topk-1 chain, and the launch's
``--speculative-num-steps`` must be one of the candidates (``_init_adaptive_speculative_params``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from workers.sglang import api, multinode
from workers.sglang.rules import SPEC_FLAGS, TRAINED_DRAFTER_ALGORITHMS, adaptive_config_problem

# Where and which launch: not deployed (a multi-node server's rendezvous was an address of the sweep's).
LAUNCH_ONLY_FLAGS = ("--host", "--port", api.LAUNCH_TAG_FLAG, *multinode.DIST_INIT_ADDR_FLAGS)
# A deployment over several nodes gets its ranks' flags per script (``rank_args``), not the measured ones.
_DEPLOY_DROPS = (*LAUNCH_ONLY_FLAGS, multinode.NNODES_FLAG, multinode.NODE_RANK_FLAG)
# Stands for rank 0's HOST:PORT in a rank's argv until its launch script names the shell variable.
DIST_INIT_ADDR_SLOT = "@DIST_INIT_ADDR@"
MODEL_FLAG = "--model-path"
DRAFT_FLAG = "--speculative-draft-model-path"
ADAPTIVE_CONFIG_FLAG = "--speculative-adaptive-config"
LAUNCH_MODULE = ("-m", "sglang.launch_server")


def launch_args(argv: Sequence[str]) -> list[str]:
    """The SGLang arguments of a process argv (``python -m <module> ARGS``), without the program."""
    return list(argv[3:]) if len(argv) >= 3 and argv[1] == "-m" else list(argv)


def deploy_args(args: Sequence[str], *, model_path: str, draft_path: str | None) -> list[str]:
    """``args`` without a listen address, launch tag or rank flags, with the model and drafter paths to
    deploy. The drafter's path replaces the measured one only where the launch loaded the trained drafter
    (EAGLE3 / EAGLE): a STANDALONE launch keeps its own draft model."""
    out = _with_value(strip_launch_only(args), MODEL_FLAG, model_path)
    if (
        draft_path is not None
        and _loads_trained_drafter(out)
        and any(t.split("=", 1)[0] == DRAFT_FLAG for t in out)
    ):
        out = _with_value(out, DRAFT_FLAG, draft_path)
    return out


def _loads_trained_drafter(args: Sequence[str]) -> bool:
    """Whether the launch's --speculative-algorithm is one that loads the sweep's trained drafter."""
    flag = SPEC_FLAGS[api.SPEC_ALGORITHM]
    for i, token in enumerate(args):
        name, _, value = token.partition("=")
        if name == flag:
            value = value or (args[i + 1] if i + 1 < len(args) else "")
            return value.upper() in TRAINED_DRAFTER_ALGORITHMS
    return False


def strip_launch_only(args: Sequence[str]) -> list[str]:
    """``args`` without the flags that say where and which launch ran (``LAUNCH_ONLY_FLAGS``) and the rank
    flags of a server over several nodes (each rank's script adds its own)."""
    out: list[str] = []
    skip = False
    for token in args:
        if skip:
            skip = False
            continue
        name = token.split("=", 1)[0]
        if name in _DEPLOY_DROPS:
            skip = "=" not in token
            continue
        out.append(token)
    return out


def compared_flags(argv: Sequence[str]) -> dict[str, str]:
    """A measured launch's flags as flag -> value (its values joined by spaces, "" for a switch), for
    telling what two sweeps ran differently: without the launch-only flags and the drafter's path (a
    node-local copy named by its content hash; the spec and the drafter's input digest say what it is)."""
    return {
        name: value
        for name, value in _flag_values(launch_args(argv)).items()
        if name not in LAUNCH_ONLY_FLAGS and name != DRAFT_FLAG
    }


def changed_flags(measured: Sequence[str], deployed: Sequence[str]) -> dict[str, str | None]:
    """The flags whose value the deploy launch changed (flag -> the measured value) or left out
    (flag -> None), in the measured launch's order."""
    before, after = _flag_values(measured), _flag_values(deployed)
    return {
        flag: (value if flag in after else None)
        for flag, value in before.items()
        if flag not in after or after[flag] != value
    }


def _flag_values(args: Sequence[str]) -> dict[str, str]:
    """``--flag value``, ``--flag=value``, ``--flag v1 v2`` (values joined by spaces) and a bare ``--flag``
    ("") of an argument list."""
    flags: dict[str, list[str]] = {}
    current: list[str] | None = None
    for token in args:
        if token.startswith("--"):
            name, _, value = token.partition("=")
            current = flags.setdefault(name, [])
            if value:
                current.append(value)
        elif current is not None:
            current.append(token)
    return {name: " ".join(values) for name, values in flags.items()}


def _with_value(args: list[str], flag: str, value: str) -> list[str]:
    out = list(args)
    for i, token in enumerate(out):
        if token == flag and i + 1 < len(out):
            out[i + 1] = value
            return out
        if token.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return out
    return [*out, flag, value]


def adaptive_config(steps_by_batch_size: Mapping[int, int]) -> dict[str, Any]:
    """The adaptive config file's JSON: one fixed depth per batch-size threshold (0 = no drafting)."""
    config = {str(bs): {"candidate_steps": [steps]} for bs, steps in sorted(steps_by_batch_size.items())}
    problem = adaptive_config_problem(config)
    if problem is not None:
        raise ValueError(problem)
    return config


def adaptive_args(
    chain_args: Sequence[str], steps_by_batch_size: Mapping[int, int], config_path: str
) -> list[str]:
    """A topk-1 chain's launch turned adaptive: starts at the deepest scheduled depth (every candidate's
    buffers are sized by the deepest), topk 1, draft tokens = steps + 1, the schedule in ``config_path``."""
    steps = max(steps_by_batch_size.values())
    out = list(chain_args)
    for dest, value in (
        (api.SPEC_NUM_STEPS, steps),
        (api.SPEC_EAGLE_TOPK, 1),
        (api.SPEC_NUM_DRAFT_TOKENS, steps + 1),
    ):
        out = _with_value(out, SPEC_FLAGS[dest], str(value))
    if SPEC_FLAGS[api.SPEC_ADAPTIVE] not in out:
        out.append(SPEC_FLAGS[api.SPEC_ADAPTIVE])
    return _with_value(out, ADAPTIVE_CONFIG_FLAG, config_path)


def command(python: str, args: Sequence[str]) -> list[str]:
    """The full argv that starts SGLang with ``args``."""
    return [python, *LAUNCH_MODULE, *args]


def rank_command(
    python: str, args: Sequence[str], nnodes: int, node_rank: int, dist_init_addr: str
) -> list[str]:
    """The argv of rank ``node_rank`` of a server of ``args`` over ``nnodes`` nodes meeting at ``dist_init_addr``."""
    return command(python, [*args, *multinode.rank_args(nnodes, node_rank, dist_init_addr)])
