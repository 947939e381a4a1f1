"""Per-tensor encoding decisions for one commit: what is written, where, and how.

The planner sees the flattened leaves and decides, for each tensor, its layout (own array, packed
with other small tensors, alias of a tied tensor, or a view of a shared storage) and its chunk codec.
It writes nothing. Later encodings (incremental rows, quantization, deltas) are further plan kinds.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .arrays import CHUNK_BYTES, ChunkGrid, dtype_name, storage_dtype
from .chunkcodec import BloscLossless, ChunkCodec, RawLossless
from .errors import UnsupportedLeafError
from .state import Leaf

__all__ = ["PACKED_ARRAY", "CommitPlan", "EncodingOptions", "TensorPlan", "plan_commit"]

PACKED_ARRAY = "_packed"
PACK_ALIGN = 16
_NAME_OK = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


@dataclass(frozen=True)
class EncodingOptions:
    """How a store encodes lossless commits.

    Parameters
    ----------
    pack_below
        Tensors smaller than this many bytes share one packed array (one object per ~8 MiB
        instead of one per bias vector).
    chunk_bytes
        Target size of a chunk before compression.
    compression
        ``"lz4"`` (blosc lz4 + bit-shuffle: fast, ~9% smaller on float32) or ``"none"``.
    """

    pack_below: int = 64 * 1024
    chunk_bytes: int = CHUNK_BYTES
    compression: str = "lz4"

    def codec(self) -> ChunkCodec:
        if self.compression == "lz4":
            return BloscLossless()
        if self.compression == "none":
            return RawLossless()
        raise ValueError(f"compression must be 'lz4' or 'none', not {self.compression!r}")


@dataclass
class TensorPlan:
    """One manifest tensor entry to produce.

    ``source`` is the tensor (or numpy array) whose bits are stored; for ``view`` storages it is a
    flat tensor over the shared span.
    """

    path: str
    dtype: str
    shape: list[int]
    layout: str  # array | packed | alias | view
    container: str = "torch"
    source: Any = None
    array: str | None = None
    base: int | None = None
    storage_offset: int | None = None
    stride: list[int] | None = None
    offset: int | None = None  # packed: byte offset
    nbytes: int = 0
    grid: ChunkGrid | None = None  # array: its chunking
    codec: ChunkCodec | None = None  # array: its codec (lossless or quantized)
    kind: str = "full"
    chain: Any = None  # incremental.ChainPlan for layout "chain"
    keep_codes: bool = False  # quantized: keep the codes as the base of later code deltas
    want: str = "full"  # what the policy wanted (full, rows, codes)


@dataclass
class CommitPlan:
    tensors: list[TensorPlan] = field(default_factory=list)
    storages: list[TensorPlan] = field(default_factory=list)
    packed_nbytes: int = 0
    packed_grid: ChunkGrid | None = None
    codec: ChunkCodec = field(default_factory=BloscLossless)

    @property
    def logical_bytes(self) -> int:
        return sum(p.nbytes for p in self.tensors
                   if p.layout in ("array", "packed", "view", "chain"))

    def stored(self) -> list[TensorPlan]:
        """Entries whose bits are written (arrays, packed, chains), storages included."""
        return [p for p in (*self.tensors, *self.storages)
                if p.layout in ("array", "packed", "chain")]


def _container(value: Any) -> str:
    if isinstance(value, np.generic):
        return "numpy-scalar"
    return "numpy" if isinstance(value, np.ndarray) else "torch"


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    a = np.asarray(value)  # np.ascontiguousarray would turn 0-d arrays into 1-d ones
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))


def _storage_key(t: torch.Tensor) -> tuple[Any, ...] | None:
    if t.numel() == 0 or t.layout != torch.strided:
        return None
    return t.device.type, t.device.index, t.untyped_storage().data_ptr()


def _array_name(path: str, index: int, taken: set[str]) -> str:
    name = path if _NAME_OK.match(path) else f"t{index}"
    if name in taken or name == PACKED_ARRAY:
        name = f"{name[:180]}~{index}"
    taken.add(name)
    return name


Decide = Callable[[str, torch.Tensor, ChunkGrid], tuple[ChunkCodec | None, Any, str]]


def plan_commit(leaves: list[Leaf], options: EncodingOptions,
                decide: Decide | None = None) -> CommitPlan:
    """Decide the layout of every leaf tensor; shared storages are detected here.

    ``decide(path, tensor, grid) -> (codec, chain, want)`` is asked about every tensor that gets
    an array of its own: a codec other than the lossless default (quantization), a
    :class:`~ckptstore.incremental.ChainPlan` to store it as a chain entry instead of in full,
    and what the policy wanted for it (``full``, ``rows`` or ``codes``).
    """
    plan = CommitPlan(codec=options.codec())
    tensors = [_as_tensor(leaf.value) for leaf in leaves]
    for t, leaf in zip(tensors, leaves):
        if t.is_sparse or t.layout != torch.strided:
            raise UnsupportedLeafError(
                f"tensor at {leaf.path!r} has layout {t.layout}: convert it with .to_dense()")
        storage_dtype(t.dtype)  # unsupported dtypes fail before anything is written

    groups: dict[tuple[Any, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        key = _storage_key(t) if isinstance(leaves[i].value, torch.Tensor) else None
        if key is not None:
            groups.setdefault(key, []).append(i)
    role: dict[int, tuple[str, int]] = {}  # index -> ("alias", first) | ("view", storage index)
    for members in groups.values():
        if len(members) < 2:
            continue
        first = tensors[members[0]]
        sig = lambda t: (t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))
        if all(sig(tensors[m]) == sig(first) for m in members):
            for m in members[1:]:
                role[m] = ("alias", members[0])
            continue
        if len({tensors[m].dtype for m in members}) != 1:
            continue  # mixed dtypes over one storage: stored independently
        lo = min(tensors[m].storage_offset() for m in members)
        hi = max(tensors[m].storage_offset() + sum((s - 1) * st for s, st in
                 zip(tensors[m].shape, tensors[m].stride())) + 1 for m in members)
        span = torch.empty(0, dtype=first.dtype, device=first.device).set_(
            first.untyped_storage(), lo, (hi - lo,), (1,))
        plan.storages.append(TensorPlan(path=f"<storage of {leaves[members[0]].path}>",
                                        dtype=dtype_name(first.dtype), shape=[hi - lo],
                                        layout="array", source=span,
                                        nbytes=span.numel() * span.element_size()))
        for m in members:
            role[m] = ("view", len(plan.storages) - 1)

    taken: set[str] = set()
    for i, (t, leaf) in enumerate(zip(tensors, leaves)):
        p = TensorPlan(path=leaf.path, dtype=dtype_name(t.dtype), shape=list(t.shape),
                       layout="array", container=_container(leaf.value), source=t,
                       nbytes=t.numel() * t.element_size())
        if i in role:
            kind, ref = role[i]
            p.layout, p.base, p.source = kind, ref, None
            if kind == "view":
                lo = plan.storages[ref].source.storage_offset()
                p.storage_offset, p.stride = t.storage_offset() - lo, list(t.stride())
        plan.tensors.append(p)

    for i, p in enumerate([*plan.tensors, *plan.storages]):
        if p.layout != "array" or p.nbytes == 0:
            if p.layout == "array":  # empty: nothing to store
                p.layout, p.offset = "packed", plan.packed_nbytes
            continue
        grid = ChunkGrid.for_array(tuple(p.shape), storage_dtype(p.source.dtype).itemsize,
                                   options.chunk_bytes)
        codec, chain = None, None
        if decide is not None and p.container == "torch" and i < len(plan.tensors):
            # asked for small tensors too: a policy may quantize below pack_below
            codec, chain, p.want = decide(p.path, p.source, grid)
        if codec is None and chain is None and p.nbytes < options.pack_below:
            p.layout, p.offset, p.want = "packed", plan.packed_nbytes, "full"
            plan.packed_nbytes += -(-p.nbytes // PACK_ALIGN) * PACK_ALIGN
            continue
        p.array, p.grid, p.codec = _array_name(p.path, i, taken), grid, codec or plan.codec
        p.keep_codes = p.want == "codes"
        if chain is not None:
            p.layout, p.kind, p.chain = "chain", chain.kind, chain
    if plan.packed_nbytes:
        plan.packed_grid = ChunkGrid.for_array((plan.packed_nbytes,), 1, options.chunk_bytes)
    return plan
