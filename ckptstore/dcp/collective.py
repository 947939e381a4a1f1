"""The Store verbs under a ``torch.distributed`` process group, on :mod:`ckptstore.dcp`.

``Store.commit`` / ``Store.commit_async`` with a process group of more than one rank are
collectives built on DCP's ``save`` / ``async_save`` with a :class:`~ckptstore.dcp.StorageWriter`;
``Store.checkout(ref, into=state)`` loads the DTensors of the live state (:mod:`ckptstore.checkout.flow`
finds them) with ``dcp.load(..., no_dist=True)``: each rank only the chunks that overlap its
shards, straight into them, no collective.
"""

from __future__ import annotations

import contextlib
import inspect
import time
import warnings
from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.checkpoint import async_save as dcp_async_save

from . import StorageReader, StorageWriter
from ..errors import CkptStoreError, DistributedError, StagingBudgetError
from ..info import CommitInfo
from ..history.manifest import Manifest
from ..commit.pending import PendingCommit
from ..commit.shared import local_shard
from ..commit.pipeline import plain_metadata
from ..policy import Policy
from ..state.tree import Leaf, flatten
from ..tracking.rows import RowTracker

if TYPE_CHECKING:
    from ..commit.committer import Committer
    from ..store import Store

__all__ = ["commit_async_collective", "commit_collective", "load_shards"]


def _our_error(e: BaseException) -> BaseException:
    """DCP reports failures as a ``CheckpointException`` (a BaseException, not an Exception):
    the first rank's ckptstore error itself, else a :class:`DistributedError` naming the failed
    ranks; any other exception as it is."""
    from torch.distributed.checkpoint.api import CheckpointException
    if not isinstance(e, CheckpointException):
        return e
    errors = {r: f[0] if isinstance(f, tuple) else f for r, f in e.failures.items()}
    ours = next((x for x in errors.values() if isinstance(x, CkptStoreError)), None)
    if ours is not None:
        return ours
    first = next(iter(errors.values()), None)
    return DistributedError(f"failed on rank(s) {sorted(errors)}: "
                            f"{type(first).__name__}: {first}")


@contextlib.contextmanager
def _unwrapped() -> Iterator[None]:
    """Raise DCP's failures as ckptstore errors (:func:`_our_error`)."""
    try:
        yield
    except BaseException as e:
        ours = _our_error(e)
        if ours is e:
            raise
        raise ours from e


def _dcp_state(leaves: list[Leaf]) -> dict[str, Any]:
    """``{path: tensor}`` for DCP (numpy leaves as tensors over the same memory)."""
    return {leaf.path: leaf.value if isinstance(leaf.value, torch.Tensor)
            else torch.from_numpy(np.asarray(leaf.value)) for leaf in leaves}


def commit_collective(store: Store, state: object, message: str, branch: str,
                      tags: Sequence[str], metadata: dict[str, object] | None,
                      policy: Policy, tracker: RowTracker | None = None,
                      process_group: Any = None) -> CommitInfo:
    """``Store.commit`` on every rank of a process group: one commit, DCP's planning."""
    try:
        return _commit_collective(store, state, message, branch, tags, metadata, policy,
                                  tracker, process_group)
    except BaseException:
        if store.tiers is not None:  # a tiered store: the parts this rank journalled
            store.tiers.failed_commit()
        raise


def _commit_collective(store: Store, state: object, message: str, branch: str,
                       tags: Sequence[str], metadata: dict[str, object] | None,
                       policy: Policy, tracker: RowTracker | None,
                       process_group: Any) -> CommitInfo:
    import torch.distributed.checkpoint as dcp

    committer = store.committer
    committer.wait()
    tree, leaves = flatten(state)
    writer = StorageWriter(store, message, branch, tags, policy, plain_metadata(metadata, state),
                           tracker, tree, [leaf.path for leaf in leaves])
    sd, _ = _snapshot(committer, writer, state, policy, tracker, _dcp_state(leaves), None,
                      process_group)
    # the caller waits for the parts: a persist process writes its part raised
    with committer.raised() if writer.in_process else contextlib.nullcontext(), _unwrapped():
        md = dcp.save(sd, storage_writer=writer, process_group=process_group)
    writer.adopt(md)  # a tiered store: this rank's local tier keeps the manifest and ref
    return writer.last_commit or CommitInfo.from_manifest(store.manifest(writer.commit_id))


