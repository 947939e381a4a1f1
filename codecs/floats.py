"""Casts between the float dtypes the codecs accept, on their bits (public API).

bfloat16 has no numpy dtype: an array of bfloat16 values travels as its uint16 bit pattern, and
these functions read and write that pattern. Every cast is one compiled pass over the bits (the
implementation lives in a private module and may change; the bits these functions return do
not: ``tests/codecs/test_codec_floats.py`` compares them with numpy's casts and the bfloat16
rounding rule on every exponent, sign, tie and special value).

- :func:`to_bf16_bits`: float values -> bfloat16 bits, nearest (ties to even); finite values
  beyond the bfloat16 range saturate to the largest finite bfloat16, NaN stays a quiet NaN.
- :func:`from_bf16_bits`: bfloat16 bits -> float32 values (exact).
- :func:`to_float16`: ``x.astype(np.float16)``, the same bits (faster from float32).
- :func:`float16_values`: float16 -> float32 values (exact).
- :func:`from_float`: float32/float64 values -> an array of a dtype named by string
  (``"bfloat16"``: uint16 bits), as :func:`ckptcodecs.dequantize` returns its values.
- :func:`add_rounded`: ``base + residual`` of two bfloat16 (bits) or float16 arrays, added in
  float32 and rounded once; a sum of finite values saturates at the largest finite value.

>>> import numpy as np
>>> from ckptcodecs.floats import add_rounded, from_bf16_bits, to_bf16_bits
>>> b = to_bf16_bits(np.array([1.0, 2.5, 1.00390625], np.float32))
>>> b.dtype, from_bf16_bits(b).tolist()
(dtype('uint16'), [1.0, 2.5, 1.0])
>>> from_bf16_bits(add_rounded(b, b, "bfloat16")).tolist()
[2.0, 5.0, 2.0]
"""

from __future__ import annotations

from ._floats import (
    add_rounded,
    float16_values,
    from_bf16_bits,
    from_float,
    to_bf16_bits,
    to_float16,
)

__all__ = ["add_rounded", "float16_values", "from_bf16_bits", "from_float", "to_bf16_bits",
           "to_float16"]
