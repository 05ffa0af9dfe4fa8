"""Run in SGLang's interpreter (.venv-sglang): load converted drafts with SGLang's OWN draft classes.

``python tests/workers/sglang_draft_load.py PARAMS_DIR DRAFT...`` builds, for each draft directory,
the class its config.json names (``LlamaForCausalLMEagle3`` or ``Eagle3DeepseekV2ForCausalLM``) on
the CPU inside a single-rank gloo process group, fills every parameter with NaN, feeds the
checkpoint to the model's own ``load_weights``, writes the loaded parameters to
``PARAMS_DIR/<n>.safetensors`` and prints one JSON line per draft: the parameters left unfilled,
the checkpoint elements that reached no parameter (a skipped weight), the warnings SGLang logged
while loading, the hot-token ids SGLang derived from d2t and the rotary embedding it built.

Building reads the device once: DeepseekV2AttentionMLA picks its rotary embedding by it
(rotary_embedding/factory.py ``get_rope_wrapper``). On ``"cpu"`` it takes ``get_rope_cpu``, which
builds the deepseek_yarn rope MLA uses whenever the config scales its rope and asserts on an
unscaled one; so an unscaled draft is built with the device reading ``"cuda"``, as a GPU node builds
it (``get_rope``: a plain RotaryEmbedding), and a scaled one on ``"cpu"`` (off the CPU path the yarn
rope asks the hardware for an accelerator). Neither rope holds a parameter, and every tensor lands
on the CPU, torch's default device. SGLANG_USE_CPU_ENGINE is not set: it needs ``sgl_kernel``,
which the venv lacks. One forward-only import is missing and stood in for, never called:
``vllm._custom_ops.rotary_embedding`` (RotaryEmbedding's non-CUDA kernel, bound when built).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import sys
import types
from pathlib import Path
from typing import Any


def _stand_ins() -> None:
    def never(*args: object, **kwargs: object) -> None:
        raise AssertionError("a forward kernel was called while only loading weights")

    ops = types.ModuleType("vllm._custom_ops")
    ops.rotary_embedding = never  # type: ignore[attr-defined]
    vllm = types.ModuleType("vllm")
    vllm._custom_ops = ops  # type: ignore[attr-defined]
    sys.modules |= {"vllm": vllm, "vllm._custom_ops": ops}


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


def _build(config: Any) -> Any:
    """SGLang's model for ``config``, built with the device its rotary embedding can be built on."""
    from sglang.srt.runtime_context import get_device

    rope = getattr(config, "rope_parameters", None) or {}
    scaled = rope.get("rope_type", "default") != "default"  # as Eagle3MLADecoderLayer reads it
    with get_device().override(device="cpu" if scaled else "cuda"):
        return _model_class(config.architectures[0])(config)


class _Warnings(logging.Handler):
    """SGLang's warnings while loading (the MLA loader logs each weight it skips)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


def _load_weights(model: Any, weights: dict[str, Any]) -> list[str]:
    warnings, sglang_logger = _Warnings(), logging.getLogger("sglang")
    sglang_logger.addHandler(warnings)
    try:
        model.load_weights(iter(weights.items()))
    finally:
        sglang_logger.removeHandler(warnings)
    return warnings.messages


def load(draft: Path, params_file: Path) -> dict[str, Any]:
    """What SGLang's load_weights did with the checkpoint in ``draft``."""
    import torch
    from safetensors.torch import load_file, save_file
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(draft))
    model = _build(config)
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
    warnings = _load_weights(model, weights)
    rows = {"lm_head.weight": config.draft_vocab_size}  # ParallelLMHead pads its rows
    loaded = {
        name: param[: rows.get(name, param.shape[0])]
        for name, param in params.items()
        if name not in from_target or name.removeprefix("model.") in weights
    }
    unfilled = [name for name, param in loaded.items() if not bool(torch.isfinite(param).all())]
    save_file({name: param.detach().contiguous() for name, param in loaded.items()}, str(params_file))
    floats = [t for t in weights.values() if t.is_floating_point()]
    hot = model.hot_token_id
    return {
        "draft": str(draft),
        "class": type(model).__name__,
        "params_file": str(params_file),
        "unfilled": unfilled,
        "warnings": warnings,
        "checkpoint_elements": sum(t.numel() for t in floats),
        "filled_elements": sum(param.numel() for name, param in loaded.items() if name not in unfilled),
        "lm_head_from_target": bool(model.load_lm_head_from_target),
        "hot_token_id": None if hot is None else hot.tolist(),
        "rotary_embedding": next(
            (type(m).__name__ for name, m in model.named_modules() if name.endswith("rotary_emb")), None
        ),
        "has_input_norm": getattr(model.model, "input_norm", None) is not None,
        "has_fc_norm": getattr(model.model, "fc_norm", None) is not None,
        "norm_output": bool(getattr(model.model, "norm_output", False)),
    }


def main(argv: list[str]) -> int:
    _stand_ins()
    params_dir, drafts = Path(argv[0]), [Path(arg) for arg in argv[1:]]
    _single_rank(drafts[0])
    for number, draft in enumerate(drafts):
        print(json.dumps(load(draft, params_dir / f"{number}.safetensors")), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
