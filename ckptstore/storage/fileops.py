"""A local store's file-system steps that take several system calls, each as one call that
releases the GIL once (the compiled ``ckptstore.storage._files``), or as the same calls from
Python where that extension is not built.

Why: every ``os`` call releases the GIL and takes it back. Beside a training loop that keeps the
GIL busy (Python launching kernels), each take-back by a background thread waits for the loop's
switch interval (5 ms): a persist that wrote a chunk in four calls (open, writev, fsync, close),
checked each new folder with a dozen ``lstat`` (``os.path.realpath``) and fsynced a commit's
folders in three calls each spent most of its time waiting for the GIL (issue 28;
docs/lab/notebook.md, "A persist that asks for the GIL less"). Both implementations make the
same system calls in the same order and raise the same ``OSError``; the tests run both
(:data:`native` set to False forces the Python one).
"""

from __future__ import annotations

import importlib
import os
import platform
import re
import stat
from collections.abc import Sequence

try:
    import fcntl
except ImportError:  # not POSIX: no O_DIRECT either
    fcntl = None  # type: ignore[assignment]

import numpy as np

from .base import Buffer

try:  # this module's compiled half (loaded by name, as ckptcodecs loads its kernels)
    _files = importlib.import_module("ckptstore.storage._files")
except ImportError:  # not built (a platform without a C compiler at install): the Python steps
    _files = None

__all__ = ["SYNC_DATA", "SYNC_FILE", "SYNC_NONE", "batch_fs", "fsync_tree", "make_folders",
           "native", "resolve_existing", "sync_store", "write_new"]

#: what :func:`write_new` makes durable (its ``fsync``): nothing; the file (``fsync``); its data
#: only, written out and waited for, its inode and name left for one :func:`sync_store` of the
#: folder it lies in (batched durability)
SYNC_NONE, SYNC_FILE, SYNC_DATA = 0, 1, 2

_IOV_MAX = 1024  # buffers one writev takes (Linux)
#: whether the compiled steps run (False where not built; tests set it to run the Python ones)
native = _files is not None


def write_new(path: str, parts: Sequence[Buffer], fsync: int, inside: str | None = None,
              drop: bool = False, direct: bool = False) -> int:
    """A new file at ``path`` holding ``parts`` in order (a file there is unlinked first, so a
    write never goes into a file a link shares or a reader maps), made durable as ``fsync``
    says (:data:`SYNC_NONE`, :data:`SYNC_FILE` or :data:`SYNC_DATA`; a bool: none or file); the
    bytes written. :data:`SYNC_DATA` writes the data out with ``sync_file_range`` (compiled) or
    ``fdatasync`` (Python has no ``sync_file_range``: durable data, a stronger step).

    ``inside`` (a store root's resolved path): make the file's folder and its missing parents
    first (up to 8), after checking that the nearest that exists resolves inside, and check the
    folder made; where the folder is there already or a check fails, nothing is written and -1
    comes back (the caller takes its checked way).
    ``drop`` (with ``fsync``): advise the file's pages out of the page cache once on disk;
    ``direct`` (with both): write the page-aligned front of buffers that start on a page past
    the page cache (``O_DIRECT``, straight from them), where the file system takes it; the rest
    goes through the cache."""
    fsync = int(fsync)
    if fsync not in (SYNC_NONE, SYNC_FILE, SYNC_DATA):
        raise ValueError(f"write_new: fsync is {SYNC_NONE}, {SYNC_FILE} or {SYNC_DATA}")
    if native:
        return _files.write_new(path, parts, fsync, inside, drop, direct)
    if inside is not None and not _made_inside(os.path.dirname(path), inside):
        return -1
    fd = _create_anew(path)
    try:
        views = [memoryview(p).cast("B") for p in parts]
        total = sum(len(v) for v in views)
        views = [v for v in views if len(v)]
        if fsync and drop and direct:
            views = _write_direct(fd, views)
        while views:  # writev takes at most _IOV_MAX buffers and may write short
            views = _advance(views, os.writev(fd, views[:_IOV_MAX]))
        if fsync:
            (os.fsync if fsync == SYNC_FILE else os.fdatasync)(fd)
            if drop and hasattr(os, "posix_fadvise"):
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
    return total


