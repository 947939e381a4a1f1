"""Thin zarr v3 adapters over the numcodecs codecs.

``QuantizeCodec`` is an array-to-bytes codec (it replaces zarr's ``bytes`` serializer: floats in,
packed codes out); ``RLEHuffmanCodec`` and ``BytePlanesCodec`` are bytes-to-bytes codecs::

    zarr.create_array(store, shape=..., dtype="float32", chunks=...,
                      serializer=QuantizeCodec(method="adaptive-asymmetric", bits=4),
                      compressors=[RLEHuffmanCodec()])

They are registered under the ``zarr.codecs`` entry point group (names ``ckpt.quantize``,
``ckpt.rle_huffman``, ``ckpt.byte_planes`` and ``ckpt.qdelta``), so a process that imports only
zarr reads such arrays after ``pip install``; ``CodeDeltaCodec`` (``ckpt.qdelta``) lets plain zarr
open code-delta arrays, whose values only ckptstore rebuilds. The work runs in a thread
(``asyncio.to_thread``), off the event loop.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np
from zarr.abc.codec import ArrayBytesCodec, BytesBytesCodec
from zarr.core.common import JSON, parse_named_configuration

from .errors import CodecError
from .planes import BytePlanes
from .quantize import Quantize
from .rle_huffman import rle_huffman_decode, rle_huffman_encode

if TYPE_CHECKING:
    from typing import Self

    from zarr.core.array_spec import ArraySpec
    from zarr.core.buffer import Buffer, NDBuffer

__all__ = ["BytePlanesCodec", "CodeDeltaCodec", "QuantizeCodec", "RLEHuffmanCodec"]


class _InThread:
    """The codec's work runs in a thread (``asyncio.to_thread``), off zarr's event loop."""

    async def _decode_single(self, chunk, chunk_spec: ArraySpec):
        return await asyncio.to_thread(self._decode_sync, chunk, chunk_spec)

    async def _encode_single(self, chunk, chunk_spec: ArraySpec):
        return await asyncio.to_thread(self._encode_sync, chunk, chunk_spec)


class _Configured:
    """A codec named ``codec_name`` whose configuration is the keyword arguments of the
    numcodecs codec ``numcodec`` (validated by constructing it)."""

    codec_name: ClassVar[str]
    numcodec: ClassVar[type]
    configuration: dict[str, Any]

    def __init__(self, **configuration: Any) -> None:
        cfg = self.numcodec(**configuration).get_config()  # validates
        cfg.pop("id")
        object.__setattr__(self, "configuration", cfg)

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        _, cfg = parse_named_configuration(data, cls.codec_name, require_configuration=False)
        return cls(**(cfg or {}))

    def to_dict(self) -> dict[str, JSON]:
        return {"name": self.codec_name, "configuration": dict(self.configuration)}

    @property
    def _codec(self):
        return self.numcodec(**self.configuration)


@dataclass(frozen=True, init=False)  # __init__ of _Configured
class QuantizeCodec(_InThread, _Configured, ArrayBytesCodec):
    """zarr v3 serializer over :class:`ckptcodecs.Quantize` (same keyword arguments)."""

    is_fixed_size = False
    codec_name = "ckpt.quantize"
    numcodec = Quantize
    configuration: dict[str, Any]

    def validate(self, *, shape, dtype, chunk_grid) -> None:
        native = np.dtype(dtype.to_native_dtype())
        bf16 = self.configuration.get("dtype") == "bfloat16"
        if not (native.kind == "f" or (bf16 and native == np.uint16)):
            raise CodecError(f"QuantizeCodec needs a float array (or uint16 with "
                             f"dtype='bfloat16'), got {native}")

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        native = np.dtype(chunk_spec.dtype.to_native_dtype())
        out = self._codec.decode(chunk_bytes.as_numpy_array())
        out = np.asarray(out).view(native) if out.dtype.itemsize == native.itemsize else out
        return chunk_spec.prototype.nd_buffer.from_ndarray_like(
            out.astype(native, copy=False).reshape(chunk_spec.shape))

    def _encode_sync(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        arr = np.ascontiguousarray(chunk_array.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(self._codec.encode(arr))

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("the size of a Quantize chunk depends on its data")


@dataclass(frozen=True)
class RLEHuffmanCodec(_InThread, BytesBytesCodec):
    """zarr v3 compressor over :class:`ckptcodecs.RLEHuffman`."""

    is_fixed_size = False

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        parse_named_configuration(data, "ckpt.rle_huffman", require_configuration=False)
        return cls()

    def to_dict(self) -> dict[str, JSON]:
        return {"name": "ckpt.rle_huffman", "configuration": {}}

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        dec = rle_huffman_decode(chunk_bytes.as_numpy_array())
        return chunk_spec.prototype.buffer.from_array_like(dec)

    def _encode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        enc = rle_huffman_encode(chunk_bytes.as_numpy_array())
        return chunk_spec.prototype.buffer.from_bytes(enc)

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("the size of an RLEHuffman chunk depends on its data")


@dataclass(frozen=True, init=False)  # __init__ of _Configured
class BytePlanesCodec(_InThread, _Configured, BytesBytesCodec):
    """zarr v3 compressor over :class:`ckptcodecs.BytePlanes` (same keyword arguments)."""

    is_fixed_size = False
    codec_name = "ckpt.byte_planes"
    numcodec = BytePlanes
    configuration: dict[str, Any]

    def _decode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer:
        # into a buffer of the chunk's size: a crafted payload cannot claim more (a block of one
        # byte value costs two bytes and expands to a whole block)
        size = math.prod(chunk_spec.shape) * np.dtype(chunk_spec.dtype.to_native_dtype()).itemsize
        out = np.empty(size, np.uint8)
        return chunk_spec.prototype.buffer.from_array_like(
            self._codec.decode(chunk_bytes.as_numpy_array(), out=out))

    def _encode_sync(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> Buffer | None:
        return chunk_spec.prototype.buffer.from_array_like(
            self._codec.encode(chunk_bytes.as_numpy_array()))

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("the size of a BytePlanes chunk depends on its data")


@dataclass(frozen=True)
class CodeDeltaCodec(ArrayBytesCodec):
    """The serializer a code-delta array's ``zarr.json`` names (``ckpt.qdelta``): its chunks
    are the codes of a quantized tensor as deltas against those of its base version
    (:mod:`ckptcodecs.qdelta`), which zarr cannot see. Plain zarr opens such an array (shape,
    dtype, attributes) and lists its group; reading its values says to read them with
    ckptstore."""

    is_fixed_size = False

    @classmethod
    def from_dict(cls, data: dict[str, JSON]) -> Self:
        parse_named_configuration(data, "ckpt.qdelta", require_configuration=False)
        return cls()

    def to_dict(self) -> dict[str, JSON]:
        return {"name": "ckpt.qdelta", "configuration": {}}

    async def _decode_single(self, chunk_bytes: Buffer, chunk_spec: ArraySpec) -> NDBuffer:
        raise CodecError("ckpt.qdelta: this chunk holds code deltas, which decode only against "
                         "the base version's codes: read the tensor with ckptstore "
                         "(Store.checkout), not plain zarr")

    async def _encode_single(self, chunk_array: NDBuffer, chunk_spec: ArraySpec) -> Buffer | None:
        raise CodecError("ckpt.qdelta chunks are written by ckptstore (they need the base "
                         "version's codes), not by zarr")

    def compute_encoded_size(self, input_byte_length: int, chunk_spec: ArraySpec) -> int:
        raise NotImplementedError("the size of a code-delta chunk depends on its data")
