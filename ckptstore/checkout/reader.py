"""Rebuild tensors of a commit from the store (the read half of ``checkout``).

Full entries are read chunk by chunk straight into their output buffers; chain entries are
replayed from their full baseline (:mod:`ckptstore.chains.replay`), the chain found by the one
walk (:mod:`ckptstore.chains.walk`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Executor, Future, wait

import numpy as np
import torch

from ..format.arrays import host_to_tensor, read_array, read_chunk, start_read_array, \
    start_read_region, torch_dtype, writable_host_view
from ..chains.kinds import chain_kind
from ..chains.walk import StoredArray, Walk, blob_array, entry_array, entry_dtype, \
    entry_packed_array, needed_entries
from ..chunkcodec import QuantizedLossy, codec_from_config
from .consistency import check_entries
from ..device.decode import start_read_to_device, stored_codes, wants_device_decode
from ..format.dimorder import with_dim_order
from ..errors import CorruptedChunkError, ManifestError
from ..limits import allocate, copy_of
from ..history.manifest import Blob, Layout, Manifest, ShardPiece, TensorEntry
from ..history.repository import Repository
from ..storage import Buffer

__all__ = ["Reader"]

Restored = torch.Tensor | np.ndarray | np.generic  # what checkout hands back for a tensor


def _to_container(arr: np.ndarray, e: TensorEntry, map_location: torch.device | str | None
                  ) -> Restored:
    if e.container == "numpy-scalar":
        return arr.reshape(())[()]
    arr = with_dim_order(arr, e.dim_order)
    if e.container == "numpy":
        return arr
    t = host_to_tensor(arr, e.dtype)
    return t.to(map_location) if map_location is not None else t


class Reader:
    """Reads entries of commits; caches each commit's packed array for one checkout."""

    def __init__(self, repo: Repository):
        self.repo = repo
        self.walk = Walk(repo.manifest)
        self._packed: dict[tuple[str, str | None], np.ndarray] = {}
        self._stored: set[tuple[str, str]] = set()

    def check_stored(self, arrays: Iterable[StoredArray]) -> None:
        """Check that the store holds every chunk of the arrays (:mod:`ckptstore.limits`)
        before anything is allocated for them; each array is listed once per reader."""
        todo = {a.ident: a for a in arrays if a.ident not in self._stored}
        storage = self.repo.storage
        # one array is listed here: through the executor it would wait behind queued reads
        found = (self.repo.executor.map(lambda a: a.missing_chunks(storage), todo.values())
                 if len(todo) > 1 else [a.missing_chunks(storage) for a in todo.values()])
        for missing in found:
            if missing:
                raise CorruptedChunkError(f"chunk {missing[0]} is missing from the store",
                                          missing[0])
        self._stored.update(todo)

    def _read_stored(self, a: StoredArray) -> np.ndarray:
        self.check_stored([a])
        return read_array(self.repo.storage, a.prefix, a.grid, a.dtype,
                          codec_from_config(a.codec), self.repo.executor)

    # -- one entry -------------------------------------------------------------------------
    def host(self, e: TensorEntry, out: np.ndarray | None = None) -> np.ndarray:
        """The bits of a full or chain entry as a host array of its storage dtype; with ``out``
        (a writable C-contiguous array of that shape and dtype) rebuilt in place there: the
        baseline decoded into it, then rows, XORs, residuals or code deltas applied, nothing
        of the tensor's size allocated besides."""
        if out is not None and not (out.flags.writeable and out.flags.c_contiguous):
            raise ValueError("host(out=...) takes a writable C-contiguous array")
        if out is not None and (out.shape != tuple(e.shape) or out.dtype != entry_dtype(e)):
            raise ManifestError(f"entry {e.path!r} of shape {e.shape} and dtype {e.dtype} "
                                f"does not fit the tensor it rebuilds ({list(out.shape)})")
        if e.layout == Layout.ARRAY:
            if out is None or not e.shape:
                got = self._read_stored(entry_array(e))
                return got if out is None else _put(out, got)
            _wait_all(self._queue_into(e, out))
            return out
        if e.layout == Layout.PACKED:
            return self._from_packed(e, out)
        if e.layout == Layout.CHAIN:
            return self._replay(e, out)
        if e.layout == Layout.SHARDED:
            return self._assemble(e, out)
        raise ManifestError(f"entry {e.path!r} with layout '{e.layout}' has no bits of its own")

    def _replay(self, e: TensorEntry, out: np.ndarray | None) -> np.ndarray:
        """A chain entry rebuilt from its baseline (into ``out`` where given) by its kind
        (:mod:`ckptstore.chains.kinds`), the reader its :class:`ChainSource`."""
        chain = self.walk.chain_of(e)
        self.check_stored(self.walk.entry_arrays(e))  # replays allocate the baseline's shape
        return chain_kind(e.kind).replay(chain, self, out)

    def region(self, e: TensorEntry, offsets: Sequence[int], lengths: Sequence[int]
               ) -> np.ndarray:
        """The block ``[offsets, offsets + lengths)`` of a full or chain entry; an ``array``
        entry reads only the chunks holding those rows (a rank restoring its own shard)."""
        if any(o < 0 or o + n > s for o, n, s in zip(offsets, lengths, e.shape)) or len(
                offsets) != len(e.shape) or len(lengths) != len(e.shape):
            raise ManifestError(f"a read of {e.path!r} reaches outside its shape {e.shape}")
        if e.layout == Layout.ARRAY and e.shape:
            a = entry_array(e)
            self.check_stored([a])
            rows = read_array(self.repo.storage, a.prefix, a.grid, a.dtype,
                              codec_from_config(a.codec), self.repo.executor,
                              rows=(offsets[0], offsets[0] + lengths[0]))
            return rows[(slice(None), *(slice(o, o + n) for o, n in
                                        zip(offsets[1:], lengths[1:])))]
        whole = self.host(e)
        return whole[tuple(slice(o, o + n) for o, n in zip(offsets, lengths))]

    def _assemble(self, e: TensorEntry, out: np.ndarray | None = None) -> np.ndarray:
        """A sharded tensor put together from its pieces (the manifest checked that they cover
        it exactly once), in ``out`` where given."""
        m = self.repo.manifest(e.commit) if e.commit else None
        shards = self._shards_of(e, m)
        self.check_stored(a for _, s in shards for a in self.walk.entry_arrays(s))
        if out is None:  # covered by its pieces
            out = allocate(tuple(e.shape), entry_dtype(e), f"sharded tensor {e.path!r}")
        for piece, s in shards:
            block = out[tuple(slice(o, o + n) for o, n in zip(piece.offsets, s.shape))]
            if block.flags.c_contiguous and s.dtype == e.dtype:
                self.host(s, block)
            else:  # a block across rows: the piece rebuilt apart, then copied in
                block[...] = self.host(s)
        return out

    def _shards_of(self, e: TensorEntry, m: Manifest | None
                   ) -> list[tuple[ShardPiece, TensorEntry]]:
        if m is None:
            raise ManifestError(f"sharded tensor {e.path!r} does not name its commit")
        return [(p, m.shards[p.entry]) for p in e.pieces]

    def blob(self, b: Blob) -> np.ndarray:
        """A chain part (changed rows, their values)."""
        return self._read_stored(blob_array(b))

    @property
    def executor(self) -> Executor:
        """The I/O pool reads run on."""
        return self.repo.executor

    def blocks(self, b: Blob, put: Callable[[int, np.ndarray], None]) -> None:
        """A chain part read chunk by chunk, ``put(first row, rows)`` for each in the I/O
        threads (:data:`~ckptstore.chains.replay.ReadBlocks`): never the whole part at once."""
        a = blob_array(b)
        self.check_stored([a])
        if not a.grid.shape:
            put(0, self._read_stored(a))
            return
        _wait_all(start_read_region(self.repo.storage, a.prefix, a.grid, a.dtype,
                                    codec_from_config(a.codec), self.repo.executor,
                                    [0] * len(a.grid.shape), list(a.grid.shape), put))

    def read(self, where: str) -> Buffer:
        """One stored chunk's bytes."""
        return read_chunk(self.repo.storage, where)

    def _from_packed(self, e: TensorEntry, out: np.ndarray | None = None) -> np.ndarray:
        dt = entry_dtype(e)
        count = int(np.prod(e.shape, dtype=np.int64))
        if count * dt.itemsize != e.nbytes:
            raise ManifestError(f"tensor {e.path!r}: {e.nbytes} packed bytes for shape {e.shape}")
        if not e.nbytes:
            return np.empty(e.shape, dtype=dt) if out is None else out
        buf = self._packed.get((e.commit, e.array))
        if buf is None:
            m = self.repo.manifest(e.commit)
            info = m.pack_info(e)
            if info is None or e.offset + e.nbytes > info.nbytes:
                raise ManifestError(f"tensor {e.path!r} lies outside the packed array")
            buf = self._packed[(e.commit, e.array)] = self._read_stored(entry_packed_array(m, e))
        got = buf[e.offset: e.offset + e.nbytes].view(dt).reshape(e.shape)
        return copy_of(got, f"packed tensor {e.path!r}") if out is None else _put(out, got)

    def _start_to_device(self, e: TensorEntry, device: torch.device | str
                         ) -> tuple[torch.Tensor, list[Future]] | None:
        """Queue the reads of a quantized entry (full, or a chain of code deltas) dequantized
        on ``device`` (:mod:`ckptstore.device.decode`); None for an entry the host decodes."""
        if e.container != "torch" or e.dim_order is not None:
            return None
        if e.layout == Layout.ARRAY:
            a = entry_array(e)
            codec = codec_from_config(a.codec)
            if not isinstance(codec, QuantizedLossy):
                return None
            grid, codes_of = a.grid, stored_codes(self.repo.storage, a.prefix, codec)
        elif e.layout == Layout.CHAIN:
            found = chain_kind(e.kind).device_codes(self.walk.chain_of(e), self.read)
            if found is None:
                return None
            self.check_stored(self.walk.entry_arrays(e))  # before the first read of a code
            grid, codes_of = found
        else:
            return None
        return start_read_to_device(grid, e.dtype, codes_of, self.repo.executor, device)

    # -- into live tensors -----------------------------------------------------------------
    def read_into(self, m: Manifest, dests: Mapping[int, torch.Tensor]) -> None:
        """Decode tensors of commit ``m`` into live tensors of their shape (``{tensor index:
        tensor}``), so no copy of a tensor is made where the live one is a C-contiguous CPU
        tensor of its dtype: an ``array`` entry (or each ``array`` piece of a sharded one)
        chunk by chunk straight into it; a chain entry's baseline decoded into it and its
        links applied there (XORs and residuals a chunk at a time); a packed entry copied from
        the packed array; an alias rebuilt from its base (or copied from it, when the base is
        live too). Only a live tensor of another dtype or memory order, or on a device, gets
        its tensor rebuilt apart and copied in (one host copy of one tensor at a time). What
        this allocates is bounded by the chunks in flight, a chain's changed rows, the packed
        array and the largest tensor of that last kind, never by the state."""
        check_entries(self.walk, m, *needed_entries(m, dests))  # as verify (consistency.py)
        futures: list[Future] = []
        later: list[int] = []
        tied = [i for i in dests if m.tensors[i].layout == Layout.ALIAS
                and m.tensors[i].base in dests]  # tied weights: copied from their base
        try:
            rebuilt: list[tuple[TensorEntry, np.ndarray]] = []
            for i, t in dests.items():
                e = m.tensors[i]
                if tuple(t.shape) != tuple(e.shape):
                    raise ManifestError(f"tensor {e.path!r} of shape {e.shape} read into a "
                                        f"tensor of shape {list(t.shape)}")
                if i in tied:
                    continue
                src = m.tensors[e.base] if e.layout == Layout.ALIAS else e
                view = _direct_view(src, t) if src.layout != Layout.ALIAS else None
                if view is None:
                    later.append(i)
                elif src.layout == Layout.ARRAY and src.shape:
                    futures += self._queue_into(src, view)
                elif src.layout == Layout.SHARDED:
                    futures += self._queue_pieces(src, view)
                else:
                    rebuilt.append((src, view))
            for src, view in rebuilt:  # meanwhile the I/O pool decodes the queued ones
                self.host(src, view)
            for i in later:  # no view to rebuild in: the temporary cannot be avoided
                got = self.read_tensors(m, [i])[i]
                with torch.no_grad():
                    dests[i].copy_(torch.as_tensor(got))
                del got
        finally:
            wait(futures)
        for f in futures:
            f.result()
        for i in tied:
            t, base = dests[i], dests[m.tensors[i].base]
            if (t.data_ptr(), t.stride()) != (base.data_ptr(), base.stride()):
                with torch.no_grad():
                    t.copy_(base)

    def _queue_into(self, e: TensorEntry, view: np.ndarray) -> list[Future]:
        """Queue the chunks of an ``array`` entry, each decoded into its rows of ``view``."""
        a = entry_array(e)
        self.check_stored([a])

        def put(row: int, part: np.ndarray) -> None:  # a chunk of a strided destination
            np.copyto(view[row: row + part.shape[0]], part)

        return start_read_region(self.repo.storage, a.prefix, a.grid, a.dtype,
                                 codec_from_config(a.codec), self.repo.executor,
                                 [0] * len(e.shape), list(e.shape), put,
                                 into=view if view.flags.c_contiguous else None)

    def _queue_pieces(self, e: TensorEntry, view: np.ndarray) -> list[Future]:
        """A sharded entry into ``view``: ``array`` pieces queued chunk by chunk, others
        rebuilt one at a time."""
        m = self.repo.manifest(e.commit) if e.commit else None
        futures: list[Future] = []
        for piece, s in self._shards_of(e, m):
            block = view[tuple(slice(o, o + n) for o, n in zip(piece.offsets, s.shape))]
            if s.layout == Layout.ARRAY and s.shape and s.dtype == e.dtype:
                futures += self._queue_into(s, block)
            else:
                block[...] = self.host(s)
        return futures

    # -- a whole selection -----------------------------------------------------------------
    def read_tensors(self, m: Manifest, wanted: Iterable[int],
                     map_location: torch.device | str | None = None) -> dict[int, Restored]:
        """``{tensor index: tensor}`` for the wanted tensors (and what they share storage with)."""
        t_idx, s_idx = needed_entries(m, wanted)
        check_entries(self.walk, m, t_idx, s_idx)  # the checks verify makes (consistency.py)
        # whole arrays are queued together, so workers never idle between arrays
        pending: dict[int, np.ndarray] = {}
        futures: list[Future] = []
        arrays = {i: entry_array(m.tensors[i]) for i in t_idx
                  if m.tensors[i].layout == Layout.ARRAY}
        self.check_stored(arrays.values())
        on_device: dict[int, torch.Tensor] = {}
        if wants_device_decode(map_location):
            for i in t_idx:
                got = self._start_to_device(m.tensors[i], map_location)
                if got is not None:
                    on_device[i], fs = got
                    futures += fs
        for i, a in arrays.items():
            if i in on_device:
                continue
            pending[i], fs = start_read_array(self.repo.storage, a.prefix, a.grid, a.dtype,
                                              codec_from_config(a.codec), self.repo.executor)
            futures += fs
        bases = {i: _to_container(self.host(m.storages[i]), m.storages[i], map_location)
                 for i in s_idx}
        for f in futures:
            f.result()
        out: dict[int, Restored] = {}
        for i in t_idx:
            e = m.tensors[i]
            if i in on_device:
                out[i] = on_device[i]
            elif e.layout in (Layout.ARRAY, Layout.PACKED, Layout.CHAIN, Layout.SHARDED):
                host = pending[i] if i in pending else self.host(e)
                out[i] = _to_container(host, e, map_location)
        for i in t_idx:
            e = m.tensors[i]
            if e.layout == Layout.ALIAS:
                out[i] = out[e.base]
            elif e.layout == Layout.VIEW:
                out[i] = _view(e, bases[e.base])
        return out


