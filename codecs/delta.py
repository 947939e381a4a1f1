"""BucketDelta: DynaQuant's quantization-aware delta of codes against a base version (section 6).

With ``K`` the larger number of levels of the two versions, the residual of a value is
``(new_code - base_code) mod K`` -- the cyclic range keeps it in ``[0, K)``, one bit fewer than a
signed difference. Residuals are then rearranged so that all positions whose *base* code is ``b``
are contiguous, for ``b = 0, 1, ...`` in turn (stable within a bucket): buckets with a high
migration rate no longer break the runs of the others, which RLEHuffman then codes well. The
permutation is a function of the base codes, so it costs no storage. Protected and pruned values
are levels like any other (with ``protect_mode='sparse'`` a protected position holds an ordinary
code); the new version's protected values -- and, sparse, their positions -- travel in its own
parameters (:class:`ckptcodecs.QuantParams`). Works when the number of levels differs between
versions.

The store computes residuals outside the zarr codec pipeline (a codec sees one chunk, never
another version) and writes them as their own uint8 array, e.g. with :class:`RLEHuffman`.
"""

from __future__ import annotations

import struct

import numpy as np
from ._jit import njit
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray

from ._backend import kernels
from ._buffers import as_input, copy_out, payload
from .errors import CodecError

__all__ = ["BucketDelta", "delta_decode", "delta_encode"]


@njit(cache=True, nogil=True)
def _bucket_offsets(base, k):  # pragma: no cover - compiled
    cnt = np.zeros(k + 1, np.int64)
    for i in range(base.size):
        cnt[base[i] + 1] += 1
    for b in range(1, k + 1):
        cnt[b] += cnt[b - 1]
    return cnt


@njit(cache=True, nogil=True)
def _encode(new, base, k, out):  # pragma: no cover - compiled
    pos = _bucket_offsets(base, k)
    for i in range(new.size):
        b = base[i]
        d = np.int64(new[i]) - np.int64(b)
        if d < 0:
            d += k
        out[pos[b]] = d
        pos[b] += 1


@njit(cache=True, nogil=True)
def _decode(res, base, k, out):  # pragma: no cover - compiled
    pos = _bucket_offsets(base, k)
    for i in range(base.size):
        b = base[i]
        v = np.int64(b) + np.int64(res[pos[b]])
        if v >= k:
            v -= k
        out[i] = v
        pos[b] += 1


# The implementation this process runs (ckptcodecs._backend): C, or the numba kernels above.
_K = kernels("delta", encode=_encode, decode=_decode)


def _levels(levels: int | tuple[int, int]) -> int:
    k = max(levels) if isinstance(levels, tuple | list) else levels
    k = int(k)
    if not 1 <= k <= 256:
        raise CodecError(f"BucketDelta works on up to 256 levels (8-bit codes), got {k}")
    return k


def delta_encode(new_codes: np.ndarray, base_codes: np.ndarray,
                 levels: int | tuple[int, int]) -> np.ndarray:
    """Residuals of ``new_codes`` against ``base_codes``, rearranged by base bucket.

    Parameters
    ----------
    new_codes, base_codes : ndarray of uint8
        Codes of the two versions (same number of values, flattened in C order).
    levels : int or (int, int)
        ``K``, or the level counts of both versions (``K`` is their maximum).

    Returns
    -------
    ndarray of uint8: residuals ``(new - base) mod K`` in bucket order.
    """
    k = _levels(levels)
    new = np.ascontiguousarray(new_codes, dtype=np.uint8).reshape(-1)
    base = np.ascontiguousarray(base_codes, dtype=np.uint8).reshape(-1)
    if new.size != base.size:
        raise CodecError(f"new ({new.size}) and base ({base.size}) codes differ in size")
    if new.size and (int(new.max()) >= k or int(base.max()) >= k):
        raise CodecError(f"codes must be below K={k}")
    out = np.empty(new.size, np.uint8)
    if new.size:
        _K.encode(new, base, k, out)
    return out


def delta_decode(residuals: np.ndarray, base_codes: np.ndarray,
                 levels: int | tuple[int, int]) -> np.ndarray:
    """Inverse of :func:`delta_encode`: the new codes (uint8, flat)."""
    k = _levels(levels)
    res = np.ascontiguousarray(residuals, dtype=np.uint8).reshape(-1)
    base = np.ascontiguousarray(base_codes, dtype=np.uint8).reshape(-1)
    if res.size != base.size:
        raise CodecError(f"{res.size} residuals for {base.size} base codes")
    if res.size and (int(res.max()) >= k or int(base.max()) >= k):
        raise CodecError(f"residuals and base codes must be below K={k}")
    out = np.empty(base.size, np.uint8)
    if base.size:
        _K.decode(res, base, k, out)
    return out


class BucketDelta(Codec):
    """In-process codec form of :func:`delta_encode` carrying its base codes.

    The base is data, not configuration: ``get_config`` records only ``levels`` and the codec is
    not registered with numcodecs or zarr (a zarr codec cannot see another array version).

    Encoded layout: ``u8 version (1), u16 K, u64 count``, then ``count`` residual bytes.

    Examples
    --------
    >>> import numpy as np
    >>> base = np.array([0, 1, 2, 3, 1, 0], dtype=np.uint8)
    >>> new = np.array([0, 2, 2, 0, 1, 0], dtype=np.uint8)
    >>> codec = BucketDelta(levels=4, base=base)
    >>> codec.decode(codec.encode(new)).tolist()
    [0, 2, 2, 0, 1, 0]
    """

    codec_id = "ckpt.bucket_delta"
    _HEAD = struct.Struct("<BHQ")

    def __init__(self, levels: int, base: np.ndarray | None = None):
        self.levels = _levels(levels)
        self._base = None if base is None else np.ascontiguousarray(base, np.uint8).reshape(-1)

    def _need_base(self) -> np.ndarray:
        if self._base is None:
            raise CodecError("BucketDelta needs the base version's codes: "
                             "BucketDelta(levels, base)")
        return self._base

    def encode(self, buf) -> bytes:
        codes = ensure_contiguous_ndarray(as_input(buf)).reshape(-1).view(np.uint8)
        res = delta_encode(codes, self._need_base(), self.levels)
        return self._HEAD.pack(1, self.levels, res.size) + res.tobytes()

    def decode(self, buf, out=None):
        b = payload(buf)
        if b.size < self._HEAD.size:
            raise CodecError("BucketDelta payload truncated")
        version, k, count = self._HEAD.unpack_from(b)
        if version != 1:
            raise CodecError(f"BucketDelta format version {version} is not supported")
        if b.size - self._HEAD.size != count or k > self.levels:
            raise CodecError("BucketDelta payload truncated or corrupted")
        dec = delta_decode(b[self._HEAD.size:], self._need_base(), max(k, 1))
        return copy_out(dec, out, "BucketDelta")

    def __repr__(self) -> str:
        return f"BucketDelta(levels={self.levels})"
