"""The numba reference kernels are deferred (``ckptcodecs._jit``, issue 28): numba is imported
and the kernels compiled only when one runs, every module's globals then hold the dispatchers
(so kernels that call kernels compile), and without numba a numba kernel is a clear
CodecError while the C kernels run."""

from __future__ import annotations

import subprocess
import sys
import textwrap

import numpy as np
import pytest
from ckptcodecs import _backend, _jit, bitpack


def _run(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, timeout=300)


def test_a_deferred_kernel_compiles_on_its_first_call_and_replaces_itself():
    ref = _backend.implementation("bitpack", "numba")
    assert isinstance(ref.pack, _jit.Deferred)
    codes = np.arange(40, dtype=np.uint8) % 8
    out = np.zeros(15, np.uint8)
    ref.pack(codes, 3, out)
    assert ref.pack.dispatcher is not None and "compiled" in repr(ref.pack)
    assert type(bitpack._pack).__name__ == "CPUDispatcher"  # the module's global, for numba
    back = np.zeros(40, np.uint8)
    ref.unpack(out, 3, 40, back)
    np.testing.assert_array_equal(back, codes)


@pytest.mark.skipif(_backend.native() is None, reason="needs the compiled kernels")
def test_without_numba_the_c_kernels_run_and_a_numba_kernel_says_what_is_missing():
    run = _run("""
        import sys
        sys.modules["numba"] = None  # as if numba were not installed
        import numpy as np
        from ckptcodecs import CodecError, _backend, pack_bits, unpack_bits
        codes = np.arange(100, dtype=np.uint8) % 16
        assert (unpack_bits(pack_bits(codes, 4), 4, 100) == codes).all()
        try:
            _backend.implementation("bitpack", "numba").pack(codes, 4, np.zeros(50, np.uint8))
        except CodecError as err:
            print("refused:", err)
    """)
    assert run.returncode == 0, run.stderr
    assert "refused: the numba reference kernels need numba" in run.stdout


def test_importing_the_codecs_imports_no_numba():
    run = _run("""
        import sys
        import ckptcodecs, ckptcodecs.adaptive, ckptcodecs.kmeans, ckptcodecs.planes
        import ckptcodecs.quantization, ckptcodecs.zarr3
        print("numba" in sys.modules, "llvmlite" in sys.modules)
    """)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["False", "False"]
