"""Per-tensor encoding decisions for one commit: what is written, where, and how (no I/O).

A :class:`CommitPlan` is frozen: one item per manifest entry, in manifest order (tensors, then
the shared storages that views point into), each carrying its ``index`` in :attr:`CommitPlan.items`
-- snapshot and persist results are keyed by it, as DCP joins ``WriteItem`` and ``WriteResult``.
One item class per layout:

- :class:`ArrayItem` -- its own zarr array (lossless or quantized);
- :class:`ChainItem` -- an array item stored as a chain link, written by its kind
  (:mod:`ckptstore.chains.kinds`); the capture steps tell apart :class:`RowsItem` (the rows
  changed since its base, Check-N-Run), :class:`CodesItem` (code deltas against the previous
  commit), :class:`XorItem`, :class:`ResidualItem` (the XOR with, or a quantized residual
  against, the previous commit);
- :class:`PackedItem` -- a slice of the commit's one packed array of small tensors;
- :class:`AliasItem` -- the very same tensor as an earlier entry (tied weights);
- :class:`ViewItem` -- a strided view of a shared storage.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..format.arrays import CHUNK_BYTES, ChunkGrid, dtype_name, storage_dtype
from ..chains.kinds import chain_kind, kind_for_want
from ..chains.links import FULL_LOSSLESS, ChainLink, ChainStart, Decide, TensorDecision
from ..chunkcodec import ChunkCodec, lossless_codec
from ..format.dimorder import dim_order_of
from ..errors import UnsupportedLeafError
from ..format.grid import allocatable
from ..format.layout import PACKED_ARRAY
from ..history.manifest import Kind, Layout
from ..policy import Want
from ..state.tree import Leaf

__all__ = ["FULL_LOSSLESS", "AliasItem", "ArrayItem", "ChainItem", "CodesItem", "CommitPlan",
           "Decide", "EncodingOptions", "PackedItem", "PlanItem", "ResidualItem", "RowsItem",
           "TensorDecision", "ViewItem", "XorItem", "plan_commit"]

PACK_ALIGN = 16
#: ``EncodingOptions.device_encode`` values.
DEVICE_ENCODE_MODES = ("auto", "off", "always")
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
    dedup
        Record the sha256 of every full array and write none whose bits, encoding and chunk
        grid equal the parent commit's on the same path (see :mod:`ckptstore.commit.dedup`; in a
        sharded commit, the same block of the parent).
    compression
        ``"entropy"`` (the default: byte planes, each Huffman, zstd or raw; trained fp32 weights
        ~1.22x smaller, bf16 ~1.5x, Adam moments ~2.5x; commits as fast as ``"lz4"``, checks
        out 2x faster), ``"lz4"`` (blosc lz4 + bit-shuffle, the default before format 3:
        ~1.16x on fp32) or ``"none"`` (raw bits: the fastest synchronous commit on a local
        disk, no smaller).
    device_encode
        Where quantized tensors are quantized (:mod:`ckptstore.device.quant`): ``"auto"`` (the
        default) quantizes CUDA tensors on their GPU, with torch ops on a stream of their own,
        so only the codes and parameters cross to the host -- ``commit_async`` stages them in
        spare device memory when at least 10 % of it stays free, else in pinned host memory as
        lossless tensors; ``"off"`` moves every tensor to the host first; ``"always"`` also
        runs the device path on CPU tensors (the same bytes; for tests). Encodings it does not
        reproduce bit for bit or that would cross as more bytes (adaptive rows short enough for
        the host's value-by-value search, k-means on segments under 65,536 values or of float64
        data, sensitivity scores) take the host path.
    """

    pack_below: int = 64 * 1024
    chunk_bytes: int = CHUNK_BYTES
    compression: str = "entropy"
    dedup: bool = False
    device_encode: str = "auto"

    def __post_init__(self) -> None:
        if self.device_encode not in DEVICE_ENCODE_MODES:
            raise ValueError(f"device_encode must be one of {DEVICE_ENCODE_MODES}, not "
                             f"{self.device_encode!r}")

    def codec(self) -> ChunkCodec:
        """The lossless chunk codec named by ``compression``."""
        return lossless_codec(self.compression)


# -- plan items --------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False, kw_only=True)
class PlanItem:
    """One manifest entry to produce; ``index`` is its position in :attr:`CommitPlan.items`."""

    layout: ClassVar[Layout]
    index: int
    path: str
    dtype: str             # torch dtype name
    shape: tuple[int, ...]
    container: str = "torch"  # torch | numpy | numpy-scalar: what checkout hands back
    nbytes: int = 0        # bytes of the tensor in memory
    want: Want = "full"    # what the policy wanted for it (chains remember rows and codes)
    dim_order: tuple[int, ...] | None = None  # memory layout to restore (ckptstore.format.dimorder)

    @property
    def kind(self) -> Kind:
        return Kind.FULL


@dataclass(frozen=True, eq=False, kw_only=True)
class PackedItem(PlanItem):
    """``nbytes`` bytes at ``offset`` of the commit's packed array."""

    layout: ClassVar[Layout] = Layout.PACKED
    source: torch.Tensor
    offset: int


