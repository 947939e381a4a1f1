"""The compiled 16-bit float casts against their numba twins, and on hostile arguments
(issue 28).

The C kernels of the ``floats`` family (``bf16_bits``, ``f16_bits``, ``f32_bits``, ``add16``)
run on the same bit patterns as the numba ones -- every size class, every special value, ties,
subnormals, NaN payloads -- and write the same bits; ``benchmarks/exhaustive_floats.py`` checks
every input (its ``--quick`` sample runs here). Bad sizes, dtypes and overlapping buffers are a
``ValueError``, never a crash.
"""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ckptcodecs import _backend
from ckptcodecs.floats import add_rounded

pytestmark = [pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built"),
              pytest.mark.usefixtures("each_simd_path")]  # every CPU path

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SIZES = st.one_of(st.integers(0, 40), st.integers(0, 5000), st.sampled_from([1 << 16,
                                                                            (1 << 17) + 3]))
TOPS = {True: np.float32(65504.0), False: np.float32(3.3895313892515355e38)}
#: float32 bit patterns that sit on the edges: zeros, subnormals, float16's and bfloat16's
#: limits and ties, infinities, NaNs with and without payload
SPECIAL32 = np.array([0, 0x80000000, 1, 0x007FFFFF, 0x00800000, 0x33000000, 0x33000001,
                      0x387FE000, 0x387FF000, 0x38800000, 0x3F801000, 0x3F803000, 0x3F808000,
                      0x3F818000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x47800000, 0x7F7F7FFF,
                      0x7F7F8000, 0x7F7FFFFF, 0x7F800000, 0x7F800001, 0x7FC00000, 0x7FFFFFFF,
                      0xFF800000, 0xFF800001, 0xFFFFFFFF, 0xC77FF000], np.uint32)
SPECIAL16 = np.array([0, 0x8000, 1, 0x3FF, 0x400, 0x3C00, 0x7BFF, 0x7C00, 0x7C01, 0x7E00,
                      0x7FFF, 0xFC00, 0xFFFF, 0x7F7F, 0x7F80, 0x7F81, 0xFF7F, 0x0080],
                     np.uint16)


def _twins():
    return _backend.implementation("floats", "c"), _backend.implementation("floats", "numba")


def _patterns32(seed: int, n: int) -> np.ndarray:
    """``n`` float32 bit patterns: random bits with the special ones mixed in."""
    rng = np.random.default_rng(seed)
    u = rng.integers(0, 1 << 32, n, dtype=np.uint32)
    if n:
        at = rng.integers(0, n, min(n, 4 * SPECIAL32.size))
        u[at] = rng.choice(SPECIAL32, at.size)
    return u


def _patterns16(seed: int, n: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    h = rng.integers(0, 1 << 16, n, dtype=np.uint32).astype(np.uint16)
    if n:
        at = rng.integers(0, n, min(n, 4 * SPECIAL16.size))
        h[at] = rng.choice(SPECIAL16, at.size)
    return h


def _both(name: str, src: np.ndarray, out_dtype) -> tuple[np.ndarray, np.ndarray]:
    """``name``'s output from ``src`` under C and numba (outputs prefilled with garbage)."""
    outs = []
    for kernels in _twins():
        out = np.full(src.size + 3, 0xA5, out_dtype)
        getattr(kernels, name)(src, out)
        outs.append(out)
    return outs[0], outs[1]


@settings(max_examples=80, deadline=None)
@given(n=SIZES, seed=st.integers(0, 2**32 - 1))
def test_casts_from_float32(n, seed):
    u = _patterns32(seed, n)
    for name in ("bf16_bits", "f16_bits"):
        c, ref = _both(name, u, np.uint16)
        assert c.tobytes() == ref.tobytes(), name
    with np.errstate(all="ignore"):
        want = u.view(np.float32).astype(np.float16).view(np.uint16)
    assert np.array_equal(_both("f16_bits", u, np.uint16)[0][:n], want)


@settings(max_examples=60, deadline=None)
@given(n=SIZES, seed=st.integers(0, 2**32 - 1))
def test_cast_from_float16(n, seed):
    h = _patterns16(seed, n)
    c, ref = _both("f32_bits", h, np.uint32)
    assert c.tobytes() == ref.tobytes()
    assert np.array_equal(c[:n], h.view(np.float16).astype(np.float32).view(np.uint32))


@settings(max_examples=80, deadline=None)
@given(n=SIZES, seed=st.integers(0, 2**32 - 1), half=st.booleans())
def test_add16(n, seed, half):
    base, res = _patterns16(seed, n), _patterns16(seed + 1, n)
    outs = []
    for kernels in _twins():
        out = np.full(n + 3, 0xA5, np.uint16)
        kernels.add16(base, res, half, TOPS[half], out)
        outs.append(out)
    assert outs[0].tobytes() == outs[1].tobytes()
    in_place = base.copy()  # out may be base itself, as add_rounded(out=base) passes it
    _twins()[0].add16(in_place, res, half, TOPS[half], in_place)
    assert in_place.tobytes() == outs[1][:n].tobytes()


def test_add_rounded_in_place_through_the_codec():
    base = _patterns16(3, 1000).view(np.float16)
    res = _patterns16(4, 1000).view(np.float16)
    want = add_rounded(base, res, "float16")
    add_rounded(base, res, "float16", out=base)
    assert base.tobytes() == want.tobytes()


def _hostile():
    u32, u16 = np.zeros(100, np.uint32), np.zeros(100, np.uint16)
    shared = np.zeros(200, np.uint16)
    return {
        "bf16 short out": ("bf16_bits", (u32, np.zeros(99, np.uint16))),
        "f16 wrong input dtype": ("f16_bits", (u16, np.zeros(100, np.uint16))),
        "f32 wrong output dtype": ("f32_bits", (u16, np.zeros(100, np.uint16))),
        "f16 overlap": ("f16_bits", (u32, u32.view(np.uint16)[50:])),
        "f32 read-only out": ("f32_bits", (u16, np.frombuffer(bytes(400), np.uint32))),
        "add16 sizes": ("add16", (u16, u16[:99], True, TOPS[True], np.zeros(100, np.uint16))),
        "add16 short out": ("add16", (u16, u16, False, TOPS[False], np.zeros(99, np.uint16))),
        "add16 shifted out": ("add16", (shared[:100], u16, True, TOPS[True], shared[1:101])),
        "add16 wrong dtype": ("add16", (u32, u32, True, TOPS[True], np.zeros(100, np.uint32))),
    }


@pytest.mark.parametrize("case", sorted(_hostile()))
def test_hostile_arguments_raise_value_error(case):
    name, args = _hostile()[case]
    with pytest.raises(ValueError):
        getattr(_twins()[0], name)(*args)


def test_exhaustive_script_quick_sample():
    """``benchmarks/exhaustive_floats.py --quick``: every check on its sample, no mismatch."""
    run = subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "exhaustive_floats.py"),
                          "--quick"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "mismatches: {'f16': 0, 'bf16': 0, 'f32': 0" in run.stdout
