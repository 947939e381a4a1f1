"""What checkout requires of a manifest beyond its schema, checked in one place for checkout and
verify (git's fsck habit: "verify ok" means "checkout will succeed").

The pydantic models (:mod:`ckptstore.history.manifest`) check each manifest on its own; rebuilding a
tensor also needs what they cannot see alone -- the chain's base commits, the packed array of
another commit, the storage a view looks into -- and what the reader will allocate. The reader
calls :func:`check_entries` before it allocates or reads anything;
:mod:`ckptstore.maintenance.verify` calls :func:`commit_problems` for each commit it checks. Both walk chains through the same
:class:`~ckptstore.chains.walk.Walk`, so a cycle, a missing base or a grid beyond
:mod:`ckptstore.limits` is refused the same way. Only what the chunks hold (their checksums,
the row indices of an increment) is left to the reads.
"""

from __future__ import annotations

import math
from collections.abc import Iterable


from ..chains.kinds import chain_kind
from ..chains.walk import Walk, entry_array, entry_dtype
from ..errors import CkptStoreError, ManifestError
from ..format.grid import allocatable
from ..state.leaves import tree_paths
from ..history.manifest import Layout, Manifest, TensorEntry
from ..state.tree import unflatten

__all__ = ["check_entries", "check_entry", "check_tree", "commit_problems"]

def check_tree(m: Manifest) -> None:
    """The state tree rebuilds and every tensor it names is an entry of ``m``."""
    wanted = [n["tensor"] for n in tree_paths(m.tree).values() if "tensor" in n]
    if any(not isinstance(i, int) or not 0 <= i < len(m.tensors) for i in wanted):
        raise ManifestError(f"commit {m.id} refers to tensors it does not have")
    unflatten(m.tree, [None] * len(m.tensors))


def check_entry(walk: Walk, m: Manifest, e: TensorEntry) -> None:
    """Raise :class:`ManifestError` (or :class:`CkptStoreError`) where rebuilding entry ``e``
    of ``m`` would fail before reading a chunk: dtype, shape, layout, chain and grids."""
    dt = entry_dtype(e)
    if not allocatable(e.shape, dt.itemsize):
        raise ManifestError(f"tensor {e.path!r}: shape {e.shape} of {e.dtype} is beyond what "
                            "an array can hold; the manifest is damaged or hostile")
    if e.container == "numpy-scalar" and math.prod(e.shape) != 1:
        raise ManifestError(f"tensor {e.path!r}: a scalar of shape {e.shape}")
    if e.layout == Layout.ARRAY:
        entry_array(e)
    elif e.layout == Layout.PACKED:
        if math.prod(e.shape) * dt.itemsize != e.nbytes:
            raise ManifestError(f"tensor {e.path!r}: {e.nbytes} packed bytes for shape {e.shape}")
        if e.nbytes:
            info = walk.manifest_of(e.commit).pack_info(e)
            if info is None or e.offset + e.nbytes > info.nbytes:
                raise ManifestError(f"tensor {e.path!r} lies outside the packed array")
            walk.own_arrays(e)  # the packed array's grid (memoised per array)
    elif e.layout == Layout.CHAIN:
        _check_chain(walk, m, e)
    elif e.layout == Layout.SHARDED:
        owner = walk.manifest_of(e.commit)
        for p in e.pieces:
            if p.entry >= len(owner.shards):
                raise ManifestError(f"tensor {e.path!r} names a missing shard {p.entry}")
            check_entry(walk, owner, owner.shards[p.entry])
    elif e.layout == Layout.VIEW:
        _check_view(e, m.storages[e.base])
    elif e.layout == Layout.ALIAS:
        base = m.tensors[e.base]
        if (base.shape, base.dtype) != (e.shape, e.dtype):
            raise ManifestError(f"tensor {e.path!r} aliases {base.path!r} of another shape "
                                "or dtype")


def _check_view(e: TensorEntry, base: TensorEntry) -> None:
    if base.dtype != e.dtype or base.container != "torch":
        raise ManifestError(f"tensor {e.path!r} views a storage of another dtype")
    reach = e.storage_offset + sum((s - 1) * st for s, st in zip(e.shape, e.stride) if s > 0)
    if len(e.stride) != len(e.shape) or min(e.stride, default=0) < 0 or (
            math.prod(e.shape) and reach >= math.prod(base.shape)):
        raise ManifestError(f"view {e.path!r} reaches outside its storage")


def _check_chain(walk: Walk, m: Manifest, e: TensorEntry) -> None:
    """The chain reaches a full baseline of the same shape and dtype, its links are of the
    entry's kind, and their parts fit the tensor (each kind's check)."""
    chain = walk.chain_of(e)
    walk.entry_arrays(e)  # every grid of the chain within the read limits
    base, links = chain[0], chain[1:]
    check_entry(walk, m, base)
    kind = chain_kind(e.kind)
    if any(link.kind not in kind.kinds for link in links):
        raise ManifestError(f"chain of {e.path!r} mixes kinds")
    for link in links:
        kind.check(e, base, link)


def check_entries(walk: Walk, m: Manifest, tensors: Iterable[int],
                  storages: Iterable[int] = ()) -> None:
    """:func:`check_entry` for the tensors and shared storages a checkout of ``m`` reads."""
    for i in storages:
        check_entry(walk, m, m.storages[i])
    for i in tensors:
        check_entry(walk, m, m.tensors[i])


def commit_problems(walk: Walk, m: Manifest) -> list[str]:
    """Each reason a checkout of all of ``m`` would fail before reading a chunk, one per entry
    (``verify``: a broken entry does not hide the others)."""
    problems = []
    try:
        check_tree(m)
    except CkptStoreError as err:
        problems.append(f"commit {m.id}: {err}")
    for e in (*m.storages, *m.tensors):
        try:
            check_entry(walk, m, e)
        except CkptStoreError as err:
            problems.append(f"commit {m.id}, {e.path!r}: {err}")
    return problems
