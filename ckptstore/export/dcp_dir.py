"""A commit as a ``torch.distributed.checkpoint`` (DCP) directory, as ``FileSystemWriter``
writes it, so ``torch.distributed.checkpoint.load`` (any number of ranks) reads it.

The commit is checked out (optionally only ``paths``) and saved by DCP itself in this process.
Tensors become DCP tensor items; plain values become DCP byte items (``torch.save`` of the value,
loadable with ``weights_only=True``). DCP's own ``.metadata`` file is a pickle of its metadata
dataclasses: that is DCP's format, written by DCP, not by ckptstore.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .result import ExportError, ExportResult, target_path

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["to_dcp"]


def _size(directory: str) -> int:
    return sum(os.path.getsize(os.path.join(root, f))
               for root, _, files in os.walk(directory) for f in files)


def to_dcp(store: Store, ref: str, directory: str | os.PathLike[str],
           paths: Sequence[str] | None = None, overwrite: bool = False) -> ExportResult:
    """Write the state of a commit as a DCP checkpoint directory.

    Raises
    ------
    ExportError
        ``directory`` exists and is not empty (without ``overwrite``), the selection is empty,
        or DCP failed to write it.
    """
    import torch
    from torch.distributed.checkpoint import FileSystemWriter
    from torch.distributed.checkpoint import save as dcp_save
    from torch.distributed.checkpoint.api import CheckpointException

    from ..state.tree import flatten
    directory = target_path(directory)
    if os.path.isdir(directory) and os.listdir(directory) and not overwrite:
        raise ExportError(f"{directory} exists and is not empty; pass overwrite=True "
                          "(ckpt export --force) or choose an empty folder")
    commit_id = store.resolve(ref)
    state = store.checkout(commit_id, paths=paths)
    if not isinstance(state, dict) or not state:
        raise ExportError(f"commit {commit_id[:10]}: nothing to export (a DCP checkpoint is a "
                          "non-empty mapping; check --paths)")
    _, leaves = flatten(state)
    os.makedirs(directory, exist_ok=True)
    with warnings.catch_warnings():  # "assuming the intent is to save in a single process"
        warnings.filterwarnings("ignore", ".*single process", UserWarning)
        try:
            dcp_save(state, storage_writer=FileSystemWriter(directory, overwrite=True),
                     no_dist=True)
        except CheckpointException as e:  # a BaseException: nothing above would catch it
            first = next(iter(e.failures.values()), None)
            first = first[0] if isinstance(first, tuple) else first
            raise ExportError(f"DCP could not write {directory}: {type(first).__name__}: "
                              f"{first}; check the folder (free space, permissions)") from None
    tensors = sum(isinstance(leaf.value, torch.Tensor) for leaf in leaves)
    return ExportResult(file=directory, commit=commit_id, tensors=tensors,
                        nbytes=_size(directory), metadata_keys=(), skipped=())
