"""How SGLang 0.5.23 fails: which rule findings it refuses while resolving (and the line it prints), which
it accepts but dies on while loading, the log text that tells one crash from another, and the start-up
errors that say the node's Python cannot run SGLang at all (and what it lacks).

The simulated server uses the first two to fail the way SGLang does; the launcher uses the log classes to
classify a server that exited. Findings not listed under either are the project's stricter rules: SGLang
runs those launches. The real start-up output these are checked against is recorded in
``tests/fixtures/sglang-0.5.23/launch-*.log`` (and rerun live by ``tests/workers/test_launcher_sglang.py``).
"""

from __future__ import annotations

import re

from specsweep.error_classes import ErrorClass
from workers.sglang.api import SGLANG_VERSION

# Finding code -> the exception line SGLang's resolver prints (exit 1). Templates take the launch's values.
RESOLVE_EXCEPTIONS: dict[str, str] = {
    "unknown_algorithm": "ValueError: Unknown speculative algorithm name: {algorithm}",
    "nonpositive": "AssertionError",
    "backend_needs_chain": "ValueError: trtllm_mha backend only supports topk = 1 for speculative decoding.",
    "backend_page_tree": "ValueError: speculative_eagle_topk > 1 with page_size > 1 is only supported on "
    "('flashinfer', 'fa3', 'triton'); got attention_backend={attention_backend!r}. Use page_size == 1 or one "
    "of those backends.",
    "backend_no_spec": "AssertionError: Speculative decoding is currently not supported with Flex Attention "
    "backend",
    "rejection_sampling": "ValueError: {message}",
    "dp_attention_unsupported": "ValueError: {message}",
    "ngram_page_tree": "ValueError: {message}",
    "ngram_breadth": "ZeroDivisionError: integer division or modulo by zero",
}

# Finding codes SGLang accepts at resolution but crashes on while loading the draft or sizing the tree.
LOAD_CRASH_CODES: tuple[str, ...] = (
    "eagle3_without_draft",
    "missing_draft",
    "draft_architecture",
    "draft_vocab_mismatch",
    "incomplete_triple",
)

# Start-up errors that say the server's Python cannot serve on this node -> what it lacks ("{module}": the
# missing module's name; the first entry whose text is in the line wins). Sources: SGLang's device check
# (``get_device`` in sglang/srt/utils/common.py, raised while resolving the arguments: the first thing a
# GPU-less node hits), torch's CUDA initialisation (torch/cuda/__init__.py and libc10_cuda.so of torch
# 2.14.1) and Python's import system (sglang itself, or a module it imports, not installed).
NODE_SETUP_LINES: tuple[tuple[str, str], ...] = (
    (
        "No accelerator (CUDA, XPU, HPU, NPU, MUSA, MPS) or platform plugin is available",
        "a GPU it can use: no NVIDIA GPU and driver visible to it, or a torch built without CUDA",
    ),
    ("Found no NVIDIA driver on your system", "an NVIDIA driver: its torch found none"),
    ("The NVIDIA driver on your system is too old", "an NVIDIA driver new enough for its torch's CUDA"),
    ("No CUDA GPUs are available", "a visible GPU: its torch sees none, check CUDA_VISIBLE_DEVICES"),
    ("Torch not compiled with CUDA enabled", "a torch built with CUDA: it has a CPU-only torch"),
    ("No module named 'sglang'", "SGLang itself: the module 'sglang' is not installed there"),
    ("ModuleNotFoundError: No module named", "the module {module}, which SGLang imports"),
)
NODE_SETUP_FIX = (
    f"install SGLang {SGLANG_VERSION} with its GPU dependencies (`pip install sglang=={SGLANG_VERSION}`, "
    "not --no-deps) in that Python on the GPU nodes, or point sglang_python at a Python that has them"
)
_MISSING_MODULE = re.compile(r"No module named '([^']+)'")

# Error class -> substrings of a server log that identify it (first match wins, in this order). Besides
# torch's and CUDA's out-of-memory errors, SGLang's own when the weights leave no room for the KV cache
# (model_executor/pool_configurator.py, mem_cache/kv_cache_configurator.py; read in the source, a GPU is
# needed to see them).
LOG_CLASSES: tuple[tuple[ErrorClass, tuple[str, ...]], ...] = (
    (
        ErrorClass.CUDA_OOM,
        (
            "CUDA out of memory",
            "OutOfMemoryError",
            "CUDA error: out of memory",
            "Not enough memory. Please try to increase --mem-fraction-static",
            "Loaded weights leave no GPU memory for the KV cache",
        ),
    ),
    (ErrorClass.NCCL_ERROR, ("NCCL error", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError")),
    # uvicorn's bind failure once the weights are loaded: "[Errno 98] error while attempting to bind on
    # address ('127.0.0.1', 30000): address already in use" (asyncio lower-cases the strerror); the
    # multi-tokenizer listener's probe bind raises the plain "[Errno 98] Address already in use".
    (ErrorClass.PORT_TAKEN, ("address already in use", "Address already in use")),
    (ErrorClass.NODE_SETUP, tuple(text for text, _ in NODE_SETUP_LINES)),
)


def node_setup_evidence(line: str, python: str) -> str:
    """A node_setup failure's message: SGLang's own error ``line``, what ``python`` lacks, and the fix."""
    for text, lacks in NODE_SETUP_LINES:
        if text in line:
            module = _MISSING_MODULE.search(line)
            missing = lacks.format(module=repr(module.group(1)) if module else "named above")
            return f"{line} ({python} lacks {missing}); fix: {NODE_SETUP_FIX}"
    raise ValueError(f"not a node-setup line: {line!r}")


def python_unusable(python: str, err: OSError) -> str:
    """A node_setup failure's message when the server's Python cannot even be started (``err`` from exec)."""
    return f"cannot run {python} on this node: {err.strerror}; fix: {NODE_SETUP_FIX}"
