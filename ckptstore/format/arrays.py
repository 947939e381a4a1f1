"""Tensor <-> stored zarr v3 array: dtype map, chunk grid, parallel chunk writes and reads.

Arrays are chunked along their first dimension (rows of an embedding table stay together) into
chunks of about :data:`CHUNK_BYTES`; the row count per chunk is balanced so that the zarr edge chunk
(always stored full size) wastes almost nothing. The ``zarr.json`` written next to the chunks is
standard zarr v3, so ``zarr.open_array`` reads what the store wrote.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future

import numpy as np
import torch

from ..chunkcodec import ChunkCodec, Encoded, encoded_size
from .dtypes import STORAGE
from ..errors import CorruptedChunkError, ManifestError, UnsupportedLeafError
from .grid import CHUNK_BYTES, ChunkGrid
from .layout import ZARR_JSON, chunk_key
from ..limits import allocate, memory_bound
from ..storage import Buffer, Storage

__all__ = [
    "CHUNK_BYTES",
    "ChunkGrid",
    "array_metadata",
    "bit_view_dtype",
    "is_bit_view",
    "chunk_view",
    "dtype_name",
    "host_to_tensor",
    "read_array",
    "read_chunk",
    "start_read_array",
    "start_read_region",
    "storage_dtype",
    "tensor_to_host",
    "writable_host_view",
    "torch_dtype",
    "write_array",
    "write_chunks",
]


# numpy dtype used to hold each torch dtype's bits (bfloat16 and float8 have no numpy dtype: their
# bits are kept in an unsigned integer of the same width and the torch dtype is recorded): the
# by-name table of ckptstore.format.dtypes, for the dtypes this torch has.
_STORAGE: dict[torch.dtype, str] = {
    getattr(torch, name): np_name for name, np_name in STORAGE.items()
    if isinstance(getattr(torch, name, None), torch.dtype)}
_BY_NAME = {str(d).removeprefix("torch."): d for d in _STORAGE}
_NAMES = {d: name for name, d in _BY_NAME.items()}
_NUMPY = {d: np.dtype(np_name) for d, np_name in _STORAGE.items()}  # made once: asked per tensor
_VIEW = {"uint8": torch.uint8, "uint16": torch.uint16, "uint32": torch.uint32}


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float32`` -> ``"float32"``."""
    name = _NAMES.get(dtype)
    return name if name is not None else str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    """Inverse of :func:`dtype_name` for the dtypes ckptstore stores."""
    try:
        return _BY_NAME[name]
    except KeyError:
        raise ManifestError(f"unknown tensor dtype {name!r} in manifest") from None


def storage_dtype(dtype: torch.dtype) -> np.dtype:
    """The numpy dtype whose bits hold a torch dtype."""
    try:
        return _NUMPY[dtype]
    except KeyError:
        raise UnsupportedLeafError(f"tensors of dtype {dtype} cannot be stored") from None


def bit_view_dtype(dtype: torch.dtype) -> torch.dtype:
    """The unsigned integer dtype whose bits store ``dtype`` (bfloat16 -> uint16)."""
    return _VIEW[_STORAGE[dtype]]


def is_bit_view(dtype: torch.dtype) -> bool:
    """True for dtypes numpy lacks, whose bits live in an unsigned integer of the same width."""
    return _STORAGE[dtype] != dtype_name(dtype)


def tensor_to_host(t: torch.Tensor) -> np.ndarray:
    """A C-contiguous CPU numpy array holding the tensor's bits (a copy only where needed)."""
    storage_dtype(t.dtype)  # raises for unsupported dtypes
    t = t.detach()
    if t.is_conj():
        t = t.resolve_conj()
    if t.is_neg():
        t = t.resolve_neg()
    if t.device.type != "cpu":
        t = t.cpu()
    if is_bit_view(t.dtype):
        t = t.contiguous().view(_VIEW[_STORAGE[t.dtype]])
    a = t.numpy()  # np.ascontiguousarray would turn a 0-d array into a 1-d one
    return a if a.flags.c_contiguous else a.copy(order="C")


