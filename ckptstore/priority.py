"""CPU priority of background work: low enough that a training loop sharing the cores is slowed
little, never so low that busy cores starve it (issues 11 and 26).

The persist thread of ``commit_async`` and the I/O threads that encode and write its chunks run
at the priority ``ckptstore.open(url, background_priority=...)`` names:

``"low"`` (the default)
    nice :data:`LOW_NICE` above the process's nice value. The kernel's fair scheduler still
    gives such a thread a share of a busy core (about a tenth against one normal thread), so a
    persist always progresses, and a thread descheduled while it holds the GIL gets it back to
    training within a few time slices.
``"idle"`` (opt-in)
    Linux ``SCHED_IDLE``: a core only when no normal thread wants one. **Warning**: when other
    processes keep every core busy (DataLoader workers usually do), such a thread gets almost no
    CPU: the persist does not finish, and while it holds the GIL the training thread cannot run
    either -- a Python-bound loop beside two busy processes ran at 2.6 % CPU for minutes
    (issue 26). Use it only where cores are known to stay free. Where ``SCHED_IDLE`` does not
    exist, ``"low"``.
``"normal"``
    the priority of the process, on the store's one I/O pool (as before issue 11).

**Priority inheritance** (:meth:`BackgroundThreads.boosted`): while the caller waits for the
commit in flight (the next ``commit``/``commit_async``, ``PendingCommit.wait()``,
``store.close()``), the background threads run at the caller's priority, so the wait lasts what
the rest of the persist takes at normal priority.

**Starved, then raised** (:meth:`BackgroundThreads.observe`): a ``"low"`` or ``"idle"`` persist
uses the cores training leaves free; where none are free (busy DataLoader workers, other jobs)
it would finish only once the caller waits, at the next commit -- a longer stall than a
normal-priority persist costs. So each background thread reads its scheduler statistics
(``/proc/thread-self/schedstat``: time run, time waited runnable) after its tasks, at most every
:data:`CHECK_EVERY` seconds; when one got less than :data:`STARVED_THREAD` of a core while
runnable and the threads lately runnable less than :data:`STARVED_SHARE` together, they run
at normal priority for the rest of that persist (:meth:`BackgroundThreads.settle` lowers them
when it ends), as if the caller waited already; the next persists start raised
(:meth:`BackgroundThreads.begin`), but for every :data:`REPROBE`-th in a row, which starts low
to judge anew.

Raising a priority again needs the right to (root, ``CAP_SYS_NICE``, or ``ulimit -e`` of at
least 20 minus the process's nice value); where the system refuses, the chunks not yet started
go to the store's normal-priority pool instead (:meth:`BackgroundThreads.executor`), and the
persist thread goes on at its fair low share.

Synchronous commits and checkouts, where the caller waits, always run at normal priority.
Where the operating system refuses a change, the threads keep their priority; outside Linux
they keep the process's (per-thread priorities are Linux's).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Executor, Future, ThreadPoolExecutor
from contextlib import contextmanager

__all__ = ["BACKGROUND_PRIORITIES", "CHECK_EVERY", "DEFAULT_PRIORITY", "LOW_NICE", "REPROBE",
           "STARVED_SHARE", "STARVED_THREAD", "BackgroundThreads", "check_priority",
           "started_executor", "starved"]

BACKGROUND_PRIORITIES = ("low", "idle", "normal")
DEFAULT_PRIORITY = "low"
#: niceness added for ``"low"``: the CFS weight of nice 10 is ~1/9 of nice 0's
LOW_NICE = 10
_IDLE = getattr(os, "SCHED_IDLE", None) if hasattr(os, "sched_setscheduler") else None
#: only Linux takes a thread id where ``setpriority`` takes a process id (elsewhere the same
#: call would renice whatever process has that number): other systems keep every priority
_PER_THREAD = sys.platform.startswith("linux")
#: a thread's scheduler statistics: nanoseconds run, nanoseconds waited runnable, time slices
_SCHEDSTAT = "/proc/thread-self/schedstat"
#: seconds between two reads of a background thread's statistics (each read hands the GIL over)
CHECK_EVERY = 0.05
#: below this share of one core (while they want one) the background threads count as starved
STARVED_SHARE = 0.5
#: ... when the thread judging got less than this share itself (threads sharing a free core get
#: a half or a third each; beside busy processes at normal priority, a tenth or less)
STARVED_THREAD = 0.2
#: after a starved persist the next ones start raised, all but every REPROBE-th in a row
REPROBE = 8
#: runnable time (ns) a judgement needs at least: a few time slices, not one wake-up
_JUDGE_NS = 4_000_000
#: seconds a thread's last share counts in the threads' sum (it was runnable that recently)
_FRESH = 4 * CHECK_EVERY


def starved(share: float, shares: Iterable[float]) -> bool:
    """Whether a background thread that got ``share`` of a core while it was runnable is
    starved: it got less than :data:`STARVED_THREAD` of one, and the threads lately runnable
    (``shares``, its own among them) less than :data:`STARVED_SHARE` together."""
    return share < STARVED_THREAD and sum(shares) < STARVED_SHARE


def check_priority(level: str) -> str:
    """``level`` if it is one of :data:`BACKGROUND_PRIORITIES`, else ValueError."""
    if level not in BACKGROUND_PRIORITIES:
        raise ValueError(f"background_priority must be one of {BACKGROUND_PRIORITIES}, not "
                         f"{level!r}")
    return level


def _set(tid: int, idle: bool, nice: int) -> bool:
    """Give thread ``tid`` the policy (``SCHED_IDLE`` or normal) and nice value; False where the
    system refuses (True where threads have no priority of their own here)."""
    if not _PER_THREAD:
        return True
    try:
        if _IDLE is not None and (idle or os.sched_getscheduler(tid) == _IDLE):
            os.sched_setscheduler(tid, _IDLE if idle else os.SCHED_OTHER, os.sched_param(0))
        if not idle:
            os.setpriority(os.PRIO_PROCESS, tid, nice)  # Linux: per thread
    except ProcessLookupError:  # the thread ended
        return True
    except OSError:  # not permitted here
        return False
    return True


class _Watch:
    """One background thread's scheduler statistics: an open ``schedstat`` and its last read."""

    def __init__(self, fd: int):
        self.fd, self.at = fd, time.monotonic()
        self.ran, self.waited = self.read()
        #: the share of a core the thread got while runnable, at its last judgement (when)
        self.share, self.judged = 1.0, -_FRESH

    def read(self) -> tuple[int, int]:
        fields = os.pread(self.fd, 64, 0).split()
        return int(fields[0]), int(fields[1])


