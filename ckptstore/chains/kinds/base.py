"""The protocol of a chain kind: how a tensor entry builds on an older commit, in one place.

A :class:`ChainKind` answers, for the entry kinds it owns (:attr:`ChainKind.kinds`):

1. **decide** -- :meth:`~ChainKind.link`: does this tensor take a link, given the policy, its
   previous entry and the reference the store holds; :meth:`~ChainKind.start`: what the write
   needs from that reference;
2. **remember** -- :meth:`~ChainKind.remember`: what the chain memory keeps once the commit
   landed (the next link's reference);
3. **reads** -- :meth:`~ChainKind.reads`: the stored parts an entry of the kind reads
   (:attr:`~ChainKind.parts` names them);
4. **replay** -- :meth:`~ChainKind.replay`: the chain applied onto its rebuilt baseline, in
   place; :meth:`~ChainKind.check`: what checkout and verify require of each link first;
5. **write** -- :meth:`~ChainKind.write`: a link's parts from the snapshot, into a
   :class:`LinkSink` (``commit.persist`` owns the chunks, the pool and the manifest records).

The reader hands a replay a :class:`ChainSource`; the chain memory hands ``remember`` a
:class:`Remembered` plan item and the :class:`Kept` values of its commit.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from concurrent.futures import Executor
from typing import TYPE_CHECKING, ClassVar, Protocol

import numpy as np

from ...chunkcodec import ChunkCodec, Encoded
from ...errors import ManifestError
from ...format.grid import ChunkGrid
from ...history.manifest import Blob, Kind, Manifest, TensorEntry
from ...storage import Buffer
from ..links import ChainLink, ChainStart, CodesBase, Reference, Shadow

if TYPE_CHECKING:  # torch only for hints: `ckpt show` / `du` walk chains without it
    import torch
    from ...policy import Policy, Want
    from ...tracking.rows import RowTracker
    from ...device.quant import ChunkCodes
    from ..replay import ChunkCodesOf

__all__ = ["ChainKind", "ChainSource", "Kept", "LinkItem", "LinkSink", "LinkWritten", "Remembered",
           "StagedLink", "fits", "host_copy", "misfit"]


class ChainSource(Protocol):
    """What a replay reads through (the checkout's reader)."""

    @property
    def executor(self) -> Executor: ...

    def host(self, e: TensorEntry, out: np.ndarray | None = None) -> np.ndarray:
        """The bits of an entry (a chain's full baseline), decoded into ``out`` where given."""

    def blob(self, b: Blob) -> np.ndarray:
        """A whole chain part."""

    def blocks(self, b: Blob, put: Callable[[int, np.ndarray], None]) -> None:
        """A chain part chunk by chunk: ``put(first row, rows)`` in the I/O threads."""

    def read(self, where: str) -> Buffer:
        """One stored chunk's bytes."""


class Remembered(Protocol):
    """A planned array item as the chain memory sees it (``commit.plan.ArrayItem``)."""

    @property
    def path(self) -> str: ...

    @property
    def want(self) -> Want: ...

    @property
    def kind(self) -> Kind: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def grid(self) -> ChunkGrid: ...

    @property
    def codec(self) -> ChunkCodec: ...

    @property
    def source(self) -> torch.Tensor: ...


@dataclass(frozen=True)
class Kept:
    """What one item's commit left for its next reference: the snapshot's array (``host``;
    only the changed rows where ``rows_only``), the codes kept, the values a checkout rebuilds
    (residuals), this commit's values on their device, the commit's row tracker, and whether
    the policy wants its changed rows as the XOR of their old bits (``xor_rows``)."""

    host: np.ndarray | None = None
    codes: CodesBase | None = None
    rebuilt: np.ndarray | None = None
    on_device: torch.Tensor | None = None
    rows_only: bool = False
    tracker: RowTracker | None = None
    xor_rows: bool = False


class LinkItem(Protocol):
    """A planned chain item as its kind writes it (``commit.plan.ChainItem``)."""

    @property
    def start(self) -> ChainStart: ...

    @property
    def dtype(self) -> str: ...

    @property
    def shape(self) -> tuple[int, ...]: ...

    @property
    def grid(self) -> ChunkGrid: ...

    @property
    def codec(self) -> ChunkCodec: ...


class StagedLink(Protocol):
    """A chain item's snapshot (``commit.snapshot.Captured``): its bits (``staged``: on the
    host, or a tensor on its device), or only the changed ``rows`` (XOR-ed with their old bits
    when ``xored``), and the host copy of a device reference (``reference``)."""

    @property
    def staged(self) -> np.ndarray | torch.Tensor: ...

    @property
    def rows(self) -> np.ndarray | None: ...

    @property
    def xored(self) -> bool: ...

    @property
    def reference(self) -> np.ndarray | None: ...


class LinkSink(Protocol):
    """Where a link's parts go: each part an array ``<item's array>.<part>`` of the commit."""

    @property
    def chunk_bytes(self) -> int:
        """Target chunk size of parts whose grid the kind chooses (changed rows)."""

    @property
    def host_dtype(self) -> np.dtype:
        """The numpy dtype of the item's bits on the host."""

    def array(self, part: str, values: np.ndarray, grid: ChunkGrid, codec: ChunkCodec,
              encode: Callable[[int, np.ndarray], Encoded] | None = None) -> None:
        """Queue ``values`` as part ``part`` (``encode(chunk index, chunk)``: instead of
        ``codec.encode``)."""

    def chunks(self, part: str, grid: ChunkGrid, dtype: np.dtype, codec: ChunkCodec,
               encoded: Callable[[int, int, int], Encoded]) -> None:
        """Queue part ``part`` chunk by chunk: ``encoded(chunk index, first row, end row)``."""

    def quantized(self) -> ChunkCodes:
        """``codes(chunk index, first row, end row) -> (codes, params)`` of the item's values
        (on their device where they are staged there)."""


@dataclass(frozen=True)
class LinkWritten:
    """What a link's write reports besides its parts: the fraction of rows stored, the codes
    kept (the next delta's base), the values a checkout rebuilds (the next residual's base)."""

    fraction: float = 1.0
    codes: CodesBase | None = None
    rebuilt: np.ndarray | None = None


class ChainKind:
    """One chain kind; subclasses override what their kind does (the defaults: no chain)."""

    kinds: ClassVar[tuple[Kind, ...]]       # the manifest entry kinds it owns
    want: ClassVar[Want]                    # what a policy wants to get it
    parts: ClassVar[tuple[frozenset[str], ...]] = ()  # the part names an entry may hold
    own_array: ClassVar[bool] = True        # a baseline is never packed with small tensors
    tracks_rows: ClassVar[bool] = False     # a row tracker says which rows changed
    remembers: ClassVar[bool] = True        # the memory keeps a reference after a commit

    # -- decide --------------------------------------------------------------------------
    def rebases(self, policy: Policy, tip: Manifest) -> bool:
        """Whether this commit takes a new baseline of every chain of the kind at once."""
        return False

    def link(self, policy: Policy, quantized: bool, tip: Manifest, prev: TensorEntry,
             ref: Reference | None, tracked: bool, rebase: bool) -> ChainLink | None:
        """The link a tensor gets on ``prev`` (same shape and dtype, an array or chain entry
        of ``tip``), or None for a full entry."""
        return None

    def keeps_bits(self, policy: Policy, quantized: bool) -> bool:
        """Whether a tracked tensor keeps a host copy of its bits all the same."""
        return False

    def baseline_codec(self, codec: ChunkCodec | None) -> ChunkCodec | None:
        """The codec of a full entry a chain of the kind starts from (None: lossless)."""
        return codec

    def start(self, link: ChainLink, shadow: Shadow, tracked: bool,
              grid: ChunkGrid) -> ChainStart | None:
        """What the write of ``link`` needs from the reference (None: write a full entry)."""
        return ChainStart(link)

    def fractions(self, link: ChainLink, fraction: float) -> list[float] | None:
        """The changed-row fractions the manifest records for an entry of ``link``."""
        return None

    # -- write ---------------------------------------------------------------------------
    def write(self, item: LinkItem, staged: StagedLink, sink: LinkSink) -> LinkWritten:
        """Write the parts of ``item``'s link into ``sink``."""
        raise NotImplementedError(f"{type(self).__name__} writes no chain link")

    # -- remember ------------------------------------------------------------------------
    def remember(self, item: Remembered, commit_id: str, kept: Kept,
                 old: Shadow | None) -> Shadow | None:
        """The reference kept after ``commit_id`` stored ``item`` (None: keep none)."""
        return None

    # -- reads and replay ----------------------------------------------------------------
    def reads(self, e: TensorEntry) -> list[Blob]:
        """The chain parts an entry stores itself (read when it is rebuilt)."""
        return list((e.parts or {}).values())

    def check(self, e: TensorEntry, base: TensorEntry, link: TensorEntry) -> None:
        """Raise :class:`ManifestError` where ``link`` (of the chain of ``e`` on the full
        ``base``) cannot be replayed."""

    def replay(self, chain: list[TensorEntry], source: ChainSource,
               out: np.ndarray | None = None) -> np.ndarray:
        """The last entry of ``chain`` (full baseline first) rebuilt, into ``out`` where
        given."""
        raise ManifestError(f"entry {chain[-1].path!r} of kind {chain[-1].kind} has no chain")

    def device_codes(self, chain: list[TensorEntry], read: Callable[[str], Buffer]
                     ) -> tuple[ChunkGrid, ChunkCodesOf] | None:
        """``(grid, codes_of)`` where the chain's last version dequantizes from rebuilt codes
        (on a device), else None."""
        return None


def misfit(what: str, commit: str | None) -> ManifestError:
    """The one error of a chain part that does not fit its tensor (``what``: the part and its
    path, ``commit``: the commit holding it)."""
    return ManifestError(f"{what} in {commit} does not fit the tensor")


def fits(b: Blob, shape: list[int], itemsize: int | None = None) -> bool:
    """Whether a chain part (its dtype checked by the walk) has ``shape`` (and items of
    ``itemsize`` bytes)."""
    return b.shape == list(shape) and itemsize in (None, np.dtype(b.dtype).itemsize)


def host_copy(values: np.ndarray, old: Shadow | None) -> np.ndarray:
    """A host copy of a new reference: into the old reference's buffer when it fits (its commit
    is done with it; a fresh gigabyte costs its page faults on every commit), else a new one."""
    kept = old.values if old is not None else None
    if kept is not None and kept.shape == values.shape and kept.dtype == values.dtype:
        np.copyto(kept, values)
        return kept
    return np.array(values, copy=True)
