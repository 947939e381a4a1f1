"""Exact selection of the largest / smallest magnitudes (the protect and prune sets) in O(n).

The magnitude's bit pattern, cut to exponent and 7 mantissa bits, is a bucket key that orders
values by magnitude (``|x|`` bits of an IEEE float compare like the floats). One counting pass
finds the bucket holding the k-th value; a second pass takes every value beyond it and the
candidates inside it, of which a stable sort over the (few) candidates picks the rest: ties at
the k-th magnitude go to the lowest indices. The two passes run as :data:`SELECT` chose (the C
twins ``ckptcodecs._native.select_*`` by default; the numba ones here are the reference).
"""

from __future__ import annotations

import numpy as np
from ._jit import njit

from ._backend import kernels

__all__ = ["select_magnitudes"]

_MANT = 7


@njit(cache=True, nogil=True)
def _keys_hist(xb, excl, shift, inf_bits, counts):  # pragma: no cover - compiled
    has = excl.size > 0
    for i in range(xb.size):
        if has and excl[i]:
            continue
        u = xb[i] & ~(xb.dtype.type(1) << xb.dtype.type(xb.itemsize * 8 - 1))
        if u >= inf_bits:
            continue
        counts[np.int64(u >> shift)] += 1


@njit(cache=True, nogil=True)
def _collect(xb, excl, shift, inf_bits, b, top, sure, cand):  # pragma: no cover - compiled
    # indices beyond bucket b (above it if top, else below) into `sure`, inside it into `cand`
    has = excl.size > 0
    ns = 0
    nc = 0
    for i in range(xb.size):
        if has and excl[i]:
            continue
        u = xb[i] & ~(xb.dtype.type(1) << xb.dtype.type(xb.itemsize * 8 - 1))
        if u >= inf_bits:
            continue
        key = np.int64(u >> shift)
        if key == b:
            cand[nc] = i
            nc += 1
        elif (key > b) == top:
            sure[ns] = i
            ns += 1
    return ns, nc


#: the passes this process runs (C twins or these numba ones, by ``CKPTCODECS_KERNELS``)
SELECT = kernels("select", keys_hist=_keys_hist, collect=_collect)


def select_magnitudes(x: np.ndarray, k: int, largest: bool,
                      exclude: np.ndarray | None = None) -> np.ndarray:
    """Indices (unsorted) of the ``k`` finite values of largest (or smallest) magnitude.

    ``exclude``: optional uint8 mask of values not to consider. Non-finite values never count.
    """
    if k <= 0:
        return np.zeros(0, np.int64)
    if x.dtype == np.float64:
        xb = x.view(np.uint64)
        shift, inf_bits, nkeys = np.uint64(52 - _MANT), np.uint64(0x7FF0000000000000), 1 << 18
    else:
        xb = x.astype(np.float32, copy=False).view(np.uint32)
        shift, inf_bits, nkeys = np.uint32(23 - _MANT), np.uint32(0x7F800000), 1 << 15
    excl = np.zeros(0, np.uint8) if exclude is None else exclude
    counts = np.zeros(nkeys, np.int64)
    SELECT.keys_hist(xb, excl, shift, inf_bits, counts)
    order = counts[::-1] if largest else counts
    cum = np.cumsum(order)
    pos = int(np.searchsorted(cum, k))  # first position where the running count reaches k
    if pos >= nkeys:
        raise ValueError(f"cannot select {k} of {int(cum[-1])} values")
    b = nkeys - 1 - pos if largest else pos
    before = int(cum[pos - 1]) if pos else 0
    sure = np.empty(before, np.int64)
    cand = np.empty(int(counts[b]), np.int64)
    SELECT.collect(xb, excl, shift, inf_bits, b, largest, sure, cand)
    need = k - before
    if need < cand.size:
        # ties at the k-th magnitude go to the lowest indices (``cand`` is ascending and the
        # sort stable): the selection is a function of the values alone, which a GPU's stable
        # sort reproduces (ckptstore.device.quant)
        mag = np.abs(x[cand].astype(np.float64))
        cand = cand[np.argsort(-mag if largest else mag, kind="stable")[:need]]
    return np.concatenate([sure, cand])
