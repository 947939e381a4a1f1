"""A store root in a local directory: direct ``os`` calls, no fsspec on any path.

Atomicity: ``put`` writes a temporary file in the key's folder and ``os.replace``-s it over the
key; ``put_if_absent`` writes and fsyncs a temporary file, then ``os.link``-s it to the key, which
fails if the key exists (POSIX ``link`` is atomic), and removes the temporary name. Chunks are one
``os.writev`` of their parts. Folders this object created are remembered, so a commit of
thousands of chunks calls ``makedirs`` once per folder.

Durability (:attr:`LocalStorage.durable`, the default of ``ckptstore.open``): a commit's data is
made durable by :meth:`~LocalStorage.fsync_dir` once its chunks are written, and
``put_if_absent`` fsyncs the folder it linked into (and any it made): a commit's data, then its
manifest, then its ref reach the disk in that order, each before the next is written. On the
file systems where one ``syncfs`` makes everything on them durable (ext4, xfs, btrfs, f2fs and
tmpfs on Linux 5.8 or later: :func:`~ckptstore.storage.fileops.batch_fs`) a chunk file's data is
written out as it is written and ``fsync_dir`` syncs the file system once (batched durability:
one journal commit and one device flush a commit instead of one a file and folder; git's
``core.fsyncMethod=batch`` is the same idea with a final fsync); elsewhere every chunk file is
fsynced and ``fsync_dir`` fsyncs every folder of the commit's data and the folders above it. Reads and writes never leave the root nor touch anything but regular files and folders
(:mod:`~ckptstore.storage.localfiles`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
import threading
from collections.abc import Sequence

from ..errors import InvalidSetting
from . import fileops
from .base import TEMP_PREFIX, Buffer, Storage, as_parts
from .localfiles import Root, open_regular, read_bounded, read_into_bounded

__all__ = ["DURABILITY_ENV", "LocalStorage", "cpu_share"]

#: ``file``: a durable store fsyncs each chunk file and folder of a commit, never batches them;
#: ``batch`` (the default): batched where the file system takes it
DURABILITY_ENV = "CKPTSTORE_DURABILITY"


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
        Fsync every chunk file and every folder a commit writes into (see the module's
        docstring and :attr:`Storage.durable`).
    """

    TUNABLES = ("keep_written", "direct_writes", "batch_sync")

    def __init__(self, root: str | os.PathLike, url: str | None = None, durable: bool = False):
        self.root = os.path.abspath(os.fspath(root))
        self.url = os.fspath(root) if url is None else url
        self.durable = durable
        #: keep the chunk files a durable store writes in the page cache (by default their
        #: pages are advised out once fsynced: a checkpoint is written once and read rarely,
        #: and new page-cache pages for every commit cost system time and evict what training
        #: reads; a tiered store's local tier keeps them, its uploader reads them next)
        self.keep_written = False
        #: and write those chunk files past the page cache where their bytes start on a page
        #: (BytePlanes' do; ``O_DIRECT`` where the file system takes it, the last partial block
        #: through the cache): no page-cache pages to fill, write back and drop, about 14 % less
        #: CPU a lossless commit (docs/benchmarks.md)
        self.direct_writes = True
        #: batched durability where the file system takes it (see the module's docstring);
        #: False: fsync each chunk file and folder (the default where the environment variable
        #: ``CKPTSTORE_DURABILITY`` is ``file``). Like the two above, it reaches a persist
        #: process's storage with each commit (:attr:`TUNABLES`)
        self.batch_sync = _durability_from_environment() == "batch"
        self._batch_fs: bool | None = None  # whether the root's file system takes it
        #: a chunk file was written out, not fsynced: fsync_dir syncs it whatever batch_sync
        #: says by then
        self._wrote_data_only = False
        self._root = Root(self.root)
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
        """The bytes of a regular file inside the root, at most its size when opened. Chunks
        (``read_chunk``) too: never a mapping, so a chunk file truncated while it is read is a
        short chunk that fails its checksum, not a ``SIGBUS`` that ends the process."""
        fd, size = open_regular(self._root, self.path(key), key)
        try:
            return read_bounded(fd, size)
        finally:
            os.close(fd)

    def read_chunk_into(self, key: str, parts: Sequence[memoryview]) -> int:
        """``preadv`` straight into ``parts``, with :meth:`read`'s checks (a regular file inside
        the root, no larger than any a store writes); a file of another size is not read."""
        fd, size = open_regular(self._root, self.path(key), key)
        try:
            return read_into_bounded(fd, size, parts)
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
        path = self.path(key)
        self._root.check_folder(path, key)
        try:
            return sorted(os.listdir(path))
        except (FileNotFoundError, NotADirectoryError):
            return []

    def walk_sizes(self, key: str) -> dict[str, int]:
        path = self.path(key)
        self._root.check_folder(path, key)
        out: dict[str, int] = {}
        for d, _, files in os.walk(path):  # links to folders are not followed
            for f in files:
                full = os.path.join(d, f)
                rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                st = os.lstat(full)  # a link: its own size, never its target's
                out[rel] = st.st_size // max(st.st_nlink, 1)  # a shared chunk: its share
        return out

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        path = self.path(key)
        made = self._root.makedirs(os.path.dirname(path), key)  # checked on every call
        tmp = _write_temp(path, data, fsync=self.durable)
        os.replace(tmp, path)
        self._sync_entries(path, made)

    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        parts = as_parts(data)
        path = self.path(key)
        folder = os.path.dirname(path)
        sync = self._chunk_sync()
        if sync == fileops.SYNC_DATA:
            self._wrote_data_only = True
        if folder not in self._made_dirs:  # a new chunk's folder: made, checked and written in
            # one call (the checked way takes four, each a wait for the GIL beside a busy loop)
            if fileops.write_new(path, parts, sync, self._root.real(),
                                 not self.keep_written, self.direct_writes) >= 0:
                self._made(folder)
                return
        self._makedirs(folder, key)
        fileops.write_new(path, parts, sync, drop=not self.keep_written,
                          direct=self.direct_writes)

    def link_chunk(self, source: str, key: str) -> bool:
        path = self.path(key)
        self._makedirs(os.path.dirname(path), key)
        try:  # a link in ``source``'s place is linked as a link (and refused when read)
            os.link(self.path(source), path, follow_symlinks=False)
        except OSError:  # gone, another file system, no hard links, too many, or a retried
            return False  # write of this very chunk (it exists): the caller writes it anew
        return True

    def put_if_absent(self, key: str, data: bytes) -> bool:
        path = self.path(key)
        made = self._root.makedirs(os.path.dirname(path), key)  # checked on every call
        tmp = _write_temp(path, data, fsync=True)
        try:
            os.link(tmp, path)
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
        self._sync_entries(path, made)
        return True

    def delete(self, key: str) -> None:
        path = self.path(key)
        self._root.check_folder(os.path.dirname(path), key)
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass

    def delete_tree(self, key: str) -> None:
        path = self.path(key)
        self._root.check_folder(os.path.dirname(path), key)  # a link itself is removed as one
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
        """When :attr:`durable`: make every chunk file under ``key``, every folder under it and
        the folders above it up to the root durable, so that every entry a commit's data made
        is on disk (batched: one ``syncfs``; else each folder fsynced, deepest first, its
        chunk files fsynced when written). Not durable: nothing."""
        if not self.durable:
            return
        path = self.path(key)
        self._root.check_folder(path, key)
        if self._batched() or self._wrote_data_only:
            # chunk files were written out, not fsynced: all at once, or each now where
            # ``path`` lies on a file system that does not take it (a mount inside the store)
            if not fileops.sync_store(path, self.root):
                fileops.fsync_tree(path, self.root, files=True)
            return
        fileops.fsync_tree(path, self.root)

    # -- helpers ---------------------------------------------------------------------------
    def _batched(self) -> bool:
        """Whether chunk files are made durable by one :meth:`fsync_dir` (batched durability):
        :attr:`batch_sync`, the compiled steps, and a root on a file system that takes it
        (checked once, on the root or the nearest folder above it that exists)."""
        if not (self.batch_sync and fileops.native):
            return False
        if self._batch_fs is None:
            found = fileops.resolve_existing(self.root, os.sep)
            self._batch_fs = found is not None and fileops.batch_fs(found[0])
        return self._batch_fs

    def _chunk_sync(self) -> int:
        """How :meth:`put_chunk` makes a chunk file durable."""
        if not self.durable:
            return fileops.SYNC_NONE
        return fileops.SYNC_DATA if self._batched() else fileops.SYNC_FILE

    def _makedirs(self, path: str, key: str) -> None:
        """Make a chunk's folder (checked to lie in the root once per folder and object)."""
        if path in self._made_dirs:
            return
        self._made(*self._root.makedirs(path, key), path)

    def _made(self, *folders: str) -> None:
        with self._dirs_lock:
            self._made_dirs.update(folders)

    def _sync_entries(self, path: str, made: list[str]) -> None:
        """When :attr:`durable`: fsync the folder a new file was linked into, and the parent of
        every folder made for it (deepest first)."""
        if self.durable:
            for folder in [os.path.dirname(path), *(os.path.dirname(m) for m in reversed(made))]:
                fileops.fsync_folder(folder)


def _durability_from_environment() -> str:
    """``CKPTSTORE_DURABILITY``: ``batch`` (the default: batched where the file system takes
    it) or ``file``; another value raises :class:`~ckptstore.errors.InvalidSetting`."""
    value = os.environ.get(DURABILITY_ENV, "batch").strip().lower() or "batch"
    if value not in ("batch", "file"):
        raise InvalidSetting(f"{DURABILITY_ENV}={os.environ[DURABILITY_ENV]!r}: it takes 'batch' "
                             f"(the default: one syncfs a commit where the file system takes it) "
                             f"or 'file' (fsync each chunk file and folder)")
    return value


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
