"""A tiered store's uploads off training's interpreter: each commit copied to the remote by an
upload process of the store's own (:mod:`.upload_worker`) instead of on the upload thread.

The :class:`~.uploader.Uploader` keeps everything else -- the journal, the order, the waits, the
rules after each upload, branch and tag changes, a rank's parts -- and hands a commit's copy
(:func:`.copy.copy_commit`: its chunks, manifest, ref and tags) to the process, which answers
once the copy is done, sending its progress meanwhile. The upload thread waits on a pipe
meanwhile, without the interpreter lock: the HTTP client's work (signing, checksums, the copies
of each body) runs in the upload process. The process starts at the first upload and again
after it ended; where none can start, the copies stay on the upload thread (a warning says
why). It ends within a second of its store's process (the copy under way is then copied again by
the next open, as after a kill).
"""

from __future__ import annotations

import os
import signal
import warnings
from collections.abc import Callable
from concurrent.futures import Executor

from ..commit.child import Child
from ..commit.process import WorkerSpec, to_plain_kwargs
from ..storage import Storage
from .copy import Sent, copy_commit

__all__ = ["UploadProcess", "UploadProcessWarning"]

#: the module the upload process runs
UPLOAD_MODULE = "ckptstore.tiers.upload_worker"


class UploadProcessWarning(UserWarning):
    """A tiered store's upload process could not start: its uploads run on the upload thread."""


class UploadProcess:
    """Copies commits from ``local`` to ``remote`` in an upload process that opens them as
    ``spec`` says (the remote's URL or absolute root, its storage options and ``retry``; the
    local tier's absolute root). Its key copies run at the store's ``background_priority``
    (``"low"`` and ``"idle"``: nice :data:`~ckptstore.priority.LOW_NICE`) while the uploads
    keep up with the commits, at normal priority when another commit is queued behind the one
    under way or someone waits (``push``, ``wait(uploaded=True)``, the byte budget). Called on
    the upload thread only."""

    def __init__(self, spec: WorkerSpec, local: Storage, remote: Storage):
        self.local, self.remote = local, remote
        opening = {k: v for k, v in spec.kwargs.items()
                   if k not in ("io_workers", "keep", "background_priority")}
        self.opening = {"op": "open", "url": spec.url, "local": spec.local,
                        "priority": spec.kwargs.get("background_priority", "normal"),
                        "kwargs": to_plain_kwargs(opening)}
        self.child: Child | None = None
        self.failed: str | None = None  # why none could start: the copies stay on the thread

    def copy_commit(self, commit: str, branch: str | None, executor: Executor, sent: Sent,
                    stop: Callable[[], bool], urgent: bool = False) -> None:
        """:func:`.copy.copy_commit` in the upload process (on the thread where none starts);
        its key copies at the store's background priority, at normal priority if ``urgent``."""
        child = self._started()
        if child is None:
            copy_commit(self.local, self.remote, commit, branch, executor, sent, stop)
            return
        if stop():
            raise InterruptedError("upload stopped")
        child.call({"op": "copy", "commit": commit, "branch": branch, "urgent": urgent},
                   progress=sent)

    def _started(self) -> Child | None:
        if self.child is not None and not self.child.alive():
            self.child.close()
            self.child = None
        if self.child is None and self.failed is None:
            child = None
            try:
                child = Child(UPLOAD_MODULE, "upload process")
                child.call(self.opening)
            except Exception as e:  # noqa: BLE001 - the thread copies instead, said once
                if child is not None:
                    child.close(timeout=5)
                self.failed = f"{type(e).__name__}: {e}"
                warnings.warn(f"a tiered store's upload process could not start ({self.failed})"
                              f": its uploads run on the upload thread", UploadProcessWarning,
                              stacklevel=2)
                return None
            self.child = child
        return self.child

    def interrupt(self) -> None:
        """Stop the copy under way between keys (the store closes; from any thread)."""
        self._signal(signal.SIGUSR1)

    def hurry(self) -> None:
        """Run the rest of the copy under way at normal priority (someone waits for it, or a
        commit queued behind it; from any thread)."""
        self._signal(signal.SIGUSR2)

    def _signal(self, signum: int) -> None:
        child = self.child
        if child is not None and child.alive():
            try:
                os.kill(child.proc.pid, signum)
            except ProcessLookupError:
                pass

    def close(self) -> None:
        """End the upload process (on the upload thread: SIGPIPE blocked there)."""
        if self.child is not None:
            self.child.close()
            self.child = None
