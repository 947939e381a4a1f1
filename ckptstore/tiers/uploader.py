"""The upload thread of a tiered store: the journal's records, one commit at a time, in order.

Commit order is upload order: a record uploads only once every record before it did, so a
chain's base is on the remote before what reads it, and the remote branch moves through the same
commits as the local one. A failed upload (after the storage layer's retries) stops the queue
at that record -- what comes after it waits, nothing of it is visible remotely -- and is tried
again by the next commit, :meth:`Uploader.wait` (``store.push()``) or the next ``open``.
A rank's part of a sharded commit (``op="part"``) uploads by :mod:`.parts`: the coordinator's
record waits there (up to :attr:`Uploader.part_timeout` seconds per attempt) for the other
ranks' parts before it publishes.
"""

from __future__ import annotations

import threading
import time
import warnings
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace

from ..commit.child import exchange_thread
from ..errors import UploadError
from ..format.layout import data_dir
from ..priority import block_interrupts
from ..storage import Storage
from .copy import copy_commit
from .journal import Journal, Record
from .offload import UploadProcess
from .parts import publish_parts, upload_part
from .refops import replay_ref_change

__all__ = ["Upload", "Uploader"]

_THREADS = 8  # concurrent key copies of one commit
PART_TIMEOUT = 600.0  # seconds the coordinator waits for the other ranks' parts, per attempt


@dataclass(frozen=True)
class Upload:
    """Where one commit of a tiered store stands: ``state`` is ``"local-only"`` (queued),
    ``"uploading"``, ``"uploaded"`` or ``"failed"`` (``error`` says why; it is tried again);
    ``sent`` of ``bytes`` copied so far (``bytes`` counts the local tier's files). ``op`` other
    than ``"commit"``: a change of branch or tag ``branch`` to replay on the remote, or
    (``"part"``) rank ``rank`` of ``world``'s part of a sharded commit."""

    commit: str
    branch: str
    state: str
    bytes: int
    sent: int = 0
    error: str | None = None
    op: str = "commit"
    rank: int = 0
    world: int = 1


def _status_key(rec: Record) -> str:
    """A commit's status is keyed by its id; a branch or tag change by what it changes."""
    return rec.commit if rec.op == "commit" else f"{rec.op}:{rec.branch}:{rec.seq}"


