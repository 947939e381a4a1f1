"""The snapshot a store hands its persist process: a state's tensors copied into one shared
memory file, and the table that rebuilds them there.

The store's side lays the leaves out (:func:`layout`): leaves over one storage (tied weights,
views) share one region at their relative offsets, so the persist process's plan finds the same
aliases and views; a leaf whose elements overlap (an expanded tensor) or a numpy value gets a
contiguous region of its own. :class:`SharedFile` is the memory (an anonymous ``memfd`` on
Linux, its pages reserved at creation so too little memory is an error, not a SIGBUS later);
:func:`copy_in`
fills it; the persist process maps the same file and rebuilds the leaves (:func:`leaves_in`).
"""

from __future__ import annotations

import mmap
import os
import tempfile
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import PersistProcessError, UnsupportedLeafError
from ..state.tree import Leaf

__all__ = ["Layout", "SentRows", "SharedFile", "copy_in", "layout", "leaves_in", "local_shard",
           "located", "partial_rows"]

_ALIGN = 64


@dataclass(frozen=True)
class Layout:
    """Where each leaf lives: ``slots[i] = [path, kind, dtype, shape, stride, offset, group]``
    (kind: torch, numpy or numpy-scalar; offset in elements from its group's start; group -1
    for an empty tensor) and ``groups[g] = [byte offset, bytes]`` in the file."""

    slots: list[list[object]]
    groups: list[list[int]]
    nbytes: int

    def fits(self, other: Layout) -> bool:
        """Whether ``other``'s groups lie where this layout's do (the same file serves)."""
        return self.groups == other.groups


def _kind(value: object) -> str:
    if isinstance(value, np.generic):
        return "numpy-scalar"
    return "numpy" if isinstance(value, np.ndarray) else "torch"


def _tensor(value: object) -> torch.Tensor:
    """A leaf as a tensor over its own memory: numpy arrays keep their strides where they are
    positive and dense (a Fortran-ordered array stays one), else the plan's C-order copy."""
    if isinstance(value, torch.Tensor):
        return value.detach()
    a = np.asarray(value)
    if not a.flags.c_contiguous and a.ndim and all(st > 0 for st in a.strides):
        t = torch.from_numpy(a)
        if not _overlaps(t) and _span(t) == t.numel():
            return t
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (an expanded or crafted view)."""
    extent = 1  # elements the smaller dimensions reach
    for st, sz in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1):
        if st < extent:
            return True
        extent += (sz - 1) * st
    return False


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def _dense(t: torch.Tensor) -> bool:
    """Whether ``t``'s elements fill its span: it keeps its strides in a region of its own."""
    return not _overlaps(t) and _span(t) == t.numel() and not (t.is_conj() or t.is_neg())


def _shares(leaf: Leaf, t: torch.Tensor) -> bool:
    """Whether ``t`` may share a region with other leaves over its storage (an expanded view
    too: the span is copied once, the views laid over it)."""
    return isinstance(leaf.value, torch.Tensor) and not (t.is_conj() or t.is_neg())


#: what :func:`copy_in` copies: (the slot it fills, or None for a group's whole span; the view
#: it fills, as a slot; the tensor copied from)
Copy = tuple["int | None", list[object], torch.Tensor]


