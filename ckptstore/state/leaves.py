"""A commit's leaves by dotted path: which there are, which globs select, and their sizes (reading
their tensors a batch at a time is :mod:`ckptstore.checkout.batches`).

Diff, usage, export and ``Store.iter_tensors`` select entries the way ``checkout(paths=...)``
does -- a glob selects an entry when it matches its dotted path or the path of a container of it
(``"model"`` selects everything under ``model``) -- and read tensors by their index in the
manifest, about :data:`BATCH_BYTES` at a time, so a large state is never in memory at once.
Only reading tensors imports torch: paths, selection and sizes serve ``ckpt show`` without it.

>>> matches("model.emb.weight", ["model"]), matches("model.emb.weight", ["opt*"])
(True, False)
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeAlias

import numpy as np

from ..format.dtypes import nbytes
from ..errors import ManifestError, StateMismatchError
from ..history.manifest import Manifest, TensorEntry

if TYPE_CHECKING:
    import torch

__all__ = ["BATCH_BYTES", "Leaves", "PlainValue", "TensorLike", "as_tensor", "check_patterns",
           "entry_nbytes", "join_path", "matches", "nothing_selected", "select_tree", "tree_paths"]

BATCH_BYTES = 256 * 2**20  # tensor bytes read per round trip

PlainValue = None | bool | int | float | str | bytes
"""A leaf of the state that is not a tensor (step, learning rate, names, ...)."""

TensorLike: TypeAlias = "torch.Tensor | np.ndarray | np.generic"
"""A tensor leaf as checkout returns it (numpy leaves stay numpy)."""


def join_path(prefix: str, key: Any) -> str:
    """The dotted path of ``key`` under ``prefix`` (``""`` is the root)."""
    return f"{prefix}.{key}" if prefix else str(key)


def tree_paths(tree: Any) -> dict[str, Any]:
    """``{dotted path: node}`` of every leaf node (tensors and values) of a tree."""
    out: dict[str, Any] = {}

    def walk(node: Any, path: str) -> None:
        if not isinstance(node, dict):
            raise ManifestError(f"invalid state tree node at {path or '<root>'!r}")
        for kind in ("dict", "odict"):
            if kind in node:
                if not isinstance(node[kind], list) or not all(
                        isinstance(p, list) and len(p) == 2 for p in node[kind]):
                    raise ManifestError(f"invalid dict in state tree at {path or '<root>'!r}")
                for k, v in node[kind]:
                    walk(v, join_path(path, k))
                return
        for kind in ("list", "tuple"):
            if kind in node:
                for i, v in enumerate(node[kind]):
                    walk(v, join_path(path, i))
                return
        out[path] = node

    walk(tree, "")
    return out


def check_patterns(patterns: str | Sequence[str]) -> list[str]:
    """The ``paths=`` patterns as a list (a bare string is one pattern); an empty pattern, a
    lone ``"!"``, ``"!!..."`` or a non-string raises :class:`StateMismatchError`."""
    patterns = [patterns] if isinstance(patterns, str) else list(patterns)
    for p in patterns:
        if not isinstance(p, str) or p.lstrip("!") == "" or p.startswith("!!"):
            raise StateMismatchError(
                f"paths= pattern {p!r} is not understood: give globs of dotted paths "
                "('model', 'model.emb.*'), or '!' and a glob to leave entries out ('!optim')")
    return patterns


def nothing_selected(patterns: Sequence[str], m: Manifest) -> StateMismatchError:
    """The error for ``paths=`` that select nothing of commit ``m``: never an empty result
    without a word."""
    top = m.tree.get("dict", m.tree.get("odict", [])) if isinstance(m.tree, dict) else []
    names = [str(p[0]) for p in top if isinstance(p, list) and p]
    return StateMismatchError(
        f"paths={list(patterns)} select nothing of commit {m.id[:10]} (its entries: "
        f"{', '.join(names[:8]) or 'none'}): check the spelling; `ckpt show {m.id[:10]}` "
        "lists every path")


def _split(patterns: Sequence[str]) -> tuple[list[str], list[str]]:
    """``(selecting globs, excluding globs)``: a leading ``!`` excludes."""
    return ([p for p in patterns if not p.startswith("!")],
            [p[1:] for p in patterns if p.startswith("!")])


def _glob_hit(path: str, globs: Sequence[str]) -> bool:
    return any(fnmatch.fnmatchcase(path, g) for g in globs)


def matches(path: str, patterns: Sequence[str]) -> bool:
    """True when ``patterns`` select the dotted ``path``: a glob matches it or one of its
    containers, and no ``!glob`` matches it or one of its containers (only ``!globs``: everything
    but what they match)."""
    take, leave = _split(patterns)
    prefixes = [path[:k] for k, ch in enumerate(path) if ch == "."] + [path]
    return (not take or any(_glob_hit(x, take) for x in prefixes)) and not any(
        _glob_hit(x, leave) for x in prefixes)


def select_tree(tree: Any, patterns: Sequence[str]) -> Any:
    """Prune a state tree to the entries ``patterns`` select (:func:`matches`).

    A selected container comes whole (empty sub-containers included) unless an exclusion
    reaches into it; a container all of whose entries are left out disappears; a sequence
    keeps its positions (unselected items become None); the root stays (possibly empty).
    """
    take, leave = _split(patterns)

    def walk(node: Any, path: str, taken: bool) -> Any | None:
        if path and leave and _glob_hit(path, leave):
            return None
        taken = taken or not take or bool(path) and _glob_hit(path, take)
        if taken and not leave:
            return node
        for kind in ("dict", "odict"):
            if kind in node:
                kept = [[k, s] for k, v in node[kind]
                        if (s := walk(v, join_path(path, k), taken)) is not None]
                if path and not kept and (node[kind] or not taken):
                    return None
                return {kind: kept, **({"meta": node["meta"]} if "meta" in node else {})}
        for kind in ("list", "tuple"):
            if kind in node:
                items = [walk(v, join_path(path, i), taken) for i, v in enumerate(node[kind])]
                if path and all(s is None for s in items) and (items or not taken):
                    return None
                return {kind: [s if s is not None else {"value": None} for s in items]}
        return node if taken else None

    pruned = walk(tree, "", False)
    return pruned if pruned is not None else {"dict": []}


@dataclass(frozen=True)
class Leaves:
    """The leaves of a commit's state: ``{dotted path: tensor index}`` and
    ``{dotted path: plain value}``, in the order of the state."""

    tensors: Mapping[str, int]
    values: Mapping[str, PlainValue]

    @classmethod
    def of(cls, m: Manifest) -> Leaves:
        """The leaves of commit ``m``."""
        tensors: dict[str, int] = {}
        values: dict[str, PlainValue] = {}
        for path, node in tree_paths(m.tree).items():
            if "tensor" in node:
                tensors[path] = node["tensor"]
            elif "value" in node:
                values[path] = node["value"]
            elif "bigint" in node:
                values[path] = int(node["bigint"])
            elif "bytesio" in node:
                values[path] = node["bytesio"]
        return cls(tensors, values)

    def select(self, patterns: Sequence[str] | None) -> Leaves:
        """The leaves that :func:`matches` selects (all of them for no patterns)."""
        if not patterns:
            return self
        patterns = check_patterns(patterns)
        return Leaves({p: i for p, i in self.tensors.items() if matches(p, patterns)},
                      {p: v for p, v in self.values.items() if matches(p, patterns)})


def entry_nbytes(e: TensorEntry) -> int:
    """Bytes of an entry's tensor in memory (what it costs to read it)."""
    return nbytes(e.dtype, e.shape)


def as_tensor(value: TensorLike) -> torch.Tensor:
    """A torch tensor of a tensor leaf (numpy arrays and scalars share memory where they can)."""
    import torch

    if isinstance(value, torch.Tensor):
        return value
    a = np.asarray(value)  # (np.ascontiguousarray would make a 0-d array 1-d)
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy())
