"""CKPTCODECS_KERNELS chooses the kernels' implementation, once, in ckptcodecs._backend (issue 28).

The codec suite runs under the implementation this process chose (C where it is built); the
codec tests of the ported families -- golden fixtures included -- run again here, in a
subprocess, under the other one.
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest

from ckptcodecs import CodecError, _backend

HERE = Path(__file__).resolve().parent
#: the codec tests of the families with C kernels (bytegroup, bitpack, delta, rle_huffman),
#: golden data too
PORTED = ["test_codec_bitpack.py", "test_codec_delta.py", "test_codec_planes.py",
          "test_codec_planes_region.py", "test_codec_qdelta.py", "test_codec_backcompat.py",
          "test_codec_rle_huffman.py"]


@pytest.fixture
def environment(monkeypatch):
    """Set the two variables (None: unset) and, with ``built=False``, hide the extension."""

    def set_(kernels: str | None, simd: str | None = None, built: bool = True) -> None:
        for name, value in ((_backend.KERNELS_ENV, kernels), (_backend.SIMD_ENV, simd)):
            if value is None:
                monkeypatch.delenv(name, raising=False)
            else:
                monkeypatch.setenv(name, value)
        if not built:
            monkeypatch.setitem(sys.modules, "ckptcodecs._native", None)  # import fails

    return set_


def test_this_process_runs_what_the_variable_asks():
    asked = os.environ.get(_backend.KERNELS_ENV, "")
    expected = asked or ("c" if _backend.native() is not None else "numba")
    assert _backend.CHOICE == expected
    ref = _backend.implementation("bitpack", "numba")
    from ckptcodecs import bitpack
    assert (bitpack._K.pack is ref.pack) == (expected == "numba")


@pytest.mark.parametrize("value", ["c", "C", " numba "])
def test_explicit_choice(environment, value):
    if value.strip().lower() == "c" and _backend.native() is None:
        pytest.skip("ckptcodecs' compiled kernels are not built")
    environment(value)
    assert _backend._choose() == value.strip().lower()


def test_default_is_c_where_built(environment):
    environment(None)
    assert _backend._choose() == ("c" if _backend.native() is not None else "numba")


def test_without_the_extension_numba_runs_with_one_warning(environment):
    environment("", built=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert _backend._choose() == "numba"
    assert [type(w.message) for w in caught] == [RuntimeWarning]
    assert "pip install" in str(caught[0].message)


def test_without_the_extension_nor_numba_the_import_says_how_to_build(environment, monkeypatch):
    environment("", built=False)
    monkeypatch.setattr(_backend.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(CodecError, match="numba .* is not installed: reinstall with"):
        _backend._choose()


def test_c_asked_without_the_extension_is_an_error(environment):
    environment("c", built=False)
    with pytest.raises(CodecError, match="not built"):
        _backend._choose()
    with pytest.raises(CodecError, match="not built"):
        _backend.implementation("delta", "c")


@pytest.mark.parametrize("kernels, simd", [("cuda", None), ("c", "avx9"), ("numba", "sse")])
def test_unknown_values_are_refused(environment, kernels, simd):
    environment(kernels, simd)
    check = _backend._simd if simd else _backend._choose
    with pytest.raises(CodecError, match="expected one of"):
        check()


def test_simd_values(environment):
    environment(None, " AVX2 ")
    assert _backend._simd() == "avx2"
    environment(None, None)
    assert _backend._simd() == "auto"


@pytest.mark.skipif(_backend.native() is None, reason="ckptcodecs' compiled kernels are not built")
def test_each_simd_path_this_cpu_runs_can_be_chosen():
    native = _backend.native()
    before, paths = native.simd(), native.simd_paths()
    assert paths[0] == "portable" and set(paths) <= {"portable", "sse2", "avx2", "avx512"}
    try:
        for path in paths:
            _backend.use_simd(path)
            assert native.simd() == path
        _backend.use_simd("auto")
        assert native.simd() == paths[-1]  # the best
        with pytest.raises(CodecError, match="this CPU runs"):
            _backend.use_simd("neon")
    finally:
        _backend.use_simd(before)


@pytest.mark.skipif(_backend.native() is None, reason="ckptcodecs' compiled kernels are not built")
@pytest.mark.skipif(not os.path.exists("/proc/cpuinfo"), reason="no /proc/cpuinfo to compare with")
def test_the_avx2_path_needs_the_features_its_code_is_compiled_for():
    """CK_TARGET_AVX2 compiles for AVX2 with BMI1 and BMI2: a CPU (or a VM's CPU model) with
    AVX2 but without them must not be offered the path."""
    with open("/proc/cpuinfo") as f:
        flags = set(next((line.split(":", 1)[1].split() for line in f
                          if line.startswith("flags")), []))
    if not flags or "sse2" not in flags:
        pytest.skip("not an x86-64 CPU")
    paths = _backend.native().simd_paths()
    assert ("avx2" in paths) == ({"avx2", "bmi1", "bmi2"} <= flags)


def test_this_process_runs_the_simd_path_asked_for():
    if _backend.CHOICE != "c":
        pytest.skip("the numba kernels have no CPU paths")
    native = _backend.native()
    assert native.simd() == (native.simd_paths()[-1] if _backend.SIMD == "auto"
                             else _backend.SIMD)


def test_unknown_family_or_implementation():
    with pytest.raises(CodecError):
        _backend.implementation("huffman", "numba")
    with pytest.raises(CodecError):
        _backend.implementation("bitpack", "fortran")


@pytest.mark.parametrize("other", ["c", "numba"])
def test_ported_codec_tests_pass_under_the_other_implementation(other):
    if other == _backend.CHOICE:
        pytest.skip(f"the suite itself runs under {other}")
    if other == "c" and _backend.native() is None:
        pytest.skip("ckptcodecs' compiled kernels are not built")
    env = {**os.environ, _backend.KERNELS_ENV: other}
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist",
         *[str(HERE / name) for name in PORTED], str(Path(__file__)),
         "-k", "not other_implementation"],
        env=env, cwd=HERE.parents[1], capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    assert " passed" in run.stdout and "failed" not in run.stdout
