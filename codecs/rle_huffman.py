"""RLEHuffman: DynaQuant's run-length + canonical Huffman coding of byte symbols (section 6.2).

Run lengths are stored only for runs longer than one, told apart from values by sign (values map
to ``<= 0``, run lengths are ``> 0``); the resulting symbols are Huffman coded with a canonical code
whose code-length table travels in a small header. Where coding would not make the data smaller,
the bytes are stored raw.

Encoded layout (little-endian), version 1::

    u8  version (1)
    u8  mode: 0 = raw, 1 = RLE + Huffman
    u64 n: number of decoded bytes
    mode 0: n raw bytes
    mode 1: u64 nsym (symbols in the stream), u32 nused (distinct symbols),
            nused x u16 symbol index (strictly increasing), nused x u8 code length (1..24),
            u32 CRC-32 of all header bytes before it,
            then the MSB-first bit stream (zero padded to a byte)

The header CRC means a corrupted length field is refused before anything is allocated.

See :mod:`ckptcodecs._hkernels` for the symbol alphabet.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np
from numcodecs.abc import Codec
from numcodecs.compat import ensure_contiguous_ndarray

from ._backend import CHOICE, kernels, native
from ._hkernels import (
    ALPHABET,
    ERR_BITS,
    ERR_CODE,
    ERR_OVERFLOW,
    ERR_RUN,
    ERR_SHORT,
    LUT_BITS,
    MAX_LEN,
    MAX_RUN,
    canonical_codes,
    code_lengths,
    decode_symbols,
    encode_stream,
)
from ._buffers import as_input, copy_out, payload
from .errors import CodecError
from .planes import huffman_share

__all__ = ["SAMPLE_BLOCK", "SAMPLE_BLOCKS", "RLEHuffman", "coded_parts", "decode_tables",
           "pays_to_code", "rle_huffman_decode", "rle_huffman_encode"]

VERSION = 1
_HEAD = struct.Struct("<BBQ")
_HUFF = struct.Struct("<QI")
# The implementation this process runs (ckptcodecs._backend): C, or the numba kernels.
_K = kernels("rle_huffman", encode_stream=encode_stream, code_lengths=code_lengths,
             canonical_codes=canonical_codes, decode_symbols=decode_symbols)
#: the whole payload in one call that releases the GIL once (C; numba runs the steps below)
_ONE_CALL = native().rle_huffman_encode_all if CHOICE == "c" else None
_ERRORS = {
    ERR_BITS: "bit stream ends early",
    ERR_CODE: "bit pattern that is no Huffman code",
    ERR_RUN: "run length before any value",
    ERR_OVERFLOW: "symbols decode to more bytes than the header announces",
    ERR_SHORT: "symbols decode to fewer bytes than the header announces",
}


#: :func:`pays_to_code` reads this many evenly spaced blocks of a buffer ...
SAMPLE_BLOCKS = 16
#: ... of this many bytes each (1/16 of the 8-bit codes of a 1 MiB chunk)
SAMPLE_BLOCK = 1024
#: below this share of bytes that start a run, runs are common: RLE may pay whatever the
#: bytes' entropy
_RUNS_RARE = 7 / 8


def pays_to_code(arr: np.ndarray, min_saving: float) -> bool:
    """Whether RLEHuffman coding ``arr`` (uint8, 1-d) saves at least ``min_saving`` of its
    size, as a sample tells: its :data:`SAMPLE_BLOCKS` evenly spaced blocks of
    :data:`SAMPLE_BLOCK` bytes. Where runs are common in them, or the buffer is under four
    samples' size, yes (coding finds out); else where a Huffman code of the sample's byte
    histogram takes at most ``1 - min_saving`` of its size."""
    n = arr.size
    if n < 4 * SAMPLE_BLOCKS * SAMPLE_BLOCK:
        return True
    step = (n - SAMPLE_BLOCK) // (SAMPLE_BLOCKS - 1)
    sample = np.lib.stride_tricks.as_strided(arr, (SAMPLE_BLOCKS, SAMPLE_BLOCK), (step, 1))
    if np.count_nonzero(sample[:, 1:] != sample[:, :-1]) < _RUNS_RARE * (sample.size
                                                                          - SAMPLE_BLOCKS):
        return True
    return huffman_share(sample.reshape(-1)) <= 1.0 - min_saving


def _raw(arr: np.ndarray) -> bytes:
    """``arr`` stored raw (mode 0), copied once."""
    return b"".join((_HEAD.pack(VERSION, 0, arr.size), arr))


def rle_huffman_encode(data, min_saving: float = 0.0) -> bytes:
    """Encode bytes (any contiguous buffer) to the RLEHuffman layout (the coding runs in one
    compiled call that releases the GIL). ``min_saving`` > 0: stored raw, without coding,
    where a sample of it says that coding would save less than that share of the size
    (:func:`pays_to_code`), as zstd stores literals raw below a minimum gain: coding costs a
    core a few nanoseconds a byte."""
    arr = ensure_contiguous_ndarray(as_input(data)).reshape(-1).view(np.uint8)
    n = arr.size
    if not 0.0 <= min_saving < 1.0:
        raise ValueError(f"min_saving must be in [0, 1), not {min_saving!r}")
    if _ONE_CALL is not None:
        return _ONE_CALL(arr, float(min_saving))
    return _encode_steps(arr, min_saving)


def _encode_steps(arr: np.ndarray, min_saving: float) -> bytes:
    """:func:`rle_huffman_encode` of ``arr`` (uint8, 1-d) a step at a time, kernel by kernel:
    what numba runs, and the twin the one compiled call is checked against."""
    n = arr.size
    if n == 0:
        return _HEAD.pack(VERSION, 0, 0)
    if min_saving and not pays_to_code(arr, min_saving):
        return _raw(arr)
    head = _HEAD.size + _HUFF.size
    out, end, nsym, used, lens = _K.encode_stream(arr, head)
    if end < 0:  # coding would not make it smaller: store raw
        return _raw(arr)
    header = (_HEAD.pack(VERSION, 1, n) + _HUFF.pack(nsym, used.size)
              + used.astype("<u2").tobytes() + lens.astype(np.uint8).tobytes())
    header += struct.pack("<I", zlib.crc32(header))
    out[:len(header)] = np.frombuffer(header, np.uint8)
    return out[:end].tobytes()


def rle_huffman_decode(buf) -> np.ndarray:
    """Decode an RLEHuffman payload to a uint8 array; raise CodecError if it is malformed."""
    parts = coded_parts(buf)
    if isinstance(parts, np.ndarray):  # stored raw
        return parts
    stream, nsym, n, tables = parts
    out = np.empty(n, np.uint8)
    status = _K.decode_symbols(stream, nsym, n, *tables, out)
    if status < 0:
        raise CodecError(f"RLEHuffman payload corrupted: {_ERRORS[status]}")
    if (status + 7) // 8 != stream.size:
        raise CodecError(f"RLEHuffman bit stream has {stream.size} bytes, the symbols use "
                         f"{(status + 7) // 8} (trailing garbage)")
    return out


def coded_parts(buf) -> np.ndarray | tuple[np.ndarray, int, int, tuple]:
    """The checked header of an RLEHuffman payload: a copy of the bytes where they are stored
    raw, else ``(stream, nsym, n, tables)``, the arguments of the decoder kernel but its output
    (``tables``: :func:`decode_tables`'). A CodecError where the header is malformed."""
    b = payload(buf)
    if b.size < _HEAD.size:
        raise CodecError(f"RLEHuffman payload truncated: {b.size} bytes, header needs {_HEAD.size}")
    version, mode, n = _HEAD.unpack_from(b)
    if version != VERSION:
        raise CodecError(f"RLEHuffman format version {version} is not supported (expected "
                         f"{VERSION}); was it written by a newer ckptcodecs?")
    body = b[_HEAD.size:]
    if mode == 0:
        if body.size != n:
            raise CodecError(f"RLEHuffman raw payload holds {body.size} bytes, header says {n}")
        return body.copy()
    if mode != 1:
        raise CodecError(f"RLEHuffman mode {mode} is unknown")
    if body.size < _HUFF.size:
        raise CodecError("RLEHuffman payload truncated in the Huffman header")
    nsym, nused = _HUFF.unpack_from(body)
    table_end = _HUFF.size + 3 * nused
    if not 1 <= nused <= ALPHABET or body.size < table_end + 4:
        raise CodecError(f"RLEHuffman code table of {nused} symbols does not fit the payload")
    (crc,) = struct.unpack_from("<I", body, table_end)
    if crc != zlib.crc32(b[:_HEAD.size + table_end]):
        raise CodecError("RLEHuffman header checksum mismatch (corrupted payload)")
    syms = body[_HUFF.size:_HUFF.size + 2 * nused].copy().view("<u2").astype(np.int64)
    lens = body[_HUFF.size + 2 * nused:table_end].astype(np.int64)
    stream = body[table_end + 4:]
    if np.any(np.diff(syms) <= 0) or lens.min() < 1 or lens.max() > MAX_LEN:
        raise CodecError("RLEHuffman code table is corrupted (symbols not increasing or code "
                         "lengths outside 1..24)")
    if int((1 << (MAX_LEN - lens)).sum()) > 1 << MAX_LEN:
        raise CodecError("RLEHuffman code lengths violate the Kraft inequality (corrupted table)")
    if nsym > 8 * stream.size or nsym > n or n > nsym * MAX_RUN:
        raise CodecError(f"RLEHuffman header inconsistent: {nsym} symbols, {n} bytes, "
                         f"{stream.size} bytes of bit stream")
    return stream, nsym, n, decode_tables(syms, lens)


def decode_tables(syms: np.ndarray, lens: np.ndarray) -> tuple:
    """The decoder kernel's tables of a checked code table (symbols, code lengths):
    ``(lut, first, offset, count, sorted_syms, maxlen)``."""
    codes = np.empty(syms.size, np.int64)
    _K.canonical_codes(lens, codes)
    maxlen = int(lens.max())
    nbits = LUT_BITS
    sym1 = np.zeros(1 << nbits, np.int64)
    len1 = np.zeros(1 << nbits, np.int64)
    short = lens <= nbits
    for s, c, ln in zip(syms[short], codes[short], lens[short]):
        lo = int(c) << (nbits - int(ln))
        sym1[lo:lo + (1 << (nbits - int(ln)))] = s
        len1[lo:lo + (1 << (nbits - int(ln)))] = ln
    # second symbol: the code in the bits after the first one, if it fits the table's window
    # and both symbols are values (runs are expanded one at a time)
    idx = np.arange(1 << nbits, dtype=np.int64)
    rest = (idx << len1) & ((1 << nbits) - 1)
    len2 = len1[rest]
    pair = (len1 > 0) & (len2 > 0) & (len1 + len2 <= nbits) & (sym1 < 256) & (sym1[rest] < 256)
    lut = len1 | (sym1 << 8) | np.where(pair, ((len1 + len2) << 24) | (sym1[rest] << 32), 0)
    order = np.lexsort((syms, lens))
    sorted_syms = syms[order]
    count = np.bincount(lens, minlength=MAX_LEN + 2).astype(np.int64)
    offset = np.zeros(MAX_LEN + 2, np.int64)
    offset[1:] = np.cumsum(count)[:-1]
    first = np.zeros(MAX_LEN + 2, np.int64)
    for ln in range(1, MAX_LEN + 1):
        if count[ln]:
            first[ln] = codes[order[offset[ln]]]
    return lut, first, offset, count, sorted_syms, maxlen


class RLEHuffman(Codec):
    """Lossless bytes codec: run lengths + canonical Huffman (DynaQuant, section 6.2).

    Meant for data with long runs and few distinct byte values, such as BucketDelta residuals or
    packed quantization codes. Stores the input raw when coding would expand it.

    Examples
    --------
    >>> import numpy as np
    >>> codec = RLEHuffman()
    >>> data = np.zeros(10_000, dtype=np.uint8)
    >>> len(codec.encode(data)) < 100
    True
    >>> bool((codec.decode(codec.encode(data)) == data).all())
    True
    """

    codec_id = "ckpt.rle_huffman"

    def encode(self, buf) -> bytes:
        """Encode the bytes of ``buf`` (any contiguous buffer; object arrays: TypeError)."""
        return rle_huffman_encode(buf)

    def decode(self, buf, out=None):
        """Decode to uint8, or into ``out`` (writeable, exactly the decoded size)."""
        return copy_out(rle_huffman_decode(buf), out, "RLEHuffman")

    def __repr__(self) -> str:
        return "RLEHuffman()"
