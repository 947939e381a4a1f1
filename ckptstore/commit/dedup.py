"""Deduplication: bits already stored are not written again.

With ``EncodingOptions(dedup=True)`` every full array entry records the sha256 of each of its
chunks' bits (``chunk_digests``, format 6), as the codec gets them, hashed in one parallel pass
before anything is written. (Commits of format 3 to 5 recorded one sha256 of the whole array,
``TensorEntry.digest``; it is computed only to compare with such a parent.)

* **Whole arrays.** When a commit finds the same chunk digests, dtype, shape, chunk grid and
  codec on the same path of its parent commit, its entry points at the parent's stored array
  (``commit`` names the commit that wrote it) and nothing is written: frozen layers, the base
  model of a LoRA fine-tune and unchanged optimizer state cost a manifest entry. ``gc`` keeps
  a data folder as long as any retained commit points into it, so shared arrays live as long
  as their last user.
* **Chunks.** Any other full array is written chunk by chunk; a chunk whose digest, dtype, chunk
  shape and codec equal those of a chunk of any full array of the parent commit (any path: a
  table whose untouched rows fill whole chunks, a tensor equal to another one) is not encoded or
  sent: the storage links it (:meth:`~ckptstore.storage.base.Storage.link_chunk`: a hard link on
  local disks, where the file system counts the references and ``gc`` frees a chunk with its last
  commit; a server-side copy on object stores, which sends no bytes). Every commit stays a plain
  zarr group holding all its chunks.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

import numpy as np

from ..format.grid import ChunkGrid
from ..format.layout import array_dir, chunk_key
from ..history.manifest import Layout, Manifest, TensorEntry
from .plan import ArrayItem

__all__ = ["Dedup", "Reused", "chunk_digest", "content_digest"]


def content_digest(host: np.ndarray) -> str:
    """``"sha256:<hex>"`` of an array's bits in C order (hashlib releases the GIL)."""
    return "sha256:" + chunk_digest(host)


def chunk_digest(chunk: np.ndarray) -> str:
    """The hex sha256 of an array's bits in C order."""
    return hashlib.sha256(memoryview(np.ascontiguousarray(chunk)).cast("B")).hexdigest()


# what makes two chunks' stored bytes equal: their bits' digest, dtype, chunk shape and codec
_ChunkKey = tuple[str, str, tuple[int, ...], str]


def _codec_key(config: Mapping[str, object] | None) -> str:
    return json.dumps(config, sort_keys=True, separators=(",", ":"))


@dataclass(frozen=True)
class Reused:
    """Where the bits of a deduplicated entry already are."""

    commit: str
    array: str


@dataclass(frozen=True)
class Dedup:
    """The parent commit's full array entries by path (empty for a first commit), and where each
    of their chunks is stored by content."""

    previous: Mapping[str, TensorEntry]
    chunks: Mapping[_ChunkKey, str] = field(default_factory=dict)

    @classmethod
    def against(cls, parent: Manifest | None, paths: Collection[str] | None = None) -> Dedup:
        """The full arrays of ``parent``: whole tensors, and the shards of sharded ones (by
        their ``<fqn>@<offsets>`` paths: a shard is compared with the same block). ``paths``
        limits the chunk index to the arrays on those paths (a rank indexes its own blocks, not
        every rank's chunks)."""
        if parent is None:
            return cls({})
        entries = [e for e in (*parent.tensors, *parent.shards) if e.layout == Layout.ARRAY]
        chunks: dict[_ChunkKey, str] = {}
        for e in entries:
            if not e.chunk_digests or paths is not None and e.path not in paths:
                continue
            assert e.commit is not None and e.array is not None and e.chunks is not None
            grid = ChunkGrid.checked(e.shape, e.chunks)
            prefix, codec = array_dir(e.commit, e.array), _codec_key(e.codec)
            for i in range(grid.nchunks):
                key = (e.chunk_digests[64 * i: 64 * i + 64], e.dtype, grid.chunks, codec)
                chunks.setdefault(key, chunk_key(prefix, grid.key(i)))
        return cls({e.path: e for e in entries}, chunks)

    def _same_array(self, p: ArrayItem) -> TensorEntry | None:
        """The parent's entry on ``p``'s path if it has the same dtype, shape, grid and codec."""
        e = self.previous.get(p.path)
        if (e is None or e.dtype != p.dtype or e.shape != list(p.shape)
                or e.chunks != list(p.grid.chunks) or e.codec != p.codec.config()):
            return None
        return e

    def find(self, p: ArrayItem, chunk_digests: str) -> Reused | None:
        """The parent's array holding exactly these chunks (by their digests), encoded the same
        way, if any."""
        e = self._same_array(p)
        if e is None or e.chunk_digests != chunk_digests:
            return None
        return Reused(e.commit, e.array)

    def needs_digest(self, p: ArrayItem) -> bool:
        """Whether the parent's array on ``p``'s path records only a whole-array digest (a
        commit before format 6): :meth:`find_digest` compares that one."""
        e = self._same_array(p)
        return e is not None and e.chunk_digests is None and e.digest is not None

    def find_digest(self, p: ArrayItem, digest: str) -> Reused | None:
        """The parent's array whose whole-array ``digest`` (format 3) is ``digest``, if any."""
        e = self._same_array(p)
        if e is None or e.digest != digest:
            return None
        return Reused(e.commit, e.array)

    def chunk_sources(self, p: ArrayItem) -> Callable[[str], str | None]:
        """For a chunk of ``p`` whose bits have hex sha256 ``digest``: the key of a stored chunk
        of the parent commit that ``p``'s chunk grid and codec encode to the same bytes, if
        any."""
        fixed = (p.dtype, p.grid.chunks, _codec_key(p.codec.config()))
        return lambda digest: self.chunks.get((digest, *fixed))
