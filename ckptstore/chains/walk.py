"""The one walk of what a commit reads: chains back to their baselines, and the stored arrays.

A tensor entry of a commit may rebuild from other commits' data: a chain entry (any kind but
``full``, :mod:`ckptstore.chains.kinds`: its parts are what it reads) applies its own parts to
the same path in its base commit, down to a full baseline. The reader, gc, verify and usage all ask the same questions, answered here once by a
:class:`Walk` over a store's (immutable) manifests:

- :meth:`Walk.chain_of`: the entries from the full baseline to an entry, oldest first;
- :meth:`Walk.entry_arrays` / :meth:`Walk.arrays_read`: every stored array that rebuilding an
  entry / checking out a commit reads, as :class:`StoredArray`;
- :meth:`Walk.commits_read`: every commit whose manifest checking out a commit reads.

A walk memoises each (commit, path) it visits, so walking many commits of long chains (gc,
verify, usage) costs one visit per chain link, not one per commit and link.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

import numpy as np

from ..format.dtypes import numpy_dtype
from ..errors import ManifestError
from ..format.grid import ChunkGrid
from ..format.layout import PACKED_ARRAY, array_dir, chunk_key
from ..limits import check_grid, missing_chunks
from ..history.manifest import Blob, Kind, Layout, Manifest, PackedInfo, TensorEntry
from ..storage import Storage
from .kinds import chain_kind

__all__ = ["MAX_CHAIN", "ManifestOf", "StoredArray", "Walk", "blob_array", "entry_array",
           "entry_dtype", "entry_packed_array", "needed_entries", "packed_array"]

ManifestOf = Callable[[str], Manifest]
MAX_CHAIN = 10_000  # no writer makes a longer chain (policies cap theirs far below)

_BLOB_DTYPES = {"bool", "int8", "int16", "int32", "int64", "uint8", "uint16", "uint32", "uint64",
                "float16", "float32", "float64", "complex64", "complex128"}


@dataclass(frozen=True)
class StoredArray:
    """One zarr array in the store: whose folder, its name, grid, stored dtype and codec.

    Its grid is within :data:`ckptstore.limits.READ_LIMITS` (else :class:`ManifestError`);
    :meth:`missing_chunks` compares it with the chunks the store holds."""

    commit: str
    name: str
    grid: ChunkGrid
    dtype: np.dtype
    codec: dict[str, object]

    def __post_init__(self) -> None:
        check_grid(self.prefix, self.grid.shape, self.grid.chunks, self.dtype)

    def missing_chunks(self, storage: Storage) -> list[str]:
        """Store keys of the grid's chunks the store lacks; ManifestError where it lacks
        too many to walk (call before allocating the array or walking its grid)."""
        return [self.chunk(self.grid.key(i)) for i in missing_chunks(
            storage, self.prefix, self.grid.nchunks, len(self.grid.shape))]

    @property
    def prefix(self) -> str:
        """Its folder, ``data/<commit>/<name>``."""
        return array_dir(self.commit, self.name)

    @property
    def ident(self) -> tuple[str, str]:
        return self.commit, self.name

    def chunk(self, key: str) -> str:
        """The store key of one chunk (``key`` from the grid)."""
        return chunk_key(self.prefix, key)


def entry_dtype(e: TensorEntry) -> np.dtype:
    """The numpy dtype holding the bits of an entry's torch dtype."""
    return numpy_dtype(e.dtype)


def entry_array(e: TensorEntry) -> StoredArray:
    """The array of an entry with layout ``array``."""
    return StoredArray(e.commit, e.array, ChunkGrid.checked(e.shape, e.chunks), entry_dtype(e),
                       e.codec)


def blob_array(b: Blob) -> StoredArray:
    """The array of a chain part; ManifestError for anything but plain numeric dtypes."""
    if b.dtype not in _BLOB_DTYPES:
        raise ManifestError(f"blob {b.array!r} has unsupported dtype {b.dtype!r}")
    return StoredArray(b.commit, b.array, ChunkGrid.checked(b.shape, b.chunks),
                       np.dtype(b.dtype), b.codec)


def packed_array(m: Manifest, info: PackedInfo | None = None) -> StoredArray:
    """A packed array of small tensors of commit ``m`` (default: its single-process one)."""
    info = info or m.packed
    if info is None:
        raise ManifestError(f"commit {m.id} has no packed array")
    name = PACKED_ARRAY if info is m.packed else info.array
    return StoredArray(m.id, name, ChunkGrid.checked([info.nbytes], info.chunks),
                       np.dtype(np.uint8), info.codec)


def entry_packed_array(m: Manifest, e: TensorEntry) -> StoredArray:
    """The packed array a ``packed`` entry of ``m`` lies in."""
    info = m.pack_info(e)
    if info is None:
        raise ManifestError(f"tensor {e.path!r} lies in a packed array commit {m.id} lacks")
    return packed_array(m, info)


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


@dataclass(frozen=True)
class _Node:
    """The chain ending at one (commit, path): its entries, oldest first, and their commits."""

    chain: tuple[TensorEntry, ...]
    commits: frozenset[str]