#: a block O_DIRECT writes in: any logical block size up to a page (files.c's DIRECT_ALIGN)
_DIRECT_ALIGN = 4096


def _write_direct(fd: int, views: list[memoryview]) -> list[memoryview]:
    """Write the ``_DIRECT_ALIGN``-aligned fronts of the views at the head of ``views`` that
    start on a page to the new file ``fd`` with ``O_DIRECT`` (files.c's ``write_direct``), then
    clear ``O_DIRECT``; the views left for the buffered writes (all of them where none starts on
    a page, or the file system refuses O_DIRECT or a direct write)."""
    o_direct = getattr(os, "O_DIRECT", 0)

    def in_place(v: memoryview) -> int:  # the aligned front of v, where v starts on a page
        start = np.frombuffer(v, np.uint8).ctypes.data if len(v) else 1
        return 0 if start % _DIRECT_ALIGN else len(v) & ~(_DIRECT_ALIGN - 1)

    if not o_direct or fcntl is None or not views or not in_place(views[0]):
        return views
    flags = fcntl.fcntl(fd, fcntl.F_GETFL)
    try:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags | o_direct)
    except OSError:  # not on this file system
        return views
    try:
        while views and (piece := in_place(views[0])):
            try:
                done = os.write(fd, views[0][:piece])
            except InterruptedError:
                continue
            except OSError:  # refused: the buffered writes write the rest
                break
            if done <= 0:
                break
            views = _advance(views, done)
            if done < piece:  # the offset may be unaligned now: the rest through the cache
                break
    finally:
        fcntl.fcntl(fd, fcntl.F_SETFL, flags)
    return views


def _advance(views: list[memoryview], done: int) -> list[memoryview]:
    """``views`` less their first ``done`` bytes."""
    views = list(views)
    while views and done >= len(views[0]):
        done -= len(views.pop(0))
    if done:
        views[0] = views[0][done:]
    return views


#: the most missing folders the one-call write makes above a file (files.c's MAX_NEW_LEVELS)
_MAX_NEW_LEVELS = 8


def _made_inside(folder: str, root: str) -> bool:
    """Make ``folder`` and its missing parents (up to ``_MAX_NEW_LEVELS`` in all) where the
    nearest ancestor that exists resolves inside ``root`` and the folder is not there; whether
    it was made and resolves inside."""
    base, missing = os.path.dirname(folder), []
    while True:  # up to the nearest ancestor that exists
        try:
            os.lstat(base)
            break
        except FileNotFoundError:
            if len(missing) + 1 >= _MAX_NEW_LEVELS or base in ("", os.sep):
                return False
            missing.append(base)
            base = os.path.dirname(base)
        except OSError:  # not a folder on the way, no access: the checked way says which
            return False
    try:
        if not _inside(os.path.realpath(base, strict=True), root):
            return False
    except OSError:  # a dangling link, a loop: the checked way says which
        return False
    for parent in reversed(missing):
        try:
            os.mkdir(parent)
        except FileExistsError:  # made meanwhile
            pass
    try:
        os.mkdir(folder)
    except FileExistsError:
        return False
    try:
        return _inside(os.path.realpath(folder, strict=True), root)
    except OSError:
        return False


def _inside(resolved: str, root: str) -> bool:
    return resolved == root or resolved.startswith(root.rstrip(os.sep) + os.sep)