def commit_async_collective(store: Store, state: object, message: str, branch: str,
                            tags: Sequence[str], metadata: dict[str, object] | None,
                            policy: Policy, tracker: RowTracker | None = None) -> PendingCommit:
    """``Store.commit_async`` on every rank: the local shards are copied (here, by
    :func:`_copies`, where all are CPU tensors; else by DCP's stager in ``async_save``), then
    a background thread commits them over a gloo group of the store's own, so the commit's
    collectives never interleave with training's. Where the store's persist process writes
    this rank's part (``committer.parts_in_process``), the snapshot is the shards' copies in its
    shared file (:func:`_staged`), and the thread only plans, waits and merges."""
    import torch.distributed.checkpoint as dcp

    if tracker is not None:
        raise DistributedError(
            "commit_async under a process group takes no tracker: DCP stages copies of the "
            "shards, so the tracker's rows cannot be matched to them nor cleared at the snapshot; "
            "use commit(..., tracker=...) or commit_async without one (rows are compared)")
    t0 = time.perf_counter()
    committer = store.committer
    committer.wait()
    if committer.async_group is None:
        committer.async_group = dist.new_group(backend="gloo")
    tree, leaves = flatten(state)
    writer = StorageWriter(store, message, branch, tags, policy, plain_metadata(metadata, state),
                           None, tree, [leaf.path for leaf in leaves])
    nbytes = sum(_local_nbytes(leaf.value) for leaf in leaves)
    sd, staged = _snapshot(committer, writer, state, policy, None, _dcp_state(leaves), nbytes,
                           committer.async_group)
    if not staged:
        sd = _past_dcp_stager(sd)
    with _unwrapped():  # staged: DCP's own stager would copy the copies
        fut = dcp.async_save(sd, storage_writer=writer, process_group=committer.async_group,
                             **({"async_stager": _AsStaged()} if staged else {}))
    # a wait raises the part in a persist process (priority inheritance, as for a commit)
    pending = PendingCommit(time.perf_counter() - t0, nbytes,
                            committer.raised if writer.in_process else contextlib.nullcontext)
    future = getattr(fut, "upload_completion", fut)

    def done(f: Any) -> None:
        try:
            writer.adopt(f.result())
            info = writer.last_commit or CommitInfo.from_manifest(
                store.manifest(writer.commit_id))
        except BaseException as e:  # noqa: BLE001 - handed to the caller through wait()
            pending.finish(None, _our_error(e))
        else:
            pending.finish(info, None)

    committer.inflight = pending
    future.add_done_callback(done)
    return pending


#: whether this torch's ``async_save`` takes a stager (2.8 and later; older ones stage with their
#: own, and a rank's part sent to the persist process is copied into its shared file on the
#: save's thread)
_STAGER = "async_stager" in inspect.signature(dcp_async_save).parameters


def _snapshot(committer: Committer, writer: StorageWriter, state: object, policy: Policy,
              tracker: RowTracker | None, sd: dict[str, Any], nbytes: int | None,
              group: Any) -> tuple[dict[str, Any], bool]:
    """Choose the way of this rank's part (``writer.in_process``) and, where the persist
    process writes it and the local shards are CPU tensors, copy them into its shared file:
    ``(the state DCP saves, whether it is those copies)``. ``nbytes``: a ``commit_async``'s
    staging bytes, checked against the budget. One all-reduce, always run, tells every rank
    whether any failed here, so that all raise before the save's first collective."""
    staged, failed = False, None
    budget = committer.staging.budget if nbytes is not None else None
    over = budget is not None and nbytes is not None and nbytes > budget  # refused below
    try:
        writer.in_process = committer.parts_in_process(state, policy, tracker,
                                                       asynchronous=nbytes is not None)
        if writer.in_process and _stageable(sd) and (_STAGER or nbytes is None) and not over:
            sd, staged = _staged(committer.stage, sd), True
        elif nbytes is not None and _STAGER and _copyable(sd) and not over:
            sd, staged = _staged(_copies, sd), True  # a thread's: here, where a failure is agreed
    except Exception as e:  # noqa: BLE001 - raised below, once every rank knows
        failed = e
    _agree(nbytes or 0, budget, group, failed)
    return sd, staged


