"""The storage a tiered store reads and writes through: the local tier first, the remote behind.

Writes, deletes and fsyncs go to the local tier only (a commit lands there; the uploader copies
it to the remote). Reads try the local tier and fall back to the remote where the local tier
lacks the key -- except a chunk of a commit whose manifest the local tier holds: that commit's
data is all local (gc deletes a manifest before its data), so a missing chunk there is a chunk
zarr never wrote and the remote is not asked (unless ``partial``: a rank's local tier under a
process group holds only that rank's part of each commit, :mod:`.parts`; a chunk missing on
both tiers is a ``CorruptedChunkError`` for the reader, never a fill value). Listings:
``refs/heads``, ``refs/tags`` and ``commits`` are the union of both tiers; any other folder is
the local tier's when it has one, else the remote's. (gc and local retention take the local tier alone: :mod:`.tiered`.)
"""

from __future__ import annotations

from collections.abc import Sequence

from ..format.layout import COMMITS, DATA, HEADS, TAGS, manifest_key
from ..storage import Buffer, Storage

__all__ = ["TieredStorage"]

_UNION = (HEADS, TAGS, COMMITS)


class TieredStorage(Storage):
    """``local`` over ``remote``: one :class:`~ckptstore.storage.Storage` with both tiers."""

    def __init__(self, local: Storage, remote: Storage, partial: bool = False):
        self.local, self.remote = local, remote
        self.partial = partial  # a rank's local tier: a commit's other parts are remote
        self.url = remote.url
        self.root = local.root
        self.durable = local.durable

    def __repr__(self) -> str:
        return f"TieredStorage({self.local.url!r} over {self.remote.url!r})"

    def tunables(self) -> dict[str, bool]:
        """The local tier's switches (``store.storage.local.batch_sync`` ...): where a commit
        lands."""
        return self.local.tunables()

    def tune(self, settings: dict[str, bool]) -> None:
        self.local.tune(settings)

    @property
    def local_disk(self) -> bool:
        return self.local.local_disk

    @property
    def io_threads(self) -> int:
        return self.local.io_threads

    def path(self, key: str) -> str:
        return self.local.path(key) if self.local.exists(key) else self.remote.path(key)

    def _local_only(self, key: str) -> bool:
        """Whether a key the local tier lacks is no use to ask the remote for: a data key of a
        commit whose manifest is local (its data is complete here)."""
        if self.partial or not key.startswith(f"{DATA}/"):
            return False
        commit = key[len(DATA) + 1:].split("/", 1)[0]
        return self.local.exists(manifest_key(commit))

    # -- reads: local first ----------------------------------------------------------------
    def read(self, key: str) -> bytes:
        try:
            return self.local.read(key)
        except FileNotFoundError:
            if self._local_only(key):
                raise
            return self.remote.read(key)

    def read_chunk(self, key: str) -> Buffer:
        try:
            return self.local.read_chunk(key)
        except FileNotFoundError:
            if self._local_only(key):
                raise
            return self.remote.read_chunk(key)

    def read_chunk_into(self, key: str, parts: Sequence[memoryview]) -> int:
        try:
            return self.local.read_chunk_into(key, parts)
        except FileNotFoundError:
            if self._local_only(key):
                raise
            return self.remote.read_chunk_into(key, parts)

    def exists(self, key: str) -> bool:
        return self.local.exists(key) or (not self._local_only(key) and self.remote.exists(key))

    def size(self, key: str) -> int:
        try:
            return self.local.size(key)
        except FileNotFoundError:
            return self.remote.size(key)

    def mtime(self, key: str) -> float | None:
        return self.local.mtime(key)

    def listdir(self, key: str) -> list[str]:
        names = self.local.listdir(key)
        if key.rstrip("/") in _UNION:
            return sorted(set(names) | set(self.remote.listdir(key)))
        return names or self.remote.listdir(key)

    def walk_sizes(self, key: str) -> dict[str, int]:
        sizes = self.local.walk_sizes(key)
        return sizes or self.remote.walk_sizes(key)

    # -- writes: the local tier ------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.local.put(key, data)

    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        self.local.put_chunk(key, data)

    def link_chunk(self, source: str, key: str) -> bool:
        return self.local.link_chunk(source, key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        return self.local.put_if_absent(key, data)

    def delete(self, key: str) -> None:
        self.local.delete(key)

    def delete_tree(self, key: str) -> None:
        self.local.delete_tree(key)

    def fsync_dir(self, key: str) -> None:
        self.local.fsync_dir(key)
