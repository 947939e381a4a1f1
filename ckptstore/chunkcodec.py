"""How one chunk of an array becomes bytes on the store, and back.

A chunk pipeline is the zarr v3 codec chain ``bytes -> <compressor> -> crc32c``; the store writes
and reads chunks itself (pipelined, in parallel) but produces exactly the bytes zarr would, so plain
zarr reads every full commit. The manifest records each array's pipeline as a small dict
(:meth:`ChunkCodec.config`) and :func:`codec_from_config` rebuilds it.
"""

from __future__ import annotations

from typing import Any, Protocol

import google_crc32c
import numpy as np
from numcodecs import Blosc

from .errors import CorruptedChunkError, ManifestError

__all__ = [
    "Encoded",
    "encoded_size",
    "BloscLossless",
    "ChunkCodec",
    "QuantizedLossy",
    "RawLossless",
    "add_crc",
    "check_crc",
    "codec_from_config",
]


_CRC32C_RESIDUE = 0x48674BC7  # crc32c of any message followed by its own little-endian crc32c


Encoded = tuple[bytes, bytes]  # a stored chunk: its body, then its 4-byte crc32c


try:  # hardware crc32c over any buffer, no copy (19 GB/s here)
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - google_crc32c wants bytes: one copy per chunk
    def _crc32c(data: Any) -> int:
        return google_crc32c.value(bytes(data))


def add_crc(data: bytes | memoryview) -> Encoded:
    """``(data, crc)``: the stored chunk is their concatenation (zarr's crc32c codec layout).

    Kept as two parts so local writes need no copy to join them (``os.writev``); ``data`` may
    be a memoryview of the caller's array (valid until the chunk is written).
    """
    return data, _crc32c(data).to_bytes(4, "little")


def encoded_size(parts: Encoded | bytes) -> int:
    return len(parts) if isinstance(parts, (bytes, bytearray)) else sum(len(p) for p in parts)


def check_crc(data: bytes, where: str) -> memoryview:
    """Check and strip the crc32c suffix; raise :class:`CorruptedChunkError` naming ``where``."""
    if len(data) < 4:
        raise CorruptedChunkError(f"chunk {where} is truncated ({len(data)} bytes)", where)
    if _crc32c(data) != _CRC32C_RESIDUE:
        raise CorruptedChunkError(
            f"chunk {where} failed its crc32c checksum: the stored bytes are corrupted. "
            "Check out an older commit, or restore the file from a replica.", where)
    return memoryview(data)[:-4]


class ChunkCodec(Protocol):
    """Encodes one C-contiguous chunk to stored bytes (checksum included) and back."""

    def config(self) -> dict[str, Any]: ...

    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]: ...

    def encode(self, chunk: np.ndarray) -> Encoded: ...

    def decode(self, data: bytes, out: np.ndarray, where: str) -> None: ...


class BloscLossless:
    """Blosc (lz4, bit-shuffle, level 1) + crc32c: fast, lossless; float32 shrinks ~9%."""

    def __init__(self, cname: str = "lz4", clevel: int = 1, shuffle: str = "bitshuffle"):
        shuffles = {"noshuffle": Blosc.NOSHUFFLE, "shuffle": Blosc.SHUFFLE,
                    "bitshuffle": Blosc.BITSHUFFLE}
        if shuffle not in shuffles:
            raise ValueError(f"shuffle must be one of {sorted(shuffles)}, not {shuffle!r}")
        self.cname, self.clevel, self.shuffle = cname, int(clevel), shuffle
        self._blosc = Blosc(cname=cname, clevel=self.clevel, shuffle=shuffles[shuffle])

    def config(self) -> dict[str, Any]:
        return {"id": "blosc", "cname": self.cname, "clevel": self.clevel, "shuffle": self.shuffle}

    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]:
        return [
            {"name": "bytes", "configuration": {"endian": "little"}},
            {"name": "blosc", "configuration": {"typesize": itemsize, "cname": self.cname,
                                                "clevel": self.clevel, "shuffle": self.shuffle,
                                                "blocksize": 0}},
            {"name": "crc32c"},
        ]

    def encode(self, chunk: np.ndarray) -> Encoded:
        return add_crc(self._blosc.encode(chunk))

    def decode(self, data: bytes, out: np.ndarray, where: str) -> None:
        body = check_crc(data, where)
        # blosc header: u8 version, u8 lz version, u8 flags, u8 typesize, u32 nbytes,
        # u32 blocksize, u32 cbytes (little-endian)
        head = bytes(body[:16])
        if len(head) < 16 or int.from_bytes(head[12:16], "little") != len(body):
            raise CorruptedChunkError(f"chunk {where} is not a whole blosc frame", where)
        nbytes = int.from_bytes(head[4:8], "little")
        if nbytes != out.nbytes:
            raise CorruptedChunkError(
                f"chunk {where} decodes to {nbytes} bytes, expected {out.nbytes}", where)
        try:
            self._blosc.decode(body, out=out.reshape(-1).view(np.uint8))
        except Exception as e:
            raise CorruptedChunkError(f"chunk {where} does not decode: {e}", where) from e


