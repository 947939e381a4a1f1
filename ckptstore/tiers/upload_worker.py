"""The upload process of a tiered store (:mod:`.offload`):
``python -m ckptstore.tiers.upload_worker <in fd> <out fd>``.

It answers its store's frames (:mod:`ckptstore.commit.wire`) one at a time: ``open`` (the local
tier at ``local`` and the remote at ``url`` as storages, with the remote's storage options and
``retry``; ``priority``: the store's background priority), ``copy`` (one commit to the
remote, :func:`.copy.copy_commit`, its progress sent as ``{"sent": n}`` frames before the
answer; its key copies at that priority unless ``urgent``). SIGUSR1 stops the copy under way
between keys (its store closes); SIGUSR2 runs the rest of it at normal priority. It ends at an
``end`` frame, when its store closes the pipe, or within a second of its store's process
ending (the copy under way is left as a kill leaves it: the next open copies it again).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from typing import Any

from ..commit.child import serve
from ..commit.wire import from_plain, write_frame
from ..errors import PersistProcessError
from ..priority import LOW_NICE
from ..storage import Storage, open_storage
from .copy import copy_commit

_THREADS = 8  # concurrent key copies of one commit, as the upload thread's


class _Hurried(Executor):
    """The key copies of one commit: on the low pool until :attr:`hurried`, then each copy not
    started yet goes to the normal-priority pool (SIGUSR2: someone waits for the commit)."""

    def __init__(self, low: Executor, normal: Executor):
        self.low, self.normal, self.hurried = low, normal, False

    def submit(self, fn: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Future:
        if self.hurried or self.low is self.normal:
            return self.normal.submit(fn, *args, **kwargs)
        out: Future = Future()

        def run(pool_is_low: bool) -> None:
            if pool_is_low and self.hurried:  # raised while it waited: the normal pool runs it
                self.normal.submit(run, False)
                return
            if not out.set_running_or_notify_cancel():
                return
            try:
                out.set_result(fn(*args, **kwargs))
            except BaseException as e:  # noqa: BLE001 - handed to the waiter
                out.set_exception(e)

        self.low.submit(run, True)
        return out


class _Worker:
    def __init__(self, sink: int) -> None:
        self.sink, self.sending = sink, threading.Lock()
        self.local: Storage | None = None
        self.remote: Storage | None = None
        self.stopping = False
        # the key copies: at the store's background priority while the uploads keep up, at
        # normal priority for a copy the store marks urgent (behind, or waited for) and for
        # the rest of one it hurries (SIGUSR2)
        normal = ThreadPoolExecutor(_THREADS, thread_name_prefix="ckptstore-upload-io")
        _start_threads(normal, _THREADS)  # here: a thread inherits its creator's nice value
        self.copies = _Hurried(normal, normal)
        signal.signal(signal.SIGUSR1, self._stop)
        signal.signal(signal.SIGUSR2, self._hurry)

    def _stop(self, signum: int, frame: object) -> None:
        self.stopping = True  # the store closes: this process ends after the copy under way

    def _hurry(self, signum: int, frame: object) -> None:
        self.copies.hurried = True

    def handle(self, message: Any) -> Any:
        op = message.get("op") if isinstance(message, dict) else None
        if op == "open":
            if message.get("priority") in ("low", "idle"):
                self.copies.low = ThreadPoolExecutor(
                    _THREADS, thread_name_prefix="ckptstore-upload-low", initializer=_lower)
            kwargs = {k: from_plain(v) for k, v in message["kwargs"].items()}
            self.local = open_storage(message["local"])
            self.remote = open_storage(message["url"], **kwargs)  # durable=, retry=, options
            return os.getpid()
        if self.local is None or self.remote is None:
            raise PersistProcessError(f"{op!r} before 'open'")
        if op == "copy":
            # a hurry that came before this frame holds for this copy (it was meant for it)
            self.copies.hurried = self.copies.hurried or bool(message.get("urgent"))
            try:
                copy_commit(self.local, self.remote, str(message["commit"]),
                            message["branch"], self.copies, self.sent, lambda: self.stopping)
            finally:
                self.copies.hurried = False
            return True
        raise PersistProcessError(f"an unknown request {op!r}")

    def sent(self, n: int) -> None:
        with self.sending:  # the copies' threads
            write_frame(self.sink, {"sent": n})


def _start_threads(pool: ThreadPoolExecutor, n: int) -> None:
    """Make ``pool``'s ``n`` threads now, on this thread (a pool makes them as tasks come, on
    the submitting thread: a low copy handing a task over would make a low one)."""
    barrier = threading.Barrier(n + 1)
    for _ in range(n):
        pool.submit(barrier.wait)
    barrier.wait()


def _lower() -> None:
    """A low key-copy thread: nice ``LOW_NICE`` for ``"low"`` and ``"idle"`` alike (never
    ``SCHED_IDLE``: a copy starved there would hold ``push`` for as long as the cores stay
    busy)."""
    try:
        os.nice(LOW_NICE)
    except OSError:
        pass  # not permitted here: the process's own priority


def _orphaned(parent: int) -> None:
    """End this process once its store's process ended (its uploads resume at the next open)."""
    while os.getppid() == parent:
        time.sleep(0.5)
    os._exit(1)


def main(argv: list[str]) -> int:
    threading.Thread(target=_orphaned, args=(os.getppid(),), daemon=True).start()
    worker = _Worker(int(argv[1]))
    return serve(int(argv[0]), int(argv[1]), worker.handle, worker.sending)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
