"""A local store on a disk that fills up: :class:`LocalStorage` with a byte budget.

A size-limited filesystem needs root (a loop device or a tmpfs mount) on this machine, so the
disk is the real local filesystem wrapped: every write that would take the files under the root
past ``capacity`` bytes fails with ``OSError(ENOSPC)`` as the kernel's does -- a chunk after
writing the part that fits (a short write), a manifest or ref before its temporary file is linked
into place. Freeing space is raising ``capacity`` (or deleting files, e.g. by gc).
"""

from __future__ import annotations

import errno
import os
from collections.abc import Sequence

from ckptstore.storage import LocalStorage
from ckptstore.storage.base import Buffer, as_parts

__all__ = ["FullDiskStorage"]


class FullDiskStorage(LocalStorage):
    """A local store root whose disk holds ``capacity`` bytes (None: unlimited), or whose
    ``fail_at``-th write (counting from 1) finds the disk full."""

    def __init__(self, root: str, capacity: int | None = None, fail_at: int | None = None):
        super().__init__(root)
        self.capacity, self.fail_at, self.writes = capacity, fail_at, 0

    def used(self) -> int:
        return sum(self.walk_sizes("").values())

    def _room(self, key: str, size: int) -> int | None:
        """Bytes that fit if the write does not (None when it does)."""
        self.writes += 1
        if self.writes == self.fail_at:
            return size // 2
        if self.capacity is None:
            return None
        room = self.capacity - self.used()
        return None if size <= room else max(room, 0)

    def _full(self, key: str) -> OSError:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), self.path(key))

    def put_chunk(self, key: str, data: Buffer | Sequence[Buffer]) -> None:
        whole = b"".join(bytes(p) for p in as_parts(data))
        room = self._room(key, len(whole))
        if room is not None:
            super().put_chunk(key, whole[:room])  # the short write the kernel made
            raise self._full(key)
        super().put_chunk(key, whole)

    def put(self, key: str, data: bytes) -> None:
        if self._room(key, len(data)) is not None:
            raise self._full(key)
        super().put(key, data)

    def put_if_absent(self, key: str, data: bytes) -> bool:
        if self._room(key, len(data)) is not None:
            raise self._full(key)
        return super().put_if_absent(key, data)
