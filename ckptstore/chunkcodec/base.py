"""What a chunk codec is: the :class:`ChunkCodec` interface and the crc32c every stored chunk ends
with (zarr's ``crc32c`` codec layout)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Protocol

import google_crc32c
import numpy as np

from ..errors import CorruptedChunkError
from ..limits import allocate
from ..storage.base import Buffer

__all__ = ["ChunkCodec", "ChunkSource", "Encoded", "add_crc", "check_crc", "check_crc_parts",
           "encoded_size"]


_CRC32C_RESIDUE = 0x48674BC7  # crc32c of any message followed by its own little-endian crc32c


Encoded = tuple[bytes, bytes]  # a stored chunk: its body, then its 4-byte crc32c


try:  # hardware crc32c over any buffer, no copy (19 GB/s here)
    from crc32c import crc32c as _crc32c
except ImportError:  # pragma: no cover - google_crc32c wants bytes: one copy per chunk
    def _crc32c(data: Any, value: int = 0) -> int:
        return google_crc32c.extend(value, bytes(data))


def add_crc(data: Buffer) -> Encoded:
    """``(data, crc)``: the stored chunk is their concatenation (zarr's crc32c codec layout).

    Kept as two parts so local writes need no copy to join them (``os.writev``); ``data`` may
    be a memoryview of the caller's array (valid until the chunk is written).
    """
    return data, _crc32c(data).to_bytes(4, "little")


def encoded_size(parts: Encoded | bytes) -> int:
    """Bytes of a stored chunk, whole or as its ``(body, crc)`` parts."""
    return len(parts) if isinstance(parts, (bytes, bytearray)) else sum(len(p) for p in parts)


def check_crc(data: Buffer, where: str) -> memoryview:
    """Check and strip the crc32c suffix; raise :class:`CorruptedChunkError` naming ``where``."""
    if len(data) < 4:
        raise CorruptedChunkError(f"chunk {where} is truncated ({len(data)} bytes)", where)
    if _crc32c(data) != _CRC32C_RESIDUE:
        raise CorruptedChunkError(
            f"chunk {where} failed its crc32c checksum: the stored bytes are corrupted. "
            "Check out an older commit, or restore the file from a replica.", where)
    return memoryview(data)[:-4]


def check_crc_parts(parts: Sequence[Buffer], crc: Buffer, where: str) -> None:
    """Raise :class:`CorruptedChunkError` naming ``where`` unless ``crc`` (4 bytes, little-endian)
    is the crc32c of the parts' concatenation (a chunk read in pieces, checked in place)."""
    value = 0
    for p in parts:
        value = _crc32c(p, value)
    if value != int.from_bytes(crc, "little"):
        raise CorruptedChunkError(
            f"chunk {where} failed its crc32c checksum: the stored bytes are corrupted. "
            "Check out an older commit, or restore the file from a replica.", where)


class ChunkSource(Protocol):
    """One stored chunk, to be read (``arrays.py`` binds a storage and a key to it)."""

    where: str  #: the chunk's key, for messages

    def read(self) -> Buffer:
        """The stored bytes, crc32c included."""

    def read_into(self, parts: Sequence[memoryview]) -> int:
        """The stored bytes scattered over ``parts`` (see ``Storage.read_chunk_into``); the
        bytes the chunk holds."""


class ChunkCodec(ABC):
    """Encodes one C-contiguous chunk to stored bytes (checksum included) and back.

    A subclass names its ``codec_id`` (the ``"id"`` of its manifest config) and keeps its
    constructor's arguments as public attributes of the same names, so that the default
    :meth:`config` and :meth:`from_config` round-trip it (numcodecs' convention); it validates
    them in ``__init__``, raising ``TypeError`` or ``ValueError``.
    """

    codec_id: ClassVar[str]
    #: False for chunks that decode only against other data (code deltas need their base
    #: version's codes): plain zarr cannot read them and ``verify`` checks their crc32c only.
    standalone: ClassVar[bool] = True

    @classmethod
    def from_config(cls, config: Mapping[str, Any]) -> ChunkCodec:
        """The codec a manifest config describes (its keys but ``"id"`` as keyword arguments)."""
        return cls(**{k: v for k, v in config.items() if k != "id"})

    def config(self) -> dict[str, Any]:
        """The manifest's record of this codec: ``{"id": codec_id, **public attributes}``."""
        return {"id": self.codec_id,
                **{k: v for k, v in vars(self).items() if not k.startswith("_")}}

    @abstractmethod
    def zarr_codecs(self, itemsize: int) -> list[dict[str, Any]]:
        """The zarr v3 codec chain (``zarr.json`` ``codecs``) that produces the same bytes."""

    @abstractmethod
    def encode(self, chunk: np.ndarray) -> Encoded:
        """Stored bytes of one chunk, crc32c included."""

    @abstractmethod
    def decode(self, data: Buffer, out: np.ndarray, where: str) -> None:
        """Fill ``out`` from stored bytes; :class:`CorruptedChunkError` naming ``where``."""

    def decoded(self, data: Buffer, shape: tuple[int, ...], dtype: np.dtype,
                where: str) -> np.ndarray:
        """The chunk as an array: a read-only view of ``data`` where the codec stores the bits
        as they are (no copy), else a new array :meth:`decode` fills."""
        out = allocate(shape, dtype, where)  # an AllocationError, not a raw MemoryError
        self.decode(data, out, where)
        return out

    def read_rows(self, source: ChunkSource, shape: tuple[int, ...], dtype: np.dtype,
                  rows: tuple[int, int] | None, out: np.ndarray) -> None:
        """Read the chunk of ``shape`` from ``source`` and fill ``out`` (C-contiguous, writable)
        with its rows ``rows[0]:rows[1]``, whole in later dimensions (``None``: the whole chunk,
        as a 0-d one is read). The default reads the stored bytes, then :meth:`decode` or
        :meth:`decode_region`; a codec that stores the bits as they are reads them straight
        into ``out``."""
        data = source.read()
        if rows is None or rows == (0, shape[0]):
            self.decode(data, out, source.where)
        else:
            cols = (0, shape[1]) if len(shape) > 1 else (0, 1)
            self.decode_region(data, shape, dtype, source.where, rows, cols, out)

    def decode_region(self, data: Buffer, shape: tuple[int, ...], dtype: np.dtype, where: str,
                      rows: tuple[int, int], cols: tuple[int, int], out: np.ndarray) -> None:
        """Fill ``out`` with the block ``[rows[0]:rows[1], cols[0]:cols[1]]`` (whole in later
        dimensions) of the chunk of ``shape``; 1-d chunks take ``cols=(0, 1)``. Codecs that can
        put together only the block's items override this (the default decodes the chunk)."""
        chunk = self.decoded(data, shape, dtype, where)
        index = (slice(*rows), slice(*cols)) if chunk.ndim > 1 else (slice(*rows),)
        np.copyto(out, chunk[index])

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.config().items() if k != "id")
        return f"{type(self).__name__}({args})"
