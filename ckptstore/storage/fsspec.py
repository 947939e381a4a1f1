"""A store root on any fsspec filesystem other than the local one (S3, GCS, Azure, memory://).

Atomicity: ``put_if_absent`` is ``pipe_file(..., mode="create")``, which each filesystem maps to
its conditional create (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure
``overwrite=False``, memory: checked under its lock) and which raises ``FileExistsError`` when
the key exists; ``put`` is one whole-object PUT (atomic on object stores). Listings may be cached
by the filesystem: every listing and existence check drops the cache of its path first, and
put-if-absent and deletes drop it afterwards.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from fsspec import AbstractFileSystem

from .base import Buffer, Storage, as_parts

__all__ = ["FsspecStorage"]

_MIN_REMOTE_THREADS = 16  # requests wait on the network: overlap many of them


class FsspecStorage(Storage):
    """A store root on an fsspec filesystem.

    Parameters
    ----------
    fs
        The filesystem (``s3fs.S3FileSystem``, ``MemoryFileSystem``, ...).
    root
        The root as ``fs`` names it (``bucket/prefix``; the protocol stripped).
    url
        The location as the caller gave it (default: ``root``).
    durable
        Kept for the protocol; object stores acknowledge a PUT once it is stored.
    """

    def __init__(self, fs: AbstractFileSystem, root: str, url: str | None = None,
                 durable: bool = False):
        self.fs = fs
        self.root = root.rstrip("/")
        self.url = root if url is None else url
        self.durable = durable

    # -- capabilities ----------------------------------------------------------------------
    @property
    def local_disk(self) -> bool:
        return False

    @property
    def io_threads(self) -> int:
        return max(_MIN_REMOTE_THREADS, os.cpu_count() or 2)

    # -- paths -----------------------------------------------------------------------------
    def path(self, key: str) -> str:
        return f"{self.root}/{key}" if key else self.root

    # -- reads -----------------------------------------------------------------------------
    def read(self, key: str) -> bytes:
        return self.fs.cat_file(self.path(key))

    def exists(self, key: str) -> bool:
        self._invalidate(key)
        return self.fs.exists(self.path(key))

    def size(self, key: str) -> int:
        return int(self.fs.size(self.path(key)))

    def mtime(self, key: str) -> float | None:
        return None

    def listdir(self, key: str) -> list[str]:
        self._invalidate(key)
        try:
            entries = self.fs.ls(self.path(key), detail=False)
        except FileNotFoundError:
            return []
        prefix = self.path(key).rstrip("/") + "/"
        names = [e.rstrip("/")[len(prefix):] if e.startswith(prefix) else e.rsplit("/", 1)[-1]
                 for e in entries]
        return sorted(n for n in names if n and "/" not in n)

    def walk_sizes(self, key: str) -> dict[str, int]:
        self._invalidate(key)
        try:
            found = self.fs.find(self.path(key), detail=True)
        except FileNotFoundError:
            return {}
        return {p[len(self.root) + 1:]: int(info.get("size") or 0) for p, info in found.items()}

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(self.path(key), data)

    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        parts = as_parts(data)
        whole = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
        self.fs.pipe_file(self.path(key), whole)  # clients take bytes, not memoryviews

    def put_if_absent(self, key: str, data: bytes) -> bool:
        try:
            self.fs.pipe_file(self.path(key), data, mode="create")
        except FileExistsError:
            return False
        self._invalidate(key)
        return True

    def delete(self, key: str) -> None:
        try:
            self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            pass
        self._invalidate(key)

    def delete_tree(self, key: str) -> None:
        try:
            self.fs.rm(self.path(key), recursive=True)
        except FileNotFoundError:
            pass
        self._invalidate(key)

    def fsync_dir(self, key: str) -> None:
        """Nothing to do: an object store has no directory entries to sync."""

    # -- helpers ---------------------------------------------------------------------------
    def _invalidate(self, key: str) -> None:
        self.fs.invalidate_cache(self.path(key))
