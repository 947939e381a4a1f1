"""The one walk of what a commit reads: chains back to their baselines, and the stored arrays.

A tensor entry of a commit may rebuild from other commits' data: a chain entry (incremental,
consecutive, delta) applies its own parts to the same path in its base commit, down to a full
baseline; an array entry may point into another commit's folder. The reader, gc, verify and
usage all ask the same two questions, answered here once:

- :func:`chain_of`: the entries from the full baseline to an entry, oldest first;
- :func:`arrays_read`: every stored array that checking out a commit (or some of its tensors)
  reads, each once, as :class:`StoredArray`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import numpy as np

from ..arrays import ChunkGrid, storage_dtype, torch_dtype
from ..errors import ManifestError
from ..layout import PACKED_ARRAY, array_dir
from ..manifest import Blob, Layout, Manifest, TensorEntry

__all__ = ["MAX_CHAIN", "ManifestOf", "StoredArray", "arrays_read", "base_entry", "blob_dtype",
           "chain_of", "entry_arrays", "entry_dtype", "needed_entries",
           "packed_array"]

ManifestOf = Callable[[str], Manifest]
MAX_CHAIN = 10_000  # a longer chain is a cycle in a hostile store

_BLOB_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"}


@dataclass(frozen=True)
class StoredArray:
    """One zarr array in the store: whose folder, its name, grid, stored dtype and codec."""

    commit: str
    name: str
    grid: ChunkGrid
    dtype: np.dtype
    codec: dict[str, object]

    @property
    def prefix(self) -> str:
        """Its folder, ``data/<commit>/<name>``."""
        return array_dir(self.commit, self.name)

    @property
    def ident(self) -> tuple[str, str]:
        return self.commit, self.name


def blob_dtype(b: Blob) -> np.dtype:
    """The numpy dtype of a chain part; ManifestError for anything but plain numeric dtypes."""
    if b.dtype not in _BLOB_DTYPES:
        raise ManifestError(f"blob {b.array!r} has unsupported dtype {b.dtype!r}")
    return np.dtype(b.dtype)


def entry_dtype(e: TensorEntry) -> np.dtype:
    """The numpy dtype holding the bits of an entry's torch dtype."""
    return storage_dtype(torch_dtype(e.dtype))


def base_entry(manifest_of: ManifestOf, entry: TensorEntry) -> TensorEntry:
    """The entry of the same path in the base commit of a chain entry."""
    for e in manifest_of(entry.base_commit).tensors:
        if e.path == entry.path:
            return e
    raise ManifestError(f"base commit {entry.base_commit} has no tensor {entry.path!r}")


def chain_of(manifest_of: ManifestOf, entry: TensorEntry) -> list[TensorEntry]:
    """Entries from the full baseline to ``entry``, oldest first (``[entry]`` for a full one)."""
    out = [entry]
    while out[-1].kind != "full":
        if len(out) > MAX_CHAIN:
            raise ManifestError(f"chain of {entry.path!r} is longer than {MAX_CHAIN} (a cycle?)")
        nxt = base_entry(manifest_of, out[-1])
        if nxt.shape != entry.shape or nxt.dtype != entry.dtype:
            raise ManifestError(f"chain of {entry.path!r} changes shape or dtype")
        out.append(nxt)
    return out[::-1]


def packed_array(m: Manifest) -> StoredArray:
    """The packed array of small tensors of commit ``m``."""
    if m.packed is None:
        raise ManifestError(f"commit {m.id} has no packed array")
    return StoredArray(m.id, PACKED_ARRAY, ChunkGrid.checked([m.packed.nbytes], m.packed.chunks),
                       np.dtype(np.uint8), m.packed.codec)


def _own_arrays(manifest_of: ManifestOf, m: Manifest, e: TensorEntry) -> Iterator[StoredArray]:
    """Arrays one entry stores itself (no chain walk); ``m`` is the commit being read."""
    if e.layout == Layout.ARRAY:
        yield StoredArray(e.commit, e.array, ChunkGrid.checked(e.shape, e.chunks), entry_dtype(e),
                          e.codec)
    elif e.layout == Layout.PACKED and e.nbytes:
        yield packed_array(m if e.commit == m.id else manifest_of(e.commit))
    for b in (e.parts or {}).values():
        yield StoredArray(b.commit, b.array, ChunkGrid.checked(b.shape, b.chunks),
                          blob_dtype(b), b.codec)


def entry_arrays(manifest_of: ManifestOf, m: Manifest, e: TensorEntry) -> list[StoredArray]:
    """Every array rebuilding entry ``e`` of commit ``m`` reads, its chain's bases included."""
    return [a for link in chain_of(manifest_of, e) for a in _own_arrays(manifest_of, m, link)]


def needed_entries(m: Manifest, tensors: Iterable[int]) -> tuple[list[int], list[int]]:
    """Sorted tensor and storage indices that rebuilding ``tensors`` of ``m`` needs (the
    tensors, what they alias, the storages they view)."""
    t_idx: set[int] = set()
    s_idx: set[int] = set()
    for i in tensors:
        e = m.tensors[i]
        t_idx.add(i)
        if e.layout == Layout.ALIAS:
            t_idx.add(e.base)
        elif e.layout == Layout.VIEW:
            s_idx.add(e.base)
    return sorted(t_idx), sorted(s_idx)


def arrays_read(manifest_of: ManifestOf, m: Manifest,
                tensors: Iterable[int] | None = None) -> list[StoredArray]:
    """Every stored array that checking out ``m`` (or only the tensors at indices ``tensors``)
    reads, each once, in a stable order. A whole checkout reads the packed array even when it
    holds only empty tensors' slots."""
    if tensors is None:
        entries = [*m.tensors, *m.storages]
        found = {packed_array(m).ident: packed_array(m)} if m.packed is not None else {}
    else:
        t_idx, s_idx = needed_entries(m, tensors)
        entries = [*(m.tensors[i] for i in t_idx), *(m.storages[i] for i in s_idx)]
        found = {}
    for e in entries:
        for a in entry_arrays(manifest_of, m, e):
            found.setdefault(a.ident, a)
    return list(found.values())
