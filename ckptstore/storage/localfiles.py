"""Safe access to the files under a local store's root: regular files only, never a link out of
the root, reads bounded by the file's size.

A store is untrusted input. A key may have been replaced by a FIFO (an ``open`` that waits
forever), a link to ``/dev/zero`` (a read that never ends), a link loop, or a folder linked out
of the root (``refs/tags -> /elsewhere``: a ``tag()`` that writes there). :func:`open_regular`
opens a key without blocking, checks that it is a regular file no larger than any a store writes
(:func:`max_file_bytes`) and that the file it opened lies under the root (the kernel's own
name for the open file, ``/proc/self/fd``; nothing can swap a link between the check and the
read), and :class:`Root` checks a folder before anything is
written into it or deleted under it. Anything else is an :class:`~ckptstore.UnsafeFileError`.

Files are read, never mapped: a mapped file truncated by another program ends the process with
``SIGBUS``; a read of one is short, and a short chunk fails its checksum. Raw chunks are read
straight into their destination (:func:`read_into_bounded`, ``preadv``), others into a new
``bytes`` (reads into reused per-thread buffers were measured no faster:
``benchmarks/mapped_reads.py``).
"""

from __future__ import annotations

import errno
import os
import stat
from collections.abc import Sequence

from ..errors import UnsafeFileError
from . import fileops

__all__ = ["FolderInPlace", "Root", "max_file_bytes", "open_regular", "read_bounded",
           "read_into_bounded"]

_OPEN_FLAGS = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | \
    getattr(os, "O_CLOEXEC", 0)  # O_NONBLOCK: a FIFO opens at once (and is then refused)
_PROC_FD = "/proc/self/fd/"
_IOV_MAX = 1024  # buffers one preadv takes (Linux)
_KINDS = ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISCHR, "a character device"),
          (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))


class Root:
    """A store root on the local file system, and the checks that keep every access in it."""

    def __init__(self, root: str):
        self.root = root
        self._real: str | None = None  # the root's resolved path (once it exists)

    def real(self) -> str:
        """The root's resolved path (a root that is itself a link is fine)."""
        if self._real is None:
            real = os.path.realpath(self.root)
            if not os.path.isdir(real):
                return real  # not made yet: resolve again later
            self._real = real
        return self._real

    def inside(self, resolved: str) -> bool:
        """Whether a resolved path is the root or under it."""
        real = self.real()
        return resolved == real or resolved.startswith(real.rstrip(os.sep) + os.sep)

    def check_folder(self, path: str, key: str) -> bool:
        """Raise :class:`UnsafeFileError` unless the folder ``path`` (or, where it does not exist
        yet, its nearest existing ancestor) resolves inside the root; whether ``path`` exists."""
        found = fileops.resolve_existing(path, self.root)
        if found is None:
            return False  # the root is not made yet: nothing in it can lead out
        probe, resolved = found
        if not self.inside(resolved):
            raise _unsafe(key, path, f"a link leading out of the store (to {resolved})")
        return probe == path

    def makedirs(self, path: str, key: str) -> list[str]:
        """Make the folder ``path`` and its missing parents, each checked to lie in the root;
        return the folders made (parents first)."""
        if self.check_folder(path, key):
            return []
        made = fileops.make_folders(path)
        self.check_folder(path, key)  # nothing swapped a link in meanwhile
        return made


class FolderInPlace(UnsafeFileError, IsADirectoryError):
    """A folder where a file belongs: an :class:`UnsafeFileError` that is also the
    ``IsADirectoryError`` a chunk read turns into a ``CorruptedChunkError``."""


def open_regular(root: Root, path: str, key: str) -> tuple[int, int]:
    """Open a key's file for reading; ``(fd, size)``. A missing file raises
    ``FileNotFoundError``; a folder, :class:`FolderInPlace`; anything else but a regular file
    inside the root, :class:`UnsafeFileError`."""
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except OSError as e:
        if e.errno == errno.ELOOP:
            raise _unsafe(key, path, "a link loop") from None
        if e.errno == errno.ENXIO:
            raise _unsafe(key, path, "a socket") from None
        raise
    try:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise _unsafe(key, path, "a folder where a file belongs", FolderInPlace)
        if not stat.S_ISREG(st.st_mode):
            what = next((name for test, name in _KINDS if test(st.st_mode)), "not a file")
            raise _unsafe(key, path, what)
        resolved = _opened_path(fd, path)
        if not root.inside(resolved):
            raise _unsafe(key, path, f"a link leading out of the store (to {resolved})")
        if st.st_size > max_file_bytes():
            raise _unsafe(key, path, f"a file of {st.st_size} bytes, larger than any a store "
                          f"writes ({max_file_bytes()}; a store written with larger chunks is read "
                          "after raising ckptstore.limits.READ_LIMITS.max_chunk_bytes)")
    except BaseException:
        os.close(fd)
        raise
    return fd, st.st_size


def max_file_bytes() -> int:
    """The largest file a store holds: a chunk of ``READ_LIMITS.max_chunk_bytes`` decoded bytes
    (with room for a codec that expands incompressible bytes a little); manifests are far
    smaller. A larger file (a sparse one of a terabyte) is refused before it is read."""
    from .. import limits

    most = limits.READ_LIMITS.max_chunk_bytes
    return most + (most >> 3) + (1 << 20)


def read_bounded(fd: int, size: int) -> bytes:
    """At most ``size`` bytes of an open file from its start (fewer where it was truncated
    meanwhile: the caller's checks see a short file)."""
    parts, left = [], size
    while left > 0:
        part = os.pread(fd, min(left, 1 << 30), size - left)
        if not part:
            break
        parts.append(part)
        left -= len(part)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_into_bounded(fd: int, size: int, parts: Sequence[memoryview]) -> int:
    """Fill the writable byte buffers ``parts`` in order from the start of an open file of
    ``size`` bytes (``preadv``: no copy through a bytes object); the bytes the file holds.

    A file whose size is not the buffers' total is not read (its size comes back); one
    truncated while it is read gives the bytes read before its end."""
    if size != sum(len(p) for p in parts):
        return size
    views = [p for p in parts if len(p)]
    done = 0
    while views:
        n = os.preadv(fd, views[:_IOV_MAX], done)
        if not n:
            break
        done += n
        while views and n >= len(views[0]):  # drop the buffers filled, cut into the next one
            n -= len(views.pop(0))
        if n:
            views[0] = views[0][n:]
    return done


def _opened_path(fd: int, path: str) -> str:
    """The resolved path of an open file (the kernel's name for it where ``/proc`` is there;
    else the path resolved now)."""
    try:
        name = os.readlink(_PROC_FD + str(fd))
    except OSError:
        return os.path.realpath(path)
    return name.removesuffix(" (deleted)")


def _unsafe(key: str, path: str, what: str,
            kind: type[UnsafeFileError] = UnsafeFileError) -> UnsafeFileError:
    return kind(
        f"{path} (store key {key!r}) is {what}: a store holds only regular files and folders "
        "inside its root. Remove it, or restore the file from a copy of the store",
        key, errno.EPERM)
