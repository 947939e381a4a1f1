"""Flatten nested training state into a plain tree plus a list of tensors, and back.

The tree is what the manifest stores; every node is a one-key map::

    {"dict": [[key, node], ...]}      {"odict": [[key, node], ...], "meta": node}
    {"list": [node, ...]}             {"tuple": [node, ...]}
    {"tensor": i}                     index into the commit's tensor table
    {"value": v}                      None, bool, int (64-bit), float, str, bytes
    {"bigint": "123..."}              ints beyond 64 bits

Keys are str, int, float, bool or None. Objects with ``state_dict()`` / ``load_state_dict()``
(modules, optimizers, schedulers, samplers) are stored as their state dicts. Anything else raises
:class:`~ckptstore.errors.UnsupportedLeafError` -- nothing is ever pickled.
"""

from __future__ import annotations

import fnmatch
from collections import OrderedDict
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from .errors import ManifestError, UnsupportedLeafError
from .leaves import join_path as _join
from .leaves import tree_paths

__all__ = ["Leaf", "Tree", "check_text", "flatten", "is_stateful", "load_into", "select", "tree_paths", "unflatten"]

Tree = dict[str, object]  # a node of the flattened tree (a one-key map, see the module docstring)

_SCALARS = (type(None), bool, int, float, str, bytes)
_KEYS = (str, int, float, bool, type(None))
_MAX_DEPTH = 200


@dataclass
class Leaf:
    """A tensor found while flattening: its dotted path and the object."""

    path: str
    value: torch.Tensor | np.ndarray | np.generic


def is_stateful(obj: Any) -> bool:
    """True for objects that save and load through ``state_dict()`` / ``load_state_dict()``."""
    return (not isinstance(obj, (torch.Tensor, Mapping)) and callable(getattr(obj, "state_dict", None))
            and callable(getattr(obj, "load_state_dict", None)))


def flatten(state: Any) -> tuple[Tree, list[Leaf]]:
    """Return ``(tree, leaves)``; ``tree`` refers to ``leaves`` by index."""
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


def select(tree: Any, patterns: list[str]) -> Any:
    """Prune a tree to the leaves whose dotted path matches any glob pattern.

    A pattern also selects everything below a matching container (``"model"`` selects the model).
    Containers left empty disappear; the root stays (possibly empty).
    """

    literal = {p for p in patterns if not any(c in p for c in "*?[")}
    globs = [p for p in patterns if p not in literal]

    def match(path: str) -> bool:
        return path in literal or any(fnmatch.fnmatchcase(path, p) for p in globs)

    def walk(node: Any, path: str) -> Any | None:
        if path and match(path):
            return node
        for kind in ("dict", "odict"):
            if kind in node:
                kept = [[k, s] for k, v in node[kind] if (s := walk(v, _join(path, k))) is not None]
                if not kept and path:
                    return None
                return {kind: kept, **({"meta": node["meta"]} if "meta" in node else {})}
        for kind in ("list", "tuple"):
            if kind in node:
                # a sequence keeps its positions: unselected items become None
                items = [walk(v, _join(path, i)) for i, v in enumerate(node[kind])]
                if all(s is None for s in items) and path:
                    return None
                return {kind: [s if s is not None else {"value": None} for s in items]}
        return None

    pruned = walk(tree, "")
    return pruned if pruned is not None else {"dict": []}


def load_into(state: Any, into: Any) -> None:
    """Load checked-out ``state`` into live objects: one stateful object, or a mapping of them."""
    if is_stateful(into):
        into.load_state_dict(state)
        return
    if not isinstance(into, Mapping):
        raise TypeError("into= takes an object with load_state_dict() or a mapping of names to them")
    if not isinstance(state, Mapping):
        raise TypeError("into= as a mapping needs a commit whose state is a mapping")
    for key, obj in into.items():
        if key not in state:
            raise KeyError(f"into[{key!r}]: the commit has no entry {key!r} "
                           f"(it has {sorted(map(str, state))})")
        if is_stateful(obj):
            obj.load_state_dict(state[key])
        elif isinstance(obj, torch.Tensor):
            with torch.no_grad():
                obj.copy_(state[key])
        else:
            raise TypeError(f"into[{key!r}] has no load_state_dict()")
