"""What changed between two commits: tensors changed (with the largest absolute difference),
added or removed, and plain values changed, added or removed (the library behind ``ckpt diff``).

Tensors that both commits read from the very same stored array are equal without being read;
the others are read a batch at a time and compared bit for bit first.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from ..checkout.batches import read_tensors
from ..state.leaves import Leaves, PlainValue, as_tensor, entry_nbytes
from ..history.manifest import Layout, Manifest, TensorEntry
from ..progress import bar
from ..history.repository import Repository

__all__ = ["DiffResult", "TensorChange", "TensorSpec", "ValueChange", "diff", "max_abs_diff"]

_STEP = 1 << 22  # elements compared at once by max_abs_diff


@dataclass(frozen=True)
class TensorSpec:
    """A tensor's path, dtype name (as in manifests) and shape."""

    path: str
    dtype: str
    shape: tuple[int, ...]

    @classmethod
    def of(cls, e: TensorEntry, path: str) -> TensorSpec:
        return cls(path, e.dtype, tuple(e.shape))

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "dtype": self.dtype, "shape": list(self.shape)}


@dataclass(frozen=True)
class TensorChange:
    """A tensor present in both commits with other bits, dtype or shape.

    ``max_abs_diff`` is the largest ``|new - old|`` (NaN where a NaN meets a number), or None
    when the dtype or shape changed or the dtypes cannot be subtracted.
    """

    old: TensorSpec
    new: TensorSpec
    max_abs_diff: float | None

    @property
    def path(self) -> str:
        return self.new.path

    def to_json(self) -> dict[str, Any]:
        def spec(s: TensorSpec) -> dict[str, Any]:
            return {"dtype": s.dtype, "shape": list(s.shape)}

        return {"path": self.path, "old": spec(self.old), "new": spec(self.new),
                "max_abs_diff": self.max_abs_diff}


@dataclass(frozen=True)
class ValueChange:
    """A plain value (step, learning rate, ...) that differs: ``old`` and ``new``."""

    path: str
    old: PlainValue
    new: PlainValue

    def to_json(self) -> dict[str, Any]:
        return {"path": self.path, "old": self.old, "new": self.new}


@dataclass(frozen=True)
class DiffResult:
    """The differences between commits ``ref1`` (old) and ``ref2`` (new), by dotted path.

    ``values_added`` and ``values_removed`` map paths to values; ``unchanged`` counts the
    tensors present in both with the same bits.
    """

    ref1: str
    ref2: str
    changed: tuple[TensorChange, ...]
    added: tuple[TensorSpec, ...]
    removed: tuple[TensorSpec, ...]
    unchanged: int
    values_changed: tuple[ValueChange, ...]
    values_added: tuple[tuple[str, PlainValue], ...]
    values_removed: tuple[tuple[str, PlainValue], ...]

    @property
    def differs(self) -> bool:
        """True when anything (tensor or value) was changed, added or removed."""
        return bool(self.changed or self.added or self.removed or self.values_changed
                    or self.values_added or self.values_removed)

    def to_json(self) -> dict[str, Any]:
        """A plain dict (``ckpt diff --json``); bytes values are left as they are."""
        return {"ref1": self.ref1, "ref2": self.ref2,
                "changed": [c.to_json() for c in self.changed],
                "added": [a.to_json() for a in self.added],
                "removed": [r.to_json() for r in self.removed],
                "unchanged": self.unchanged,
                "values_changed": [v.to_json() for v in self.values_changed],
                "values_added": [{"path": p, "value": v} for p, v in self.values_added],
                "values_removed": [{"path": p, "value": v} for p, v in self.values_removed]}