@dataclass(frozen=True, eq=False, kw_only=True)
class AliasItem(PlanItem):
    """The very same tensor as ``tensors[base]`` (tied weights): no bits of its own."""

    layout: ClassVar[Layout] = Layout.ALIAS
    base: int


@dataclass(frozen=True, eq=False, kw_only=True)
class ViewItem(PlanItem):
    """``as_strided(storages[base], shape, stride, storage_offset)``: no bits of its own."""

    layout: ClassVar[Layout] = Layout.VIEW
    base: int
    storage_offset: int
    stride: tuple[int, ...]


@dataclass(frozen=True, eq=False, kw_only=True)
class ArrayItem(PlanItem):
    """Its own zarr array ``data/<commit>/<array>``, chunked by ``grid``, encoded by ``codec``."""

    layout: ClassVar[Layout] = Layout.ARRAY
    source: torch.Tensor
    array: str
    grid: ChunkGrid
    codec: ChunkCodec

    @property
    def keep_codes(self) -> bool:
        """Quantized: keep the codes as the base of the next commit's code deltas."""
        return self.want == "codes"


@dataclass(frozen=True, eq=False, kw_only=True)
class ChainItem(ArrayItem):
    """An array item stored as a chain entry on a base commit (``start.link`` says which)."""

    layout: ClassVar[Layout] = Layout.CHAIN
    start: ChainStart

    @property
    def kind(self) -> Kind:
        return self.start.link.kind

    @property
    def link(self) -> ChainLink:
        return self.start.link


@dataclass(frozen=True, eq=False, kw_only=True)
class RowsItem(ChainItem):
    """Stored as its changed rows (``<array>.rows``, ``<array>.values``): incremental or
    consecutive."""


@dataclass(frozen=True, eq=False, kw_only=True)
class CodesItem(ChainItem):
    """Stored as code deltas against the previous commit's codes (``<array>.codes``)."""


@dataclass(frozen=True, eq=False, kw_only=True)
class XorItem(ChainItem):
    """Stored as the XOR of its bits with the previous commit's (``<array>.xor``)."""


@dataclass(frozen=True, eq=False, kw_only=True)
class ResidualItem(ChainItem):
    """Stored as a pruned, quantized residual against the previous commit's rebuilt values
    (``<array>.residual``); the snapshot holds the pruned residual, not the tensor
    (:func:`ckptstore.commit.shrinking.shrink_snapshot`)."""


# the item class of a chain kind the capture steps tell apart (placement, shrink, sensitivity),
# by the policy's want that asks for it; any other kind's items are plain ChainItems
_CHAIN_ITEMS: dict[str, type[ChainItem]] = {"rows": RowsItem, "codes": CodesItem, "xor": XorItem,
                                            "residual": ResidualItem}


def _own_array(d: TensorDecision) -> bool:
    """Whether a tensor needs an array of its own whatever its size: a quantized one, a chain
    entry, or the baseline of a kind that wants one (a chain baseline is never packed)."""
    kind = kind_for_want(d.want)
    return d.codec is not None or d.chain is not None or (kind is not None and kind.own_array)


# -- the plan ----------------------------------------------------------------------------------
@dataclass(frozen=True, eq=False)
class CommitPlan:
    """Every entry of a commit, tensors first (``items[:n_tensors]``), then shared storages."""

    items: tuple[PlanItem, ...]
    n_tensors: int
    packed_nbytes: int
    packed_grid: ChunkGrid | None
    codec: ChunkCodec  # of the packed array

    @property
    def tensors(self) -> tuple[PlanItem, ...]:
        return self.items[: self.n_tensors]

    @property
    def storages(self) -> tuple[PlanItem, ...]:
        return self.items[self.n_tensors:]

    @property
    def logical_bytes(self) -> int:
        return sum(p.nbytes for p in self.tensors if not isinstance(p, AliasItem))

    def stored(self) -> Iterator[PlanItem]:
        """Items whose bits are written (arrays, chains, packed), storages included."""
        return (p for p in self.items if isinstance(p, (ArrayItem, PackedItem)))


def _container(value: object) -> str:
    if isinstance(value, np.generic):
        return "numpy-scalar"
    return "numpy" if isinstance(value, np.ndarray) else "torch"


def _as_tensor(value: object) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        if value.is_conj() or value.is_neg():  # a lazy view's values, not its storage's
            return value.detach().resolve_conj().resolve_neg()
        return value.detach()
    a = np.asarray(value)  # np.ascontiguousarray would turn 0-d arrays into 1-d ones
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy(order="C"))


def _storage_key(t: torch.Tensor) -> tuple[object, ...] | None:
    if t.numel() == 0 or t.layout != torch.strided:
        return None
    return t.device.type, t.device.index, t.untyped_storage().data_ptr()


