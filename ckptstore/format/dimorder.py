"""The memory layout of a dense tensor as a dimension order, so checkout restores it.

A tensor is stored by its logical values (C order of its shape, what every codec, chunk grid and
row chain works on). A dense tensor whose strides are a permutation of C order -- channels_last
(``NCHW`` laid out as ``NHWC``), a transposed matrix, a Fortran-ordered numpy array -- records that
permutation, outermost dimension first (``Tensor.dim_order()``'s convention, the
``physical_layout`` of ``torch.empty_permuted``); checkout hands back a tensor with those strides.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch

from ..limits import allocate

__all__ = ["dim_order_of", "with_dim_order"]


def _order(shape: Sequence[int], strides: Sequence[int]) -> tuple[int, ...] | None:
    """The permutation (outermost first) under which ``strides`` are C-contiguous for
    ``shape``; None when that is C order itself or when the strides are not dense."""
    if len(shape) < 2 or 0 in shape:
        return None
    order = _place_unit_dims(shape, strides)
    expected = 1
    for d in reversed(order):
        if shape[d] > 1 and strides[d] != expected:
            return None
        expected *= shape[d]
    return None if order == sorted(order) else tuple(order)


def _place_unit_dims(shape: Sequence[int], strides: Sequence[int]) -> list[int]:
    """Sort by stride only the dimensions longer than 1 and leave each size-1 dimension where
    it is, so an ambiguous layout counts as C order (what ``contiguous()`` would give)."""
    long_dims = sorted((d for d in range(len(shape)) if shape[d] > 1),
                       key=lambda d: (-strides[d], d))
    it = iter(long_dims)
    return [d if shape[d] == 1 else next(it) for d in range(len(shape))]


def dim_order_of(value: object) -> tuple[int, ...] | None:
    """The dimension order to record for a tensor or numpy array (None: C order, or a layout
    that is not a dense permutation -- those come back C-contiguous)."""
    if isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_contiguous():
            return None
        return _order(value.shape, value.stride())
    if isinstance(value, np.ndarray):
        if value.flags.c_contiguous or value.itemsize == 0:
            return None
        if any(s % value.itemsize for s in value.strides):
            return None
        return _order(value.shape, [s // value.itemsize for s in value.strides])
    return None


def with_dim_order(a: np.ndarray, order: Sequence[int] | None, where: str = "a tensor"
                   ) -> np.ndarray:
    """``a``'s values laid out in ``order`` (a copy), or ``a`` itself when there is none; an
    :class:`~ckptstore.errors.AllocationError` naming ``where`` if the copy cannot be had."""
    if order is None:
        return a
    physical = allocate(tuple(a.shape[d] for d in order), a.dtype, where)
    out = physical.transpose(np.argsort(order))
    np.copyto(out, a)
    return out
