"""The committer a store opened with ``background="auto"`` (the default) uses, and the choice of
a store's committer.

A persist thread shares the interpreter lock with training: beside busy cores each time it takes
the lock back training waits (issue 28 measured 1.37x the bare copy's step time on a real
training state beside two busy processes, 1.16x with a persist process). ``"auto"`` runs
``commit_async`` in a persist process (:mod:`ckptstore.commit.process`) where one can take the
commit, and on a thread where it cannot:

- ``commit`` runs on the caller's thread until the first ``commit_async`` starts the persist
  process in the background (a fresh interpreter: about a second once) and persists on the
  thread meanwhile, so that no commit waits for the start; the first commit once it runs
  (and the thread's commit in flight ended) moves there, and every commit after it, so that
  one chain memory serves them all (:meth:`~AutoCommitter.reserve` starts it and moves at
  once, waiting for the start);
- a commit the process cannot take -- a policy object it cannot receive (a ``sensitivity``
  average, a custom rebase predictor), a tensor off the CPU (its device snapshot, pinned
  staging and device encoding stay on a thread), a rank's part of a sharded commit that a
  row tracker sees, or one a ``StorageWriter`` of the caller's own plans once the store runs in
  the process (before, such a part simply runs on the thread, where the store is) -- and every
  commit after it run on a thread, as with ``background="thread"``; so do all commits where no
  persist process could start (a warning says why);
- under a process group a rank's part of a collective commit goes the way a commit goes
  (:meth:`AutoCommitter.parts_in_process`).

Each change of way starts the chains anew (the next commit stores each tensor whole: the other
way's chain memory is dropped). Local and object stores get one (an object store's HTTP client
then runs in the persist process too). Stores the process cannot open are not given one:
tiered stores, ``memory://``, ``device_encode="always"``, a ``staging_budget`` (a process
needs a shared copy of every commit, ``commit`` and ``staged=True`` ones too), configurations
and storage options it cannot receive (a client session object), frozen applications and
platforms other than POSIX ones; tiered collective stores under a process group of several
ranks keep the thread too (each rank journals its parts).
"""

from __future__ import annotations

import os
import sys
import warnings
from collections.abc import Sequence
from concurrent.futures import Future
from contextlib import AbstractContextManager
from typing import Any

import torch

from ..errors import PersistProcessError
from ..info import CommitInfo
from ..policy import Policy
from ..tracking.rows import RowTracker
from .committer import Committer
from .pending import PendingCommit
from .pipeline import Metadata
from .plan import EncodingOptions
from .process import ProcessCommitter, WorkerSpec
from .wire import to_plain
from ..history.repository import Repository
from ..state.tree import flatten

__all__ = ["AutoCommitter", "PersistProcessWarning", "committer_for", "process_group",
           "sendable"]


class PersistProcessWarning(UserWarning):
    """``background="auto"`` persists on a thread: no persist process could start."""


def sendable(*configuration: object) -> bool:
    """Whether a persist process can receive every policy, option and keyword given."""
    try:
        for c in configuration:
            to_plain(c)
    except PersistProcessError:
        return False
    return True


