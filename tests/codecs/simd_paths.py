"""The CPU-path fixture of the compiled kernels' tests, a plugin of its own: tests/codecs/conftest.py
imports it, and the sanitizer run (asan_fuzz.py, without conftest files) loads it with ``-p``."""

from __future__ import annotations

import pytest


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