class Uploader:
    """Uploads the journal's records from ``local`` to ``remote`` on one background thread;
    ``landed(commit)`` is called after each upload (the tiers' retention rules); :meth:`wait`
    returns once it ran."""

    def __init__(self, local: Storage, remote: Storage, journal: Journal,
                 landed: Callable[[str], None] | None = None,
                 offload: UploadProcess | None = None):
        self.local, self.remote, self.journal, self.landed = local, remote, journal, landed
        self.offload = offload  # a commit's copy in an upload process (.offload)
        self.part_timeout = PART_TIMEOUT
        self._cond = threading.Condition()
        self._queue: list[Record] = []
        self._status: dict[str, Upload] = {}  # by _status_key, in the order queued
        self._halted: UploadError | None = None  # the head's failure: the queue waits
        self._stopping = False
        self._attempts = 0  # uploads begun so far
        self._failed_at = 0  # the number of the attempt that failed last
        self._landing: str | None = None  # uploaded, its rules (``landed``) still running
        self._waiting = 0  # callers in wait(): the next copy is urgent (.offload)
        self._low = False  # a copy under way at the background priority (.offload)
        self._copies = ThreadPoolExecutor(_THREADS, thread_name_prefix="ckptstore-upload-io",
                                          initializer=block_interrupts)
        # held by the thread from an upload's first key to the end of what follows it
        # (``landed``): remote gc takes it to run between two uploads
        self.busy = threading.Lock()
        self._thread = threading.Thread(target=self._run, name="ckptstore-upload", daemon=True)
        self._thread.start()

    # -- the queue -------------------------------------------------------------------------
    def add(self, rec: Record) -> None:
        """Queue a journal record (a commit durable locally); a halted queue tries again."""
        with self._cond:
            # (a seq number is reused once the journal is empty: a record is its seq and commit)
            if any(r.seq == rec.seq and r.commit == rec.commit for r in self._queue):
                return
            self._queue.append(rec)
            self._status[_status_key(rec)] = Upload(rec.commit, rec.branch, "local-only",
                                                    rec.bytes, op=rec.op, rank=rec.rank,
                                                    world=rec.world)
            self._halted = None
            if len(self._queue) > 1:
                self._hurry()
            self._cond.notify_all()

    def _hurry(self) -> None:
        """A copy under way at the background priority goes on at normal priority (under the
        condition's lock)."""
        if self._low and self.offload is not None:
            self._low = False
            self.offload.hurry()

    def queued_bytes(self) -> int:
        with self._cond:
            return sum(r.bytes for r in self._queue)

    def pending(self) -> set[str]:
        """Commits queued and not uploaded yet."""
        with self._cond:
            return {r.commit for r in self._queue}

    def status(self) -> list[Upload]:
        with self._cond:
            return list(self._status.values())

    def wait(self, timeout: float | None = None, below: int | None = None,
             commit: str | None = None) -> None:
        """Wait until every queued commit is uploaded, or (``below``) until the queued bytes
        are under that, or until ``commit`` is uploaded (not queued: at once); a halted queue
        is tried once more first. Raises the :class:`UploadError` of a failure, or
        ``TimeoutError``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            self._waiting += 1
            self._hurry()
            try:
                self._wait(deadline, timeout, below, commit)
            finally:
                self._waiting -= 1

    def _wait(self, deadline: float | None, timeout: float | None, below: int | None,
              commit: str | None) -> None:
        """:meth:`wait`, under the condition's lock."""
        begun = self._attempts  # only a failure of an attempt begun after this counts
        if self._halted is not None:
            self._halted = None
            self._cond.notify_all()
        while not self._reached(below, commit):
            if self._halted is not None:
                if self._failed_at > begun:
                    raise self._halted
                self._halted = None  # an attempt begun before this wait: try once more
                self._cond.notify_all()
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise TimeoutError(f"uploads still running after {timeout} s" + (
                    "" if commit is None else f" (commit {commit[:12]} not uploaded yet)"))
            self._cond.wait(left)

    def _reached(self, below: int | None, commit: str | None) -> bool:
        if commit is not None:
            return self._landing != commit and all(r.commit != commit for r in self._queue)
        if below is not None:
            return sum(r.bytes for r in self._queue) < below
        return not self._queue and self._landing is None

    def close(self) -> None:
        """Stop after the key copies under way; what is left stays in the journal."""
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        if self.offload is not None:
            self.offload.interrupt()
        self._thread.join()  # it ends the upload process
        self._copies.shutdown(wait=True)

    # -- the thread ------------------------------------------------------------------------
    def _run(self) -> None:
        exchange_thread()  # no Ctrl-C, no SIGPIPE (the upload process's pipe)
        try:
            self._serve()
        finally:
            if self.offload is not None:
                self.offload.close()

    def _serve(self) -> None:
        while True:
            with self._cond:
                while not self._stopping and (not self._queue or self._halted is not None):
                    self._cond.wait()
                if self._stopping:
                    return
                rec = self._queue[0]
                self._attempts += 1
                attempt = self._attempts
                self._set(rec, state="uploading", error=None)
                # behind the commits (another queued) or waited for: at normal priority
                urgent = len(self._queue) > 1 or self._waiting > 0
                self._low = not urgent
            with self.busy:
                error = self._upload(rec, urgent)
            with self._cond:
                self._low = False
                self._settle(rec, attempt, error)
                if error is None:
                    self._after(rec.commit)
                    with self._cond:  # waiters on this commit return once its rules ran
                        self._landing = None
                        self._cond.notify_all()

    def _settle(self, rec: Record, attempt: int, error: UploadError | None) -> None:
        """Record the outcome of one attempt and wake the waiters."""
        with self._cond:
            if error is None:
                self._queue.pop(0)
                self._landing = rec.commit
                self._set(rec, state="uploaded", sent=rec.bytes)
            elif not self._stopping:
                self._failed_at = attempt
                self._halted = error
                self._set(rec, state="failed", error=str(error))
            self._cond.notify_all()

    def _after(self, commit: str) -> None:
        """``landed(commit)``; its failure is a warning (the upload itself landed)."""
        if self.landed is None:
            return
        try:
            self.landed(commit)
        except Exception as e:  # noqa: BLE001 - the upload landed; the thread goes on
            warnings.warn(f"commit {commit[:12]} was uploaded, but what follows an "
                          f"upload failed: {type(e).__name__}: {e}", stacklevel=1)

    def _upload(self, rec: Record, urgent: bool = False) -> UploadError | None:
        def sent(n: int) -> None:
            with self._cond:
                s = self._status[_status_key(rec)]
                self._status[_status_key(rec)] = replace(s, sent=s.sent + n)

        try:
            stop = lambda: self._stopping  # noqa: E731
            if rec.op == "commit" and self.offload is not None:
                self.offload.copy_commit(rec.commit, rec.branch, self._copies, sent, stop,
                                         urgent)
            elif rec.op == "commit":
                copy_commit(self.local, self.remote, rec.commit, rec.branch, self._copies,
                            sent, stop)
            elif rec.op == "part" and rec.rank == 0:
                publish_parts(self.local, self.remote, rec, self._copies, sent, stop,
                              self.part_timeout)
            elif rec.op == "part":
                upload_part(self.local, self.remote, rec, self._copies, sent, stop)
            else:
                replay_ref_change(self.local, self.remote, rec, self._copies, sent,
                                  lambda: self._stopping)
            self.journal.done(rec)
            return None
        except InterruptedError:
            return UploadError(f"upload of commit {rec.commit[:12]} stopped (store closed); "
                               "it resumes on the next open", commit_id=rec.commit)
        except Exception as e:  # noqa: BLE001 - any failure halts the queue, never the thread
            error = e if isinstance(e, UploadError) else UploadError(
                f"upload of commit {rec.commit[:12]} ({data_dir(rec.commit)}) to "
                f"{self.remote.url} failed: {e}. The commit is safe on the local tier and "
                "queued; nothing of it is visible remotely: store.push() or `ckpt push` tries "
                "again", commit_id=rec.commit, key=getattr(e, "key", None))
            try:
                self.journal.failed(rec, error)
            except OSError:
                pass  # the local tier failing too: the status in memory still says it
            return error

    def _set(self, rec: Record, **changes: object) -> None:
        key = _status_key(rec)
        self._status[key] = replace(self._status[key], **changes)
