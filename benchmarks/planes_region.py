"""Byte-planes decodes of a block of columns against the whole chunk (issue 10's resharded loads).

Usage::

    .venv/bin/python benchmarks/planes_region.py          # a few seconds

What is measured, side by side, best of ``--repeat`` per row, one thread, on a chunk of
``--rows`` x ``--cols`` random values (the shape of one stored chunk of a 64-wide embedding
shard) for fp32, fp16 and fp64:

* the whole chunk decoded into a preallocated array (``planes_decode``);
* half of its columns the way a resharded load read them before region decodes: the whole chunk
  decoded, then the slice copied into the target;
* the same half decoded straight into the target (``planes_decode_region``).
"""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import best_time, command_line, machine_description, markdown_table  # noqa: E402

from ckptcodecs import planes_decode, planes_decode_region, planes_encode  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=25_000)
    ap.add_argument("--cols", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=30)
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rng = np.random.default_rng(0)
    shape, half = (args.rows, args.cols), args.cols // 2
    rows = []
    for dtype in (np.float32, np.float16, np.float64):
        x = rng.standard_normal(shape).astype(dtype)
        enc = planes_encode(x, x.dtype.itemsize)
        whole = np.empty_like(x)
        target = np.empty((args.rows, half), dtype)

        def old_way() -> None:
            np.copyto(target, planes_decode(enc, whole).view(dtype).reshape(shape)[:, :half])

        def region() -> None:
            planes_decode_region(enc, shape, (0, args.rows), (0, half), target)

        region()
        assert np.array_equal(target.view(np.uint8), x[:, :half].copy().view(np.uint8))
        t_whole = best_time(lambda: planes_decode(enc, whole), args.repeat)
        t_old, t_region = best_time(old_way, args.repeat), best_time(region, args.repeat)
        rows.append([np.dtype(dtype).name, f"{x.nbytes / 1e6:.1f}", f"{1e3 * t_whole:.2f}",
                     f"{1e3 * t_old:.2f}", f"{1e3 * t_region:.2f}", f"{t_old / t_region:.2f}×"])
    print(markdown_table(["dtype", "chunk MB", "whole decode ms", "half: decode + copy ms",
                          "half: region decode ms", "region speed-up"], rows, "lrrrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
