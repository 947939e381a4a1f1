"""The ``ckpt.quantize`` numcodecs codec: float arrays -> self-contained chunks of packed codes.

The arithmetic is :mod:`ckptcodecs.quantization` (:func:`quantize` / :func:`dequantize`), the
parameters :mod:`ckptcodecs.qparams`, the chunk layout :mod:`ckptcodecs._qformat`; their names are
re-exported here for code that imported them from this module.
"""

from __future__ import annotations

import numpy as np
from numcodecs.abc import Codec

from ._buffers import as_input, copy_out, payload
from ._qformat import decode_chunk, encode_chunk
from .errors import CodecError, CodecTypeError
from .qparams import (
    GRANULARITIES,
    METHODS,
    PARAM_DTYPES,
    PROTECT_MODES,
    QuantParams,
    check_parameters,
    segment_length,
)
from .quantization import dequantize, quantize
from .uniform_chunk import encode_checked, one_call_applies

# the codec; the names imported above stay importable from here for code written against the
# single-module quantize of earlier releases
__all__ = ["Quantize"]


class Quantize(Codec):
    """Lossy numcodecs codec: float arrays -> self-contained chunks of packed 1..8-bit codes.

    Parameters
    ----------
    method : str
        ``'uniform-symmetric'``, ``'uniform-asymmetric'`` (default), ``'adaptive-asymmetric'``
        (Check-N-Run greedy range search) or ``'kmeans'`` (DynaQuant histogram k-means).
    bits : int
        Width of one code, 1..8.
    granularity : str
        ``'row'`` (one set of parameters per row along the last axis; default), ``'group'``
        (per ``group_size`` consecutive values) or ``'tensor'``.
    group_size : int, optional
        Values per group with ``granularity='group'``.
    protect : float
        Fraction of largest-magnitude values kept in bfloat16 (NaN and +-inf always are).
    prune : float
        Fraction of smallest-magnitude values set to zero (a level of its own).
    levels : int, optional
        k-means only: number of quantization levels (any number up to what ``bits`` holds next
        to the special levels; default: all of them).
    num_bins : int, optional
        adaptive only: greedy steps over the range (default 25 for <= 3 bits, else 45).
    ratio : float
        adaptive only: fraction of the range the greedy search may cut (default 1.0).
    lam : float
        k-means only: weight of frequency versus magnitude of a histogram bucket (1.0 = plain
        frequency-weighted k-means, the lowest L2 error).
    dtype : str, optional
        ``'bfloat16'`` to treat uint16 input as bfloat16 bits; ``'float16'``, ``'float32'`` or
        ``'float64'`` (any little-endian or native numpy spelling, stored as the name); None: the
        input's float dtype. With a dtype, raw bytes (bytes, bytearray, memoryview, array.array,
        uint8/int8 arrays) are read as values of it, as numcodecs' own filters do.
    protect_mode : str
        ``'level'`` (default): protected values take a code of their own, so ``nq`` is one less;
        ``'sparse'``: every code is a quantization level and the chunk stores the sorted
        positions of the protected values (format version 2). The config carries
        ``protect_mode`` only when it is not the default, so level-mode configs are unchanged.
    param_dtype : str
        ``'float32'`` (default; float64 for float64 data) or ``'float16'``: how zero points,
        scales and k-means levels are stored. float16 halves the parameter bytes (they dominate
        narrow rows: 8 of 12 bytes for 16 values at 2 bits). Zero points are rounded down and
        scales up to float16 *before* the codes are computed, so the error bound still holds
        with the stored scale; a chunk whose parameters exceed the float16 range (+-65504) keeps
        float32 parameters (the chunk header says which). In the config only when float16.

    Notes
    -----
    The decoded array has the input's dtype (bfloat16 as uint16 bits); a chunk carries its count,
    parameters and protected values (see :mod:`ckptcodecs._qformat`), so ``decode`` returns a
    flat array unless ``out`` gives the shape. NaN and +-inf are protected, hence restored exactly.

    numcodecs conventions: values are encoded in memory order, so an F-ordered array is encoded
    as its (C-ordered) transpose -- ``'row'`` segments then run along its first axis -- and
    ``decode(buf, out=f_ordered)`` fills it back in that order. ``out`` must be writeable and
    hold exactly the decoded bytes (else :class:`CodecError`); object arrays, to encode or to
    decode into, raise :class:`CodecTypeError` (a ``TypeError``). Parameters are checked here,
    at construction: wrong types raise :class:`CodecTypeError`, bad values :class:`CodecError`.

    Examples
    --------
    >>> import numpy as np
    >>> x = np.linspace(-1, 1, 64, dtype="float32").reshape(4, 16)
    >>> codec = Quantize(method="uniform-asymmetric", bits=4)
    >>> y = codec.decode(codec.encode(x)).reshape(x.shape)
    >>> bool(np.abs(x - y).max() <= (2 / 3) / 15 / 2 + 1e-6)
    True
    """

    codec_id = "ckpt.quantize"

    def __init__(self, method: str = "uniform-asymmetric", bits: int = 4, granularity: str = "row",
                 group_size: int | None = None, protect: float = 0.0, prune: float = 0.0,
                 levels: int | None = None, num_bins: int | None = None, ratio: float = 1.0,
                 lam: float = 1.0, dtype: str | None = None, protect_mode: str = "level",
                 param_dtype: str = "float32"):
        check_parameters(method, bits, granularity, group_size, protect, prune, levels,
                          num_bins, ratio, lam, protect_mode, param_dtype)
        dtype = _dtype_name(dtype)
        self.method = method
        self.bits = int(bits)
        self.granularity = granularity
        self.group_size = None if group_size is None else int(group_size)
        self.protect = float(protect)
        self.prune = float(prune)
        self.levels = None if levels is None else int(levels)
        self.num_bins = None if num_bins is None else int(num_bins)
        self.ratio = float(ratio)
        self.lam = float(lam)
        self.dtype = dtype
        self.protect_mode = protect_mode
        self.param_dtype = param_dtype
        self._one_call = one_call_applies(method, self.protect, self.prune, dtype, protect_mode,
                                          param_dtype)

    def get_config(self) -> dict:
        config = super().get_config()
        if config["protect_mode"] == "level":  # configs written before the option stay as they were
            del config["protect_mode"]
        if config["param_dtype"] == "float32":  # likewise
            del config["param_dtype"]
        return config

    def encode(self, buf) -> bytes:
        """Quantize ``buf`` (any buffer; see the class notes) into one chunk."""
        arr = self._values(buf)
        chunk = self._one_call_chunk(arr)
        if chunk is not None:
            return chunk
        codes, params = quantize(
            arr, self.method, self.bits, granularity=self.granularity,
            group_size=self.group_size, protect=self.protect, prune=self.prune,
            levels=self.levels, num_bins=self.num_bins, ratio=self.ratio, lam=self.lam,
            dtype=self.dtype, protect_mode=self.protect_mode, param_dtype=self.param_dtype)
        return encode_chunk(codes, params)

    def encode_one_call(self, buf, *, entropy: bool = False, min_saving: float = 0.0
                        ) -> bytes | None:
        """:meth:`encode`'s chunk in one compiled call that releases the GIL once, or None
        where quantize's special cases need its own steps (see
        :func:`ckptcodecs.encode_uniform_chunk`); ``entropy``: RLEHuffman coded, as
        ``rle_huffman_encode(chunk, min_saving)`` codes it."""
        return self._one_call_chunk(self._values(buf), entropy, min_saving)

    def _one_call_chunk(self, arr: np.ndarray, entropy: bool = False, min_saving: float = 0.0
                        ) -> bytes | None:
        if not self._one_call:
            return None
        return encode_checked(arr, self.method, self.bits, self.granularity, self.group_size,
                              entropy=entropy, min_saving=min_saving, dtype=self.dtype,
                              num_bins=self.num_bins, ratio=self.ratio)

    def _values(self, buf) -> np.ndarray:
        """The array to quantize: ``buf`` in memory order; raw bytes read as ``self.dtype``."""
        arr = as_input(buf)
        if not arr.flags.c_contiguous and arr.flags.f_contiguous:
            arr = arr.T  # memory order: the C-ordered transpose (no copy)
        if arr.dtype.kind in "iub" and arr.dtype.itemsize == 1:  # untyped bytes
            if self.dtype is None:
                raise CodecError(f"Quantize got raw bytes ({arr.dtype}): configure the codec's "
                                 "dtype ('float16', 'float32', 'float64' or 'bfloat16') to "
                                 "encode untyped buffers")
            storage = np.dtype("uint16" if self.dtype == "bfloat16" else self.dtype)
            flat = np.ascontiguousarray(arr).reshape(-1)
            if flat.size % storage.itemsize:
                raise CodecError(f"{flat.size} bytes are not a whole number of {self.dtype} "
                                 f"values ({storage.itemsize} bytes each)")
            arr = flat.view(storage)
        return arr

    def decode(self, buf, out=None):
        """Dequantize a chunk: a flat array of the encoded dtype, or into ``out``."""
        codes, params = decode_chunk(payload(buf))
        return copy_out(dequantize(codes, params), out, "Quantize")

    def __repr__(self) -> str:
        cfg = self.get_config()
        cfg.pop("id")
        args = ", ".join(f"{k}={v!r}" for k, v in cfg.items())
        return f"Quantize({args})"


_DTYPES = ("float16", "float32", "float64")


def _dtype_name(dtype) -> str | None:
    """``dtype`` as the name the config stores: None, 'bfloat16' or a float dtype name."""
    if dtype is None or (isinstance(dtype, str) and dtype == "bfloat16"):
        return dtype
    try:
        dt = np.dtype(dtype)
    except TypeError as e:  # not a dtype at all; a string naming none is a bad value
        cls = CodecError if isinstance(dtype, str) else CodecTypeError
        raise cls(f"dtype must be a float dtype or 'bfloat16', got {dtype!r}") from e
    if dt.name == "bfloat16":  # ml_dtypes' bfloat16
        return "bfloat16"
    if dt.name not in _DTYPES or dt.byteorder == ">":
        raise CodecError(f"dtype must be a (little-endian) float dtype name or 'bfloat16', "
                         f"got {dtype!r}")
    return dt.name
