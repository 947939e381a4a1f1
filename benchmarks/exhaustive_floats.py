"""The compiled 16-bit float casts on every input (issue 28): C against its references.

Usage::

    nice -n 10 python benchmarks/exhaustive_floats.py           # every input (minutes)
    python benchmarks/exhaustive_floats.py --quick              # a sample (seconds)

Checks, in chunks of 2**24 inputs (vectorised numpy), each printing its progress and its count
of mismatches:

- ``f16``: all 2**32 float32 bit patterns cast to float16 by the C kernel against numpy's
  ``astype(np.float16)``;
- ``bf16``: all 2**32 float32 bit patterns cast to bfloat16 by the C kernel against the numba
  kernel (and against the numpy rule ``bf16_bits_numpy`` under ``--quick``);
- ``f32``: all 2**16 float16 bit patterns cast to float32 against numpy's ``astype`` and the
  numba kernel;
- ``add16 float16`` and ``add16 bfloat16``: the residual sum of all 2**32 pairs of 16-bit
  patterns against the numba kernel (and ``add_rounded_numpy`` under ``--quick``).

``--quick`` runs each on a sample: every exponent and sign with the lowest and highest
mantissas and those around float16's rounding bit, plus random patterns. Exit status 1 when any
check has a mismatch.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable, Iterator

import numpy as np

from ckptcodecs import _backend, _floats

CHUNK = 1 << 24
_LARGEST = {True: np.float32(65504.0), False: np.float32(3.3895313892515355e38)}


def _quick_f32_patterns(rng: np.random.Generator) -> np.ndarray:
    """Float32 bit patterns of every sign and exponent with edge mantissas, and random ones."""
    low = np.arange(256, dtype=np.uint32)
    mant = np.concatenate([low, 0x7FFFFF - low, 0xFFF + low - 128, 0x1FFF + low - 128,
                           0x7FFF + low - 128, 0xFFFF + low - 128]).astype(np.uint32)
    heads = np.arange(512, dtype=np.uint32) << np.uint32(23)
    edges = (heads[:, None] | mant[None, :]).reshape(-1)
    return np.concatenate([edges, rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint32)])


def _chunks(quick: bool, total_bits: int, sample: Callable[[], np.ndarray]
            ) -> Iterator[np.ndarray]:
    """The inputs, 2**24 at a time (all ``2**total_bits``), or the sample under ``quick``."""
    if quick:
        yield sample()
        return
    step = np.arange(min(CHUNK, 1 << total_bits), dtype=np.uint32)
    for start in range(0, 1 << total_bits, CHUNK):
        yield step + np.uint32(start)


def _cast_check(name: str, c_kernel, references: list[Callable[[np.ndarray], np.ndarray]],
                inputs: Iterator[np.ndarray], out_dtype) -> int:
    """Mismatches of ``c_kernel(u, out)`` against each reference over all ``inputs``."""
    bad, done, t0 = 0, 0, time.monotonic()
    for u in inputs:
        got = np.empty(u.size, out_dtype)
        c_kernel(u, got)
        for ref in references:
            bad += int(np.count_nonzero(got != ref(u)))
        done += u.size
        if done % (1 << 28) == 0 or u.size < CHUNK:
            print(f"  {name}: {done:>11} inputs, {bad} mismatches, "
                  f"{time.monotonic() - t0:.0f} s", flush=True)
    return bad


def _numba_cast(kernel, out_dtype) -> Callable[[np.ndarray], np.ndarray]:
    def run(u: np.ndarray) -> np.ndarray:
        out = np.empty(u.size, out_dtype)
        kernel(u, out)
        return out
    return run


def _pairs(u: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (base, residual) 16-bit patterns of the 32-bit pair indices ``u``."""
    return (u >> np.uint32(16)).astype(np.uint16), (u & np.uint32(0xFFFF)).astype(np.uint16)


def _add_check(half: bool, c, ref, quick: bool, rng: np.random.Generator) -> int:
    """Mismatches of the C residual sum against numba's (and numpy's steps under ``quick``)."""
    top = _LARGEST[half]
    dtype = "float16" if half else "bfloat16"

    def c_kernel(u: np.ndarray, out: np.ndarray) -> None:
        c.add16(*_pairs(u), half, top, out)

    def numba_ref(u: np.ndarray) -> np.ndarray:
        out = np.empty(u.size, np.uint16)
        ref.add16(*_pairs(u), half, top, out)
        return out

    def numpy_ref(u: np.ndarray) -> np.ndarray:
        b, r = _pairs(u)
        if half:
            b, r = b.view(np.float16), r.view(np.float16)
        return _floats.add_rounded_numpy(b, r, dtype).view(np.uint16)

    def sample() -> np.ndarray:
        every_base = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
        some = rng.integers(0, 1 << 16, 16, dtype=np.uint32)
        grid = (every_base[:, None] | some[None, :]).reshape(-1)
        return np.concatenate([grid, rng.integers(0, 1 << 32, 1 << 20, dtype=np.uint32)])

    refs = [numba_ref, numpy_ref] if quick else [numba_ref]
    return _cast_check(f"add16 {dtype}", c_kernel, refs, _chunks(quick, 32, sample), np.uint16)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="a sample instead of every input")
    parser.add_argument("--seed", type=int, default=0, help="the sample's random seed")
    args = parser.parse_args(argv)
    c, ref = _backend.implementation("floats", "c"), _backend.implementation("floats", "numba")
    rng = np.random.default_rng(args.seed)
    t0 = time.monotonic()
    bad: dict[str, int] = {}
    with np.errstate(all="ignore"):
        bad["f16"] = _cast_check(
            "f16", c.f16_bits, [lambda u: u.view(np.float32).astype(np.float16).view(np.uint16)],
            _chunks(args.quick, 32, lambda: _quick_f32_patterns(rng)), np.uint16)
        bf16_refs = [_numba_cast(ref.bf16_bits, np.uint16)]
        if args.quick:
            bf16_refs.append(lambda u: _floats.bf16_bits_numpy(u.view(np.float32)))
        bad["bf16"] = _cast_check("bf16", c.bf16_bits, bf16_refs,
                                  _chunks(args.quick, 32, lambda: _quick_f32_patterns(rng)),
                                  np.uint16)
        halves = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16)
        bad["f32"] = _cast_check(
            "f32", c.f32_bits,
            [lambda h: h.view(np.float16).astype(np.float32).view(np.uint32),
             _numba_cast(ref.f32_bits, np.uint32)], iter([halves]), np.uint32)
        for half in (True, False):
            name = "add16 float16" if half else "add16 bfloat16"
            bad[name] = _add_check(half, c, ref, args.quick, rng)
    print(f"mismatches: {bad}; {time.monotonic() - t0:.0f} s "
          f"({'sample' if args.quick else 'every input'})")
    return 1 if any(bad.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
