"""Compiled per-element kernels of Quantize: segment ranges, uniform codes, dequantization.

The functions here are the numba reference; callers run :data:`QUANT`, the kernels
:mod:`ckptcodecs._backend` chose (the C twins of ``ckptcodecs._native``, ``quant_*``, by default:
the same arguments and bytes; on bad sizes or dtypes they raise ValueError).

Segments are consecutive runs of ``seg`` values of a flat array (the last one may be shorter).
``mask`` arguments are uint8 arrays of the input's size (nonzero = value handled elsewhere:
protected, pruned or non-finite) or of size 0 (no value excluded).
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

from ._backend import kernels

__all__ = ["QUANT", "dequant_codebook", "dequant_uniform", "f16_round", "seg_absmax",
           "seg_minmax", "uniform_codes", "uniform_params_f16"]


@njit(cache=True, nogil=True)
def seg_minmax(x, seg, mask, lo, hi):  # pragma: no cover - compiled
    n = x.size
    has_mask = mask.size > 0
    for s in range(lo.size):
        a0 = s * seg
        b0 = min(a0 + seg, n)
        mn = np.inf
        mx = -np.inf
        if has_mask:
            for i in range(a0, b0):
                if mask[i] == 0:
                    v = x[i]
                    mn = min(mn, v)
                    mx = max(mx, v)
        else:
            for i in range(a0, b0):
                v = x[i]
                mn = min(mn, v)
                mx = max(mx, v)
        if mn > mx:  # no value in this segment
            mn = 0.0
            mx = 0.0
        lo[s] = mn
        hi[s] = mx


@njit(cache=True, nogil=True)
def seg_absmax(x, seg, mask, out):  # pragma: no cover - compiled
    n = x.size
    has_mask = mask.size > 0
    for s in range(out.size):
        a0 = s * seg
        b0 = min(a0 + seg, n)
        m = 0.0
        for i in range(a0, b0):
            if has_mask and mask[i]:
                continue
            m = max(m, abs(x[i]))
        out[s] = m


@njit(cache=True, nogil=True)
def uniform_codes(x, seg, zero, inv, fq, half, fzero, out):  # pragma: no cover - compiled
    """out[i] = clip(floor((x - zero) * inv + 0.5), 0, qmax); NaN -> 0.

    ``fq`` (qmax), ``half`` (0.5) and ``fzero`` (0.0) are scalars of the working float type, so
    that float32 data is computed in float32 (twice the SIMD width of float64).
    """
    n = x.size
    for s in range(zero.size):
        a0 = s * seg
        b0 = min(a0 + seg, n)
        z = zero[s]
        iv = inv[s]
        for i in range(a0, b0):
            t = (x[i] - z) * iv + half
            t = min(max(t, fzero), fq)
            out[i] = 0 if np.isnan(t) else np.uint8(t)


@njit(cache=True, nogil=True)
def dequant_uniform(codes, seg, zero, scale, nq, prune_code, protect_code, prot, lim,
                    out):  # pragma: no cover - compiled
    n = codes.size
    p = 0
    for s in range(zero.size):
        a0 = s * seg
        b0 = min(a0 + seg, n)
        z = np.float64(zero[s])  # float64: z + sc * c may exceed the float32 range midway
        sc = np.float64(scale[s])
        for i in range(a0, b0):
            c = codes[i]
            if c < nq:
                # rounding of float32 parameters may step past the largest finite value
                out[i] = min(max(z + sc * c, -lim), lim)
            elif c == protect_code:
                out[i] = prot[p]
                p += 1
            else:
                out[i] = 0.0


@njit(cache=True, nogil=True)
def dequant_codebook(codes, seg, book, nq, prune_code, protect_code, prot, out):  # pragma: no cover
    n = codes.size
    p = 0
    for s in range(book.shape[0]):
        a0 = s * seg
        b0 = min(a0 + seg, n)
        for i in range(a0, b0):
            c = codes[i]
            if c < nq:
                out[i] = book[s, c]
            elif c == protect_code:
                out[i] = prot[p]
                p += 1
            else:
                out[i] = 0.0


_POW2 = np.array([2.0 ** k for k in range(-24, 6)])  # float16 spacings 2**-24 .. 2**5
_INV_POW2 = 1.0 / _POW2


@njit(cache=True, nogil=True)
def f16_round(v, direction, out):  # pragma: no cover - compiled
    """``out[i]`` = ``v[i]`` (float64) rounded to a float16 value: down (-1), nearest-even (0, as
    IEEE: +-inf from 65520 on) or up (+1; +-inf for any ``|v| > 65504``). NaN stays NaN.
    ``out`` may be ``v``."""
    bits = v.view(np.int64)
    pow2 = _POW2
    inv = _INV_POW2
    for i in range(v.size):
        x = v[i]
        a = abs(x)
        if not a < np.inf or a == 0.0:
            out[i] = x
            continue
        if a > 65504.0 and (direction != 0 or a >= 65520.0):
            out[i] = np.inf if x > 0 else -np.inf
            continue
        # spacing of float16 values around a: 2**(exponent - 10), at least 2**-24
        e = ((bits[i] >> 52) & 0x7FF) - 1023
        k = min(max(e - 10, -24), 5) + 24
        q = a * inv[k]  # exact: a power-of-two scaling
        if direction == 0:
            r = np.rint(q)
        elif (direction < 0) == (x > 0):  # towards zero in magnitude
            r = np.floor(q)
        else:
            r = np.ceil(q)
        r *= pow2[k]
        out[i] = r if x > 0 else -r


@njit(cache=True, nogil=True)
def uniform_params_f16(lo, hi, nq, zero, scale):  # pragma: no cover - compiled
    """float16 zero points (rounded down) and scales (rounded up) covering ``[lo, hi]``, as
    float64 in ``zero``/``scale``; ``nq == 1``: the midpoint to nearest, scale 0. False if one
    is beyond the float16 range (the outputs are then partly written)."""
    if nq == 1:
        for s in range(lo.size):
            zero[s] = lo[s] / 2 + hi[s] / 2
            scale[s] = 0.0
        f16_round(zero, 0, zero)
    else:
        f16_round(lo, -1, zero)
        for s in range(lo.size):
            scale[s] = (hi[s] - zero[s]) / (nq - 1)
        f16_round(scale, 1, scale)
    for s in range(lo.size):
        if not (abs(zero[s]) < np.inf and abs(scale[s]) < np.inf):
            return False
    return True


#: the kernels this process runs (C twins or these numba ones, by ``CKPTCODECS_KERNELS``)
QUANT = kernels("quant", seg_minmax=seg_minmax, seg_absmax=seg_absmax,
                uniform_codes=uniform_codes, dequant_uniform=dequant_uniform,
                dequant_codebook=dequant_codebook, f16_round=f16_round,
                uniform_params_f16=uniform_params_f16)
