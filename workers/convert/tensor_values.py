"""Chunk-wise value statistics of float tensors: non-finite, all zero, constant.

The checks look at every element, but one chunk at a time through numpy views of the raw bytes, so
memory stays at the chunk size. bf16 has no numpy dtype, so floats are judged by their bits, viewed
as integers of their width. Two reductions per chunk, with no temporaries, answer both questions:

- viewed as signed, a positive inf/NaN is above every finite value (``smax >= exponent``);
  viewed as unsigned, a negative inf/NaN is (``umax >= sign | exponent``);
- every element is +0 or -0 exactly when ``umax <= sign`` and ``smax <= 0``.

Only a chunk that holds a non-finite value is looked at again, to count them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class _Bits:
    unsigned: type[np.unsignedinteger]
    signed: type[np.signedinteger]
    sign: int
    exponent: int  # all exponent bits set: inf or NaN


_FLOAT_BITS: dict[str, _Bits] = {
    "BF16": _Bits(np.uint16, np.int16, 0x8000, 0x7F80),
    "F16": _Bits(np.uint16, np.int16, 0x8000, 0x7C00),
    "F32": _Bits(np.uint32, np.int32, 0x8000_0000, 0x7F80_0000),
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
        if dtype == "BF16":
            return float(np.array([self.constant_bits << 16], dtype=np.uint32).view(np.float32)[0])
        bits = _FLOAT_BITS[dtype]
        as_float = np.float16 if dtype == "F16" else np.float32
        return float(np.array([self.constant_bits], dtype=bits.unsigned).view(as_float)[0])


def merge_summaries(parts: list[ValueSummary]) -> ValueSummary:
    """One summary for a tensor scanned in consecutive parts."""
    constants = {part.constant_bits for part in parts if part.elements}
    elements = sum(part.elements for part in parts)
    return ValueSummary(
        elements=elements,
        non_finite=sum(part.non_finite for part in parts),
        all_zero=elements > 0 and all(part.all_zero for part in parts if part.elements),
        constant_bits=constants.pop() if len(constants) == 1 else None,
    )


class ValueScanner:
    """Accumulates a ValueSummary over the chunks of one tensor (chunks split on element bounds)."""

    def __init__(self, dtype: str) -> None:
        self._bits = _FLOAT_BITS[dtype]
        self._elements = 0
        self._non_finite = 0
        self._all_zero = True
        self._first: int | None = None
        self._constant = True

    def add(self, chunk: memoryview) -> None:
        """Scan one chunk; its length must be a whole number of elements."""
        bits = self._bits
        unsigned = np.frombuffer(chunk, dtype=bits.unsigned)
        if unsigned.size == 0:
            return
        signed = unsigned.view(bits.signed)
        umax, smax = int(unsigned.max()), int(signed.max())
        if smax >= bits.exponent or umax >= bits.sign | bits.exponent:
            magnitude = np.bitwise_and(unsigned, bits.sign - 1)
            self._non_finite += int(np.count_nonzero(magnitude >= bits.exponent))
        self._all_zero = self._all_zero and umax <= bits.sign and smax <= 0
        if self._first is None:
            self._first = int(unsigned[0])
        if self._constant:
            self._constant = umax == int(unsigned.min()) == self._first
        self._elements += unsigned.size

    def summary(self) -> ValueSummary:
        return ValueSummary(
            elements=self._elements,
            non_finite=self._non_finite,
            all_zero=self._elements > 0 and self._all_zero,
            constant_bits=self._first if self._constant and self._elements > 0 else None,
        )