def writable_host_view(t: torch.Tensor) -> np.ndarray | None:
    """A numpy view sharing a CPU tensor's memory (bit views for dtypes numpy lacks), to copy
    into without a temporary tensor; None where there is none (device or exotic tensors)."""
    if t.device.type != "cpu" or t.layout != torch.strided or t.is_conj() or t.is_neg() or (
            t.dtype not in _STORAGE):
        return None
    t = t.detach()
    if is_bit_view(t.dtype):
        if t.dim() == 0 or t.stride(-1) != 1:
            return None
        t = t.view(_VIEW[_STORAGE[t.dtype]])
    return t.numpy()


def host_to_tensor(a: np.ndarray, name: str) -> torch.Tensor:
    """Tensor of dtype ``name`` over the bits of ``a`` (shares memory)."""
    dtype = torch_dtype(name)
    t = torch.from_numpy(a)
    return t.view(dtype) if is_bit_view(dtype) else t


def _fill_value(np_dtype: np.dtype) -> bool | int | float | list[float]:
    if np_dtype.kind == "b":
        return False
    if np_dtype.kind == "c":
        return [0.0, 0.0]
    if np_dtype.kind == "f":
        return 0.0
    return 0


def array_metadata(grid: ChunkGrid, np_dtype: np.dtype, codec: ChunkCodec,
                   attributes: dict[str, object]) -> bytes:
    """Standard zarr v3 ``zarr.json`` of an array."""
    meta = {
        "zarr_format": 3,
        "node_type": "array",
        "shape": list(grid.shape),
        "data_type": np_dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(grid.chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "fill_value": _fill_value(np_dtype),
        "codecs": codec.zarr_codecs(np_dtype.itemsize),
        "attributes": attributes,
        "storage_transformers": [],
    }
    return json.dumps(meta).encode()


def chunk_view(a: np.ndarray, grid: ChunkGrid, lo: int, hi: int) -> np.ndarray:
    if not grid.shape:
        return a.reshape(())
    part = a[lo:hi]
    if hi - lo < grid.chunks[0]:  # zarr stores edge chunks full size
        full = np.zeros(grid.chunks, dtype=a.dtype)
        full[: hi - lo] = part
        return full
    return part


def write_array(storage: Storage, prefix: str, a: np.ndarray, grid: ChunkGrid, codec: ChunkCodec,
                attributes: dict[str, object] | None, submit: Callable[..., Future],
                encode: Callable[[int, np.ndarray], Encoded] | None = None,
                source: Callable[[int], str | None] | None = None) -> list[Future]:
    """Queue the chunks of ``a`` and its ``zarr.json`` under ``prefix``; returns the futures.

    ``submit(fn, *args)`` schedules work (an executor's submit, possibly bounded); each future
    resolves to the number of bytes written. ``encode(chunk index, chunk)`` replaces
    ``codec.encode`` (to keep codes, or to write code deltas); ``attributes=None`` writes no
    ``zarr.json`` (arrays only ckptstore reads). ``source(chunk index)`` names a stored chunk
    with the same bytes, linked instead of encoded and written where the storage can
    (:meth:`~ckptstore.storage.base.Storage.link_chunk`; 0 bytes written).
    """
    if tuple(a.shape) != grid.shape:
        raise ValueError(f"array of shape {a.shape} written with a grid for {grid.shape}")

    def encoded(i: int, lo: int, hi: int) -> Encoded:
        chunk = chunk_view(a, grid, lo, hi)
        return codec.encode(chunk) if encode is None else encode(i, chunk)

    return write_chunks(storage, prefix, grid, a.dtype, codec, attributes, submit, encoded,
                        source)


def write_chunks(storage: Storage, prefix: str, grid: ChunkGrid, dtype: np.dtype,
                 codec: ChunkCodec, attributes: dict[str, object] | None,
                 submit: Callable[..., Future],
                 encoded: Callable[[int, int, int], Encoded],
                 source: Callable[[int], str | None] | None = None) -> list[Future]:
    """:func:`write_array` for an array that is not on the host: ``encoded(chunk index, first
    row, end row)`` makes each chunk's stored bytes (in a worker: it may encode on a device)."""

    def put_chunk(i: int, key: str, lo: int, hi: int) -> int:
        target = chunk_key(prefix, key)
        same = source(i) if source is not None else None
        if same is not None and storage.link_chunk(same, target):
            return 0
        data = encoded(i, lo, hi)
        storage.put_chunk(target, data)
        return encoded_size(data)

    def put_meta() -> int:
        meta = array_metadata(grid, dtype, codec, attributes or {})
        storage.put_chunk(chunk_key(prefix, ZARR_JSON), meta)
        return len(meta)

    def put_meta_and_chunk(i: int, key: str, lo: int, hi: int) -> int:
        return put_meta() + put_chunk(i, key, lo, hi)

    # the zarr.json goes in the first chunk's task: a task of its own cost the background
    # threads two more takes of the GIL (its worker woken, its future), one per array
    chunks = list(grid)
    if attributes is None or not chunks:
        futures = [submit(put_meta)] if attributes is not None else []
        return futures + [submit(put_chunk, *c) for c in chunks]
    return [submit(put_meta_and_chunk, *chunks[0])] + [submit(put_chunk, *c) for c in chunks[1:]]


def read_array(storage: Storage, prefix: str, grid: ChunkGrid, np_dtype: np.dtype,
               codec: ChunkCodec, executor: Executor,
               rows: tuple[int, int] | None = None) -> np.ndarray:
    """Read and check the chunks of an array written by :func:`write_array`.

    ``rows=(lo, hi)`` reads only the chunks that hold those rows and returns ``a[lo:hi]``.
    """
    out, futures = start_read_array(storage, prefix, grid, np_dtype, codec, executor, rows)
    for f in futures:
        f.result()
    return out


def read_chunk(storage: Storage, where: str) -> Buffer:
    """The stored bytes of one chunk (a read-only buffer); a missing one (or a folder in its
    place) is a :class:`CorruptedChunkError`."""
    return _Chunk(storage, where).read()


class _Chunk:
    """A stored chunk as a codec reads it (:class:`~ckptstore.chunkcodec.ChunkSource`): whole,
    or into the decode's destination (``Storage.read_chunk_into``); a missing one (or a folder
    in its place) is a :class:`CorruptedChunkError`."""

    def __init__(self, storage: Storage, where: str):
        self.storage, self.where = storage, where

    def read(self) -> Buffer:
        try:
            return self.storage.read_chunk(self.where)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise self._error(e) from None

    def read_into(self, parts: Sequence[memoryview]) -> int:
        try:
            return self.storage.read_chunk_into(self.where, parts)
        except (FileNotFoundError, IsADirectoryError, NotADirectoryError) as e:
            raise self._error(e) from None

    def _error(self, e: OSError) -> CorruptedChunkError:
        where = self.where
        if isinstance(e, FileNotFoundError):
            return CorruptedChunkError(f"chunk {where} is missing from the store", where)
        return CorruptedChunkError(  # a folder: the manifest's dimensions are not the store's
            f"chunk {where} is not a chunk in the store (a folder, or under a file): the "
            "manifest's dimensions disagree with the stored array", where)


def start_read_array(storage: Storage, prefix: str, grid: ChunkGrid, np_dtype: np.dtype,
                     codec: ChunkCodec, executor: Executor,
                     rows: tuple[int, int] | None = None) -> tuple[np.ndarray, list[Future]]:
    """Queue the reads of :func:`read_array`; the array is complete once every future is."""
    shape = grid.shape
    lo_want, hi_want = rows if rows is not None else (0, shape[0] if shape else 1)
    out_shape = (hi_want - lo_want, *shape[1:]) if shape else ()
    out = allocate(out_shape, np_dtype, prefix)

    def get_chunk(key: str, lo: int, hi: int) -> None:
        source = _Chunk(storage, chunk_key(prefix, key))
        with memory_bound(f"chunk {source.where}"):
            if not grid.shape:
                codec.read_rows(source, (), np_dtype, None, out.reshape(()))
                return
            a, b = max(lo, lo_want), min(hi, hi_want)  # its rows wanted, straight into place
            codec.read_rows(source, grid.chunks, np_dtype, (a - lo, b - lo),
                            out[a - lo_want: b - lo_want])

    futures = []
    if out.size:
        futures = [executor.submit(get_chunk, key, lo, hi) for _, key, lo, hi in grid
                   if hi > lo_want and lo < hi_want or not grid.shape]
    return out, futures


def start_read_region(storage: Storage, prefix: str, grid: ChunkGrid, np_dtype: np.dtype,
                      codec: ChunkCodec, executor: Executor, offsets: Sequence[int],
                      lengths: Sequence[int], put: Callable[[int, np.ndarray], None],
                      into: np.ndarray | None = None) -> list[Future]:
    """Queue the reads of the block ``[offsets, offsets + lengths)`` of an array, chunk by chunk:
    each chunk that holds some of its rows is read, checked and decoded, and
    ``put(row, part)`` receives its share (``row`` counted from ``offsets[0]``; ``part`` sliced
    in the other dimensions, a view) -- no array of the whole block is ever built.

    ``into`` (a writable array of the block's shape, the destination ``put`` copies to) lets a
    chunk decode straight into place: rows of a C-contiguous destination through the codec's
    :meth:`~ckptstore.chunkcodec.ChunkCodec.read_rows` (raw chunks are read from the store into
    them), other blocks (a column slice) through its
    :meth:`~ckptstore.chunkcodec.ChunkCodec.decode_region`, whenever the block is whole past its
    second dimension."""
    if not grid.shape:
        raise ValueError("a 0-d array has no region to read")
    lo_want, hi_want = offsets[0], offsets[0] + lengths[0]
    rest = tuple(slice(o, o + n) for o, n in zip(offsets[1:], lengths[1:]))

    whole_rows = into is not None and into.dtype == np_dtype and all(
        o == 0 and n == s for o, n, s in zip(offsets[1:], lengths[1:], grid.shape[1:]))
    # a block whole past its second dimension: the codec decodes straight into its place
    in_place = into is not None and into.dtype == np_dtype and all(
        o == 0 and n == s for o, n, s in zip(offsets[2:], lengths[2:], grid.shape[2:]))
    cols = (offsets[1], offsets[1] + lengths[1]) if len(offsets) > 1 else (0, 1)

    def get_chunk(key: str, lo: int, hi: int) -> None:
        source = _Chunk(storage, chunk_key(prefix, key))
        with memory_bound(f"chunk {source.where}"):
            read_chunk_region(source, lo, hi)

    def read_chunk_region(source: _Chunk, lo: int, hi: int) -> None:
        a, b = max(lo, lo_want), min(hi, hi_want)
        dest = into[a - lo_want: b - lo_want] if in_place else None
        if whole_rows and dest.flags.c_contiguous and dest.flags.writeable:
            codec.read_rows(source, grid.chunks, np_dtype, (a - lo, b - lo), dest)  # in place
            return
        data = source.read()
        if dest is not None:
            codec.decode_region(data, grid.chunks, np_dtype, source.where, (a - lo, b - lo),
                                cols, dest)
            return
        chunk = codec.decoded(data, grid.chunks, np_dtype, source.where)
        put(a - lo_want, chunk[(slice(a - lo, b - lo), *rest)])

    if not lengths[0] or any(n == 0 for n in lengths):
        return []
    return [executor.submit(get_chunk, key, lo, hi) for _, key, lo, hi in grid
            if hi > lo_want and lo < hi_want]