def _stageable(sd: dict[str, Any]) -> bool:
    """Whether every value is a CPU tensor or a DTensor over one (a ShardedTensor, a device's
    tensors: DCP stages them, and a part copies what it hands over)."""
    from torch.distributed.tensor import DTensor

    return all((type(v) is torch.Tensor or isinstance(v, DTensor))
               and local_shard(v).device.type == "cpu" for v in sd.values())


def _staged(stage: Callable[[list[torch.Tensor]], list[torch.Tensor]],
            sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` with each tensor (a DTensor: its local shard) replaced by its copy ``stage``
    made (in the persist process's shared file), DTensors rewrapped over their copies."""
    from torch.distributed.tensor import DTensor

    with torch.no_grad():
        copies = stage([v.to_local() if isinstance(v, DTensor) else v for v in sd.values()])
        return {k: DTensor.from_local(c, v.device_mesh, v.placements, run_check=False,
                                      shape=v.shape, stride=v.stride())
                if isinstance(v, DTensor) else c for (k, v), c in zip(sd.items(), copies)}


def _past_dcp_stager(sd: dict[str, Any]) -> dict[str, Any]:
    """``sd`` as DCP's own stager can copy it. That stager takes a DTensor whose local shard
    starts past its storage's beginning (``DTensor.from_local`` over a view) for a tensor with
    storage of its own -- the wrapper's ``data_ptr()`` is the offset, not 0 -- and fails
    ("copy_() on an invalid python storage", torch 2.13). Such a DTensor goes to it rewrapped
    over a copy of its shard; a copy only of those, one per DTensor however many paths hold it."""
    from torch.distributed.tensor import DTensor

    copies: dict[int, DTensor] = {}

    def passable(v: Any) -> Any:
        if not isinstance(v, DTensor) or v.to_local().storage_offset() == 0:
            return v
        if id(v) not in copies:
            with torch.no_grad():
                copies[id(v)] = DTensor.from_local(
                    v.to_local().clone(), v.device_mesh, v.placements, run_check=False,
                    shape=v.shape, stride=v.stride())
        return copies[id(v)]

    return {k: passable(v) for k, v in sd.items()}


def _copyable(sd: dict[str, Any]) -> bool:
    """Whether every value is a strided CPU tensor, a Parameter or a DTensor over one: what
    :func:`_copies` stages on a thread (a ShardedTensor, a device's tensors: DCP's stager)."""
    return all(isinstance(v, torch.Tensor) and local_shard(v).layout == torch.strided
               and local_shard(v).device.type == "cpu" for v in sd.values())


def _byte_span(t: torch.Tensor) -> tuple[int, int]:
    """The bytes of its storage that ``t`` reads: ``[lo, hi)``, empty for an empty tensor."""
    if t.numel() == 0:
        return 0, 0
    last = t.storage_offset() + sum((n - 1) * k for n, k in zip(t.shape, t.stride()))
    return t.storage_offset() * t.element_size(), (last + 1) * t.element_size()


def _copies(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """A thread's staging copy of a ``commit_async``'s CPU tensors, made before the agreeing
    all-reduce so that a rank whose copy fails (memory) fails every rank at once: of each
    storage, the bytes its tensors read, once (tensors over one storage -- tied weights from
    ``state_dict()``, views -- stay views of one copy; an expanded tensor stays expanded), and
    each tensor rebuilt over it with its own offset, shape and strides. DCP's own stager copied
    after that all-reduce -- a rank failing there left the others waiting in the save's first
    collective -- and whole storages, and could not copy a DTensor over a view that starts past
    its storage's beginning (:func:`_past_dcp_stager`). A conjugate or negative view, or one
    whose offset is not a whole item of the copy, is cloned alone."""
    where = [(_byte_span(t), t.untyped_storage()) for t in tensors]
    spans: dict[int, list[Any]] = {}  # storage -> [lo, hi, storage] over its tensors
    for (lo, hi), storage in where:
        if hi > lo:
            span = spans.setdefault(storage.data_ptr(), [lo, hi, storage])
            span[0], span[1] = min(span[0], lo), max(span[1], hi)
    out = []
    with torch.no_grad():
        copied = {key: (lo, torch.empty(0, dtype=torch.uint8).set_(storage, lo, (hi - lo,)).clone())
                  for key, (lo, hi, storage) in spans.items()}
        for t, ((lo, hi), storage) in zip(tensors, where):
            base, copy = copied[storage.data_ptr()] if hi > lo else (0, None)
            start, size = lo - base, t.element_size()
            if copy is None or t.is_conj() or t.is_neg() or start % size:
                out.append(t.clone())
            else:
                out.append(torch.empty(0, dtype=t.dtype).set_(
                    copy.untyped_storage(), start // size, t.shape, t.stride()))
    return out


class _AsStaged:
    """DCP's stager for a state already copied (:func:`_staged`): hands it on as it is."""

    _synchronize_after_execute = False

    @property
    def should_synchronize_after_execute(self) -> bool:
        return False

    def stage(self, state_dict: dict[str, Any]) -> dict[str, Any]:
        return state_dict

    def synchronize_staging(self) -> None:
        """Nothing to wait for: the copies were made before ``async_save``."""

    def close(self) -> None:
        """Nothing to release: the copies are the store's (its shared file) or the commit's."""


def _local_nbytes(value: Any) -> int:
    """Bytes DCP's staging copies of a leaf on this rank (a DTensor: its local shard)."""
    if not isinstance(value, torch.Tensor):
        return int(getattr(value, "nbytes", 0))
    value = local_shard(value)
    return value.numel() * value.element_size()


def _agree(nbytes: int, budget: int | None, group: Any, failed: Exception | None) -> None:
    """Every rank learns whether any rank's staging copy would exceed its ``staging_budget``
    (a collective ``commit_async``), or its snapshot failed (``failed``): one all-reduce, always
    run, so ranks opened with different budgets, or one whose persist process could not take
    the copy, cannot disagree into a hang. All raise before anything is written: the rank that
    failed its own error, the others :class:`StagingBudgetError` or :class:`DistributedError`."""
    code = 0 if failed is None else 2 if isinstance(failed, StagingBudgetError) else 1
    over = torch.tensor([nbytes if budget is not None and nbytes > budget else 0,
                         nbytes, code], dtype=torch.int64)
    dist.all_reduce(over, op=dist.ReduceOp.MAX, group=group)
    if over[0] > 0:
        mine = (f"this rank needs {nbytes} bytes against staging_budget={budget}"
                if budget is not None else "this rank has no budget")
        raise StagingBudgetError(
            f"commit_async would stage {int(over[0])} bytes on one rank, more than its "
            f"staging_budget ({mine}; the largest rank needs {int(over[1])}): raise the budget, "
            "shard the state over more ranks, or use commit(); nothing was written on any "
            "rank") from failed
    if failed is not None:
        raise failed
    if over[2] == 2:
        raise StagingBudgetError(
            "another rank's snapshot does not fit its staging_budget (its error says how much "
            "it needs): raise the budget there, or use commit(); nothing was written on any rank")
    if over[2]:
        raise DistributedError("another rank could not take its snapshot of the commit (its "
                               "error says why); nothing was written on any rank")


def load_shards(store: Store, m: Manifest, shards: dict[str, Any]) -> None:
    """Load commit ``m``'s tensors into DTensors in place (``{dotted path: DTensor}``), reading
    on this rank only the chunks that overlap its shards, each decoded into the local shard
    (``dcp.load(..., no_dist=True)`` over :class:`~ckptstore.dcp.StorageReader`): no
    collective, so one restarted rank recovers alone."""
    import torch.distributed.checkpoint as dcp

    with warnings.catch_warnings():  # "assuming the intent is to load in a single process": yes
        warnings.filterwarnings("ignore", "torch.distributed is disabled", UserWarning)
        with _unwrapped():
            dcp.load(dict(shards), storage_reader=StorageReader(store, m.id), no_dist=True)
