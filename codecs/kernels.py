"""Steps of :func:`ckptcodecs.quantize` that another implementation of it shares (public API).

A quantizer that runs elsewhere -- ckptstore quantizes a CUDA tensor on its GPU -- reproduces
the codes and parameters of :func:`ckptcodecs.quantize` bit for bit by doing the data-parallel
work itself and leaving to these functions the few sequential steps, which then run exactly as
on the host path. Each takes and fills numpy arrays; the implementation behind them (compiled
loops today) may change, their results may not.

Constants both sides must agree on:

- ``HIST_PER_BIN``: histogram cells per step of the adaptive range search; a segment's
  histogram has ``num_bins * HIST_PER_BIN`` cells (:func:`cell_counts_shape`).
- ``MANTISSA_BITS``: mantissa bits kept in a k-means bucket key; a bucket holds the values
  sharing sign, exponent and these mantissa bits of their float32 bit pattern.

Functions:

- :func:`segment_length`: values per quantization segment of a chunk.
- :func:`use_direct`: True where the adaptive search runs on the values themselves (short
  segments), so only the host can run it; else it runs on a histogram, which anyone may count.
- :func:`default_num_bins`, :func:`cell_counts_shape`, :func:`histogram_ranges_from_counts`:
  the adaptive-asymmetric range search from the segments' cell counts.
- :func:`fit_from_buckets`: the k-means levels of each segment from its buckets' counts and sums.
- :func:`uniform_params_f16`: zero points and scales of the uniform methods as float16 values
  (``param_dtype="float16"``).
"""

from __future__ import annotations

import numpy as np

from ._qkernels import QUANT as _Q
from .adaptive import (
    HIST_PER_BIN,
    cell_counts_shape,
    default_num_bins,
    histogram_ranges_from_counts,
    use_direct,
)
from .kmeans import MANTISSA_BITS
from .kmeans import fit_from_buckets as _fit_from_buckets
from .qparams import segment_length

__all__ = ["HIST_PER_BIN", "MANTISSA_BITS", "cell_counts_shape", "default_num_bins",
           "fit_from_buckets", "histogram_ranges_from_counts", "segment_length",
           "uniform_params_f16", "use_direct"]


def fit_from_buckets(counts: np.ndarray, sums: np.ndarray, offsets: np.ndarray, k: int,
                     lam: float, seed: int, out: np.ndarray) -> None:
    """Fit ``k`` k-means levels per segment from its buckets into ``out`` (float64, one row of
    ``k`` per segment), as ``quantize(method="kmeans", lam=lam, seed=seed)`` fits them.

    Segment ``s`` owns the buckets ``offsets[s]:offsets[s + 1]`` of ``counts`` (values in the
    bucket, > 0) and ``sums`` (their float64 sum), buckets in ascending key order (see
    ``MANTISSA_BITS``). ValueError for arrays that do not fit together.
    """
    counts, sums, offsets = np.asarray(counts), np.asarray(sums), np.asarray(offsets)
    if counts.ndim != 1 or sums.shape != counts.shape:
        raise ValueError(f"counts {counts.shape} and sums {sums.shape}: one value per bucket")
    if out.ndim != 2 or out.shape[1] != k or offsets.shape != (out.shape[0] + 1,):
        raise ValueError(f"offsets {offsets.shape} and out {out.shape}: out holds {k} levels a "
                         "segment, offsets one entry more than segments")
    if offsets.size and (offsets[0] < 0 or offsets[-1] > counts.size
                         or bool(np.any(np.diff(offsets) < 0))):
        raise ValueError(f"offsets must ascend within 0..{counts.size}")
    if counts.size and int(counts.min()) <= 0:
        raise ValueError("counts are of non-empty buckets: each > 0")
    _fit_from_buckets(counts, sums, offsets, k, lam, seed, out)


def uniform_params_f16(lo: np.ndarray, hi: np.ndarray, nq: int, zero: np.ndarray,
                       scale: np.ndarray) -> bool:
    """Zero points (rounded down) and scales (rounded up) that are float16 values and cover each
    segment's range ``[lo, hi]`` with ``nq`` levels, into ``zero`` and ``scale`` (float64);
    ``nq == 1``: the midpoint, rounded to nearest, and scale 0. False when one of them is beyond
    the float16 range: the chunk then keeps float32 parameters (outputs partly written).
    All four arrays are float64 with one value per segment, else ValueError."""
    arrays = (lo, hi, zero, scale)
    if any(a.ndim != 1 or a.dtype != np.float64 or a.size != lo.size for a in arrays):
        raise ValueError("lo, hi, zero and scale are float64 with one value per segment, got "
                         + ", ".join(f"{a.dtype}{a.shape}" for a in arrays))
    return bool(_Q.uniform_params_f16(lo, hi, int(nq), zero, scale))
