"""``Store.checkout``: a commit's state rebuilt, or loaded into live objects in place.

The order of calls:

1. ``Repository.resolve(ref)`` and ``Repository.manifest(id)``.
2. ``paths=`` checked (:func:`~ckptstore.state.leaves.check_patterns`) and the tree pruned
   (:func:`~ckptstore.state.tree.select`, ``"!glob"`` leaves entries out); a selection of nothing
   raises :class:`StateMismatchError`.
3. Without ``into=``: :meth:`Reader.read_tensors` then :func:`~ckptstore.state.tree.unflatten`.
4. With ``into=``: ``settle()`` -- the store's part: its commit in flight lands and its chain
   memory is forgotten (live tensors change behind any tracker);
   :func:`~ckptstore.state.tree.live_targets` finds the live tensors at the places of the
   commit's tensors -- as ``dcp.load`` does, through the ``state_dict()`` of objects that have
   one -- and the reader decodes straight into them (DTensors by shard through ``load_shards``,
   which the store gives: :func:`ckptstore.dcp.collective.load_shards`); only the commit's
   tensors that ``into`` has no place for are read into new memory; then
   :func:`~ckptstore.state.tree.load_into` hands objects their part and replaces plain values.
5. ``for_resume=True``: ``Repository.record_restore(id)``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch

from ..errors import DistributedError, ManifestError, StateMismatchError
from ..state.leaves import check_patterns, nothing_selected, tree_paths
from ..history.manifest import Manifest
from ..history.repository import Repository
from .reader import Reader
from ..state.tree import Tree, live_targets, load_into, select, unflatten

__all__ = ["ShardLoader", "checkout"]

ShardLoader = Callable[[Manifest, dict[str, torch.Tensor]], None]
"""Loads commit ``m``'s tensors into DTensors in place, by shard (``{dotted path: DTensor}``)."""


def checkout(repo: Repository, ref: str, into: Any = None,
             paths: str | Sequence[str] | None = None, map_location: Any = None,
             for_resume: bool = False, *, settle: Callable[[], None],
             load_shards: ShardLoader) -> Any:
    """:meth:`ckptstore.Store.checkout` (see there) on ``repo``: ``settle`` is called before
    a load into ``into`` (step 4), ``load_shards`` loads the DTensors of ``into``."""
    m = repo.manifest(repo.resolve(ref))
    patterns = check_patterns(paths) if paths is not None else []
    tree = select(m.tree, patterns) if patterns else m.tree
    if patterns and not _holds_anything(tree):
        raise nothing_selected(patterns, m)
    wanted = [n["tensor"] for n in tree_paths(tree).values() if "tensor" in n]
    if any(not isinstance(i, int) or not 0 <= i < len(m.tensors) for i in wanted):
        raise ManifestError(f"commit {m.id} refers to tensors it does not have")
    if into is None:
        got = Reader(repo).read_tensors(m, wanted, map_location)
        state = unflatten(tree, [got.get(i) for i in range(len(m.tensors))])
    else:
        settle()
        state = _load_in_place(repo, m, tree, wanted, into, bool(patterns), map_location,
                               load_shards)
    if for_resume:
        repo.record_restore(m.id)
    return state


def _holds_anything(tree: Tree) -> bool:
    """False for a pruned tree whose root container kept nothing (a sequence keeps its
    positions, unselected items as None)."""
    for kind in ("dict", "odict"):
        if kind in tree:
            return bool(tree[kind])
    for kind in ("list", "tuple"):
        if kind in tree:
            return any(item != {"value": None} for item in tree[kind])
    return True


def _load_in_place(repo: Repository, m: Manifest, tree: Tree, wanted: list[int], into: Any,
                   partial: bool, map_location: Any, load_shards: ShardLoader) -> Any:
    """Decode the commit's tensors straight into the live ones of ``into``, read the rest,
    and load the state (step 4 of the module docstring)."""
    from torch.distributed.tensor import DTensor

    dests: dict[int, torch.Tensor] = {}
    shards: dict[str, torch.Tensor] = {}
    wanted_set = set(wanted)
    for i, target in live_targets(tree, into).items():
        if i not in wanted_set:
            continue
        e = m.tensors[i]
        if tuple(target.tensor.shape) != tuple(e.shape):
            if target.owned:  # its load_state_dict() decides what another shape means
                continue
            raise StateMismatchError(
                f"into's {target.path!r} has shape {list(target.tensor.shape)}, the commit's "
                f"tensor {list(e.shape)}: give a tensor of the committed shape")
        dests[i] = target.tensor
        if isinstance(target.tensor, DTensor):
            shards[target.path] = target.tensor
    fresh = [i for i in wanted if i not in dests]
    if shards:
        if fresh and not partial:
            path = next(p for p, n in tree_paths(tree).items() if n.get("tensor") == fresh[0])
            raise DistributedError(
                f"the live state lacks {len(fresh)} tensors of commit {m.id[:10]} (e.g. "
                f"{path!r}): load with paths= to restore part of it")
        load_shards(m, shards)
    reader = Reader(repo)
    reader.read_into(m, {i: t for i, t in dests.items() if not isinstance(t, DTensor)})
    got = reader.read_tensors(m, fresh, map_location) if fresh else {}
    state = unflatten(tree, [dests[i] if i in dests else got.get(i)
                             for i in range(len(m.tensors))])
    load_into(state, into, partial)
    return state
