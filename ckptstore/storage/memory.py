"""fsspec ``memory://``: a per-process store whose put-if-absent is made atomic by a lock.

fsspec's ``MemoryFileSystem`` implements ``mode="create"`` as an existence check followed by a
write, so two threads racing for one key could both create it. Every ``MemoryFileSystem`` of a
process shares one dictionary, so one process-wide lock around the check and the write makes
put-if-absent atomic, as refs need. Other processes never see a ``memory://`` store.
"""

from __future__ import annotations

import threading
from typing import ClassVar

from .fsspec import FsspecStorage

__all__ = ["MemoryStorage"]


class MemoryStorage(FsspecStorage):
    """A store root on fsspec's ``memory://`` filesystem (see :class:`FsspecStorage`)."""

    _create_lock: ClassVar[threading.Lock] = threading.Lock()

    def put_if_absent(self, key: str, data: bytes) -> bool:
        with self._create_lock:
            return super().put_if_absent(key, data)