def _array_name(path: str, index: int, taken: set[str], prefix: str = "") -> str:
    name = prefix + (path if _NAME_OK.match(path) else f"t{index}")
    if name in taken or name == PACKED_ARRAY:
        name = f"{name[:180]}~{index}"
    taken.add(name)
    return name


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _shared_storages(tensors: list[torch.Tensor], leaves: list[Leaf]
                     ) -> tuple[dict[int, tuple[str, int]], list[tuple[str, torch.Tensor]]]:
    """Tensors sharing a storage: ``({index: ("alias", first) | ("view", storage)}, storages)``
    where each storage is ``(path, flat tensor over the shared span)``."""
    groups: dict[tuple[object, ...], list[int]] = {}
    for i, t in enumerate(tensors):
        key = _storage_key(t) if isinstance(leaves[i].value, torch.Tensor) else None
        if key is not None:
            groups.setdefault(key, []).append(i)
    role: dict[int, tuple[str, int]] = {}
    spans: list[tuple[str, torch.Tensor]] = []
    for members in groups.values():
        if len(members) < 2:
            continue
        first = tensors[members[0]]
        sig = lambda t: (t.dtype, t.storage_offset(), tuple(t.shape), tuple(t.stride()))  # noqa
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
        spans.append((f"<storage of {leaves[members[0]].path}>", span))
        for m in members:
            role[m] = ("view", len(spans) - 1)
    return role, spans


def plan_commit(leaves: list[Leaf], options: EncodingOptions,
                decide: Decide | None = None, array_prefix: str = "") -> CommitPlan:
    """Decide the layout of every leaf tensor; shared storages are detected here.

    ``decide(path, tensor, grid)`` is asked about every tensor that may get an array of its own
    (small tensors too: a policy may quantize below ``pack_below``) and returns a
    :class:`TensorDecision`. ``array_prefix`` starts every array name (each rank of a sharded
    commit plans its own part of one commit).
    """
    tensors = [_as_tensor(leaf.value) for leaf in leaves]
    for t, leaf in zip(tensors, leaves):
        if t.is_sparse or t.layout != torch.strided:
            raise UnsupportedLeafError(
                f"tensor at {leaf.path!r} has layout {t.layout}: convert it with .to_dense()")
        storage_dtype(t.dtype)  # unsupported dtypes fail before anything is written
        if not allocatable(t.shape, t.element_size()):
            raise UnsupportedLeafError(
                f"tensor at {leaf.path!r} has shape {list(t.shape)}: no numpy array can hold "
                "that shape (its non-zero dimensions span more bytes than an index holds), so "
                "checkout could never give it back; store it with a smaller shape")
    role, spans = _shared_storages(tensors, leaves)
    lossless = options.codec()
    items: list[PlanItem] = []
    packed_nbytes = 0
    taken: set[str] = set()
    entries = [(leaf.path, t, _container(leaf.value)) for t, leaf in zip(tensors, leaves)]
    entries += [(path, span, "torch") for path, span in spans]
    for i, (path, t, container) in enumerate(entries):
        dtype, shape, nbytes = dtype_name(t.dtype), tuple(t.shape), _nbytes(t)
        order = dim_order_of(leaves[i].value) if i < len(leaves) else None
        if i in role:
            kind, ref = role[i]
            if kind == "alias":
                items.append(AliasItem(index=i, path=path, dtype=dtype, shape=shape,
                                       container=container, nbytes=nbytes, base=ref))
            else:
                lo = spans[ref][1].storage_offset()
                items.append(ViewItem(index=i, path=path, dtype=dtype, shape=shape,
                                      container=container, nbytes=nbytes, base=ref,
                                      storage_offset=t.storage_offset() - lo,
                                      stride=tuple(t.stride())))
            continue
        d = FULL_LOSSLESS
        if nbytes:
            grid = ChunkGrid.for_array(shape, storage_dtype(t.dtype).itemsize,
                                       options.chunk_bytes)
            if decide is not None and container == "torch" and i < len(leaves):
                d = decide(path, t, grid)
        # small tensors share the packed array; empty ones store nothing
        if not nbytes or (not _own_array(d) and nbytes < options.pack_below):
            items.append(PackedItem(index=i, path=path, dtype=dtype, shape=shape,
                                    container=container, nbytes=nbytes, source=t,
                                    offset=packed_nbytes, dim_order=order))
            packed_nbytes += -(-nbytes // PACK_ALIGN) * PACK_ALIGN
            continue
        cls = ArrayItem if d.chain is None else _CHAIN_ITEMS.get(
            chain_kind(d.chain.link.kind).want, ChainItem)
        extra = {} if d.chain is None else {"start": d.chain}
        items.append(cls(index=i, path=path, dtype=dtype, shape=shape, container=container,
                         nbytes=nbytes, source=t, array=_array_name(path, i, taken, array_prefix),
                         grid=grid,
                         codec=d.codec or lossless, want=d.want, dim_order=order, **extra))
    grid = ChunkGrid.for_array((packed_nbytes,), 1, options.chunk_bytes) if packed_nbytes else None
    return CommitPlan(tuple(items), len(leaves), packed_nbytes, grid, lossless)