class RawLossless:
    """No compression, crc32c only (for data that does not compress)."""

    def config(self) -> dict[str, Any]:
        return {"id": "raw"}

    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]:
        return [{"name": "bytes", "configuration": {"endian": "little"}}, {"name": "crc32c"}]

    def encode(self, chunk: np.ndarray) -> Encoded:
        return add_crc(memoryview(np.ascontiguousarray(chunk)).cast("B"))

    def decode(self, data: bytes, out: np.ndarray, where: str) -> None:
        body = check_crc(data, where)
        flat = out.reshape(-1).view(np.uint8)
        if len(body) != flat.nbytes:
            raise CorruptedChunkError(
                f"chunk {where} holds {len(body)} bytes, expected {flat.nbytes}", where)
        flat[...] = np.frombuffer(body, dtype=np.uint8)


class QuantizedLossy:
    """Quantize (ckptcodecs) -> optional RLE+Huffman -> crc32c: lossy, 4-16x smaller floats.

    Registered zarr codecs (``ckpt.quantize``, ``ckpt.rle_huffman``) make the chunks readable by
    plain zarr after ``pip install ckptstore``. ``sink``, when given, receives the codes and
    parameters of every encoded chunk (the base of later code deltas).
    """

    def __init__(self, quantize: dict[str, Any], entropy: bool = True):
        from ckptcodecs import Quantize

        self.quantize = dict(quantize)
        self.entropy = bool(entropy)
        self._codec = Quantize(**self.quantize)  # validates early

    def config(self) -> dict[str, Any]:
        return {"id": "quantize", "quantize": self.quantize, "entropy": self.entropy}

    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]:
        chain: list[dict[str, Any]] = [{"name": "ckpt.quantize",
                                        "configuration": self._codec.get_config() | {}}]
        chain[0]["configuration"].pop("id", None)
        if self.entropy:
            chain.append({"name": "ckpt.rle_huffman", "configuration": {}})
        return chain + [{"name": "crc32c"}]

    def encode_codes(self, chunk: np.ndarray) -> tuple[Encoded, Any, Any]:
        """``(stored bytes, codes, params)`` of one chunk."""
        from ckptcodecs import encode_chunk, quantize, rle_huffman_encode

        kw = dict(self.quantize)
        codes, params = quantize(np.ascontiguousarray(chunk), kw.pop("method"), kw.pop("bits"),
                                 **kw)
        body = encode_chunk(codes, params)
        return add_crc(rle_huffman_encode(body) if self.entropy else body), codes, params

    def encode(self, chunk: np.ndarray) -> Encoded:
        return self.encode_codes(chunk)[0]

    def decode_codes(self, data: bytes, where: str) -> tuple[np.ndarray, Any]:
        """``(codes, params)`` of a stored chunk."""
        from ckptcodecs import decode_chunk, rle_huffman_decode

        body = check_crc(data, where)
        try:
            raw = rle_huffman_decode(body) if self.entropy else np.frombuffer(body, np.uint8)
            return decode_chunk(raw)
        except ValueError as e:
            raise CorruptedChunkError(f"chunk {where} does not decode: {e}", where) from e

    def encode_delta(self, chunk: np.ndarray, base_codes: np.ndarray,
                     base_params: Any) -> tuple[Encoded, np.ndarray, Any]:
        """``(stored bytes, codes, params)`` of one chunk stored as code deltas against the codes
        of the same chunk in the previous version (DynaQuant)."""
        from .qdelta import encode_delta_chunk

        return encode_delta_chunk(chunk, self.quantize, base_codes, base_params)

    def decode_delta(self, data: bytes, base_codes: np.ndarray, base_params: Any,
                     where: str) -> tuple[np.ndarray, Any]:
        """``(codes, params)`` of a chunk stored by :meth:`encode_delta`."""
        from .qdelta import decode_delta_chunk

        return decode_delta_chunk(data, base_codes, base_params, where)

    def decode(self, data: bytes, out: np.ndarray, where: str) -> None:
        from ckptcodecs import dequantize

        codes, params = self.decode_codes(data, where)
        if params.count != out.size:
            raise CorruptedChunkError(
                f"chunk {where} holds {params.count} values, expected {out.size}", where)
        values = dequantize(codes, params)
        out.reshape(-1)[...] = values.view(out.dtype) if values.dtype.itemsize == \
            out.dtype.itemsize and values.dtype != out.dtype else values


def codec_from_config(config: dict[str, Any]) -> ChunkCodec:
    """Rebuild a chunk codec from the dict stored in a manifest."""
    kind = config.get("id") if isinstance(config, dict) else None
    try:
        if kind == "blosc":
            return BloscLossless(config.get("cname", "lz4"), config.get("clevel", 1),
                                 config.get("shuffle", "bitshuffle"))
        if kind == "raw":
            return RawLossless()
        if kind == "quantize" and isinstance(config.get("quantize"), dict):
            return QuantizedLossy(config["quantize"], config.get("entropy", True))
    except (TypeError, ValueError) as e:
        raise ManifestError(f"invalid chunk codec {config!r}: {e}") from e
    raise ManifestError(
        f"unknown chunk codec {config!r}: the store was written by a newer ckptstore; upgrade it")
