"""Chunk-wise value statistics of float tensors: non-finite, all zero, constant.

The checks look at every element, but one chunk at a time through numpy views of the raw bytes, so
memory stays at the chunk size. bf16 has no numpy dtype, so floats are viewed as unsigned integers of
their width and judged by their bits: with the sign bit masked off, a value is inf or NaN exactly when
its exponent bits are all ones (``abs_bits >= exponent_mask``) and zero exactly when ``abs_bits == 0``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

# dtype -> (unsigned view dtype, mask without the sign bit, all-ones exponent).
_FLOAT_BITS: dict[str, tuple[type[np.unsignedinteger], int, int]] = {
    "BF16": (np.uint16, 0x7FFF, 0x7F80),
    "F16": (np.uint16, 0x7FFF, 0x7C00),
    "F32": (np.uint32, 0x7FFF_FFFF, 0x7F80_0000),
}
FLOAT_DTYPES = frozenset(_FLOAT_BITS)


@dataclass(frozen=True)
class ValueSummary:
    """What the values of one float tensor look like.

    ``constant_bits`` is the bit pattern every element shares, or None when they differ.
    """

    elements: int
    non_finite: int
    all_zero: bool
    constant_bits: int | None

    def constant_value(self, dtype: str) -> float | None:
        """The shared value as a Python float, or None when the tensor is not constant."""
        if self.constant_bits is None:
            return None
        view, _, _ = _FLOAT_BITS[dtype]
        if dtype == "BF16":
            return float(np.array([self.constant_bits << 16], dtype=np.uint32).view(np.float32)[0])
        as_float = np.float16 if dtype == "F16" else np.float32
        return float(np.array([self.constant_bits], dtype=view).view(as_float)[0])


class ValueScanner:
    """Accumulates a ValueSummary over the chunks of one tensor (chunks split on element bounds)."""

    def __init__(self, dtype: str) -> None:
        self._view, self._abs_mask, self._exponent = _FLOAT_BITS[dtype]
        self._elements = 0
        self._non_finite = 0
        self._max_abs_bits = 0
        self._first: int | None = None
        self._constant = True
        self._scratch = np.empty(0, dtype=self._view)
        self._differs = np.empty(0, dtype=np.bool_)

    def add(self, chunk: memoryview) -> None:
        """Scan one chunk; its length must be a whole number of elements."""
        bits = np.frombuffer(chunk, dtype=self._view)
        count = bits.size
        if count == 0:
            return
        if self._scratch.size < count:
            # Reused across chunks: a fresh temporary per chunk costs page faults on every call.
            self._scratch = np.empty(count, dtype=self._view)
            self._differs = np.empty(count, dtype=np.bool_)
        abs_bits = np.bitwise_and(bits, self._abs_mask, out=self._scratch[:count])
        top = int(abs_bits.max())
        if top >= self._exponent:
            self._non_finite += int(np.count_nonzero(abs_bits >= self._exponent))
        self._max_abs_bits = max(self._max_abs_bits, top)
        if self._first is None:
            self._first = int(bits[0])
        if self._constant:
            differs = np.not_equal(bits, self._view(self._first), out=self._differs[:count])
            self._constant = not bool(differs.any())
        self._elements += count

    def summary(self) -> ValueSummary:
        return ValueSummary(
            elements=self._elements,
            non_finite=self._non_finite,
            all_zero=self._elements > 0 and self._max_abs_bits == 0,
            constant_bits=self._first if self._constant and self._elements > 0 else None,
        )
