"""A store root in a local directory: direct ``os`` calls, no fsspec on any path.

Atomicity: ``put`` writes a temporary file in the key's folder and ``os.replace``-s it over the
key; ``put_if_absent`` writes and fsyncs a temporary file, then ``os.link``-s it to the key, which
fails if the key exists (POSIX ``link`` is atomic), and removes the temporary name. Chunks are one
``os.writev`` of their parts, fsynced only when the store is durable. Folders this object created
are remembered, so a commit of thousands of chunks calls ``makedirs`` once per folder.
"""

from __future__ import annotations

import io
import mmap
import os
import shutil
import tempfile
import threading
from collections.abc import Sequence

from ..layout import TEMP_PREFIX
from .base import Buffer, Storage, as_parts

__all__ = ["MAP_MIN", "LocalStorage", "cpu_share"]

MAP_MIN = 1 << 20
"""Chunks of at least this many bytes are read through a mapping (smaller ones: mapping and
unmapping cost more than the copy)."""
_MAP_FLAGS = (mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)  # every page at once
              if hasattr(mmap, "MAP_SHARED") else None)  # None: no POSIX mmap (Windows)
_NOWAIT = getattr(os, "RWF_NOWAIT", None)  # None (not Linux): no probe, large chunks mapped


def cpu_share() -> int:
    """The CPUs this process may use (its affinity mask, not the machine's count) divided
    among the ranks that share the host (``LOCAL_WORLD_SIZE``, set by torchrun): at least 1.
    Local chunk I/O is CPU-bound, so more threads than that only contend."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        cpus = os.cpu_count() or 2
    try:
        ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        ranks = 1
    return max(1, cpus // ranks)


class LocalStorage(Storage):
    """A store root in a local directory.

    Parameters
    ----------
    root
        The directory (made absolute; created on the first write).
    url
        The location as the caller gave it (default: ``root``).
    durable
        Fsync every chunk file (see :attr:`Storage.durable`).

    Attributes
    ----------
    map_reads
        Read chunks of at least :data:`MAP_MIN` bytes through a read-only mapping (default
        True; resharded and whole checkouts pass over the page cache once less). The cost: a
        disk error under a mapped page, or another program truncating a chunk file while it is
        read, is a ``SIGBUS`` that ends the process instead of an ``OSError`` (a read loses
        nothing either way). Set ``store.storage.map_reads = False`` to trade the speed for the
        error.
    """

    map_reads: bool = True

    def __init__(self, root: str | os.PathLike, url: str | None = None, durable: bool = False):
        self.root = os.path.abspath(os.fspath(root))
        self.url = os.fspath(root) if url is None else url
        self.durable = durable
        self._made_dirs: set[str] = set()
        self._dirs_lock = threading.Lock()

    # -- capabilities ----------------------------------------------------------------------
    @property
    def local_disk(self) -> bool:
        return True

    @property
    def io_threads(self) -> int:
        return cpu_share()

    # -- paths -----------------------------------------------------------------------------
    def path(self, key: str) -> str:
        if not key:
            return self.root
        return os.path.join(self.root, *key.split("/"))

    # -- reads -----------------------------------------------------------------------------
    def read(self, key: str) -> bytes:
        with open(self.path(key), "rb") as f:
            return f.read()

    def read_chunk(self, key: str) -> Buffer:
        """A chunk of at least :data:`MAP_MIN` bytes in the page cache mapped read-only, not
        copied: the page cache is read in place (a decode then passes over it once less). One
        not in the cache is read (a read's large requests fetch it from disk ~20 % faster than
        a mapping's faults). Chunk files are never rewritten in place (:meth:`put_chunk`
        unlinks first), so a mapping sees one version. With :attr:`map_reads` off, every chunk
        is read (see its caveat)."""
        fd = os.open(self.path(key), os.O_RDONLY)
        try:
            size = os.fstat(fd).st_size
            if self.map_reads and size >= MAP_MIN and _MAP_FLAGS is not None and _cached(
                    fd, size - 1):
                try:
                    return memoryview(mmap.mmap(fd, size, flags=_MAP_FLAGS, prot=mmap.PROT_READ))
                except (OSError, ValueError):  # a file system that does not map, or the
                    pass  # file shrank since fstat: read it (a short chunk fails its crc)
            with io.FileIO(fd, closefd=False) as f:
                return f.readall()
        finally:
            os.close(fd)

    def exists(self, key: str) -> bool:
        return os.path.exists(self.path(key))

    def size(self, key: str) -> int:
        return os.path.getsize(self.path(key))

    def mtime(self, key: str) -> float | None:
        try:
            return os.path.getmtime(self.path(key))
        except FileNotFoundError:
            return None

    def listdir(self, key: str) -> list[str]:
        try:
            return sorted(os.listdir(self.path(key)))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk_sizes(self, key: str) -> dict[str, int]:
        out: dict[str, int] = {}
        for d, _, files in os.walk(self.path(key)):
            for f in files:
                full = os.path.join(d, f)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                st = os.stat(full)
                out[rel] = st.st_size // max(st.st_nlink, 1)  # a shared chunk: its share
        return out

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        path = self.path(key)
        self._makedirs(os.path.dirname(path))
        tmp = _write_temp(path, data, fsync=False)
        os.replace(tmp, path)

    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        parts = as_parts(data)
        path = self.path(key)
        self._makedirs(os.path.dirname(path))
        fd = _create_anew(path)
        try:
            total, done = sum(len(p) for p in parts), os.writev(fd, parts)
            if done < total:  # short write: finish the rest plainly
                os.write(fd, b"".join(parts)[done:])
            if self.durable:
                os.fsync(fd)
        finally:
            os.close(fd)

    def link_chunk(self, source: str, key: str) -> bool:
        path = self.path(key)
        self._makedirs(os.path.dirname(path))
        try:
            os.link(self.path(source), path)
        except OSError:  # gone, another file system, no hard links, too many, or a retried
            return False  # write of this very chunk (it exists): the caller writes it anew
        return True

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self.path(key)
        self._makedirs(os.path.dirname(path))
        tmp = _write_temp(path, data, fsync=True)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        return True

    def delete(self, key: str) -> None:
        try:
            os.unlink(self.path(key))
        except FileNotFoundError:
            pass

    def delete_tree(self, key: str) -> None:
        path = self.path(key)
        try:
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)
            else:
                os.remove(path)
        except FileNotFoundError:
            pass
        with self._dirs_lock:
            self._made_dirs = {d for d in self._made_dirs if not d.startswith(path)}

    def fsync_dir(self, key: str) -> None:
        try:
            fd = os.open(self.path(key), os.O_RDONLY)
        except FileNotFoundError:
            return
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # -- helpers ---------------------------------------------------------------------------
    def _makedirs(self, path: str) -> None:
        if path in self._made_dirs:
            return
        os.makedirs(path, exist_ok=True)
        with self._dirs_lock:
            self._made_dirs.add(path)


def _write_temp(path: str, data: bytes, fsync: bool) -> str:
    """A temporary file next to ``path`` holding ``data``; its name."""
    fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=TEMP_PREFIX)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            if fsync:
                f.flush()
                os.fsync(f.fileno())
    except BaseException:
        os.unlink(tmp)
        raise
    return tmp


def _cached(fd: int, offset: int) -> bool:
    """Whether the byte at ``offset`` of an open file is in the page cache (a one-byte read
    that may not wait for the disk; True where the kernel cannot tell)."""
    if _NOWAIT is None:
        return True
    try:
        return os.preadv(fd, [bytearray(1)], offset, _NOWAIT) == 1
    except BlockingIOError:  # not cached
        return False
    except OSError:  # no RWF_NOWAIT for this file system or kernel
        return True


def _create_anew(path: str) -> int:
    """A new file at ``path`` open for writing: one there is unlinked first, so the write never
    goes into a file a link shares or a reader maps. Ranks writing the same key (a commit's
    group metadata) race here; each ends with a whole file of its own."""
    for _ in range(100):
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                os.unlink(path)
            except FileNotFoundError:  # another writer unlinked it first
                pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)