def _watch() -> _Watch | None:
    """The calling thread's statistics, where this system keeps them."""
    if not _PER_THREAD:
        return None
    try:
        return _Watch(os.open(_SCHEDSTAT, os.O_RDONLY | os.O_CLOEXEC))
    except (OSError, ValueError, IndexError):  # no schedstat here (kernel without it)
        return None


class BackgroundThreads:
    """The threads of background persists: made at ``level``, raised to the creator's priority
    while someone waits for them (:meth:`boosted`) or while they are starved
    (:meth:`observe`, until :meth:`settle`).

    Make it on the thread whose priority counts as normal (the store's opener); threads are
    registered as they start, and forgotten at :meth:`close`.

    Attributes
    ----------
    starved_persists
        How many persists ran at normal priority because their threads were starved (or the
        persist before them was).
    """

    def __init__(self, level: str):
        self.level = check_priority(level)
        self.normal_nice = os.getpriority(os.PRIO_PROCESS, 0) if hasattr(os, "getpriority") \
            else 0
        self._tids: set[int] = set()
        self._lock = threading.Lock()
        self._waiters = 0
        self._watches: list[_Watch] = []
        self._local = threading.local()
        self._starved = False
        self._streak = 0  # persists in a row that ran raised because starved
        self.starved_persists = 0
        #: True while someone waits and the threads could not be raised
        self.refused = False

    def pool(self, workers: int, name: str) -> ThreadPoolExecutor:
        """A thread pool whose threads run at this level (normal while :meth:`boosted`)."""
        return ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=self._register)

    @property
    def thread_ids(self) -> frozenset[int]:
        """Native ids of the threads running at this level now (those of this store only)."""
        with self._lock:
            return frozenset(self._tids)

    def executor(self, low: Executor, normal: Executor) -> Executor:
        """Submits to ``low``, or to ``normal`` while a wait could not raise the threads; each
        task on ``low`` ends with :meth:`observe`."""
        return _Routed(self, low, normal)

    def _register(self) -> None:
        block_interrupts()
        tid = threading.get_native_id()
        with self._lock:
            self._tids.add(tid)
            if self._waiters:  # it may have inherited a low priority from its creator
                self.refused |= not _set(tid, False, self.normal_nice)
            else:
                self._lower(tid)
        watch = _watch() if self.level != "normal" else None
        if watch is not None:
            self._local.watch = watch
            with self._lock:
                self._watches.append(watch)

    def _lower(self, tid: int) -> None:
        if self.level == "idle" and _IDLE is not None:
            _set(tid, True, self.normal_nice)
        elif self.level != "normal":
            _set(tid, False, min(19, self.normal_nice + LOW_NICE))

    def _raise_all(self) -> None:  # under the lock
        self._waiters += 1
        if self._waiters == 1:
            self.refused = not all([_set(t, False, self.normal_nice) for t in self._tids])

    def _lower_all(self) -> None:  # under the lock
        self._waiters -= 1
        if not self._waiters:
            self.refused = False
            for t in self._tids:
                self._lower(t)

    @contextmanager
    def boosted(self) -> Iterator[None]:
        """While the body runs, the background threads run at normal priority."""
        if self.level == "normal":
            yield
            return
        with self._lock:
            self._raise_all()
        try:
            yield
        finally:
            with self._lock:
                self._lower_all()

    def observe(self) -> None:
        """On a background thread after a task: read its scheduler statistics (at most every
        :data:`CHECK_EVERY` s) and, where the threads are :func:`starved`, raise them to normal
        priority until :meth:`settle`."""
        watch = getattr(self._local, "watch", None)
        if watch is None or self._starved or time.monotonic() - watch.at < CHECK_EVERY:
            return
        try:
            ran, waited = watch.read()
        except (OSError, ValueError, IndexError):  # unreadable now: stop watching this thread
            self._local.watch = None
            return
        ran_ns, waited_ns = ran - watch.ran, waited - watch.waited
        if ran_ns + waited_ns < _JUDGE_NS:
            return  # judge on more: keep the last reading
        now = time.monotonic()
        watch.ran, watch.waited, watch.at = ran, waited, now
        watch.share, watch.judged = ran_ns / (ran_ns + waited_ns), now
        # the threads lately runnable, wherever the scheduler put them: one sharing the
        # training thread's core may get a tenth while another has a free core to itself
        if starved(watch.share, (w.share for w in self._watches if now - w.judged <= _FRESH)):
            with self._lock:
                if not self._starved:
                    self._raise_starved()

    def begin(self) -> None:
        """A persist starts: after a starved one it starts raised (the cores are likely still
        taken: judging again costs the first chunks' wait at a low share, and a thread holding
        the GIL meanwhile stalls training), but every :data:`REPROBE`-th in a row starts at its
        level to judge anew."""
        with self._lock:
            if self.level != "normal" and self._streak % REPROBE:
                self._raise_starved()

    def _raise_starved(self) -> None:  # under the lock: this persist runs raised until settle
        self._starved = True
        self.starved_persists += 1
        self._raise_all()

    def settle(self) -> None:
        """A persist ended: threads raised because they were starved go back to their level."""
        with self._lock:
            if self._starved:
                self._starved = False
                self._streak += 1
                self._lower_all()
            else:
                self._streak = 0

    def close(self) -> None:
        """Forget the threads (after their pools shut down: their ids may be reused)."""
        with self._lock:
            self._tids.clear()
            for watch in self._watches:
                os.close(watch.fd)
            self._watches.clear()


