"""The snapshot a store hands its persist process: a state's tensors copied into one shared
memory file, and the table that rebuilds them there.

The store's side lays the leaves out (:func:`layout`): leaves over one storage (tied weights,
views) share one region at their relative offsets, so the persist process's plan finds the same
aliases and views; a leaf whose elements overlap (an expanded tensor) or a numpy value gets a
contiguous region of its own. :class:`SharedFile` is the memory (a file in ``/dev/shm``, its
pages reserved at creation so a full tmpfs is an error, not a SIGBUS later); :func:`copy_in`
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

__all__ = ["Layout", "SentRows", "SharedFile", "copy_in", "layout", "leaves_in", "partial_rows"]

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
    if isinstance(value, torch.Tensor):
        return value.detach()
    a = np.asarray(value)  # the plan's own conversion: C order
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))


def _overlaps(t: torch.Tensor) -> bool:
    """Whether two elements of ``t`` may share memory (an expanded or crafted view)."""
    dims = sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz > 1)
    extent = 1
    for st, sz in dims:
        if st < extent:
            return True
        extent = st * sz
    return False


def _span(t: torch.Tensor) -> int:
    return 1 + sum((s - 1) * st for s, st in zip(t.shape, t.stride()))


def layout(leaves: list[Leaf]) -> tuple[Layout, list[torch.Tensor]]:
    """The layout of ``leaves`` and the tensors :func:`copy_in` copies from (CPU or device)."""
    tensors = [_tensor(leaf.value) for leaf in leaves]
    slots: list[list[object]] = []
    groups: list[list[int]] = []
    members: dict[tuple[object, ...], list[int]] = {}
    own: list[int] = []
    for i, (leaf, t) in enumerate(zip(leaves, tensors)):
        if t.layout != torch.strided:
            raise UnsupportedLeafError(
                f"tensor at {leaf.path!r} has layout {t.layout}: convert it with .to_dense()")
        if t.numel() == 0:
            continue
        if isinstance(leaf.value, torch.Tensor) and not _overlaps(t):
            key = (t.device.type, t.device.index, t.untyped_storage().data_ptr(), t.dtype)
            members.setdefault(key, []).append(i)
        else:
            own.append(i)
    offsets: dict[int, tuple[int, int]] = {}  # leaf -> (group, element offset)
    end = 0

    def add_group(nbytes: int) -> int:
        nonlocal end
        start = -(-end // _ALIGN) * _ALIGN
        groups.append([start, nbytes])
        end = start + nbytes
        return len(groups) - 1

    for idx in members.values():
        lo = min(tensors[i].storage_offset() for i in idx)
        hi = max(tensors[i].storage_offset() + _span(tensors[i]) for i in idx)
        g = add_group((hi - lo) * tensors[idx[0]].element_size())
        for i in idx:
            offsets[i] = (g, tensors[i].storage_offset() - lo)
    for i in own:
        offsets[i] = (add_group(tensors[i].numel() * tensors[i].element_size()), 0)
    for i, (leaf, t) in enumerate(zip(leaves, tensors)):
        g, off = offsets.get(i, (-1, 0))
        stride = list(t.stride()) if isinstance(leaf.value, torch.Tensor) and i not in own \
            else _contiguous_strides(t.shape)
        slots.append([leaf.path, _kind(leaf.value), str(t.dtype).removeprefix("torch."),
                      list(t.shape), stride, off, g])
    return Layout(slots, groups, end), tensors


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


def copy_in(shape: Layout, tensors: list[torch.Tensor], memory: torch.Tensor,
            rows: dict[int, torch.Tensor] | None = None) -> None:
    """Copy ``tensors`` into ``memory`` (the file's bytes as uint8) where ``shape`` puts them;
    of a leaf ``i`` in ``rows``, only those rows (the rest of its region holds them already)."""
    for i, (slot, t) in enumerate(zip(shape.slots, tensors)):
        if slot[6] < 0:
            continue
        start, nbytes = shape.groups[slot[6]]
        dst = _view(memory[start:start + nbytes], slot)
        if rows is not None and i in rows:
            index = rows[i]
            dst.index_copy_(0, index, t.index_select(0, index.to(t.device)).cpu())
        else:
            dst.copy_(t)


def partial_rows(shape: Layout, tracked: dict[int, torch.Tensor], valid: set[int]
                 ) -> dict[int, torch.Tensor]:
    """Of the ``tracked`` leaves (index -> touched rows), those whose rows alone need copying:
    their region already holds the rest (``valid``: leaves copied into this file before, nothing
    loaded into them since) and every leaf over the same region is tracked too."""
    members: dict[int, list[int]] = {}
    for i, slot in enumerate(shape.slots):
        members.setdefault(int(slot[6]), []).append(i)
    return {i: r for i, r in tracked.items() if shape.slots[i][6] >= 0
            and all(m in tracked and m in valid for m in members[int(shape.slots[i][6])])}


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
    """``nbytes`` of memory in a file another process can map (``/dev/shm`` where there is one):
    every page reserved now, so a tmpfs too small for it fails here."""

    def __init__(self, nbytes: int):
        folder = "/dev/shm" if os.path.isdir("/dev/shm") and os.access("/dev/shm", os.W_OK) \
            else tempfile.gettempdir()
        fd, self.path = tempfile.mkstemp(prefix="ckptstore-snapshot-", dir=folder)
        self.nbytes = max(nbytes, 1)
        try:
            try:
                os.posix_fallocate(fd, 0, self.nbytes)
            except OSError as e:
                raise PersistProcessError(
                    f"no room for a {self.nbytes}-byte snapshot in {folder} ({e.strerror}): "
                    "make it larger (a container's --shm-size) or use background='thread'"
                ) from None
            self.map = mmap.mmap(fd, self.nbytes)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)
        self.memory = torch.frombuffer(self.map, dtype=torch.uint8)

    def unlink(self) -> None:
        """Remove the file's name (the mappings stay until both sides drop them)."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass
