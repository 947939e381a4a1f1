"""Codec tests: make ``common`` (shared helpers) importable without a package ``__init__``."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))


def _simd_paths() -> list[str]:
    from ckptcodecs import _backend

    native = _backend.native()
    return native.simd_paths() if native is not None and _backend.CHOICE == "c" else ["none"]


@pytest.fixture(scope="module", params=_simd_paths())
def each_simd_path(request):
    """Every test of a module once per CPU path of the compiled kernels this machine runs
    (``CKPTCODECS_SIMD``'s values; restored after): ``pytestmark =
    pytest.mark.usefixtures("each_simd_path")``."""
    from ckptcodecs import _backend

    if request.param == "none":  # numba, or no extension: no paths
        yield request.param
        return
    before = _backend.native().simd()
    _backend.use_simd(request.param)
    yield request.param
    _backend.use_simd(before)
