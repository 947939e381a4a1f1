"""A committer whose persists run in a process of their own (``open(..., background="process")``).

A background thread's persist shares the interpreter lock with training: each time one of its
calls returns, it waits for the lock, and training waits for it in turn (issue 28 measured the
cost beside busy cores). Here the store's side flattens the state, copies its tensors into a
shared memory file (:mod:`ckptstore.commit.shared`: the stall, as the thread's snapshot) and
sends the tree and the leaf table (:mod:`ckptstore.commit.wire`) to a persist process, which runs
the store's one pipeline on them (``ckptstore.persist_worker``: ``commit_async(..., staged=True)``
on a store of the same URL, options and policy) and answers with the commit. One persist is in
flight at a time, as with the thread; chain memory (incremental, delta and shrink references)
lives in the persist process.

A row tracker stays in the store's process: each commit sends the touched rows of the tables it
tracks, and copies only those rows of a table whose region already holds the rest (a new file or
a load in place copies it whole). Refused (:class:`PersistProcessError`, ``TypeError``): a
policy or option object outside :data:`~ckptstore.commit.wire.CONFIG_TYPES` (a ``sensitivity``
average, a custom rebase predictor). A tiered store's persist process commits to its local tier;
its journal stays here (``ckptstore.opening.open_tier``).

Under a process group a rank's part of a collective commit goes there too
(:meth:`ProcessCommitter.part`: the DCP save's collectives, planning and merge stay on the
store's side; the rank's encoding and writes run in the persist process, with its chain memory);
a collective ``commit_async`` copies the rank's tensors into the shared file as its snapshot
(:meth:`ProcessCommitter.stage`).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..errors import PersistProcessError, StagingBudgetError
from ..history.repository import Repository
from ..info import CommitInfo
from ..policy import Policy
from ..state.tree import Leaf, flatten
from ..tracking.rows import RowTracker
from .child import Child, exchange_thread
from .committer import Committer
from .pending import PendingCommit
from .pipeline import Metadata
from .plan import EncodingOptions
from .records import PartEntry
from .shared import (Layout, SharedFile, copy_in, identity, layout, leaves_in, local_shard,
                     located, partial_rows)
from .wire import to_plain

__all__ = ["ProcessCommitter", "RankTensor", "WorkerSpec"]

#: the module the persist process runs
WORKER_MODULE = "ckptstore.persist_worker"


@dataclass(frozen=True)
class WorkerSpec:
    """How the persist process opens the store: ``open(url, create=False, **kwargs)`` (or
    ``open_tier(url, local, **kwargs)``) with these keywords (plain values and configuration
    objects); ``auto``: the store's ``background="auto"`` (:mod:`.auto`), not ``"process"``."""

    url: str
    kwargs: dict[str, Any] = field(default_factory=dict)
    auto: bool = False
    collective: bool = False  # open's collective=: under a process group, auto keeps a thread
    local: str | None = None  # a tiered store's local tier (absolute): ``opening.open_tier``


class RankTensor(Protocol):
    """A tensor a rank writes (``dcp.shards.LocalTensor``): all of ``fqn``, or its block."""

    fqn: str
    offsets: tuple[int, ...]
    global_shape: tuple[int, ...]
    tensor: torch.Tensor


class _Worker(Child):
    """The persist process and its two pipes; every exchange runs on the caller's thread (the
    committer's one exchange thread)."""

    failure = PersistProcessError
    next_time = "the next commit starts a new one"

    def __init__(self, spec: WorkerSpec, options: EncodingOptions, policy: Policy,
                 priority: str, owner: ProcessCommitter | None = None):
        opening = {"url": spec.url, "local": spec.local, "kwargs": to_plain_kwargs(
            {**spec.kwargs, "options": options, "policy": policy,
             "background_priority": priority})}
        super().__init__(WORKER_MODULE, "persist process")
        self.mapped: SharedFile | None = None
        try:
            if owner is not None:
                owner.booting = self.proc  # killed by a close that will not wait for the open
            self.call({"op": "open", **opening})
        except BaseException:
            self.close()
            raise


def to_plain_kwargs(kwargs: dict[str, Any]) -> dict[str, Any]:
    return {k: to_plain(v, f"{k}=") for k, v in kwargs.items()}


