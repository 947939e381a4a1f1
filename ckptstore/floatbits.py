"""Float arithmetic on stored bits: a tensor's host array holds its bits in the dtype
:mod:`ckptstore.dtypes` names (bfloat16 as uint16), so sums on 16-bit floats go through float32
and round back to nearest (ties to even), the same way on the write side and the read side.

>>> import numpy as np
>>> b = from_values(np.array([1.0, 2.5], np.float32), "bfloat16")
>>> b.dtype, float_values(add_residual(b, b, "bfloat16"), "bfloat16").tolist()
(dtype('uint16'), [2.0, 5.0])
"""

from __future__ import annotations

import numpy as np

__all__ = ["add_residual", "float_values", "from_values"]


def float_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a host array of dtype ``dtype``: float32 for the 16-bit floats (exact), the
    array itself for float32 and float64."""
    if dtype == "bfloat16":
        from ckptcodecs._floats import from_bf16_bits  # ckptcodecs loads in ~0.3 s: when used
        return from_bf16_bits(bits)
    if dtype == "float16":
        return bits.astype(np.float32)
    return bits


def from_values(values: np.ndarray, dtype: str) -> np.ndarray:
    """The host array of dtype ``dtype`` holding ``values`` (16-bit floats rounded to nearest,
    ties to even; float32 and float64 as they are)."""
    if dtype == "bfloat16":
        from ckptcodecs._floats import to_bf16_bits
        return to_bf16_bits(values)
    if dtype == "float16":
        return values.astype(np.float16)
    return values


def add_residual(base: np.ndarray, residual: np.ndarray, dtype: str,
                 out: np.ndarray | None = None) -> np.ndarray:
    """``base + residual`` as a checkout rebuilds a residual link (both host arrays of dtype
    ``dtype``): float32 and float64 add in place of ``out``; 16-bit floats add in float32 and
    round once."""
    if dtype in ("bfloat16", "float16"):
        total = from_values(float_values(base, dtype) + float_values(residual, dtype), dtype)
        if out is None:
            return total
        out[...] = total
        return out
    return np.add(base, residual, out=out)
