"""A store root on any fsspec filesystem other than the local one (S3, GCS, Azure, memory://).

Atomicity: ``put_if_absent`` is ``pipe_file(..., mode="create")``, which each filesystem maps to
its conditional create (S3 ``If-None-Match: *``, GCS ``ifGenerationMatch=0``, Azure
``overwrite=False``, memory: checked under its lock) and which raises ``FileExistsError`` when
the key exists; ``put`` is one whole-object PUT (atomic on object stores).

Freshness: which commits, refs and chunks exist is decided from what is stored now, never from a
listing made before. s3fs (like gcsfs and adlfs) keeps a listings cache in the filesystem object,
which fsspec's instance cache shares with every store and every other user of the same options
in the process, and which answers ``ls``, ``exists``, ``info``/``size`` and even ``cat_file``
(it asks the size first) -- so a process that listed ``commits/`` once would take another
process's new commit for a missing one. An :class:`FsspecStorage` therefore works on a
filesystem whose listings cache is off (:func:`without_listings_cache`). A read is one GET on S3
(s3fs would ask the size first, which the cache used to answer).

Faults: every request goes through :class:`~ckptstore.storage.retry.Retry` (bounded attempts
with backoff; what still fails becomes a :class:`~ckptstore.StorageError`). Repeating a request
is safe: reads, listings and deletes are idempotent, chunks are immutable. A put-if-absent is
repeated too, yet its earlier attempt (or the client's own retry) may have landed with the answer
lost, and the repeat then finds the key: on S3 each call tags its object with a random writer
token (``x-amz-meta-ckptstore-writer``) and a key carrying its own token counts as created by
it; elsewhere a key holding exactly its bytes does, once an attempt of this call failed. So a ref
is never reported lost when it moved, nor moved twice.
"""

from __future__ import annotations

import base64
import os
import uuid
from collections.abc import Sequence

import crc32c
from fsspec import AbstractFileSystem

from .base import Buffer, Storage, as_parts
from .retry import Retry

__all__ = ["FsspecStorage", "without_listings_cache"]

_MIN_REMOTE_THREADS = 16  # requests wait on the network: overlap many of them
_WRITER = "ckptstore-writer"  # S3 user metadata naming the call that created a key


