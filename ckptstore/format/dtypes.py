"""Tensor dtypes by name, without torch: which numpy dtype holds each one's bits.

Manifests record a tensor's dtype as torch names it (``"float32"``, ``"bfloat16"``). What is
stored is a numpy array of :data:`STORAGE`'s dtype of the same width: the dtype itself where
numpy has it, else an unsigned integer holding the bits (bfloat16, complex32, float8). Sizes and
stored dtypes come from here, so that code which only inspects a store (``ckpt show``, ``ckpt
du``, gc, verify) never imports torch; :mod:`ckptstore.format.arrays` builds its torch-keyed tables from
this one.

>>> numpy_dtype("bfloat16"), itemsize("complex64"), nbytes("float16", (3, 4))
(dtype('uint16'), 8, 24)
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from types import MappingProxyType

import numpy as np

from ..errors import ManifestError

__all__ = ["STORAGE", "is_bit_view", "itemsize", "nbytes", "numpy_dtype"]

STORAGE: Mapping[str, str] = MappingProxyType({
    "float64": "float64", "float32": "float32", "float16": "float16", "bfloat16": "uint16",
    "complex128": "complex128", "complex64": "complex64", "complex32": "uint32",
    "int64": "int64", "int32": "int32", "int16": "int16", "int8": "int8",
    "uint64": "uint64", "uint32": "uint32", "uint16": "uint16", "uint8": "uint8", "bool": "bool",
    "float8_e4m3fn": "uint8", "float8_e5m2": "uint8", "float8_e4m3fnuz": "uint8",
    "float8_e5m2fnuz": "uint8",
})
"""``{torch dtype name: numpy dtype name of its stored bits}`` for every dtype ckptstore stores
(``uint16``, ``uint32``, ``uint64`` and the float8 kinds where the installed torch has them)."""

_NUMPY = {name: np.dtype(np_name) for name, np_name in STORAGE.items()}


def numpy_dtype(name: str) -> np.dtype:
    """The numpy dtype whose bits hold tensors of dtype ``name``; :class:`ManifestError` for a
    name ckptstore does not store."""
    try:
        return _NUMPY[name]
    except (KeyError, TypeError):
        raise ManifestError(f"unknown tensor dtype {name!r} in manifest") from None


def itemsize(name: str) -> int:
    """Bytes of one element of dtype ``name``."""
    return numpy_dtype(name).itemsize


def nbytes(name: str, shape: Sequence[int]) -> int:
    """Bytes of a dense tensor of dtype ``name`` and ``shape`` (what reading it costs)."""
    return math.prod(shape) * itemsize(name)


def is_bit_view(name: str) -> bool:
    """True for dtypes numpy lacks, whose bits live in an unsigned integer of the same width."""
    return STORAGE[name] != name
