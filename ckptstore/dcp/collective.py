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
from ..commit.pipeline import plain_metadata
from ..policy import Policy
from ..state.tree import Leaf, flatten
from ..tracking.rows import RowTracker

if TYPE_CHECKING:
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
    writer.in_process = committer.parts_in_process(state, policy, tracker, asynchronous=False)
    with _unwrapped():
        md = dcp.save(_dcp_state(leaves), storage_writer=writer, process_group=process_group)
    writer.adopt(md)  # a tiered store: this rank's local tier keeps the manifest and ref
    return writer.last_commit or CommitInfo.from_manifest(store.manifest(writer.commit_id))


def commit_async_collective(store: Store, state: object, message: str, branch: str,
                            tags: Sequence[str], metadata: dict[str, object] | None,
                            policy: Policy, tracker: RowTracker | None = None) -> PendingCommit:
    """``Store.commit_async`` on every rank: DCP's ``async_save`` stages the local shards, then
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
    _check_staging_budget(nbytes, committer.staging.budget, committer.async_group)
    sd = _dcp_state(leaves)
    staging: dict[str, Any] = {}
    writer.in_process = committer.parts_in_process(state, policy, None, asynchronous=True)
    if writer.in_process and _STAGER:  # else DCP stages, and the part copies its copies
        sd, staging = _staged(committer.stage, sd), {"async_stager": _AsStaged()}
    with _unwrapped():
        fut = dcp.async_save(sd, storage_writer=writer, process_group=committer.async_group,
                             **staging)
    pending = PendingCommit(time.perf_counter() - t0, nbytes)
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


#: whether this torch's ``async_save`` takes a stager (older ones stage with their own, and a
#: rank's part sent to the persist process is copied into its shared file on the save's thread)
_STAGER = "async_stager" in inspect.signature(dcp_async_save).parameters


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
        """Nothing to release: the shared file is the store's."""


def _local_nbytes(value: Any) -> int:
    """Bytes DCP's staging copies of a leaf on this rank (a DTensor: its local shard)."""
    if not isinstance(value, torch.Tensor):
        return int(getattr(value, "nbytes", 0))
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor):
        value = value.to_local()
    return value.numel() * value.element_size()


def _check_staging_budget(nbytes: int, budget: int | None, group: Any) -> None:
    """``staging_budget`` for a collective ``commit_async``: every rank learns whether any rank's
    staging copy would exceed its budget (one all-reduce, always run, so ranks opened with
    different budgets cannot disagree into a hang) and all raise
    :class:`StagingBudgetError` before anything is staged or written."""
    over = torch.tensor([nbytes if budget is not None and nbytes > budget else 0,
                         nbytes], dtype=torch.int64)
    dist.all_reduce(over, op=dist.ReduceOp.MAX, group=group)
    if over[0] > 0:
        mine = (f"this rank needs {nbytes} bytes against staging_budget={budget}"
                if budget is not None else "this rank has no budget")
        raise StagingBudgetError(
            f"commit_async would stage {int(over[0])} bytes on one rank, more than its "
            f"staging_budget ({mine}; the largest rank needs {int(over[1])}): raise the budget, "
            "shard the state over more ranks, or use commit(); nothing was staged or written "
            "on any rank")


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