class FsspecStorage(Storage):
    """A store root on an fsspec filesystem.

    Parameters
    ----------
    fs
        The filesystem (``s3fs.S3FileSystem``, ``MemoryFileSystem``, ...); one with a listings
        cache is replaced by its like without one (:func:`without_listings_cache`).
    root
        The root as ``fs`` names it (``bucket/prefix``; the protocol stripped).
    url
        The location as the caller gave it (default: ``root``).
    durable
        Kept for the protocol; object stores acknowledge a PUT once it is stored.
    retry
        How failed requests are repeated (default: :class:`Retry` ``()``, 4 attempts).
    """

    def __init__(self, fs: AbstractFileSystem, root: str, url: str | None = None,
                 durable: bool = False, retry: Retry | None = None):
        self.fs = without_listings_cache(fs)
        self.root = root.rstrip("/")
        self.url = root if url is None else url
        self.durable = durable
        self.retry = retry or Retry()
        self._tagged = "s3" in _protocols(fs)  # s3fs passes put_object's Metadata through
        # s3fs's cat_file asks an object's size first (a HEAD, now that no listing answers it)
        # to split objects over 50 MiB into ranged GETs; chunks are 8 MiB by default and read
        # many at once: one GET each
        self._cat = {"max_concurrency": 1} if self._tagged else {}

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
        return self.retry.call(lambda _: self.fs.cat_file(self.path(key), **self._cat), "read",
                               key)

    def exists(self, key: str) -> bool:
        return self.retry.call(lambda _: self.fs.exists(self.path(key)), "look for", key)

    def size(self, key: str) -> int:
        return self.retry.call(lambda _: int(self.fs.size(self.path(key))), "stat", key)

    def mtime(self, key: str) -> float | None:
        return None

    def listdir(self, key: str) -> list[str]:
        try:
            entries = self.retry.call(lambda _: self.fs.ls(self.path(key), detail=False), "list",
                                      key)
        except FileNotFoundError:
            return []
        prefix = self.path(key).rstrip("/") + "/"
        names = [e.rstrip("/")[len(prefix):] if e.startswith(prefix) else e.rsplit("/", 1)[-1]
                 for e in entries]
        return sorted(n for n in names if n and "/" not in n)

    def walk_sizes(self, key: str) -> dict[str, int]:
        try:
            found = self.retry.call(lambda _: self.fs.find(self.path(key), detail=True), "list",
                                    key)
        except FileNotFoundError:
            return {}
        return {p[len(self.root) + 1:]: int(info.get("size") or 0) for p, info in found.items()}

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        self.retry.call(lambda _: self.fs.pipe_file(self.path(key), data), "write", key)

    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        parts = as_parts(data)
        whole = parts[0] if len(parts) == 1 and isinstance(parts[0], bytes) else b"".join(parts)
        checked = s3_checksum(whole) if self._tagged and len(whole) < _ONE_PUT else {}
        # clients take bytes, not memoryviews; a repeated chunk PUT writes the same bytes
        self.retry.call(lambda _: self.fs.pipe_file(self.path(key), whole, **checked), "write",
                        key)

    def link_chunk(self, source: str, key: str) -> bool:
        def copy(_: int) -> bool:
            try:
                self.fs.cp_file(self.path(source), self.path(key))
            except (FileNotFoundError, NotImplementedError):
                return False
            return True
        return self.retry.call(copy, "copy", key)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        token = uuid.uuid4().hex
        extra = {"Metadata": {_WRITER: token}} if self._tagged else {}

        def create(attempt: int) -> bool:
            try:
                self.fs.pipe_file(self.path(key), data, mode="create", **extra)
            except FileExistsError:
                return self._created_by(key, data, token, retried=attempt > 1)
            return True

        return self.retry.call(create, "create", key)

    def delete(self, key: str) -> None:
        def rm(_: int) -> None:
            try:
                self.fs.rm_file(self.path(key))
            except FileNotFoundError:
                pass
        self.retry.call(rm, "delete", key)

    def delete_tree(self, key: str) -> None:
        def rm(_: int) -> None:
            try:
                self.fs.rm(self.path(key), recursive=True)
            except FileNotFoundError:
                pass
        self.retry.call(rm, "delete", key)

    def fsync_dir(self, key: str) -> None:
        """Nothing to do: an object store has no directory entries to sync."""

    # -- helpers ---------------------------------------------------------------------------
    def _created_by(self, key: str, data: bytes, token: str, retried: bool) -> bool:
        """Whether an existing ``key`` is this call's own earlier attempt, whose answer was lost
        (see the module docstring)."""
        path = self.path(key)
        if self._tagged:
            return self.fs.metadata(path, refresh=True).get(_WRITER) == token
        return retried and self.fs.cat_file(path) == data


def without_listings_cache(fs: AbstractFileSystem) -> AbstractFileSystem:
    """``fs`` if it keeps no listings cache, else a filesystem of the same class and options
    with the cache off (fsspec keeps ``storage_args``/``storage_options`` to rebuild any
    filesystem). ``fs`` itself, and whoever else shares it, keep their cache; an ``fs`` made
    with ``skip_instance_cache=True`` gets a private one too."""
    cache = getattr(fs, "dircache", None)
    if cache is None or not getattr(cache, "use_listings_cache", False):
        return fs
    # the instance fsspec hands out for these options, or one made with skip_instance_cache
    shared = type(fs)(*fs.storage_args, **fs.storage_options) is fs
    return type(fs)(*fs.storage_args, **{**fs.storage_options, "use_listings_cache": False,
                                         "skip_instance_cache": not shared})


#: s3fs sends a body of less than twice its 50 MiB part size in one PUT (a larger one in parts,
#: which take no whole-object checksum)
_ONE_PUT = 100 << 20


def s3_checksum(data: bytes) -> dict[str, str]:
    """put_object's ``ChecksumCRC32C`` of ``data``: S3 refuses a PUT whose body does not match
    it (bytes damaged between this process and the bucket fail the request instead of being
    stored), and botocore then skips its own CRC-32 of the body (zlib's: about 4x the time of
    crc32c's)."""
    return {"ChecksumAlgorithm": "CRC32C",  # the object keeps it (GetObjectAttributes)
            "ChecksumCRC32C": base64.b64encode(crc32c.crc32c(data).to_bytes(4, "big")).decode()}


def _protocols(fs: AbstractFileSystem) -> tuple[str, ...]:
    protocol = fs.protocol
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)