def _put(out: np.ndarray, got: np.ndarray) -> np.ndarray:
    np.copyto(out, got)
    return out


def _wait_all(futures: list[Future]) -> None:
    """Wait for every future (none still writes into a destination), then raise the first
    error."""
    wait(futures)
    for f in futures:
        f.result()


def _direct_view(e: TensorEntry, t: torch.Tensor) -> np.ndarray | None:
    """A writable numpy view of ``t`` that entry ``e`` is rebuilt straight into (a CPU tensor
    of the entry's dtype and memory order; C-contiguous for what is not decoded chunk by chunk
    into its rows: chains, packed entries, 0-d arrays); else None."""
    if e.layout not in _DIRECT or e.dim_order is not None:
        return None
    if t.dtype != torch_dtype(e.dtype) or type(t) is not torch.Tensor and not isinstance(
            t, torch.nn.Parameter):
        return None
    view = writable_host_view(t)
    if view is None or not view.flags.writeable or view.dtype != entry_dtype(e):
        return None
    if not view.flags.c_contiguous and not (e.shape and e.layout in _BY_ROWS):
        return None
    return view


_BY_ROWS = (Layout.ARRAY, Layout.SHARDED)  # decoded chunk by chunk into any strided view
_DIRECT = (*_BY_ROWS, Layout.CHAIN, Layout.PACKED)


def _view(e: TensorEntry, base: torch.Tensor) -> torch.Tensor:
    """``as_strided`` of a shared storage, after checking it stays inside."""
    if base.dtype != torch_dtype(e.dtype):
        raise ManifestError(f"tensor {e.path!r} views a storage of another dtype")
    reach = e.storage_offset + sum((s - 1) * st for s, st in zip(e.shape, e.stride) if s > 0)
    if len(e.stride) != len(e.shape) or min(e.stride, default=0) < 0 or (
            math.prod(e.shape) and reach >= base.numel()):
        raise ManifestError(f"view {e.path!r} reaches outside its storage")
    return torch.as_strided(base, e.shape, e.stride, e.storage_offset)
