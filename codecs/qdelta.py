"""DynaQuant code deltas of one chunk: the new version's codes as bucket-rearranged cyclic deltas
against the base version's codes, RLE + Huffman coded, next to the new version's parameters.

Byte layout (little-endian; ckptstore appends zarr's crc32c)::

    b"QD" | u8 version (1) | u32 n = length of the parameter block
    u8 bits | u16 levels (of the new version, special levels included) | u64 count
    parameter block: a Quantize chunk without its packed codes (header, scales or codebook,
                     protected values; see :mod:`ckptcodecs._qformat`) -- the new parameters
    RLEHuffman(delta_encode(new codes, base codes, K))   with K = the larger level count

Decoding needs the base codes, which zarr cannot see: this is a format of functions, not a
numcodecs codec, and arrays stored this way are read by ckptstore only.

Examples
--------
>>> import numpy as np
>>> from ckptcodecs import quantize
>>> x = np.linspace(-1, 1, 64, dtype="float32")
>>> base_codes, base_params = quantize(x, "uniform-asymmetric", 4)
>>> codes, params = quantize(x + 0.01, "uniform-asymmetric", 4)
>>> buf = qdelta_encode(codes, params, base_codes, base_params)
>>> got, _ = qdelta_decode(buf, base_codes, base_params)
>>> bool((got == codes).all())
True
"""

from __future__ import annotations

import struct

import numpy as np

from ._qformat import decode_chunk, encode_chunk
from .bitpack import pack_bits, packed_size
from .delta import delta_decode, delta_encode
from .errors import CodecError
from .qparams import QuantParams
from .rle_huffman import rle_huffman_decode, rle_huffman_encode

__all__ = ["VERSION", "qdelta_decode", "qdelta_encode"]

#: Format version of a code-delta chunk.
VERSION = 1
_HEAD = struct.Struct("<2sBIBHQ")
_MAGIC = b"QD"


def qdelta_encode(codes: np.ndarray, params: QuantParams, base_codes: np.ndarray,
                  base_params: QuantParams) -> bytes:
    """Bytes of the new version ``(codes, params)`` of a chunk as deltas against its base."""
    full = encode_chunk(codes, params)
    block = full[: len(full) - packed_size(params.count, params.bits)]
    residual = delta_encode(codes, base_codes, (params.levels, base_params.levels))
    head = _HEAD.pack(_MAGIC, VERSION, len(block), params.bits, params.levels, params.count)
    return head + block + rle_huffman_encode(residual)


def qdelta_decode(buf, base_codes: np.ndarray,
                  base_params: QuantParams) -> tuple[np.ndarray, QuantParams]:
    """``(codes, params)`` of the new version of a chunk; CodecError if ``buf`` is malformed."""
    body = memoryview(buf).cast("B")
    if len(body) < _HEAD.size:
        raise CodecError("code delta truncated")
    magic, version, n, bits, levels, count = _HEAD.unpack_from(body)
    if magic != _MAGIC or version != VERSION or _HEAD.size + n > len(body) or not 1 <= bits <= 8:
        raise CodecError("code delta has a bad header")
    block = bytes(body[_HEAD.size: _HEAD.size + n])
    residual = rle_huffman_decode(body[_HEAD.size + n:])
    if count != base_codes.size:
        raise CodecError(f"code delta of {count} values against {base_codes.size} base codes")
    codes = delta_decode(residual, base_codes, (levels, base_params.levels))
    # decode_chunk re-validates the parameters and that every code fits their levels
    return decode_chunk(np.frombuffer(block + pack_bits(codes, bits).tobytes(), np.uint8))
