"""fsspec access for a store: reads, put-if-absent, atomic local writes, listing, deletes.

Every key is relative to the store root. Local directories get direct ``os`` calls (atomic
``os.link`` for put-if-absent, ``os.replace`` for overwrite); every other filesystem goes through
fsspec, where put-if-absent is ``pipe_file(..., mode="create")`` (S3 ``If-None-Match``, GCS
``ifGenerationMatch=0``, Azure ``overwrite=False``, memory: checked under its lock).
"""

from __future__ import annotations

import os
import tempfile
import threading
from collections.abc import Sequence
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

__all__ = ["Storage"]


class Storage:
    """A store root on an fsspec filesystem.

    Parameters
    ----------
    url
        Local path or fsspec URL (``memory://run1``, ``s3://bucket/prefix``).
    storage_options
        Passed to fsspec (e.g. ``endpoint_url``, ``key``, ``secret`` for S3).
    """

    def __init__(self, url: str | os.PathLike, **storage_options: Any):
        url = os.fspath(url)
        fs, root = fsspec.core.url_to_fs(url, **storage_options)
        self.fs = fs
        self.url = url
        self.storage_options = storage_options
        self.is_local = isinstance(fs, LocalFileSystem)
        self.root = os.path.abspath(root) if self.is_local else root.rstrip("/")
        self._made_dirs: set[str] = set()
        self.durable = False  # fsync every chunk (power-loss safety, costs write throughput)
        self._dirs_lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Storage({self.url!r})"

    # -- paths -----------------------------------------------------------------------------
    def path(self, key: str) -> str:
        """Absolute filesystem path of a key."""
        if not key:
            return self.root
        return os.path.join(self.root, *key.split("/")) if self.is_local else f"{self.root}/{key}"

    # -- reads -----------------------------------------------------------------------------
    def read(self, key: str) -> bytes:
        """Bytes of a key; ``FileNotFoundError`` if it does not exist."""
        if self.is_local:
            with open(self.path(key), "rb") as f:
                return f.read()
        return self.fs.cat_file(self.path(key))

    def exists(self, key: str) -> bool:
        if self.is_local:
            return os.path.exists(self.path(key))
        self._invalidate(key)
        return self.fs.exists(self.path(key))

    def size(self, key: str) -> int:
        if self.is_local:
            return os.path.getsize(self.path(key))
        return int(self.fs.size(self.path(key)))

    def mtime(self, key: str) -> float | None:
        """Modification time of a local file (None elsewhere or when missing)."""
        if not self.is_local:
            return None
        try:
            return os.path.getmtime(self.path(key))
        except FileNotFoundError:
            return None

    def listdir(self, key: str) -> list[str]:
        """Names (not paths) directly under ``key``; empty if it does not exist."""
        if self.is_local:
            try:
                return sorted(os.listdir(self.path(key)))
            except (FileNotFoundError, NotADirectoryError):
                return []
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
        """``{key: size}`` of every file under ``key`` (recursive)."""
        out: dict[str, int] = {}
        if self.is_local:
            base = self.path(key)
            for d, _, files in os.walk(base):
                for f in files:
                    full = os.path.join(d, f)
                    rel = os.path.relpath(full, self.root).replace(os.sep, "/")
                    out[rel] = os.path.getsize(full)
            return out
        self._invalidate(key)
        try:
            found = self.fs.find(self.path(key), detail=True)
        except FileNotFoundError:
            return out
        for p, info in found.items():
            out[p[len(self.root) + 1:]] = int(info.get("size") or 0)
        return out

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: str, data: bytes) -> None:
        """Write (or overwrite) a key; atomic on local disks."""
        if self.is_local:
            path = self.path(key)
            self._makedirs(os.path.dirname(path))
            tmp = self._write_temp(path, data, fsync=False)
            os.replace(tmp, path)
            return
        self.fs.pipe_file(self.path(key), data)

    def put_chunk(self, key: str, data: bytes | Sequence[bytes]) -> None:
        """Write a data chunk, given whole or as parts to concatenate (never read before its
        manifest exists, so no atomicity needed; fsynced when the store is ``durable``)."""
        parts = [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)
        if self.is_local:
            path = self.path(key)
            self._makedirs(os.path.dirname(path))
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                total, done = sum(len(p) for p in parts), os.writev(fd, parts)
                if done < total:  # short write: finish the rest plainly
                    os.write(fd, b"".join(parts)[done:])
                if self.durable:
                    os.fsync(fd)
            finally:
                os.close(fd)
            return
        self.fs.pipe_file(self.path(key), parts[0] if len(parts) == 1 else b"".join(parts))

    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` only if it does not exist; return False if it already existed.

        Atomic: of two writers racing for one key exactly one gets True.
        """
        if self.is_local:
            path = self.path(key)
            self._makedirs(os.path.dirname(path))
            tmp = self._write_temp(path, data, fsync=True)
            try:
                os.link(tmp, path)
            except FileExistsError:
                return False
            finally:
                os.unlink(tmp)
            return True
        try:
            self.fs.pipe_file(self.path(key), data, mode="create")
        except FileExistsError:
            return False
        self._invalidate(key)
        return True

    def delete(self, key: str) -> None:
        """Remove a file; missing is fine."""
        try:
            if self.is_local:
                os.unlink(self.path(key))
            else:
                self.fs.rm_file(self.path(key))
        except FileNotFoundError:
            pass
        self._invalidate(key)

    def delete_tree(self, key: str) -> None:
        """Remove everything under ``key``; missing is fine."""
        try:
            self.fs.rm(self.path(key), recursive=True)
        except FileNotFoundError:
            pass
        self._invalidate(key)
        with self._dirs_lock:
            self._made_dirs = {d for d in self._made_dirs if not d.startswith(self.path(key))}

    def fsync_dir(self, key: str) -> None:
        """Make directory entries under ``key`` durable (local disks only)."""
        if not self.is_local:
            return
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

    @staticmethod
    def _write_temp(path: str, data: bytes, fsync: bool) -> str:
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(path), prefix=".tmp-")
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

    def _invalidate(self, key: str) -> None:
        if not self.is_local:
            self.fs.invalidate_cache(self.path(key))
