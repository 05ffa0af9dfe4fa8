"""Run in SGLang's interpreter (.venv-sglang): load converted drafts with SGLang's OWN draft classes.

``python tests/workers/sglang_draft_load.py DIR...`` builds, for each converted draft directory, the
class its config.json names (``LlamaForCausalLMEagle3`` or ``Eagle3DeepseekV2ForCausalLM``) on the
CPU inside a single-rank gloo process group, fills every parameter with NaN, feeds the checkpoint to
the model's own ``load_weights``, and prints one JSON line per draft: the parameters left unfilled,
the checkpoint elements that reached no parameter (a skipped weight), and the hot-token ids SGLang
derived from d2t.

Two forward-only imports are missing from the resolver venv and are stood in for, never called:
``vllm._custom_ops.rotary_embedding`` (RotaryEmbedding's non-CUDA fallback kernel, bound at
construction) and ``sglang.srt.layers.sampler.SYNC_TOKEN_IDS_ACROSS_TP`` (an env flag
``initialize_model_parallel`` imports; the real module pulls in the ``openai`` package).
SGLANG_USE_CPU_ENGINE is not used: it needs ``sgl_kernel``, which the venv lacks too.
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys
import types
from pathlib import Path
from typing import Any


def _stand_ins() -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a forward kernel was called while only loading weights")

    sampler = types.ModuleType("sglang.srt.layers.sampler")
    sampler.SYNC_TOKEN_IDS_ACROSS_TP = os.environ.get("SYNC_TOKEN_IDS_ACROSS_TP") == "1"  # type: ignore[attr-defined]
    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = never  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")
    vllm._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules |= {"sglang.srt.layers.sampler": sampler, "vllm": vllm, "vllm._custom_ops": ops}


def _single_rank(draft: Path) -> None:
    from sglang.srt.distributed.parallel_state import (
        init_distributed_environment,
        initialize_model_parallel,
    )
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    publish(ServerArgs(model_path=str(draft), device="cpu"), role="test", ranks=SpawnRanks(world_rank=0))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    init_distributed_environment(
        world_size=1,
        rank=0,
        local_rank=0,
        backend="gloo",
        distributed_init_method=f"tcp://127.0.0.1:{port}",
    )
    initialize_model_parallel(backend="gloo")


def _model_class(architecture: str) -> Any:
    if architecture == "LlamaForCausalLMEagle3":
        from sglang.srt.models.llama_eagle3 import LlamaForCausalLMEagle3

        return LlamaForCausalLMEagle3
    from sglang.srt.models.kimi_k25_eagle3 import Eagle3DeepseekV2ForCausalLM

    return Eagle3DeepseekV2ForCausalLM


def load(draft: Path) -> dict[str, Any]:
    """What SGLang's load_weights did with the checkpoint in ``draft``."""
    import torch
    from safetensors.torch import load_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(draft))
    model = _model_class(config.architectures[0])(config)
    # The embedding comes from the target (set_embed) unless the checkpoint carries one; the lm_head
    # too when the model says load_lm_head_from_target.
    from_target = {"model.embed_tokens.weight"}
    if model.load_lm_head_from_target:
        from_target.add("lm_head.weight")
    params = dict(model.named_parameters())
    with torch.no_grad():
        for param in params.values():
            param.fill_(math.nan)
    weights = {}
    for path in sorted(draft.glob("*.safetensors")):
        weights |= load_file(path)
    model.load_weights(iter(weights.items()))
    rows = {"lm_head.weight": config.draft_vocab_size}  # ParallelLMHead pads its rows
    loaded = {
        name: param[: rows.get(name, param.shape[0])]
        for name, param in params.items()
        if name not in from_target or name.removeprefix("model.") in weights
    }
    unfilled = [name for name, param in loaded.items() if not bool(torch.isfinite(param).all())]
    floats = [t for t in weights.values() if t.is_floating_point()]
    hot = model.hot_token_id
    return {
        "draft": str(draft),
        "class": type(model).__name__,
        "unfilled": unfilled,
        "checkpoint_elements": sum(t.numel() for t in floats),
        "filled_elements": sum(param.numel() for name, param in loaded.items() if name not in unfilled),
        "lm_head_from_target": bool(model.load_lm_head_from_target),
        "hot_token_id": None if hot is None else hot.tolist(),
        "has_input_norm": getattr(model.model, "input_norm", None) is not None,
        "has_fc_norm": getattr(model.model, "fc_norm", None) is not None,
        "norm_output": bool(getattr(model.model, "norm_output", False)),
    }


def main(argv: list[str]) -> int:
    _stand_ins()
    drafts = [Path(arg) for arg in argv]
    _single_rank(drafts[0])
    for draft in drafts:
        print(json.dumps(load(draft)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
