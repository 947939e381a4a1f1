"""Lower CPU priority for background work, so that a training loop sharing the cores is slowed
as little as possible (issue 11: "a persist phase that leaves training alone").

The persist thread of ``commit_async`` and the I/O threads that encode and write its chunks run
at the priority ``ckptstore.open(url, background_priority=...)`` names:

``"idle"`` (the default)
    Linux ``SCHED_IDLE``: the threads get a core only when no normal thread wants it. On the
    2-core VM this cut the slowdown of a Python-bound loop under ``commit_async`` from +17.5 %
    to +7.6 % (lossless) and from +39.5 % to +26.9 % (8-bit), every commit still landing
    (``benchmarks/cpu_proxy.py``; ``"low"`` measured the same). A persist starved by busy cores
    delays only the next commit, which waits for it (at most one commit is in flight). Where
    ``SCHED_IDLE`` does not exist, ``"low"``.
``"low"``
    the lowest nice value (19) for those threads.
``"normal"``
    the priority of the process, on the store's one I/O pool (as before this option existed).

Synchronous commits and checkouts, where the caller waits, always run at normal priority. Where
the operating system refuses a change, the threads keep their priority.
"""

from __future__ import annotations

import os
import threading
from concurrent.futures import ThreadPoolExecutor

__all__ = ["BACKGROUND_PRIORITIES", "background_executor", "check_priority",
           "lower_thread_priority", "started_executor"]

BACKGROUND_PRIORITIES = ("idle", "low", "normal")


def check_priority(level: str) -> str:
    """``level`` if it is one of :data:`BACKGROUND_PRIORITIES`, else ValueError."""
    if level not in BACKGROUND_PRIORITIES:
        raise ValueError(f"background_priority must be one of {BACKGROUND_PRIORITIES}, not "
                         f"{level!r}")
    return level


def lower_thread_priority(level: str) -> None:
    """Give the calling thread the priority ``level`` (a thread initializer)."""
    if level == "normal":
        return
    tid = threading.get_native_id()
    try:
        if level == "idle" and hasattr(os, "sched_setscheduler") and hasattr(os, "SCHED_IDLE"):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
            return
        if hasattr(os, "setpriority"):
            os.setpriority(os.PRIO_PROCESS, tid, 19)  # Linux: per thread
    except OSError:  # not permitted here: stay at the process's priority
        pass


def background_executor(workers: int, level: str, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads run at priority ``level``."""
    return ThreadPoolExecutor(workers, thread_name_prefix=name,
                              initializer=lower_thread_priority, initargs=(level,))


def started_executor(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads all start now, from the calling thread: on Linux a thread
    inherits the scheduling policy and nice value of the thread that creates it, and
    ``ThreadPoolExecutor`` creates its workers lazily, at a submit -- a worker started by a
    background thread (``SCHED_IDLE``) would run the store's synchronous work at idle
    priority."""
    executor = ThreadPoolExecutor(workers, thread_name_prefix=name)
    barrier = threading.Barrier(workers + 1)

    def hold() -> None:  # each worker waits here, so that every submit starts a new one
        try:
            barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            pass

    for _ in range(workers):
        executor.submit(hold)
    try:
        barrier.wait(timeout=30)
    except threading.BrokenBarrierError:  # a worker could not start: the rest start lazily
        pass
    return executor
