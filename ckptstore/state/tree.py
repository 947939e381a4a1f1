"""Flatten nested training state into a plain tree plus a list of tensors, and back.

The tree is what the manifest stores; every node is a one-key map::

    {"dict": [[key, node], ...]}      {"odict": [[key, node], ...], "meta": node}
    {"list": [node, ...]}             {"tuple": [node, ...]}
    {"tensor": i}                     index into the commit's tensor table
    {"value": v}                      None, bool, int (64-bit), float, str, bytes
    {"bigint": "123..."}              ints beyond 64 bits
    {"bytesio": b"..."}               an ``io.BytesIO``: its bytes (as DCP stores it)

Keys are str, int, float, bool or None. Objects with ``state_dict()`` / ``load_state_dict()``
(modules, optimizers, schedulers, samplers) are stored as their state dicts. Anything else raises
:class:`~ckptstore.errors.UnsupportedLeafError` -- nothing is ever pickled.
"""

from __future__ import annotations

import io
from collections import OrderedDict
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from ..errors import ManifestError, StateMismatchError, UnsupportedLeafError
from .leaves import check_patterns, select_tree, tree_paths
from .leaves import join_path as _join

__all__ = ["Flattened", "Leaf", "Target", "Tree", "check_text", "flatten", "is_stateful", "live_targets",
           "load_into", "select", "tree_paths", "unflatten"]

Tree = dict[str, object]  # a node of the flattened tree (a one-key map, see the module docstring)

_SCALARS = (type(None), bool, int, float, str, bytes)
_KEYS = (str, int, float, bool, type(None))
_MAX_DEPTH = 200


@dataclass
class Leaf:
    """A tensor found while flattening: its dotted path and the object."""

    path: str
    value: torch.Tensor | np.ndarray | np.generic


@dataclass(frozen=True)
class Flattened:
    """A state already flattened (:func:`flatten`'s tree and leaves), committed as it is: what a
    persist process rebuilds from its store's snapshot."""

    tree: Tree
    leaves: list[Leaf]


def is_stateful(obj: Any) -> bool:
    """True for objects that save and load through ``state_dict()`` / ``load_state_dict()``."""
    return (not isinstance(obj, (torch.Tensor, Mapping))
            and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None)))


def flatten(state: Any) -> tuple[Tree, list[Leaf]]:
    """Return ``(tree, leaves)``; ``tree`` refers to ``leaves`` by index."""
    if isinstance(state, Flattened):
        return state.tree, list(state.leaves)
    leaves: list[Leaf] = []
    seen: set[str] = set()

    def leaf_path(path: str) -> str:
        if path in seen:
            raise UnsupportedLeafError(
                f"two entries of the state have the dotted path {path!r} (e.g. keys 'a.b' and "
                "a -> b, or 1 and '1'): rename one so every path is unique")
        seen.add(path)
        return path

    def walk(obj: Any, path: str, depth: int) -> Any:
        if depth > _MAX_DEPTH:
            raise UnsupportedLeafError(f"state nested deeper than {_MAX_DEPTH} levels at {path!r}")
        if isinstance(obj, np.generic) and obj.dtype.kind in "SU":
            return {"value": check_text(obj.item(), path)}
        if isinstance(obj, (torch.Tensor, np.ndarray, np.generic)):
            if isinstance(obj, np.ndarray) and obj.dtype.kind not in "biufc":
                raise UnsupportedLeafError(
                    f"numpy array of dtype {obj.dtype} at {path!r} cannot be stored without "
                    "pickling; use a numeric dtype")
            leaves.append(Leaf(leaf_path(path), obj))
            return {"tensor": len(leaves) - 1}
        if isinstance(obj, bool) or obj is None or isinstance(obj, (float, str, bytes)):
            leaf_path(path)
            return {"value": check_text(obj, path)}
        if isinstance(obj, int):
            leaf_path(path)
            return {"value": obj} if -(2**63) <= obj < 2**64 else {"bigint": str(obj)}
        if isinstance(obj, io.BytesIO):  # its bytes, as DCP stores it: no pickle
            leaf_path(path)
            return {"bytesio": obj.getvalue()}
        if is_stateful(obj):
            return walk(obj.state_dict(), path, depth + 1)
        if isinstance(obj, Mapping):
            items = []
            for k, v in obj.items():
                if not isinstance(k, _KEYS):
                    raise UnsupportedLeafError(
                        f"dict key {k!r} of type {type(k).__name__} at {path!r}: keys must be "
                        "str, int, float, bool or None")
                items.append([check_text(k, path), walk(v, _join(path, k), depth + 1)])
            meta = getattr(obj, "_metadata", None)
            if isinstance(obj, OrderedDict) and meta is not None:
                return {"odict": items, "meta": walk(meta, _join(path, "_metadata"), depth + 1)}
            return {"dict": items}
        if isinstance(obj, (list, tuple)):
            kind = "tuple" if isinstance(obj, tuple) else "list"
            return {kind: [walk(v, _join(path, i), depth + 1) for i, v in enumerate(obj)]}
        if isinstance(obj, torch.dtype):
            raise UnsupportedLeafError(
                f"torch.dtype at {path!r}: store str(dtype) instead")
        raise UnsupportedLeafError(
            f"cannot store {type(obj).__module__}.{type(obj).__qualname__} at {path or '<root>'!r} "
            "without pickling: convert it to tensors and plain values (int, float, str, bytes, "
            "lists, dicts), or give it state_dict()/load_state_dict()")

    return walk(state, "", 0), leaves


