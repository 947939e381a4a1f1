"""The persist process of a store opened with ``background="process"``
(:mod:`ckptstore.commit.process`): ``python -m ckptstore.persist_worker <in fd> <out fd>``.

It answers the frames its store sends on ``<in fd>`` (:mod:`ckptstore.commit.wire`), one at a
time, on ``<out fd>``: ``open`` (``ckptstore.open(url, create=False, **kwargs)``; a tiered
store's local tier over its remote, ``opening.open_tier``), ``map`` (the shared file the next
snapshots are in), ``commit`` (the leaves rebuilt over that file, committed with
``commit_async(..., staged=True)`` at the store's background priority; the answer is the
commit's :class:`~ckptstore.info.CommitInfo`), ``part`` (a rank's part of a sharded commit
over that file, written on the persist thread; the answer is its part entries), ``forget``
and ``references`` (its chain memory).
It ends at an ``end`` frame or when its store closes the pipe; a commit in flight is finished
first. Nothing here is reached from the library's import graph: it is the one module that runs
only in that process.
"""

from __future__ import annotations

import mmap
import os
import signal
import sys
from collections.abc import Callable
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from contextlib import AbstractContextManager, ExitStack, nullcontext
from typing import Any

from .commit.child import serve
from .commit.shared import Layout, SentRows, leaves_in
from .commit.wire import from_plain
from .errors import PersistProcessError
from .opening import open as open_store
from .opening import open_tier
from .state.tree import Flattened, Leaf
from .tiers.landing import landing
from .store import Store


class _Worker:
    def __init__(self) -> None:
        self.store: Store | None = None
        self.memory: mmap.mmap | None = None
        # SIGUSR1: the store waits for the commit in flight (or the next, where the signal came
        # before its frame): that commit runs at normal priority (priority inheritance)
        self.boost_asked = False
        self.boosted = 0  # commits run raised so far ('stats')
        # a tiered store's local tier: the lock held while a commit lands (tiers.landing)
        self.landing: Callable[[], AbstractContextManager[None]] = nullcontext
        signal.signal(signal.SIGUSR1, self._ask_boost)

    def _ask_boost(self, signum: int, frame: object) -> None:
        self.boost_asked = True

    def handle(self, message: Any) -> Any:
        op = message.get("op") if isinstance(message, dict) else None
        if op == "open":
            kwargs = {k: from_plain(v) for k, v in message["kwargs"].items()}
            if message.get("local"):  # a tiered store: its uploads stay in the store's process
                self.store = open_tier(message["url"], message["local"], **kwargs)
                self.landing = lambda: landing(self.store.storage.local)
            else:
                self.store = open_store(message["url"], create=False, collective=False,
                                        **kwargs, background="thread")
            return os.getpid()
        if self.store is None:
            raise PersistProcessError(f"{op!r} before 'open'")
        if op == "map":
            fd = os.open(message["path"], os.O_RDWR)
            try:
                self.memory = mmap.mmap(fd, int(message["nbytes"]))
            finally:
                os.close(fd)
            return True
        if op in ("commit", "part"):  # the caller's storage switches, as they are now
            self.store.storage.tune(message.get("storage") or {})
            return self.commit(message) if op == "commit" else self.part(message)
        if op == "forget":
            self.store.committer.forget_chains(message.get("branch"))
            return True
        if op == "references":
            return list(self.store.reference_bytes)
        if op == "stats":
            return {"boosted": self.boosted,  # raised by a wait, and because starved
                    "starved": self.store.committer.background.starved_persists,
                    "storage": self.store.storage.tunables()}
        raise PersistProcessError(f"an unknown request {op!r}")

    def _leaves(self, message: dict[str, Any]) -> list[Leaf]:
        if self.memory is None:
            raise PersistProcessError(f"a {message['op']} before its snapshot's file was mapped")
        return leaves_in(Layout(message["slots"], message["groups"], len(self.memory)),
                         self.memory)

    def _raised_when_asked(self, done: Callable[[float], bool], raised: ExitStack) -> None:
        """Wait until ``done(timeout)``, at the background priority until the store waits."""
        up = False
        while True:
            if self.boost_asked and not up:
                raised.enter_context(self.store.committer.background.boosted())
                raised.callback(setattr, self, "boost_asked", False)
                self.boosted, up = self.boosted + 1, True
            if done(0.05):
                return

    def commit(self, message: dict[str, Any]) -> dict[str, Any]:
        leaves = self._leaves(message)
        rows = SentRows(leaves, message["rows"]) if message["rows"] else None
        with ExitStack() as raised:
            raised.enter_context(self.landing())  # until its ref moved (a tiered store)
            pending = self.store.commit_async(
                Flattened(message["tree"], leaves), message["message"], message["branch"],
                tuple(message["tags"]), message["metadata"], from_plain(message["policy"]),
                tracker=rows, staged=True)
            self._raised_when_asked(pending.join, raised)
        return pending.wait().to_json()

    def part(self, message: dict[str, Any]) -> list[dict[str, object]]:
        """A rank's part of a sharded commit (``dcp.shards.write_part``) on the persist thread;
        the answer is its part entries, for the coordinator's merge."""
        from .dcp.shards import LocalTensor, write_part

        tensors = [LocalTensor(str(fqn), tuple(offsets), tuple(shape), leaf.value)
                   for (fqn, offsets, shape), leaf in zip(message["blocks"],
                                                          self._leaves(message), strict=True)]
        committer = self.store.committer
        parent = message["parent"]
        written = committer.in_background(lambda pool: write_part(
            committer, str(message["commit"]), int(message["rank"]), tensors,
            from_plain(message["policy"]), str(message["branch"]),
            None if parent is None else str(parent), executor=pool))
        with ExitStack() as raised:
            self._raised_when_asked(lambda t: _done(written, t), raised)
        return [p.to_plain() for p in written.result()]


def _done(future: Future[Any], timeout: float) -> bool:
    try:
        future.exception(timeout)
    except FutureTimeout:
        return False
    return True


def main(argv: list[str]) -> int:
    worker = _Worker()
    try:
        return serve(int(argv[0]), int(argv[1]), worker.handle)
    finally:
        if worker.store is not None:
            worker.store.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
