"""A uniform 8-bit Quantize chunk: quantize's steps against the one compiled call (issue 28),
side by side in one run, on each CPU path this machine runs.

Usage::

    .venv/bin/python benchmarks/uniform_chunk.py              # ~1 minute
    .venv/bin/python benchmarks/uniform_chunk.py --repeat 9

What is measured: the CPU seconds (this thread's, ``time.thread_time``) per 256 MB of float32
to turn 8 MB chunks (16,384 rows of 128 values) into stored bytes, the median of ``--repeat``
rounds in which every variant runs once in turn: "steps" is
``rle_huffman_encode(encode_chunk(*quantize(x, "uniform-asymmetric", 8)), 0.08)`` (the kernels
one call at a time, as before), "one call" ``encode_uniform_chunk(x, ..., entropy=True,
min_saving=0.08)``, on the CPU paths ``sse2`` (the baseline build of its loops) and ``avx2``;
and how many times each releases the GIL a chunk (the calls that take it back, counted with
``sys.setprofile`` on C calls: every C function the steps call that releases it). Two kinds of
rows: a bell curve (the entropy gate stores the codes raw), rows of few values (coded), and the
bell curve as bfloat16 (4 MB chunks of the same rows; "per 256 MB" is of float32's size).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import numpy as np

from ckptcodecs import _backend, encode_chunk, encode_uniform_chunk, quantize, rle_huffman_encode
from ckptcodecs.floats import to_bf16_bits

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402

CHUNKS = 4
ROWS, COLS = 16384, 128  # 8 MB of float32 a chunk
PER_256MB = 256 / (CHUNKS * ROWS * COLS * 4 / 2**20)


KINDS = ("bell curve (stored raw)", "rows of few values (coded)",
         "bfloat16 bell curve (stored raw)")


def _chunks(kind: str) -> list[np.ndarray]:
    """The chunks of a kind of rows: float32, or bfloat16 bits (a uint16 array)."""
    rng = np.random.default_rng(0)
    if kind == "rows of few values (coded)":
        return [np.repeat(np.round(rng.normal(0, 2, (ROWS, COLS // 16))), 16, axis=1)
                .astype(np.float32) for _ in range(CHUNKS)]
    chunks = [rng.normal(0, 0.05, (ROWS, COLS)).astype(np.float32) for _ in range(CHUNKS)]
    return [to_bf16_bits(c) for c in chunks] if kind.startswith("bfloat16") else chunks


def _dtype(x: np.ndarray) -> str | None:
    return "bfloat16" if x.dtype == np.uint16 else None


def _steps(x: np.ndarray) -> bytes:
    chunk = encode_chunk(*quantize(x, "uniform-asymmetric", 8, dtype=_dtype(x)))
    return rle_huffman_encode(chunk, 0.08)


def _one_call(x: np.ndarray) -> bytes:
    return encode_uniform_chunk(x, "uniform-asymmetric", 8, entropy=True, min_saving=0.08,
                                dtype=_dtype(x))


def _gil_calls(fn, x: np.ndarray) -> int:
    """C functions called by ``fn(x)`` (each may release and take back the GIL)."""
    calls = [0]

    def profile(frame, event, arg) -> None:
        if event == "c_call":
            calls[0] += 1

    sys.setprofile(profile)
    try:
        fn(x)
    finally:
        sys.setprofile(None)
    return calls[0]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    args = ap.parse_args(argv)
    if _backend.CHOICE != "c":
        print("needs the compiled kernels (CKPTCODECS_KERNELS=c)", file=sys.stderr)
        return 1
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    native = _backend.native()
    paths = [p for p in ("sse2", "avx2") if p in native.simd_paths()]
    rows = []
    for kind in KINDS:
        chunks = _chunks(kind)
        assert all(_one_call(c) == _steps(c) for c in chunks)  # the same bytes
        variants = {f"{name}, {path}": (fn, path) for path in paths
                    for name, fn in (("steps", _steps), ("one call", _one_call))}
        times: dict[str, list[float]] = {v: [] for v in variants}
        for _ in range(args.repeat):
            for name, (fn, path) in variants.items():
                native.set_simd(path)
                t0 = time.thread_time()
                for c in chunks:
                    fn(c)
                times[name].append((time.thread_time() - t0) * PER_256MB)
        native.set_simd("auto")
        base = statistics.median(times[f"steps, {paths[0]}"])
        for name, (fn, _) in variants.items():
            t = statistics.median(times[name])
            rows.append([kind, name, f"{t:.3f}", f"{base / t:.2f}x",
                         str(_gil_calls(fn, chunks[0]))])
    print(markdown_table(["rows", "encoder, CPU path", "CPU-s per 256 MB",
                          f"speed against the steps on {paths[0]}",
                          "C calls a chunk (GIL releases at most)"], rows, "llrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
