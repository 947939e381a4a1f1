"""DynaQuant code deltas of one chunk: quantize the new values, store their codes as bucket-
rearranged cyclic deltas against the base version's codes, RLE + Huffman coded.

Chunk layout (then zarr's crc32c)::

    b"QD" | u8 version (1) | u32 n = length of the parameter block
    u8 bits | u16 levels (of the new version, special levels included) | u64 count
    parameter block: a ckptcodecs Quantize chunk without its packed codes (header, scales or
                     codebook, protected values) -- the new version's own parameters
    RLEHuffman(delta_encode(new codes, base codes, K))   with K = the larger level count

Deltas need the base codes, which zarr cannot see: these arrays are read by ckptstore only.
"""

from __future__ import annotations

import struct
from typing import Any

import numpy as np

from .chunkcodec import add_crc, check_crc
from .errors import CorruptedChunkError

__all__ = ["decode_delta_chunk", "encode_delta_chunk"]

_HEAD = struct.Struct("<2sBIBHQ")
_MAGIC = b"QD"


def encode_delta_chunk(values: np.ndarray, quant: dict[str, Any], base_codes: np.ndarray,
                       base_params: Any) -> tuple[tuple[bytes, bytes], np.ndarray, Any]:
    """``(stored bytes, new codes, new params)`` of one chunk."""
    from ckptcodecs import delta_encode, encode_chunk, packed_size, quantize, rle_huffman_encode

    kw = dict(quant)
    codes, params = quantize(np.ascontiguousarray(values), kw.pop("method"), kw.pop("bits"), **kw)
    full = encode_chunk(codes, params)
    block = full[: len(full) - packed_size(params.count, params.bits)]
    residual = delta_encode(codes, base_codes, (params.levels, base_params.levels))
    head = _HEAD.pack(_MAGIC, 1, len(block), params.bits, params.levels, params.count)
    data = head + block + rle_huffman_encode(residual)
    return add_crc(data), codes, params


def decode_delta_chunk(data: bytes, base_codes: np.ndarray, base_params: Any,
                       where: str) -> tuple[np.ndarray, Any]:
    """``(codes, params)`` of the new version of a chunk."""
    from ckptcodecs import decode_chunk, delta_decode, pack_bits, rle_huffman_decode

    body = check_crc(data, where)
    try:
        if len(body) < _HEAD.size:
            raise ValueError("truncated")
        magic, version, n, bits, levels, count = _HEAD.unpack_from(body)
        if magic != _MAGIC or version != 1 or _HEAD.size + n > len(body) or not 1 <= bits <= 8:
            raise ValueError("bad header")
        block = bytes(body[_HEAD.size: _HEAD.size + n])
        residual = rle_huffman_decode(body[_HEAD.size + n:])
        if count != base_codes.size:
            raise ValueError(f"{count} values against {base_codes.size} base codes")
        codes = delta_decode(residual, base_codes, (levels, base_params.levels))
        # decode_chunk re-validates the parameters and that every code fits their levels
        return decode_chunk(np.frombuffer(block + pack_bits(codes, bits).tobytes(), np.uint8))
    except ValueError as e:
        raise CorruptedChunkError(f"chunk {where} does not decode: {e}", where) from e