class ProcessCommitter(Committer):
    """:class:`Committer` whose ``commit`` and ``commit_async`` hand the snapshot to a persist
    process (started at the first commit or :meth:`reserve`, restarted after it ended)."""

    def __init__(self, repo: Repository, options: EncodingOptions, policy: Policy,
                 spec: WorkerSpec, staging_budget: int | None = None,
                 background_priority: str = "low"):
        super().__init__(repo, options, staging_budget, background_priority)
        to_plain(policy, "policy")  # refused now, not at the first commit
        to_plain(options, "options")
        to_plain_kwargs(spec.kwargs)
        self.spec, self.default_policy = spec, policy
        self._worker: _Worker | None = None
        self.booting: subprocess.Popen | None = None  # the last process started
        self._layout: Layout | None = None
        self._exchange = ThreadPoolExecutor(1, "ckptstore-persist-process",
                                            initializer=exchange_thread)
        self._closed = False
        # the tensor each leaf's region of the shared file holds a copy of (identity): a tracked
        # table copied from the same tensor again copies its touched rows alone (cleared by a
        # new file or a load in place)
        self._copied: dict[int, tuple[object, ...]] = {}
        # a failed commit's tracked rows, marked in the tracker again by the next commit
        self._lost_rows: tuple[RowTracker, list[tuple[torch.Tensor, torch.Tensor]]] | None = None

    # -- the process -----------------------------------------------------------------------
    def _started(self) -> _Worker:
        """The persist process, started (again) where there is none (exchange thread only)."""
        if self._worker is not None and not self._worker.alive():
            self._worker.close()
            self._worker = None
        if self._worker is None:
            self._worker = _Worker(self.spec, self.options, self.default_policy,
                                   self.background_priority, self)
            self._layout = None  # a new process maps the next snapshot's file
        return self._worker

    def _exchange_now(self, message: dict[str, Any]) -> Any:
        return self._exchange.submit(lambda: self._started().call(message)).result()

    def _memory(self, shape: Layout, fresh: bool = False) -> SharedFile:
        """The shared file ``shape`` fits in: the last one (unless ``fresh``: values to copy in
        lie in it), or a new one the process maps."""
        worker = self._started()
        if worker.mapped is not None and self._layout is not None and self._layout.fits(shape) \
                and not fresh:
            return worker.mapped
        if self.staging.budget is not None and shape.nbytes > self.staging.budget:
            raise StagingBudgetError(
                f"commit_async needs {shape.nbytes} bytes of shared staging memory, more than "
                f"staging_budget={self.staging.budget}: raise the budget or commit the state in "
                "parts; nothing was copied or written")
        worker.mapped = None  # the process drops the old mapping when it maps the new one
        self._copied = {}
        mapped = SharedFile(shape.nbytes)
        try:
            try:
                worker.call({"op": "map", "path": mapped.path, "nbytes": mapped.nbytes})
            except OSError:  # /proc/<pid>/fd refused (a hardened /proc): a named file then
                mapped.unlink()
                mapped = SharedFile(shape.nbytes, named=True)
                worker.call({"op": "map", "path": mapped.path, "nbytes": mapped.nbytes})
        finally:
            mapped.unlink()  # both sides hold it mapped: nothing is left behind
        worker.mapped, self._layout = mapped, shape
        return mapped

    @property
    def staging_nbytes(self) -> int:
        worker = self._worker
        return worker.mapped.nbytes if worker is not None and worker.mapped is not None else 0

    @contextmanager
    def _boosted(self) -> Iterator[None]:
        """Priority inheritance across the process boundary: while a caller waits, the persist
        process raises the commit in flight (or the next it starts) to normal priority
        (SIGUSR1; it drops back once that commit ends)."""
        worker = self._worker
        if worker is not None and worker.alive() and self.background_priority != "normal":
            try:
                os.kill(worker.proc.pid, signal.SIGUSR1)
            except ProcessLookupError:
                pass
        yield

    def raised(self) -> AbstractContextManager[None]:
        """The persist process's commit or part in flight (or the next it starts) raised."""
        return self._boosted()

    def wait(self) -> None:
        """Wait for the commit in flight (its persist raised meanwhile), then as ``Committer``."""
        pending = self.inflight
        if pending is not None and not pending.done():
            with self._boosted():
                pending.join()
        super().wait()

    # -- the entry points --------------------------------------------------------------------
    def reserve(self, state: object) -> Future[int]:
        """Start the persist process and make the shared file ``commit_async(state)`` copies
        into, in the background; resolves to its bytes (0 where the last one fits)."""
        self.wait()
        _, leaves = flatten(state)
        shape, _ = layout([Leaf(leaf.path, local_shard(leaf.value)) for leaf in leaves])

        def run() -> int:  # the bytes of a new file; 0 where the last one fits
            worker = self._worker
            last = worker.mapped if worker is not None and worker.alive() else None
            mapped = self._memory(shape)
            return 0 if mapped is last else mapped.nbytes

        self._reserving = self._exchange.submit(run)
        return self._reserving

    def commit(self, state: object, message: str, branch: str, tags: Sequence[str],
               metadata: Metadata | None, policy: Policy, tracker: RowTracker | None
               ) -> CommitInfo:
        """``commit_async`` and its wait: the persist process commits either way."""
        pending = self.commit_async(state, message, branch, tags, metadata, policy, tracker,
                                    False)
        return pending.wait()

    def commit_async(self, state: object, message: str, branch: str, tags: Sequence[str],
                     metadata: Metadata | None, policy: Policy, tracker: RowTracker | None,
                     staged: bool) -> PendingCommit:
        """Check names, flatten, copy the tensors into the shared file (the stall), then send
        the commit to the persist process; its answer finishes the returned handle."""
        t0 = time.perf_counter()
        self.wait()
        tags, metadata = self.check_names(state, message, branch, tags, metadata)
        plain_policy = to_plain(policy, "policy")
        tree, leaves = flatten(state)
        shape, copies = layout(leaves)
        if self._lost_rows is not None:  # a failed commit's rows: the tracker names them again
            lost, self._lost_rows = self._lost_rows, None
            for value, rows in lost[1]:
                lost[0].mark(value, rows)
        tracked = _tracked_rows(leaves, tracker)
        mapped = self._exchange.submit(self._memory, shape).result()
        worker = self._worker  # the process that mapped it: the commit goes there, or fails
        made = {i: identity(leaves[i], src) for i, _, src in copies if i is not None}
        # rows alone where an increment may be stored and the region holds this tensor's copy
        same = {i for i, key in made.items() if self._copied.get(i) == key} \
            if policy.incremental != "off" else set()
        copy_in(shape, copies, mapped.memory, partial_rows(copies, tracked, same))
        self._copied = made
        if tracker is not None:
            tracker.clear()  # its rows are in this commit (unsaved until the ref moves)
        sent = (tracker, [(leaves[i].value, r) for i, r in tracked.items()])
        del copies
        pending = PendingCommit(time.perf_counter() - t0, shape.nbytes, self._boosted)
        request = {"op": "commit", "tree": tree, "slots": shape.slots, "groups": shape.groups,
                   "message": message, "branch": branch, "tags": list(tags),
                   "metadata": metadata, "policy": plain_policy,
                   "storage": self.repo.storage.tunables(),
                   "rows": [[i, r.numpy().astype("<i8").tobytes()] for i, r in tracked.items()]}

        def run() -> None:
            try:
                answer = worker.call(request)
                info, error = _info(answer), None
                pending.progress.written = info.stored_bytes
            except BaseException as e:  # noqa: BLE001 - handed to the caller through wait()
                info, error = None, e
                if sent[0] is not None and sent[1]:
                    self._lost_rows = sent  # marked again on the caller's thread
            pending.finish(info, error)

        self.inflight = pending
        self._exchange.submit(run)
        return pending

    # -- a rank's part of a sharded commit ----------------------------------------------------
    def parts_in_process(self, state: object, policy: Policy, tracker: RowTracker | None,
                         asynchronous: bool) -> bool:
        """Every part goes to the persist process; one with a row tracker, or a tiered
        store's (each rank journals its parts here), is refused."""
        if tracker is not None or self.spec.local is not None:
            what = "with a tracker" if tracker is not None else "of a tiered store"
            raise TypeError(f"a sharded commit {what} cannot run in a persist process yet: "
                            "open the store with background='thread' (or 'auto')")
        to_plain(policy, "policy")
        return True

    def stage(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Copies of ``tensors`` in the shared file (a collective ``commit_async``'s snapshot,
        on the caller's thread: its stall), as tensors over it: :meth:`part` sends where they
        lie, without copying them again. After :meth:`wait`."""
        leaves = [Leaf(str(i), t) for i, t in enumerate(tensors)]
        shape, copies = layout(leaves)
        mapped = self._exchange.submit(self._memory, shape).result()
        copy_in(shape, copies, mapped.memory)
        self._copied = {}  # its regions hold these copies now
        return [leaf.value for leaf in leaves_in(shape, mapped.map)]

    def part(self, commit_id: str, rank: int, tensors: Sequence[RankTensor], policy: Policy,
             branch: str, parent_id: str | None) -> list[PartEntry]:
        """Rank ``rank``'s part of sharded commit ``commit_id`` (``dcp.shards.write_part``),
        written by the persist process with its chain memory: ``tensors`` where :meth:`stage`
        put them, else copied into the shared file first. The caller (DCP's save, on its
        thread) waits on the pipe, without the interpreter lock."""
        worker, values = self._worker, [t.tensor for t in tensors]
        found = located(values, worker.mapped) \
            if worker is not None and worker.mapped is not None else None
        if found is None:  # a file of their own where some lie in the current one
            inside = worker is not None and worker.mapped is not None and any(
                located([v], worker.mapped) is not None for v in values)
            shape, copies = layout([Leaf(str(i), v) for i, v in enumerate(values)])
            mapped = self._exchange.submit(self._memory, shape, inside).result()
            copy_in(shape, copies, mapped.memory)
            self._copied, found, worker = {}, shape, self._worker
        request = {"op": "part", "commit": commit_id, "rank": rank,
                   "blocks": [[t.fqn, list(t.offsets), list(t.global_shape)] for t in tensors],
                   "slots": found.slots, "groups": found.groups,
                   "policy": to_plain(policy, "policy"), "branch": branch, "parent": parent_id,
                   "storage": self.repo.storage.tunables()}
        answer = self._exchange.submit(worker.call, request).result()
        if not isinstance(answer, list):
            raise PersistProcessError(f"the persist process answered {answer!r:.200}")
        return [PartEntry.from_plain(p) for p in answer]

    def fork(self, *args: object, **kwargs: object) -> Any:
        """A rank's part planned here: not beside a persist process (its chain memory is
        there); the collective paths send parts (:meth:`part`)."""
        raise TypeError("a sharded commit outside the collective paths cannot run beside a "
                        "persist process: open the store with background='thread'")

    def forget_chains(self, branch: str | None = None) -> None:
        """Drop the persist process's chain memory (of ``branch``, or all); the next snapshot
        copies every tensor whole (a load in place changed them behind any tracker)."""
        self._copied = {}
        if self._worker is not None and self._worker.alive():
            self._exchange_now({"op": "forget", "branch": branch})

    def reference_bytes(self) -> tuple[int, int]:
        """The persist process's chain references, ``(host, device)`` bytes (after the commit
        in flight; none where no persist process runs)."""
        if self._worker is None or not self._worker.alive():
            return 0, 0
        host, device = self._exchange_now({"op": "references"})
        return int(host), int(device)

    def call_stats(self) -> dict[str, Any]:
        """The persist process's counters: ``boosted``, its commits raised by a wait, and
        ``starved``, its persists raised because their threads were starved; and ``storage``,
        its storage's switches as the last commit set them (:meth:`Storage.tunables`)."""
        worker = self._worker
        return dict(self._exchange_now({"op": "stats"})) if worker and worker.alive() else {}

    def close(self) -> None:
        """Wait for the commit in flight, end the persist process, stop (once)."""
        if self._closed:
            return
        try:
            super().close()
        finally:
            self._closed = True
            self._stop_worker()
            self._exchange.shutdown(wait=True)

    def _stop_worker(self, wait: bool = True) -> None:
        """End the persist process after the queued exchanges; ``wait``: until it ended."""
        def stop() -> None:
            if self._worker is not None:
                self._worker.close()
                self._worker = None
        ended = self._exchange.submit(stop)
        if wait:
            ended.result()


def _tracked_rows(leaves: list[Leaf], tracker: RowTracker | None) -> dict[int, torch.Tensor]:
    """Leaf index -> the touched rows (sorted int64, CPU) of the leaves ``tracker`` tracks."""
    if tracker is None:
        return {}
    out = {}
    for i, leaf in enumerate(leaves):
        v = leaf.value
        if isinstance(v, torch.Tensor) and v.dim() > 0 and tracker.lookup(v) is not None:
            out[i] = tracker.touched_rows(v).to(torch.int64).cpu()
    return out


def _info(answer: object) -> CommitInfo:
    """The persist process's commit (its ``CommitInfo.to_json()``) as a :class:`CommitInfo`."""
    try:
        return CommitInfo.from_json(answer)
    except (KeyError, TypeError, ValueError) as e:
        raise PersistProcessError(f"the persist process answered {answer!r:.200}") from e
