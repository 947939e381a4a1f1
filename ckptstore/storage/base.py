"""The storage protocol: the few primitives a store needs from where its bytes live.

A :class:`Storage` is one store root. Every key is a ``/``-separated path relative to that root
(``refs/heads/main/3``, ``data/<id>/w/c/0``); the empty key is the root itself. Implementations:
:class:`~ckptstore.storage.local.LocalStorage` (a directory, direct ``os`` calls) and
:class:`~ckptstore.storage.fsspec.FsspecStorage` (any other fsspec filesystem). The guarantees
below are checked for every back-end by ``tests/contract/test_storage.py``; a new back-end
subclasses :class:`Storage`, implements the abstract methods and joins that suite.

Every answer reflects what is stored now: no read, size, existence check or listing is served
from a listing made before (by this store, or by other code sharing a filesystem object), so two
clients of one store -- two processes, or two ``Storage`` objects -- see each other's completed
writes and deletes (``tests/contract/test_two_clients.py``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

__all__ = ["TEMP_PREFIX", "Buffer", "Storage", "as_parts"]

Buffer = bytes | bytearray | memoryview
"""Bytes-like data a write takes (memoryviews of staging buffers are written without a copy)."""

TEMP_PREFIX = ".tmp-"
"""How a back-end's temporary files are named (a local write, before its rename or link): no
key of a store starts with it, and gc removes the ones an interrupted write left behind."""


def as_parts(data: Buffer | Sequence[Buffer]) -> list[Buffer]:
    """The parts of a chunk given whole or as a sequence of buffers, as a list."""
    return [data] if isinstance(data, (bytes, bytearray, memoryview)) else list(data)


class Storage(ABC):
    """A store root: reads, atomic writes, listing and deletes of keys.

    Attributes
    ----------
    url
        The location as the caller gave it (a path or an fsspec URL).
    root
        The root as the back-end names it (an absolute path, or ``bucket/prefix``).
    durable
        Fsync every chunk written with :meth:`put_chunk` (power-loss safety on local disks, at a
        cost in write throughput); back-ends without fsync ignore it.
    """

    url: str
    root: str
    durable: bool
    #: the switches a caller may set on this storage after opening it (booleans, each an
    #: attribute): a persist process's storage takes them with every commit (:meth:`tunables`)
    TUNABLES: tuple[str, ...] = ()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"

    def tunables(self) -> dict[str, bool]:
        """The current value of each of :attr:`TUNABLES`."""
        return {name: bool(getattr(self, name)) for name in self.TUNABLES}

    def tune(self, settings: dict[str, bool]) -> None:
        """Set switches of :attr:`TUNABLES` (another process's :meth:`tunables`); anything
        else is refused with a ValueError before one is set."""
        unknown = [k for k, v in settings.items()
                   if k not in self.TUNABLES or not isinstance(v, bool)]
        if unknown:
            raise ValueError(f"{type(self).__name__} has no switches {unknown} (it has "
                             f"{list(self.TUNABLES)}, each True or False)")
        for name, value in settings.items():
            setattr(self, name, value)

    # -- capabilities ----------------------------------------------------------------------
    @property
    @abstractmethod
    def local_disk(self) -> bool:
        """True when keys are files of this machine's filesystem: :meth:`path` is an OS path,
        :meth:`mtime` is known and :meth:`fsync_dir` does something."""

    @property
    @abstractmethod
    def io_threads(self) -> int:
        """How many threads suit chunk I/O here (CPU-bound locally; more where requests wait
        on the network)."""

    # -- paths -----------------------------------------------------------------------------
    @abstractmethod
    def path(self, key: str) -> str:
        """The back-end's full name of a key (for messages; an OS path when local)."""

    # -- reads -----------------------------------------------------------------------------
    @abstractmethod
    def read(self, key: str) -> bytes:
        """All bytes of a key; ``FileNotFoundError`` if it does not exist."""

    def read_chunk(self, key: str) -> Buffer:
        """The bytes of a chunk as a read-only buffer, valid while referenced (a back-end may
        map the file rather than copy it); ``FileNotFoundError`` if it does not exist."""
        return self.read(key)

    def read_chunk_into(self, key: str, parts: Sequence[memoryview]) -> int:
        """Read a chunk into the writable byte buffers ``parts``, in order (a decode's
        destination, then a 4-byte crc32c: no bytes object between); return the bytes the key
        holds. Where that is not the buffers' total (a truncated chunk, or another array's),
        the buffers' content is unspecified and the caller refuses the chunk.
        ``FileNotFoundError`` if it does not exist.

        The default reads :meth:`read_chunk` and copies; local disks ``preadv`` into place."""
        data = memoryview(self.read_chunk(key)).cast("B")
        if len(data) == sum(len(p) for p in parts):
            at = 0
            for p in parts:
                p[:] = data[at: at + len(p)]
                at += len(p)
        return len(data)

    @abstractmethod
    def exists(self, key: str) -> bool:
        """Whether a key exists now (never answered from a stale listing cache)."""

    @abstractmethod
    def size(self, key: str) -> int:
        """Size of a key in bytes; ``FileNotFoundError`` if it does not exist."""

    @abstractmethod
    def mtime(self, key: str) -> float | None:
        """Modification time (seconds since the epoch) on local disks; None when missing or
        where the back-end does not record one."""

    @abstractmethod
    def listdir(self, key: str) -> list[str]:
        """Sorted names (not keys) directly under ``key``, files and folders alike; empty if
        it does not exist."""

    @abstractmethod
    def walk_sizes(self, key: str) -> dict[str, int]:
        """``{key: size}`` of every file under ``key``, recursively (keys relative to the root);
        empty if it does not exist. A file hard-linked ``n`` times (a chunk shared by dedup)
        counts ``size // n`` at each of its names, so sizes add up to the bytes used."""

    # -- writes ----------------------------------------------------------------------------
    @abstractmethod
    def put(self, key: str, data: bytes) -> None:
        """Write or overwrite a key atomically: a reader sees the old bytes or the new ones,
        never a mix or a torn file. Parent folders are created as needed."""

    @abstractmethod
    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        """Write a data chunk, given whole or as buffers to concatenate (one ``writev`` on local
        disks). Not atomic (a chunk is never read before its manifest exists); fsynced when
        :attr:`durable`."""

    def link_chunk(self, source: str, key: str) -> bool:
        """Make the data chunk ``key`` hold the bytes of the stored chunk ``source`` without
        sending them again (a hard link on local disks, a server-side copy on object stores);
        False when the back-end cannot or ``source`` is gone (the caller then writes the chunk).
        Chunks are never modified in place, so a chunk shared this way stays correct."""
        return False

    @abstractmethod
    def put_if_absent(self, key: str, data: bytes) -> bool:
        """Create ``key`` with ``data`` unless it exists; return whether this call created it.

        Atomic: of any number of writers racing for one key exactly one gets True, and the
        key then holds that writer's bytes, complete. Durable on local disks (fsynced before
        it appears)."""

    @abstractmethod
    def delete(self, key: str) -> None:
        """Remove one file; a missing key is fine."""

    @abstractmethod
    def delete_tree(self, key: str) -> None:
        """Remove everything under ``key`` (or the file ``key``); missing is fine."""

    @abstractmethod
    def fsync_dir(self, key: str) -> None:
        """Make the directory entries under ``key`` durable (a no-op off local disks or when
        the folder does not exist)."""