def resolve_existing(path: str, stop: str) -> tuple[str, str] | None:
    """The nearest of ``path`` and its ancestors that exists, going up no further than ``stop``
    (or ``/``), and its resolved path; None where none exists up to there."""
    if native:
        found = _files.resolve_existing(path, stop)
        if found is None:
            return None
        probe, real = found
        return probe, real if real is not None else os.path.realpath(probe)  # dangling, loop
    probe = path
    while not os.path.lexists(probe):
        if probe == stop or os.path.dirname(probe) == probe:
            return None
        probe = os.path.dirname(probe)
    return probe, os.path.realpath(probe)


def make_folders(path: str) -> list[str]:
    """Make the folder ``path`` and its missing parents (one another writer made meanwhile is
    passed over); the folders made, parents first."""
    if native:
        return _files.make_folders(path)
    missing = []
    probe = path
    while not os.path.isdir(probe) and os.path.dirname(probe) != probe:
        missing.append(probe)
        probe = os.path.dirname(probe)
    made = []
    for folder in reversed(missing):
        try:
            os.mkdir(folder)
            made.append(folder)
        except FileExistsError:  # another writer made it; a file there fails later
            pass
    return made


def fsync_tree(path: str, root: str, files: bool = False) -> None:
    """Fsync every folder under ``path`` (itself included, links not followed, the deepest
    first), then each folder above it up to ``root``; with ``files``, every regular file under
    ``path`` first."""
    if native:
        _files.fsync_tree(path, root, files)
        return
    walked = list(os.walk(path))
    for folder, _, names in walked if files else ():
        for name in names:
            _fsync_file(os.path.join(folder, name))
    for folder, _, _ in reversed(walked):
        fsync_folder(folder)
    while path != root and os.path.dirname(path) != path:
        path = os.path.dirname(path)
        fsync_folder(path)


def _fsync_file(path: str) -> None:
    """Fsync a regular file (a missing one, a link, anything else: nothing to make durable)."""
    try:
        if stat.S_ISREG(os.lstat(path).st_mode):
            _fsync_opened(path, getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    except FileNotFoundError:
        return


def batch_fs(path: str) -> bool:
    """Whether the file system holding ``path`` is one where one ``syncfs`` makes every file
    and folder on it durable (ext2-4, xfs, btrfs, f2fs, tmpfs), on a Linux that reports
    writeback errors to ``syncfs`` (5.8 or later): batched durability, :func:`sync_store`.
    Needs the compiled steps (Python has no ``syncfs``): False without."""
    return bool(native and _kernel_reports_syncfs_errors() and _files.batch_fs(path))


def _kernel_reports_syncfs_errors() -> bool:
    """Linux 5.8 or later (``syncfs`` returns the file system's writeback errors)."""
    numbers = re.match(r"(\d+)\.(\d+)", platform.release())
    return platform.system() == "Linux" and numbers is not None and (
        int(numbers[1]), int(numbers[2])) >= (5, 8)


def sync_store(path: str, root: str) -> bool:
    """Make the folder ``path`` and everything under it durable at once (``syncfs`` of its file
    system, then each folder above it up to ``root`` that lies on another one); False, with
    nothing done, where ``path`` is missing, its file system is not one of :func:`batch_fs`'s or
    the compiled steps are not built: the caller fsyncs each file and folder
    (``fsync_tree(..., files=True)``)."""
    return bool(native and _files.sync_store(path, root))


def fsync_folder(path: str) -> None:
    """Fsync a folder's entries (a missing folder: nothing to make durable)."""
    _fsync_opened(path, getattr(os, "O_DIRECTORY", 0))


def _fsync_opened(path: str, flags: int) -> None:
    """Fsync what ``path`` opened read-only with ``flags`` names (missing: nothing)."""
    try:
        fd = os.open(path, os.O_RDONLY | flags)
    except FileNotFoundError:
        return
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _create_anew(path: str) -> int:
    """A new file at ``path`` open for writing: one there is unlinked first. Ranks writing the
    same key (a commit's group metadata) race here; each ends with a whole file of its own."""
    for _ in range(100):
        try:
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
        except FileExistsError:
            try:
                os.unlink(path)
            except FileNotFoundError:  # another writer unlinked it first
                pass
    return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
