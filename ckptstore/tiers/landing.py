"""The lock a persist process holds while a commit lands on a tiered store's local tier.

A persist process outlives a training process that was killed: it finishes the commit in flight
(its data, manifest and the local ref). An open of the store in the meantime would reconcile the
local branches with the remote before that ref moved and never queue the commit, and the next
commit's upload, built on it, would find the remote branch a commit behind. So the persist
process holds an exclusive ``flock`` on ``<local>/.uploads/landing.lock`` from a commit's start
to its ref, and :class:`~ckptstore.tiers.Tiers` waits for it before reconciling. The kernel
drops the lock when its holder ends; where ``flock`` does not exist (or the local tier is not a
local folder) there is nothing to wait for.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from contextlib import contextmanager

from ..storage import LocalStorage, Storage
from .journal import JOURNAL

try:
    import fcntl
except ImportError:  # pragma: no cover - not POSIX: no persist process either
    fcntl = None  # type: ignore[assignment]

__all__ = ["LOCK", "landing", "wait_landed"]

LOCK = f"{JOURNAL}/landing.lock"


def _open(storage: Storage) -> int | None:
    if fcntl is None or not isinstance(storage, LocalStorage):
        return None
    path = os.path.join(storage.root, LOCK)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return os.open(path, os.O_RDWR | os.O_CREAT, 0o644)


@contextmanager
def landing(storage: Storage) -> Iterator[None]:
    """Hold the landing lock of the local tier ``storage`` (waiting for another holder)."""
    fd = _open(storage)
    try:
        if fd is not None:
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        if fd is not None:
            os.close(fd)  # releases the lock


def wait_landed(storage: Storage, timeout: float) -> bool:
    """Wait until no commit is landing on ``storage`` (True), at most ``timeout`` seconds
    (False: a holder still lands one)."""
    fd = _open(storage)
    if fd is None:
        return True
    deadline = time.monotonic() + timeout
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    return False
                time.sleep(0.02)
    finally:
        os.close(fd)
