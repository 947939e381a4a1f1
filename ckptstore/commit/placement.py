"""Placement: where each stored item of a commit is captured and encoded, chosen ONCE per plan
item before the snapshot (DCP's ``_TensorLoader`` habit: the strategy is picked, then only run).

=========  =================================================================================
HOST       copied into a host buffer (referenced in a synchronous commit), encoded there
ROWS       only the rows a tracker named, copied into a host buffer
ENCODE     kept on its device and quantized there (:mod:`ckptstore.device.quant`): only codes
           cross to the host
STAGE      copied on its device now (device-to-device), moved to the host by
           :meth:`~ckptstore.commit.snapshot.Snapshot.settle` on the persist thread
COMPARE    kept on its device and compared there with the reference kept there
           (:mod:`ckptstore.device.rows`): settle moves only the changed rows
=========  =================================================================================

A device strategy the device has no room for falls back to HOST when the snapshot runs (the
only decision left to capture time). :func:`place` is the one rule; :mod:`ckptstore.device`
knows tensors, never plans.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum

import numpy as np
import torch

from ..chunkcodec import LOSSLESS_IDS, QuantizedLossy
from ..device.quant import device_quantizable
from ..device.rows import compared_on_device
from .plan import ArrayItem, CodesItem, CommitPlan, PackedItem, PlanItem, RowsItem

__all__ = ["Capture", "Placement", "device_items", "place", "staged_items", "tracked_rows"]


class Capture(Enum):
    """How an item is captured (the table of :mod:`ckptstore.commit.placement`)."""

    HOST = "host"
    ROWS = "rows"
    ENCODE = "encode"
    STAGE = "stage"
    COMPARE = "compare"

    @property
    def on_device(self) -> bool:
        """Whether the snapshot copies (or keeps) the item on its device."""
        return self in (Capture.ENCODE, Capture.STAGE, Capture.COMPARE)


@dataclass(frozen=True, eq=False)
class Placement:
    """Where one plan item is captured, and what its capture needs.

    ``rows``: the tracker's rows (ROWS); ``against``: an increment's reference on its device and
    whether its changed rows are stored XOR-ed with their old bits (COMPARE, or, off the device,
    a reference settle copies to the host); ``keep``: this commit's values become the next
    reference, kept on their device (a baseline of an increment)."""

    capture: Capture = Capture.HOST
    rows: np.ndarray | None = None
    against: tuple[torch.Tensor, bool] | None = None
    keep: bool = False


def place(plan: CommitPlan, mode: str, *, pooled: bool, host_values: bool = False,
          dedup: bool = False) -> dict[int, Placement]:
    """The placement of every stored item of ``plan``, by index (one pass over the plan).

    ``mode``: :attr:`EncodingOptions.device_encode` (``"auto"``: CUDA tensors take the device
    strategies, ``"always"``: any tensor, ``"off"``: none); ``pooled``: the snapshot copies into
    staging buffers (``commit_async``; without them a synchronous commit references the
    tensors); ``host_values``: the commit needs every value on the host (a rank's fork, Shrink,
    sensitivity scores), so nothing is quantized on a device; ``dedup``: full arrays are
    digested from their bits on the host."""
    out: dict[int, Placement] = {}
    small: list[PackedItem] = []
    any_staged = False
    for p in plan.stored():
        if isinstance(p, PackedItem):
            out[p.index] = _HOST
            small.append(p)
        elif isinstance(p, ArrayItem):
            stage = _staged(p, mode)
            any_staged = any_staged or stage
            encode = not host_values and _device_encoded(p, mode, dedup)
            out[p.index] = _place_array(p, pooled, encode, stage)
    if pooled and any_staged:  # small CUDA tensors gathered on their device
        out.update((p.index, _GATHERED) for p in small if p.source.device.type == "cuda")
    return out


_HOST = Placement(Capture.HOST)
_GATHERED = Placement(Capture.STAGE)


def _place_array(p: ArrayItem, pooled: bool, encode: bool, stage: bool) -> Placement:
    rows = tracked_rows(p) if pooled else None
    if rows is not None:
        return Placement(Capture.ROWS, rows=rows)
    against = _device_compare(p)
    keep = (p.want == "rows" and against is None and stage and compared_on_device(p.source))
    if encode:
        capture = Capture.ENCODE
    elif stage and against is not None:
        capture = Capture.COMPARE
    elif stage and pooled:
        capture = Capture.STAGE
    else:
        capture = Capture.HOST
    return Placement(capture, against=against, keep=keep)


def _device_compare(p: ArrayItem) -> tuple[torch.Tensor, bool] | None:
    """An increment compared with a reference on its device: that reference, and whether its
    changed rows are stored as the XOR of their old bits (an exact, lossless chain)."""
    if not isinstance(p, RowsItem) or p.start.tracked_rows is not None or (
            p.start.device_reference is None):
        return None
    return p.start.device_reference, p.start.exact and p.codec.codec_id in LOSSLESS_IDS


def tracked_rows(p: PlanItem) -> np.ndarray | None:
    """The rows an increment stores, when a tracker named them and nothing else of the table
    is needed (no reference to XOR the old rows against)."""
    if not isinstance(p, RowsItem) or p.start.tracked_rows is None or (
            p.start.reference is not None):
        return None
    return np.flatnonzero(p.start.tracked_rows).astype(np.int64)


def device_items(plan: CommitPlan, mode: str, dedup: bool) -> frozenset[int]:
    """Indices of the plan items quantized on their device: full arrays and code deltas whose
    quantization :func:`~ckptstore.device.quant.device_quantizable` reproduces, of CUDA tensors
    (``mode="auto"``) or of any tensor (``"always"``); none with ``"off"``. Arrays ``dedup``
    digests are left on the host path (the digest is of the bits)."""
    return frozenset(p.index for p in plan.stored() if _device_encoded(p, mode, dedup))


def staged_items(plan: CommitPlan, mode: str) -> frozenset[int]:
    """Indices of the array items a pooled snapshot stages on their device (a device-to-device
    copy while it has room): those of CUDA tensors, any with ``"always"``."""
    return frozenset(p.index for p in plan.stored() if _staged(p, mode))


def _device_encoded(p: PlanItem, mode: str, dedup: bool) -> bool:
    """Whether item ``p`` is quantized on its device (:func:`device_items`)."""
    if mode == "off" or type(p) not in (ArrayItem, CodesItem) or p.want not in ("full", "codes"):
        return False
    codec = p.codec
    if not (isinstance(codec, QuantizedLossy) and not codec.prune_zeros
            and device_quantizable(codec.quantize, tuple(p.grid.chunks))):
        return False
    if dedup and type(p) is ArrayItem and not p.keep_codes:
        return False
    if codec.quantize["method"] == "kmeans" and p.dtype == "float64":
        return False
    return p.source.device.type == "cuda" or mode == "always"


def _staged(p: PlanItem, mode: str) -> bool:
    """Whether a pooled snapshot stages item ``p`` on its device (:func:`staged_items`)."""
    return mode != "off" and isinstance(p, ArrayItem) and (
        mode == "always" or p.source.device.type == "cuda")