class Walk:
    """Walks the chains of a store's commits, memoising each (commit, path) it visits."""

    def __init__(self, manifest_of: ManifestOf):
        self.manifest_of = manifest_of
        self._by_path: dict[str, dict[str, TensorEntry]] = {}
        self._nodes: dict[tuple[str, str], _Node] = {}
        self._arrays: dict[tuple[str, str], tuple[StoredArray, ...]] = {}
        self._packed: dict[tuple[str, str | None], StoredArray] = {}

    def _entry(self, commit: str, path: str) -> TensorEntry:
        entries = self._by_path.get(commit)
        if entries is None:
            m = self.manifest_of(commit)
            entries = self._by_path[commit] = {e.path: e for e in (*m.tensors, *m.shards)}
        try:
            return entries[path]
        except KeyError:
            raise ManifestError(f"base commit {commit} has no tensor {path!r}") from None

    def own_arrays(self, e: TensorEntry) -> list[StoredArray]:
        """Arrays one entry stores itself (no chain walk). Over a set of commits closed under
        :meth:`commits_read` their union is everything those commits read (verify; gc needs
        only their folders: :meth:`Manifest.data_commits`)."""
        out = [blob_array(b) for b in chain_kind(e.kind).reads(e)]
        if e.layout == Layout.ARRAY:
            out.insert(0, entry_array(e))
        elif e.layout == Layout.PACKED and e.nbytes:
            key = (e.commit, e.array)
            if key not in self._packed:
                self._packed[key] = entry_packed_array(self.manifest_of(e.commit), e)
            out.insert(0, self._packed[key])
        return out

    def _node(self, commit: str, path: str) -> _Node:
        """The chain ending at ``path`` in ``commit`` (a base of some chain entry)."""
        key = (commit, path)
        stack: list[tuple[tuple[str, str], TensorEntry]] = []
        passed: set[str] = set()
        while key not in self._nodes:
            e = self._entry(*key)
            stack.append((key, e))
            passed.add(key[0])
            if e.kind == Kind.FULL:
                break
            if e.base_commit in passed:
                raise ManifestError(f"chain of {path!r} loops back to commit {e.base_commit} "
                                    "(a damaged or hostile manifest): check out another commit")
            if len(stack) > MAX_CHAIN:
                raise ManifestError(f"chain of {path!r} is longer than {MAX_CHAIN}")
            key = (e.base_commit, path)
        node = self._nodes.get(key)
        for (c, _), e in reversed(stack):
            if node is not None:
                _check_link(node.chain[-1], e)
            node = self._nodes[(c, path)] = _Node((*node.chain, e) if node else (e,),
                                                  (node.commits if node else frozenset()) | {c})
        return node

    def _chain_arrays(self, commit: str, path: str) -> tuple[StoredArray, ...]:
        """Every array the chain ending at ``path`` in ``commit`` stores, oldest first."""
        key = (commit, path)
        stack: list[tuple[tuple[str, str], TensorEntry]] = []
        while key not in self._arrays:
            e = self._node(*key).chain[-1]
            stack.append((key, e))
            if e.kind == Kind.FULL:
                break
            key = (e.base_commit, path)
        arrays = self._arrays.get(key, ())
        for k, e in reversed(stack):
            arrays = self._arrays[k] = (*arrays, *self.own_arrays(e))
        return arrays

    def _base(self, e: TensorEntry) -> _Node | None:
        if e.kind == Kind.FULL:
            return None
        node = self._node(e.base_commit, e.path)
        _check_link(node.chain[-1], e)
        return node

    def _top(self, m: Manifest, e: TensorEntry) -> _Node | None:
        """The memoised node of a chain entry of ``m`` (None for a full entry, or when ``m`` has
        another entry of the same path, which only a hostile manifest has)."""
        if e.kind == Kind.FULL or self._entry(m.id, e.path) is not e:
            return None
        return self._node(m.id, e.path)

    # -- the questions -----------------------------------------------------------------------
    def chain_of(self, e: TensorEntry) -> list[TensorEntry]:
        """Entries from the full baseline to ``e``, oldest first (``[e]`` for a full one)."""
        node = self._base(e)
        return [*node.chain, e] if node else [e]

    def entry_arrays(self, e: TensorEntry) -> list[StoredArray]:
        """Every array rebuilding entry ``e`` reads, its chain's bases included."""
        if self._base(e) is None:
            return self.own_arrays(e)
        return [*self._chain_arrays(e.base_commit, e.path), *self.own_arrays(e)]

    def arrays_read(self, m: Manifest) -> list[StoredArray]:
        """Every stored array that checking out all of ``m`` reads, each once, in a stable
        order (the packed array too, even when it holds only empty tensors' slots)."""
        found = {a.ident: a for a in (packed_array(m, p) for p in m.pack_infos())}
        for e in (*m.tensors, *m.shards):
            top = self._top(m, e) is not None
            for a in (self._chain_arrays(m.id, e.path) if top else self.entry_arrays(e)):
                found.setdefault(a.ident, a)
        for e in m.storages:
            for a in self.own_arrays(e):
                found.setdefault(a.ident, a)
        return list(found.values())

    def bases_of(self, m: Manifest, e: TensorEntry) -> frozenset[str]:
        """Commits whose manifests the chain of ``e`` (an entry of ``m``) builds on."""
        node = self._top(m, e) or self._base(e)
        return node.commits - {m.id} if node is not None else frozenset()

    def commits_read(self, m: Manifest) -> set[str]:
        """``m`` and every commit whose manifest its chain entries build on."""
        return {m.id}.union(*(self.bases_of(m, e) for e in (*m.tensors, *m.shards)
                              if e.kind != Kind.FULL))


def _check_link(below: TensorEntry, above: TensorEntry) -> None:
    if below.shape != above.shape or below.dtype != above.dtype:
        raise ManifestError(f"chain of {above.path!r} changes shape or dtype")
