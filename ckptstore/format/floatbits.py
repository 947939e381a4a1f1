"""Float arithmetic on stored bits: a tensor's host array holds its bits in the dtype
:mod:`ckptstore.format.dtypes` names (bfloat16 as uint16), so sums on 16-bit floats go through float32
and round back to nearest (ties to even), the same way on the write side and the read side.

Residual links never turn finite weights into infinities: a residual of two finite values is
clamped to half the dtype's largest finite value (a quantizer's range of them stays finite), and
a sum of two finite values that would overflow saturates at the largest finite value. The
weight is then off by what was cut, and the next residual, taken against what checkout
rebuilds, carries it. Infinities and NaNs of the weights themselves pass through.

>>> import numpy as np
>>> b = from_values(np.array([1.0, 2.5], np.float32), "bfloat16")
>>> b.dtype, float_values(add_residual(b, b, "bfloat16"), "bfloat16").tolist()
(dtype('uint16'), [2.0, 5.0])
"""

from __future__ import annotations

import numpy as np

__all__ = ["add_residual", "float_values", "from_values", "residual_values"]

#: the largest finite value of each dtype a residual link may have
_TOP = {"bfloat16": 3.3895313892515355e38, "float16": 65504.0,
        "float32": float(np.finfo(np.float32).max),
        "float64": float(np.finfo(np.float64).max)}


def float_values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The values of a host array of dtype ``dtype``: float32 for the 16-bit floats (exact), the
    array itself for float32 and float64."""
    if dtype == "bfloat16":
        from ckptcodecs.floats import from_bf16_bits  # ckptcodecs loads in ~0.3 s: when used
        return from_bf16_bits(bits)
    if dtype == "float16":
        from ckptcodecs.floats import float16_values
        return float16_values(bits)
    return bits


def from_values(values: np.ndarray, dtype: str) -> np.ndarray:
    """The host array of dtype ``dtype`` holding ``values`` (16-bit floats rounded to nearest,
    ties to even; float32 and float64 as they are)."""
    if dtype == "bfloat16":
        from ckptcodecs.floats import to_bf16_bits
        return to_bf16_bits(values)
    if dtype == "float16":
        from ckptcodecs.floats import to_float16
        return to_float16(values)
    return values


def _largest(x: np.ndarray) -> float:
    """The largest magnitude in ``x`` (NaN if it holds one; 0 if empty): two reductions, no
    temporary."""
    return max(float(x.max()), -float(x.min())) if x.size else 0.0


def _clamp(x: np.ndarray, bound: float, finite: np.ndarray) -> None:
    """Where ``finite`` (both operands were finite) and ``x`` lies beyond ``+-bound`` (an
    overflow to an infinity too), ``x`` becomes ``bound`` with its sign."""
    with np.errstate(invalid="ignore"):
        cut = ~(np.abs(x) <= bound) & finite
    x[cut] = np.copysign(bound, x[cut])


def residual_values(values: np.ndarray, reference: np.ndarray, dtype: str) -> np.ndarray:
    """``values - reference`` (float values, see :func:`float_values`) as a residual link of
    dtype ``dtype`` stores it: where both are finite, clamped to half the dtype's largest
    finite value."""
    with np.errstate(over="ignore", invalid="ignore"):
        residual = np.subtract(values, reference)
    half = _TOP[dtype] / 2
    if not _largest(residual) <= half:  # rare: look element by element
        _clamp(residual, half, np.isfinite(values) & np.isfinite(reference))
    return residual


def add_residual(base: np.ndarray, residual: np.ndarray, dtype: str,
                 out: np.ndarray | None = None) -> np.ndarray:
    """``base + residual`` as a checkout rebuilds a residual link (both host arrays of dtype
    ``dtype``): float32 and float64 add in place of ``out``; 16-bit floats add in float32 and
    round once (one compiled pass). A sum of finite values beyond the dtype's largest finite
    value saturates at it (element by element: the same bits whichever block of rows a call
    gets)."""
    if dtype in ("bfloat16", "float16"):
        from ckptcodecs.floats import add_rounded
        return add_rounded(base, residual, dtype, out)
    top = _TOP[dtype]
    overflows = not _largest(base) + _largest(residual) <= top  # NaN too: element by element
    if overflows:
        finite = np.isfinite(base) & np.isfinite(residual)  # before an in-place add
    with np.errstate(over="ignore", invalid="ignore"):
        total = np.add(base, residual, out=out)
        if overflows:
            _clamp(total, top, finite)
    return total