def layout(leaves: list[Leaf]) -> tuple[Layout, list[Copy]]:
    """The layout of ``leaves`` and what :func:`copy_in` copies into it (from the leaves,
    wherever they live). Leaves over one storage share its span, copied once (gaps included, as
    the plan stores it); a leaf alone keeps its strides where it fills its span; an expanded or
    sparse view, a conjugate or negative view, and numpy values get a contiguous region."""
    tensors = [_tensor(leaf.value) for leaf in leaves]
    members: dict[tuple[object, ...], list[int]] = {}
    for i, (leaf, t) in enumerate(zip(leaves, tensors)):
        if t.layout != torch.strided:
            raise UnsupportedLeafError(
                f"tensor at {leaf.path!r} has layout {t.layout}: convert it with .to_dense()")
        if t.numel():
            key = (t.device.type, t.device.index, t.untyped_storage().data_ptr(), t.dtype) \
                if _shares(leaf, t) else ("own", i)
            members.setdefault(key, []).append(i)
    groups: list[list[int]] = []
    placed: dict[int, tuple[int, int, list[int]]] = {}  # leaf -> (group, offset, strides)
    copies: list[Copy] = []
    end = 0
    for idx in members.values():
        t = tensors[idx[0]]
        start = -(-end // _ALIGN) * _ALIGN
        if len(idx) > 1:  # the storage's span, once
            lo = min(tensors[i].storage_offset() for i in idx)
            hi = max(tensors[i].storage_offset() + _span(tensors[i]) for i in idx)
            span = torch.empty(0, dtype=t.dtype, device=t.device).set_(
                t.untyped_storage(), lo, (hi - lo,), (1,))
            copies.append((None, [None, None, _name(t.dtype), [hi - lo], [1], 0, len(groups)],
                           span))
            for i in idx:
                placed[i] = (len(groups), tensors[i].storage_offset() - lo,
                             list(tensors[i].stride()))
            nbytes = (hi - lo) * t.element_size()
        else:
            strides = list(t.stride()) if _dense(t) else _contiguous_strides(t.shape)
            placed[idx[0]] = (len(groups), 0, strides)
            nbytes = t.numel() * t.element_size()
        groups.append([start, nbytes])
        end = start + nbytes
    spanned = {i for idx in members.values() if len(idx) > 1 for i in idx}
    slots: list[list[object]] = []
    for i, (leaf, t) in enumerate(zip(leaves, tensors)):
        g, off, strides = placed.get(i, (-1, 0, _contiguous_strides(t.shape)))
        slots.append([leaf.path, _kind(leaf.value), _name(t.dtype), list(t.shape), strides, off,
                      g])
        if g >= 0 and i not in spanned:
            copies.append((i, slots[-1], t))
    return Layout(slots, groups, end), copies


def _name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _contiguous_strides(shape: torch.Size) -> list[int]:
    strides, step = [], 1
    for s in reversed(shape):
        strides.append(step)
        step *= max(s, 1)
    return strides[::-1]


def _dtype(name: object) -> torch.dtype:
    dtype = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(dtype, torch.dtype):
        raise PersistProcessError(f"a leaf of dtype {name!r:.40} in a shared snapshot")
    return dtype


def _view(region: torch.Tensor, slot: list[object]) -> torch.Tensor:
    """The tensor ``slot`` names over ``region`` (its group's bytes, uint8)."""
    _, _, dtype, shape, stride, off, _ = slot
    typed = region.view(_dtype(dtype))
    return typed.as_strided(shape, stride, typed.storage_offset() + off)


def copy_in(shape: Layout, copies: list[Copy], memory: torch.Tensor,
            rows: dict[int, torch.Tensor] | None = None) -> None:
    """Make ``copies`` (:func:`layout`'s) into ``memory`` (the file's bytes as uint8); of a leaf
    ``i`` in ``rows``, only those rows (the rest of its region holds them already)."""
    for i, spec, source in copies:
        start, nbytes = shape.groups[int(spec[6])]
        dst = _view(memory[start:start + nbytes], spec)
        if rows is not None and i in rows:
            index = rows[i]
            dst.index_copy_(0, index, source.index_select(0, index.to(source.device)).cpu())
        else:
            dst.copy_(source)


def local_shard(value: object) -> object:
    """A DTensor's local shard (what a rank's collective ``commit_async`` stages), else the
    value itself."""
    to_local = getattr(value, "to_local", None) if isinstance(value, torch.Tensor) else None
    return value if to_local is None else to_local()


def located(tensors: list[torch.Tensor], file: SharedFile) -> Layout | None:
    """The layout of ``tensors`` where they already lie in ``file`` (views :func:`leaves_in`
    made over it: a staged snapshot), a group each; None where one lies elsewhere or is not a
    dense CPU view (it is then copied in)."""
    base, slots, groups = file.memory.data_ptr(), [], []
    for i, t in enumerate(tensors):
        if t.device.type != "cpu" or t.layout != torch.strided or t.is_conj() or t.is_neg():
            return None
        g = -1
        if t.numel():
            start, nbytes = t.data_ptr() - base, _span(t) * t.element_size()
            if _overlaps(t) or start < 0 or start + nbytes > file.nbytes:
                return None
            g = len(groups)
            groups.append([start, nbytes])
        slots.append([str(i), "torch", _name(t.dtype), list(t.shape), list(t.stride()), 0, g])
    return Layout(slots, groups, file.nbytes)


def identity(leaf: Leaf, t: torch.Tensor) -> tuple[object, ...]:
    """What a region's copy was made from: the same tensor again holds its values there."""
    return (leaf.path, t.device.type, t.device.index, t.untyped_storage().data_ptr(),
            t.storage_offset(), tuple(t.shape), tuple(t.stride()), t.dtype)


def partial_rows(copies: list[Copy], tracked: dict[int, torch.Tensor],
                 same: set[int]) -> dict[int, torch.Tensor]:
    """Of the ``tracked`` leaves (index -> touched rows), those whose rows alone need copying:
    a region of their own (not a shared storage's span) that holds the same tensor's copy from
    the last commit (``same``), so only what the tracker saw change is new."""
    own = {i for i, _, _ in copies if i is not None}
    return {i: r for i, r in tracked.items() if i in own and i in same}


def _key(t: torch.Tensor) -> tuple[int, int, tuple[int, ...]]:
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape)