def max_abs_diff(a: torch.Tensor, b: torch.Tensor, step: int = _STEP) -> float | None:
    """Largest ``|a - b|`` over the elements of two same-shape tensors.

    Positions where both hold the same value, NaN included, count as 0; a NaN facing a number
    makes the result NaN. None if the dtypes cannot be subtracted.

    >>> max_abs_diff(torch.tensor([1.0, float("nan")]), torch.tensor([1.5, float("nan")]))
    0.5
    """
    a, b = a.reshape(-1), b.reshape(-1)
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return float(bool((a != b).any()))
    work = torch.complex128 if (a.dtype.is_complex or b.dtype.is_complex) else torch.float64
    best = 0.0
    try:
        for lo in range(0, a.numel(), step):
            x, y = a[lo: lo + step].to(work), b[lo: lo + step].to(work)
            d = (x - y).abs()
            same = (x == y) | (torch.isnan(x) & torch.isnan(y))
            d = torch.where(same, torch.zeros((), dtype=d.dtype), d)
            m = float(d.max())
            if math.isnan(m):
                return math.nan
            best = max(best, m)
    except (RuntimeError, TypeError):
        return None
    return best


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    if a.numel() == 0:  # an empty tensor comes back with stride 0: no byte view of it
        return True
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def _same_data(e: TensorEntry, f: TensorEntry) -> bool:
    """Both entries read the very same stored array (no need to read it)."""
    return (e.layout == f.layout == Layout.ARRAY and e.kind == f.kind
            and (e.commit, e.array, e.dtype, e.shape) == (f.commit, f.array, f.dtype, f.shape))


def _same_value(a: PlainValue, b: PlainValue) -> bool:
    nan = isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)
    return nan or (type(a), a) == (type(b), b)


def _tensor_changes(repo: Repository, m1: Manifest, m2: Manifest, t1: dict[str, int],
                    t2: dict[str, int], progress: bool) -> tuple[list[TensorChange], int]:
    """Changes among the tensors both commits have, in the order of ``t1``; and the count of
    unchanged ones."""
    results: dict[str, TensorChange] = {}
    unchanged = 0
    to_read: list[tuple[str, int, int]] = []
    for p in t1.keys() & t2.keys():
        e, f = m1.tensors[t1[p]], m2.tensors[t2[p]]
        if m1.id == m2.id or _same_data(e, f):
            unchanged += 1
        elif e.dtype != f.dtype or list(e.shape) != list(f.shape):
            results[p] = TensorChange(TensorSpec.of(e, p), TensorSpec.of(f, p), None)
        else:
            to_read.append((p, t1[p], t2[p]))
    to_read.sort(key=lambda r: r[1])
    sizes = [entry_nbytes(m1.tensors[i]) for _, i, _ in to_read]
    with bar(sum(sizes), "diff", progress and bool(to_read)) as shown:
        old = read_tensors(repo, m1, [i for _, i, _ in to_read])
        new = read_tensors(repo, m2, [j for _, _, j in to_read])
        for (p, i, j), size, a, b in zip(to_read, sizes, old, new):
            a, b = as_tensor(a), as_tensor(b)
            if _same_bits(a, b):
                unchanged += 1
            else:
                results[p] = TensorChange(TensorSpec.of(m1.tensors[i], p),
                                          TensorSpec.of(m2.tensors[j], p), max_abs_diff(a, b))
            shown.update(size)
    return [results[p] for p in t1 if p in results], unchanged


def diff(repo: Repository, a: str, b: str, paths: Sequence[str] | None = None,
         progress: bool = False) -> DiffResult:
    """Compare the states of two commits.

    Parameters
    ----------
    repo
        The store's history (``store.repo``).
    a, b
        The old and the new commit: branch, tag, commit id or unique prefix, with ``~N`` / ``^``.
    paths
        Globs as in ``checkout(paths=...)``: compare only the entries they select.
    progress
        Show a progress bar (bytes read) on stderr.

    Returns
    -------
    DiffResult
        Tensors and plain values changed, added and removed, in the order of the states.
    """
    m1, m2 = repo.manifest(repo.resolve(a)), repo.manifest(repo.resolve(b))
    l1, l2 = Leaves.of(m1).select(paths), Leaves.of(m2).select(paths)
    t1, t2 = dict(l1.tensors), dict(l2.tensors)
    v1, v2 = l1.values, l2.values
    changed, unchanged = _tensor_changes(repo, m1, m2, t1, t2, progress)
    return DiffResult(
        ref1=m1.id, ref2=m2.id, changed=tuple(changed),
        added=tuple(TensorSpec.of(m2.tensors[i], p) for p, i in t2.items() if p not in t1),
        removed=tuple(TensorSpec.of(m1.tensors[i], p) for p, i in t1.items() if p not in t2),
        unchanged=unchanged,
        values_changed=tuple(ValueChange(p, v1[p], v2[p]) for p in v1
                             if p in v2 and not _same_value(v1[p], v2[p])),
        values_added=tuple((p, v) for p, v in v2.items() if p not in v1),
        values_removed=tuple((p, v) for p, v in v1.items() if p not in v2))
