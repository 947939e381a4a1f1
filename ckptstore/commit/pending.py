"""A commit whose persist runs in the background (``Store.commit_async``)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass

from ..errors import PendingCommitError
from ..info import CommitInfo

__all__ = ["PendingCommit", "Progress"]


@dataclass
class Progress:
    """Bytes of a commit: ``total`` captured by the snapshot, ``written`` stored so far
    (after compression, so it ends below ``total`` for compressible data)."""

    total: int = 0
    written: int = 0


class PendingCommit:
    """Handle of an asynchronous commit.

    ``wait()`` returns the :class:`CommitInfo` once the ref moved, or raises what made the persist
    fail. A failure nobody observed is raised again by the store's next commit or ``close()``.
    While ``wait()`` blocks, the persist runs at normal priority (``boost``: the store's
    :meth:`ckptstore.priority.BackgroundThreads.boosted`).
    """

    def __init__(self, stall_seconds: float, total_bytes: int,
                 boost: Callable[[], AbstractContextManager[None]] = nullcontext):
        self.stall_seconds = stall_seconds
        self.progress = Progress(total=total_bytes)
        self.persist_seconds: float | None = None
        self._done = threading.Event()
        self._info: CommitInfo | None = None
        self._error: BaseException | None = None
        self.observed = False
        self._started = time.perf_counter()
        self._boost = boost
        self._uploaded: Callable[[str, float | None], None] | None = None

    def on_upload(self, wait_uploaded: Callable[[str, float | None], None]) -> None:
        """Set by a tiered store: ``wait_uploaded(commit id, timeout)`` returns once the commit
        is on the remote (``wait(uploaded=True)``)."""
        self._uploaded = wait_uploaded

    def finish(self, info: CommitInfo | None, error: BaseException | None) -> None:
        """Record the outcome (by whoever runs the commit: the committer's persist thread, or
        DCP's completion under a process group) and wake the waiters."""
        self._info, self._error = info, error
        self.persist_seconds = time.perf_counter() - self._started
        self._done.set()

    def join(self, timeout: float | None = None) -> bool:
        """Wait until the persist ended, without taking its result (``wait()`` takes it);
        return whether it ended."""
        return self._done.wait(timeout)

    def done(self) -> bool:
        """True once the persist finished (successfully or not)."""
        return self._done.is_set()

    @property
    def failed(self) -> bool:
        return self._done.is_set() and self._error is not None

    def wait(self, timeout: float | None = None, uploaded: bool = False) -> CommitInfo:
        """Block until persisted; return the commit's info or raise its error. ``uploaded``
        (a tiered store only): also until the commit is on the remote, raising the
        :class:`~ckptstore.errors.UploadError` that stops it; ``timeout`` counts both."""
        if uploaded and self._uploaded is None:
            raise PendingCommitError(
                "wait(uploaded=True) needs a tiered store (ckptstore.open(url, local=...)); "
                "this store has one tier: wait() alone returns once the commit is stored")
        deadline = None if timeout is None else time.monotonic() + timeout
        if not self._done.is_set():
            with self._boost():
                self._done.wait(timeout)
        if not self._done.is_set():
            raise TimeoutError(f"commit still persisting after {timeout} s "
                               f"({self.progress.written} bytes written)")
        self.observed = True
        if self._error is not None:
            raise self._error
        if uploaded and self._uploaded is not None:
            self._uploaded(self._info.id, None if deadline is None else
                           max(0.0, deadline - time.monotonic()))
        return self._info

    def raise_unobserved(self) -> None:
        """Raise :class:`PendingCommitError` if this commit failed and nobody called wait()."""
        if self.failed and not self.observed:
            self.observed = True
            raise PendingCommitError(
                f"the previous asynchronous commit failed and nobody called wait(): "
                f"{type(self._error).__name__}: {self._error}. The store is unchanged by it; "
                "commit again.") from self._error

    def __repr__(self) -> str:
        state = "failed" if self.failed else "done" if self.done() else "persisting"
        return (f"<PendingCommit {state} {self.progress.written}/{self.progress.total} bytes, "
                f"stall {self.stall_seconds * 1000:.1f} ms>")