class SentRows:
    """The persist process's stand-in for its store's row tracker: the touched rows of the
    tracked leaves, sent with the commit (what the pipeline asks a tracker: ``lookup``,
    ``touched_rows``, ``clear``)."""

    def __init__(self, leaves: list[Leaf], rows: list[list[object]]):
        self._rows: dict[tuple[int, int, tuple[int, ...]], torch.Tensor] = {}
        for index, data in rows:
            value = leaves[int(index)].value
            if not isinstance(value, torch.Tensor) or not isinstance(data, bytes) \
                    or len(data) % 8:
                raise PersistProcessError(f"rows of leaf {index!r:.20} that are not int64")
            self._rows[_key(value)] = torch.from_numpy(
                np.frombuffer(data, dtype="<i8").astype(np.int64))

    def lookup(self, tensor: torch.Tensor) -> SentRows | None:
        return self if isinstance(tensor, torch.Tensor) and _key(tensor) in self._rows else None

    def touched_rows(self, tensor: torch.Tensor) -> torch.Tensor:
        return self._rows[_key(tensor)]

    def clear(self) -> None:
        """Cleared in the store's process, once its snapshot was copied."""


def leaves_in(shape: Layout, memory: mmap.mmap) -> list[Leaf]:
    """The leaves of ``shape`` over the mapped file: a storage of its own for each group (its
    leaves' aliases and views as they were), numpy values as numpy."""
    for start, nbytes in shape.groups:
        if not (0 <= start and 0 < nbytes and start + nbytes <= len(memory)):
            raise PersistProcessError(f"a group of {nbytes} bytes at {start} in a shared "
                                      f"snapshot of {len(memory)} bytes")
    bases = [torch.frombuffer(memory, dtype=torch.uint8, count=n, offset=s)
             for s, n in shape.groups]
    leaves = []
    for slot in shape.slots:
        path, kind, dtype, shape_, _, _, g = slot
        t = _view(bases[g], slot) if g >= 0 else torch.empty(shape_, dtype=_dtype(dtype))
        value: object = t
        if kind == "numpy":
            value = t.numpy()
        elif kind == "numpy-scalar":
            value = t.numpy()[()]
        leaves.append(Leaf(str(path), value))
    return leaves


class SharedFile:
    """``nbytes`` of memory another process can map, every page reserved now (so too little
    memory fails here, not with a SIGBUS later). On Linux an anonymous ``memfd``: no name is
    ever left behind, whatever kills the process, and no tmpfs size applies; the persist process
    opens it as ``/proc/<pid>/fd/<fd>`` while :meth:`unlink` has not closed it. Elsewhere a file
    in the temporary folder, unlinked once both sides mapped it."""

    def __init__(self, nbytes: int, named: bool = False):
        self.nbytes = max(nbytes, 1)
        memfd = None if named else getattr(os, "memfd_create", None)
        if memfd is not None:
            self._fd = memfd("ckptstore-snapshot", os.MFD_CLOEXEC)
            self.path, self._named = f"/proc/{os.getpid()}/fd/{self._fd}", False
        else:  # not Linux, or a persist process that may not open another's descriptors
            self._fd, self.path = tempfile.mkstemp(prefix="ckptstore-snapshot-")
            self._named = True
        try:
            try:
                os.posix_fallocate(self._fd, 0, self.nbytes)
            except OSError as e:
                raise PersistProcessError(
                    f"no room for a {self.nbytes}-byte snapshot in shared memory "
                    f"({e.strerror}): free memory, or use background='thread'") from None
            self.map = mmap.mmap(self._fd, self.nbytes)
        except BaseException:
            self.unlink()
            raise
        self.memory = torch.frombuffer(self.map, dtype=torch.uint8)

    def unlink(self) -> None:
        """Drop the way in (the name, the descriptor); both mappings stay."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        if self._named:
            try:
                os.unlink(self.path)
            except FileNotFoundError:
                pass