class AutoCommitter(ProcessCommitter):
    """A :class:`ProcessCommitter` that commits on a thread (as :class:`Committer`) until the
    first ``commit_async`` and after a commit the persist process cannot take (the module's
    docstring). :attr:`way` says which: ``"thread"`` or ``"process"``."""

    def __init__(self, repo: Repository, options: EncodingOptions, policy: Policy,
                 spec: WorkerSpec, staging_budget: int | None = None,
                 background_priority: str = "low"):
        super().__init__(repo, options, policy, spec, staging_budget, background_priority)
        self.way = "thread"
        self.thread_for_good = False  # a commit the process could not take came
        self._starting: Future[Any] | None = None  # the persist process's start, once begun

    # -- the changes of way ------------------------------------------------------------------
    def _to_process(self, block: bool = True) -> bool:
        """Move to the persist process, started in the background at the first call; without
        ``block``, only once it runs and the thread's commit in flight ended (False before).
        False, with a warning, where it could not start."""
        if self.way == "process":
            return True
        if self.thread_for_good:
            return False
        if self.spec.collective and self.spec.local is not None and process_group():
            self.thread_for_good = True  # a tiered rank journals its parts: a thread
            return False
        if self._starting is None:
            self._starting = self._exchange.submit(self._started)
        if not block and not (self._starting.done() and self.thread_idle()):
            return False
        Committer.wait(self)
        try:
            self._starting.result()
        except Exception as e:  # noqa: BLE001 - whatever kept it from starting or opening
            warnings.warn(f"background='auto': no persist process could start ({e!r}); commits "
                          "persist on a thread", PersistProcessWarning, stacklevel=4)
            self.thread_for_good = True
            return False
        Committer.forget_chains(self)  # the process's chain memory serves from now on
        self.staging.clear()  # the thread's staging buffers: the shared file holds commits now
        self.way = "process"
        return True

    def close(self) -> None:
        """As :class:`ProcessCommitter`; a persist process still starting in the background is
        killed, not waited for (nothing was sent to it: an endpoint that does not answer its
        open would hold ``close`` for the client's timeouts)."""
        starting, booting = self._starting, self.booting
        if starting is not None and not starting.done() and booting is not None:
            booting.kill()
        super().close()

    def thread_idle(self) -> bool:
        """Whether no commit is in flight (the thread's, before a move to the process)."""
        return self.inflight is None or self.inflight.done()

    def _to_thread(self, wait: bool = True) -> None:
        """Commit on a thread from now on; the persist process ends (its chains with it) once
        the commit in flight did (``wait``; a rank's fork: the collective path waited, and the
        commit in flight is the one it forks for)."""
        self.thread_for_good = True
        if self.way == "thread":
            if self._starting is not None:  # started in the background: ended once it runs
                self._stop_worker(wait=False)
                self._starting = None
            return
        if wait:
            self.wait()
        self.way = "thread"
        self._copied, self._lost_rows = {}, None
        self._stop_worker()

    def _way_for(self, state: object, policy: Policy) -> str:
        """The way a commit of ``state`` and ``policy`` runs: a thread for good from the first
        that the process cannot take (a policy it cannot receive, a tensor off the CPU)."""
        if not (sendable(policy) and _on_cpu(state)):
            self._to_thread()
        return self.way

    # -- the entry points --------------------------------------------------------------------
    def commit(self, state: object, message: str, branch: str, tags: Sequence[str],
               metadata: Metadata | None, policy: Policy, tracker: RowTracker | None
               ) -> CommitInfo:
        if self._way_for(state, policy) == "process" or (
                self._starting is not None and self._to_process(block=False)):
            return super().commit(state, message, branch, tags, metadata, policy, tracker)
        return Committer.commit(self, state, message, branch, tags, metadata, policy, tracker)

    def commit_async(self, state: object, message: str, branch: str, tags: Sequence[str],
                     metadata: Metadata | None, policy: Policy, tracker: RowTracker | None,
                     staged: bool) -> PendingCommit:
        # the first starts the process in the background and persists on the thread meanwhile
        if self._way_for(state, policy) == "process" or self._to_process(block=False):
            return super().commit_async(state, message, branch, tags, metadata, policy,
                                        tracker, staged)
        return Committer.commit_async(self, state, message, branch, tags, metadata, policy,
                                      tracker, staged)

    def reserve(self, state: object) -> Future[int]:
        """Start the persist process and map the shared file ``commit_async(state)`` copies
        into, in the background; on a thread, :meth:`Committer.reserve`."""
        if self._way_for(state, self.default_policy) == "process" or self._to_process():
            return super().reserve(state)
        return Committer.reserve(self, state)

    def parts_in_process(self, state: object, policy: Policy, tracker: RowTracker | None,
                         asynchronous: bool) -> bool:
        """Whether a rank's part goes to the persist process, as ``commit_async`` and
        ``commit`` choose their way; a tracker's part runs on a thread, for good."""
        if tracker is not None:
            self._to_thread()
            return False
        if self._way_for(state, policy) == "process":
            return True
        if asynchronous or self._starting is not None:
            return self._to_process(block=False)
        return False

    def raised(self) -> AbstractContextManager[None]:
        if self.way == "process":
            return super().raised()
        return Committer.raised(self)

    def fork(self, *args: object, **kwargs: object) -> Any:
        """A rank's part of a sharded commit planned on this thread (a ``StorageWriter`` the
        collective paths did not make, ``commit_shards``): on a thread, for good, where the
        persist process held the chains."""
        if self.way == "process":
            self._to_thread(wait=False)
        return Committer.fork(self, *args, **kwargs)

    def forget_chains(self, branch: str | None = None) -> None:
        if self.way == "process":
            super().forget_chains(branch)
        else:
            Committer.forget_chains(self, branch)

    def reference_bytes(self) -> tuple[int, int]:
        if self.way == "process":
            return super().reference_bytes()
        return Committer.reference_bytes(self)

    @property
    def staging_nbytes(self) -> int:
        if self.way == "process":
            return super().staging_nbytes
        return self.staging.nbytes


def process_group() -> bool:
    """Whether a torch.distributed process group of more than one rank is initialised (a
    collective store's commits are then collectives: ``Store.commit``)."""
    import torch.distributed as dist
    return dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1


def _on_cpu(state: object) -> bool:
    """Whether every tensor of ``state`` is on the CPU (a device's tensors keep their device
    snapshot, pinned staging and device encoding on a thread)."""
    _, leaves = flatten(state)
    return all(not isinstance(leaf.value, torch.Tensor) or leaf.value.device.type == "cpu"
               for leaf in leaves)


def helpers_start() -> bool:
    """Whether helper processes can start here: POSIX, and not a frozen application (whose
    ``sys.executable`` is the application itself)."""
    return os.name == "posix" and not getattr(sys, "frozen", False)


def committer_for(repo: Repository, options: EncodingOptions, policy: Policy,
                  staging_budget: int | None, priority: str, worker: WorkerSpec | None
                  ) -> Committer:
    """A store's committer: persists on a thread, in a persist process where ``worker`` says
    how it opens the store (``open(..., background="process")``), or either way
    (``worker.auto``: where a persist process can receive the store's configuration)."""
    if worker is None:
        return Committer(repo, options, staging_budget, priority)
    if not worker.auto:
        return ProcessCommitter(repo, options, policy, worker, staging_budget, priority)
    if (helpers_start()
            and staging_budget is None  # a shared copy of every commit, commit() too
            and options.device_encode != "always"
            and sendable(policy, options, *worker.kwargs.values())):
        return AutoCommitter(repo, options, policy, worker, staging_budget, priority)
    return Committer(repo, options, staging_budget, priority)