class _Routed(Executor):
    """The background pool, or the normal one while a wait could not raise the threads."""

    def __init__(self, threads: BackgroundThreads, low: Executor, normal: Executor):
        self._threads, self._low, self._normal = threads, low, normal

    def submit(self, fn: Callable[..., object], /, *args: object, **kwargs: object) -> Future:
        if self._threads.refused:
            return self._normal.submit(fn, *args, **kwargs)
        observe = self._threads.observe

        def run() -> object:
            try:
                return fn(*args, **kwargs)
            finally:
                observe()

        return self._low.submit(run)


def block_interrupts() -> None:
    """In a thread of ckptstore's own: leave Ctrl-C (SIGINT) to the others. Python runs signal
    handlers in the main thread only, but the kernel delivers a process's signal to any thread
    that does not block it: a worker that takes it leaves the main thread asleep in its wait
    until something else wakes it, and the KeyboardInterrupt then surfaces late, or where it is
    ignored (a finalizer): Ctrl-C lost, the command run to its end."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})


def started_executor(workers: int, name: str) -> ThreadPoolExecutor:
    """A thread pool whose threads all start now, from the calling thread: on Linux a thread
    inherits the scheduling policy and nice value of the thread that creates it, and
    ``ThreadPoolExecutor`` creates its workers lazily, at a submit -- a worker started by a
    background thread (low priority) would run the store's synchronous work at low
    priority."""
    executor = ThreadPoolExecutor(workers, thread_name_prefix=name, initializer=block_interrupts)
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
