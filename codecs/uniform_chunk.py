"""A whole uniform (or adaptive-asymmetric) Quantize chunk in one compiled call (issue 28).

:func:`encode_uniform_chunk` returns the bytes of ``encode_chunk(*quantize(x, method, bits,
...))`` -- with ``entropy``, of ``rle_huffman_encode`` of them -- where the uniform path needs
none of quantize's special cases, and None elsewhere (the caller then runs those steps). The
steps release the GIL about fifteen times a chunk (numpy's checks and copies, the kernels, the
entropy gate's sample, the coder's two calls); a persist in the background waits for the GIL
again after each, and beside a training loop each wait costs the loop a hand-over. The one
call (``quant_encode_uniform``, ``csrc/quant_chunk.c``) releases it once, and quantizes a
segment at a time while it is in cache. The adaptive-asymmetric method's one call
(``quant_encode_adaptive``) takes every segment's range first, refines them all with
Check-N-Run's search (the kernels :func:`ckptcodecs.adaptive.adaptive_ranges` runs, called from
C), then codes each segment as the uniform one does.
"""

from __future__ import annotations

import numpy as np

from ._backend import CHOICE, native
from ._floats import dtype_code
from .adaptive import default_num_bins
from .qparams import check_parameters, segment_length

__all__ = ["encode_checked", "encode_uniform_chunk", "one_call_applies"]

_native = native() if CHOICE == "c" else None
_UNIFORM = ("uniform-asymmetric", "uniform-symmetric")
_METHODS = (*_UNIFORM, "adaptive-asymmetric")
#: what the one call reads besides bfloat16 bits: these values
_FLOATS = ("float32", "float16")


def one_call_applies(method: str, protect: float = 0.0, prune: float = 0.0,
                     dtype: str | None = None, protect_mode: str = "level",
                     param_dtype: str = "float32") -> bool:
    """Whether :func:`encode_uniform_chunk` can stand for quantize's steps with these
    parameters (the data's own type aside): a uniform or the adaptive-asymmetric method,
    nothing protected or pruned,
    float32 parameters, the level layout, the compiled kernels in use (not numba's reference);
    ``dtype`` None or ``"bfloat16"`` (Quantize's: bfloat16 bits in a uint16 array)."""
    return (_native is not None and method in _METHODS and protect == 0 and prune == 0
            and dtype in (None, "bfloat16") and protect_mode == "level"
            and param_dtype == "float32")


def encode_uniform_chunk(x: np.ndarray, method: str, bits: int, granularity: str = "row",
                         group_size: int | None = None, *, entropy: bool = False,
                         min_saving: float = 0.0, dtype: str | None = None,
                         num_bins: int | None = None, ratio: float = 1.0) -> bytes | None:
    """The stored bytes of a uniform Quantize chunk of ``x`` in one call, or None where
    quantize's own steps must run: data other than float32 or float16 (or, with
    ``dtype="bfloat16"``, a uint16 array of bfloat16 bits, as :func:`quantize` takes them), a
    value that is not finite (quantize protects it), a subnormal scale, an empty array -- and
    wherever :func:`one_call_applies` says no for ``method`` (check it first for the other
    parameters). 16-bit values are widened to float32 a segment at a time, as quantize widens
    them all first.

    ``entropy``: RLEHuffman coded as ``rle_huffman_encode(chunk, min_saving)`` codes it.
    ``num_bins``, ``ratio``: the adaptive-asymmetric method's search, as quantize takes them
    (CodecError where quantize raises it)."""
    check_parameters(method, bits, granularity, group_size, 0.0, 0.0, None, num_bins, ratio,
                     1.0, "level", "float32")
    return encode_checked(x, method, bits, granularity, group_size, entropy=entropy,
                          min_saving=min_saving, dtype=dtype, num_bins=num_bins, ratio=ratio)


def encode_checked(x: np.ndarray, method: str, bits: int, granularity: str = "row",
                   group_size: int | None = None, *, entropy: bool = False,
                   min_saving: float = 0.0, dtype: str | None = None,
                   num_bins: int | None = None, ratio: float = 1.0) -> bytes | None:
    """:func:`encode_uniform_chunk` for parameters already checked (``Quantize`` checks them
    once, when it is made: not again for every chunk)."""
    arr = np.asarray(x)
    if dtype == "bfloat16":
        name = dtype if arr.dtype.itemsize == 2 and arr.dtype.kind in "uif" else None
    else:
        name = arr.dtype.name if dtype is None and arr.dtype.name in _FLOATS else None
    if _native is None or method not in _METHODS or name is None:
        return None
    seg = segment_length(arr.shape, granularity, group_size)
    flat = np.ascontiguousarray(arr).reshape(-1)
    values = flat if name == "float32" else flat.view(np.uint16)
    if method == "adaptive-asymmetric":
        bins = int(num_bins) if num_bins else default_num_bins(int(bits))
        return _native.quant_encode_adaptive(values, seg, int(bits), bins, float(ratio),
                                             bool(entropy), float(min_saving), dtype_code(name))
    return _native.quant_encode_uniform(values, seg, int(bits), method == "uniform-symmetric",
                                        bool(entropy), float(min_saving), dtype_code(name))