def check_text(value: Any, where: str) -> Any:
    """``value``; a str that is not valid Unicode text (a lone surrogate, e.g. from
    ``os.fsdecode`` of bad bytes) raises :class:`UnsupportedLeafError`: the manifest stores
    UTF-8."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as e:
            raise UnsupportedLeafError(
                f"the string {value!r} at {where or '<root>'!r} is not valid Unicode text "
                f"({e.reason} at position {e.start}) and cannot be stored: store it as bytes "
                "(value.encode('utf-8', 'surrogateescape'))") from None
    return value


def unflatten(tree: Any, tensors: list[Any]) -> Any:
    """Rebuild the nested state; ``tensors[i]`` replaces ``{"tensor": i}``."""

    def walk(node: Any, depth: int) -> Any:
        if depth > _MAX_DEPTH or not isinstance(node, dict) or len(node) not in (1, 2):
            raise ManifestError(f"invalid state tree node {str(node)[:80]!r}")
        if "tensor" in node:
            i = node["tensor"]
            if not isinstance(i, int) or not 0 <= i < len(tensors):
                raise ManifestError(f"state tree refers to missing tensor {i!r}")
            return tensors[i]
        if "value" in node:
            v = node["value"]
            if not isinstance(v, _SCALARS):
                raise ManifestError(f"invalid value {v!r} in state tree")
            return v
        if "bigint" in node:
            try:
                return int(node["bigint"])
            except (TypeError, ValueError):
                raise ManifestError("invalid bigint in state tree") from None
        if "bytesio" in node:
            if not isinstance(node["bytesio"], bytes):
                raise ManifestError("invalid bytesio in state tree")
            return io.BytesIO(node["bytesio"])
        for kind in ("dict", "odict"):
            if kind in node:
                items = node[kind]
                if not isinstance(items, list) or not all(
                        isinstance(p, list) and len(p) == 2 and isinstance(p[0], _KEYS)
                        for p in items):
                    raise ManifestError("invalid dict in state tree")
                out = ({} if kind == "dict" else OrderedDict())
                for k, v in items:
                    out[k] = walk(v, depth + 1)
                if kind == "odict" and "meta" in node:
                    out._metadata = walk(node["meta"], depth + 1)  # type: ignore[attr-defined]
                return out
        for kind, ctor in (("list", list), ("tuple", tuple)):
            if kind in node:
                if not isinstance(node[kind], list):
                    raise ManifestError(f"invalid {kind} in state tree")
                return ctor(walk(v, depth + 1) for v in node[kind])
        raise ManifestError(f"unknown state tree node {sorted(node)!r}")

    return walk(tree, 0)


def select(tree: Any, patterns: str | Sequence[str]) -> Any:
    """Prune a tree to the entries the glob ``patterns`` select (``"!glob"`` leaves entries out):
    :func:`ckptstore.state.leaves.select_tree`, after :func:`~ckptstore.state.leaves.check_patterns`."""
    return select_tree(tree, check_patterns(patterns))


@dataclass(frozen=True)
class Target:
    """A live tensor where the commit's tree has a tensor: its dotted path, and whether it
    belongs to an object with ``load_state_dict`` (which then decides what a mismatch means)."""

    path: str
    tensor: torch.Tensor
    owned: bool


def live_targets(tree: Any, into: Any) -> dict[int, Target]:
    """``{tensor index: Target}``: the tensors of ``into`` at the places of the commit's tensors
    (objects with ``state_dict()`` are looked into through it, as ``dcp.load`` does), so that
    checkout decodes straight into them."""
    out: dict[int, Target] = {}

    def walk(node: Any, live: Any, path: str, owned: bool, depth: int) -> None:
        if depth > _MAX_DEPTH or not isinstance(node, dict):
            return
        if is_stateful(live):
            live, owned = live.state_dict(), True
        if "tensor" in node:
            if isinstance(live, torch.Tensor) and isinstance(node["tensor"], int):
                out[node["tensor"]] = Target(path, live, owned)
            return
        for kind in ("dict", "odict"):
            if isinstance(node.get(kind), list) and isinstance(live, Mapping):
                for item in node[kind]:
                    if isinstance(item, list) and len(item) == 2 and item[0] in live:
                        walk(item[1], live[item[0]], _join(path, item[0]), owned, depth + 1)
        for kind in ("list", "tuple"):
            if isinstance(node.get(kind), list) and isinstance(live, (list, tuple)):
                for i, (sub, obj) in enumerate(zip(node[kind], live)):
                    walk(sub, obj, _join(path, i), owned, depth + 1)

    walk(tree, into, "", False, 0)
    return out


def load_into(state: Any, into: Any, partial: bool = False) -> None:
    """Load checked-out ``state`` into live ``into`` as ``dcp.load`` does: objects with
    ``load_state_dict()`` get their part; tensors are copied into (nothing to do for those the
    reader filled in place); other values are replaced in their dict or list. Entries of the
    commit that ``into`` lacks are not added. A live entry the commit lacks, or a tensor of
    another shape, raises :class:`StateMismatchError` -- unless ``partial`` (``paths=``
    selected part of the commit): then entries not in ``state`` are left alone."""

    def fill(new: Any, live: Any, where: str) -> bool:  # False: replace ``live`` by ``new``
        if is_stateful(live):
            live.load_state_dict(new)
        elif isinstance(live, torch.Tensor):
            if new is live:
                return True
            if not isinstance(new, (torch.Tensor, np.ndarray, np.generic)):
                return False
            new = torch.as_tensor(new)
            if new.shape != live.shape:
                raise StateMismatchError(
                    f"into{where} has shape {list(live.shape)}, the commit's tensor "
                    f"{list(new.shape)}: give a tensor of the committed shape")
            with torch.no_grad():
                live.copy_(new)
        elif isinstance(live, Mapping) and isinstance(new, Mapping):
            for key, obj in list(live.items()):
                if key not in new:
                    if partial:
                        continue
                    raise StateMismatchError(
                        f"into{where}[{key!r}]: the commit has no entry {key!r} (it has "
                        f"{sorted(map(str, new))[:8]}): remove it, or load with paths= to "
                        "restore part of the commit")
                if not fill(new[key], obj, f"{where}[{key!r}]"):
                    if not isinstance(live, MutableMapping):
                        raise StateMismatchError(f"into{where} cannot be changed: use a dict")
                    live[key] = new[key]
        elif isinstance(live, (list, tuple)) and isinstance(new, (list, tuple)) and len(
                live) == len(new):
            for i, (sub, obj) in enumerate(zip(new, live)):
                if partial and sub is None:
                    continue  # not selected: a sequence keeps its positions with None
                if not fill(sub, obj, f"{where}[{i}]"):
                    if isinstance(live, tuple):
                        if sub != obj:
                            raise StateMismatchError(
                                f"into{where} is a tuple: its item {i} cannot be replaced; "
                                "use a list")
                    else:
                        live[i] = sub
        else:
            return False
        return True

    if not fill(state, into, ""):
        raise StateMismatchError(
            "into= takes an object with load_state_dict(), a tensor, or a dict or list of "
            f"them matching the commit's state; got {type(into).__name__} for a commit of "
            f"{type(state).__name__}")
