"""How SGLang 0.5.23 fails: which rule findings it refuses while resolving (and the line it prints), which
it accepts but dies on while loading, and the log text that tells one crash from another.

The simulated server uses the first two to fail the way SGLang does; the launcher uses the log classes to
classify a server that exited. Findings not listed under either are the project's stricter rules: SGLang
runs those launches.
"""

from __future__ import annotations

from specsweep.error_classes import ErrorClass

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
}

# Finding codes SGLang accepts at resolution but crashes on while loading the draft or sizing the tree.
LOAD_CRASH_CODES: tuple[str, ...] = (
    "eagle3_without_draft",
    "missing_draft",
    "draft_architecture",
    "draft_vocab_mismatch",
    "incomplete_triple",
)

# Error class -> substrings of a server log that identify it (first match wins, in this order).
LOG_CLASSES: tuple[tuple[ErrorClass, tuple[str, ...]], ...] = (
    (ErrorClass.CUDA_OOM, ("CUDA out of memory", "OutOfMemoryError", "CUDA error: out of memory")),
    (ErrorClass.NCCL_ERROR, ("NCCL error", "ncclInternalError", "ncclSystemError", "ncclUnhandledCudaError")),
    # uvicorn's bind failure once the weights are loaded: "[Errno 98] error while attempting to bind on
    # address ('127.0.0.1', 30000): address already in use" (asyncio lower-cases the strerror); the
    # multi-tokenizer listener's probe bind raises the plain "[Errno 98] Address already in use".
    (ErrorClass.PORT_TAKEN, ("address already in use", "Address already in use")),
)
