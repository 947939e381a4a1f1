"""A commit's tensors read a batch at a time: about :data:`~ckptstore.state.leaves.BATCH_BYTES` of
tensor bytes per round trip, so a large state is never in memory at once (diff, export,
``Store.iter_tensors``). Importing the reader (and torch) waits for the first read."""

from __future__ import annotations

from collections.abc import Iterator, Sequence

from ..state.leaves import BATCH_BYTES, Leaves, TensorLike, check_patterns, entry_nbytes, \
    nothing_selected
from ..history.manifest import Manifest
from ..history.repository import Repository

__all__ = ["iter_tensors", "read_tensors"]


def read_tensors(repo: Repository, m: Manifest, indices: Sequence[int],
                 batch_bytes: int = BATCH_BYTES) -> Iterator[TensorLike]:
    """The tensors at ``indices`` of commit ``m``, in that order, read about ``batch_bytes`` at a
    time (a batch holds at least one tensor)."""
    from .reader import Reader  # imports torch

    reader = Reader(repo)
    batch: list[int] = []
    size = 0
    for n, i in enumerate(indices):
        batch.append(i)
        size += entry_nbytes(m.tensors[i])
        if size < batch_bytes and n < len(indices) - 1:
            continue
        got = reader.read_tensors(m, batch)
        yield from (got[j] for j in batch)
        batch, size = [], 0


def iter_tensors(repo: Repository, ref: str, paths: Sequence[str] | None = None,
                 batch_bytes: int = BATCH_BYTES) -> Iterator[tuple[str, TensorLike]]:
    """``(dotted path, tensor)`` of a commit's tensors, read a batch at a time.

    Parameters
    ----------
    repo
        The store's history (``store.repo``).
    ref
        Branch, tag, commit id or unique prefix, with ``~N`` / ``^``.
    paths
        Globs as in ``checkout(paths=...)``: only the entries they select.
    batch_bytes
        About how many tensor bytes are read at once; the tensors of one batch are released as
        the caller moves on.

    Yields
    ------
    tuple of (str, tensor)
        In the order of the state; tied tensors come back once per path. Numpy leaves come back
        as numpy arrays or scalars, as from ``checkout``.
    """
    m = repo.manifest(repo.resolve(ref))
    chosen = Leaves.of(m).select(paths)
    if paths and not chosen.tensors and not chosen.values:
        raise nothing_selected(check_patterns(paths), m)
    tensors = chosen.tensors
    yield from zip(tensors, read_tensors(repo, m, list(tensors.values()), batch_bytes))
