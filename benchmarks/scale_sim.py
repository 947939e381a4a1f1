"""Scale simulation: sharded commits of 1,024 (or --ranks) simulated ranks built in one process.

Usage::

    .venv/bin/python benchmarks/scale_sim.py                 # 1,024 ranks, 26 tables
    .venv/bin/python benchmarks/scale_sim.py --ranks 128 --tables 8     # quick run

What it does: every simulated rank holds a row shard of each of ``--tables`` embedding tables
(``--rows-per-rank`` rows x 64 float32, small so the run fits in memory) and the coordinator
writes ``--dense`` replicated dense tensors once (spread over the ranks). Each rank's part goes
through the real write path (:func:`ckptstore.dcp.shards.commit_shards`: plan, encode, persist into
its own arrays and packed array), against ``memory://`` with every storage call counted. The run
makes ``--commits`` commits, then gc keeping the last one, and reports per commit: objects
written, requests by kind, manifest bytes, the time to assemble/encode/decode the manifest, and
gc's requests. The object count per shard is then extrapolated to ``--target-tb`` of tables: a
shard's chunks scale with its bytes (8 MiB chunks), the manifest does not (an entry records the
chunk shape, never a per-chunk list).
"""

from __future__ import annotations

import argparse
import collections
import math
import os
import pickle
import sys
import time
import uuid

import torch

import ckptstore
from ckptstore.format.arrays import CHUNK_BYTES
from ckptstore.format.layout import manifest_key
from ckptstore.history.manifest import decode_manifest
from ckptstore.dcp.shards import LocalTensor, commit_shards

_COUNTED = ("read", "exists", "size", "listdir", "walk_sizes", "put", "put_chunk",
            "put_if_absent", "delete", "delete_tree")


def count_requests(storage) -> collections.Counter:
    """Wrap a storage's methods so that every call is counted by name."""
    counts: collections.Counter = collections.Counter()
    for name in _COUNTED:
        real = getattr(storage, name)

        def counted(*a, _real=real, _name=name, **k):
            counts[_name] += 1
            return _real(*a, **k)
        setattr(storage, name, counted)
    return counts


def ranks_state(n: int, tables: int, rows: int, dense: int, step: int) -> list[list[LocalTensor]]:
    g = torch.Generator().manual_seed(step)
    out: list[list[LocalTensor]] = [[] for _ in range(n)]
    for t in range(tables):
        for r in range(n):
            out[r].append(LocalTensor(f"emb{t}.weight", (r * rows, 0), (n * rows, 64),
                                      torch.randn(rows, 64, generator=g)))
    for d in range(dense):  # replicated dense tensors: DCP's dedup gives each to one rank
        out[d % n].append(LocalTensor(f"dense{d}.weight", (0, 0), (256, 256),
                                      torch.randn(256, 256, generator=g)))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--tables", type=int, default=26)
    ap.add_argument("--rows-per-rank", type=int, default=16)
    ap.add_argument("--dense", type=int, default=64)
    ap.add_argument("--commits", type=int, default=3)
    ap.add_argument("--target-tb", type=float, default=10.0)
    args = ap.parse_args()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    store = ckptstore.open(f"memory://scale-{uuid.uuid4().hex}", io_workers=2)
    counts = count_requests(store.storage)
    rows = []
    for c in range(args.commits):
        parts = ranks_state(args.ranks, args.tables, args.rows_per_rank, args.dense, c)
        counts.clear()
        t0 = time.perf_counter()
        m = commit_shards(store, parts, message=f"commit {c}")
        elapsed = time.perf_counter() - t0
        raw = store.storage.read(manifest_key(m.id))
        t1 = time.perf_counter()
        decode_manifest(raw)
        decode_s = time.perf_counter() - t1
        rows.append((dict(counts), len(raw), elapsed, decode_s, m))
    # what DCP gathers on the coordinator: every rank's write results (PartEntry objects)
    from ckptstore.dcp.shards import PartEntry
    m = rows[-1][4]
    sample = [PartEntry(e.path, (0, 0), False, e, None) for e in m.shards[: args.tables]]
    gathered_per_rank = len(pickle.dumps(sample))
    t0 = time.perf_counter()
    from ckptstore.dcp.shards import assemble_manifest  # assembly alone, from the gathered parts
    packs = {p.array: p for p in m.packs}
    parts = [PartEntry(e.path.split("@")[0], tuple(p.offsets), False, e, packs.get(e.array))
             for t in m.tensors if t.pieces for p, e in
             ((p, m.shards[p.entry]) for p in t.pieces)]
    whole = [PartEntry(t.path, (0, 0), True, t, packs.get(t.array))
             for t in m.tensors if not t.pieces]
    shapes = {t.path: t.shape for t in m.tensors}
    assemble_manifest(m.id, None, "", {}, m.tree, shapes, parts + whole)
    assemble_s = time.perf_counter() - t0
    counts.clear()
    t0 = time.perf_counter()
    store.gc(keep_last=1, grace_period=0)
    gc_s = time.perf_counter() - t0
    gc_counts = dict(counts)

    n_shards = args.ranks * args.tables
    print(f"\n{args.ranks} ranks x {args.tables} tables ({n_shards} shards) + {args.dense} "
          f"dense tensors, {args.commits} commits, memory:// with every request counted\n")
    print("| commit | objects written | reads | lists | manifest KB | commit s (1 process) | "
          "manifest decode ms |")
    print("|---|---|---|---|---|---|---|")
    for i, (cnt, size, el, dec, _) in enumerate(rows):
        writes = cnt.get("put_chunk", 0) + cnt.get("put", 0) + cnt.get("put_if_absent", 0)
        print(f"| {i} | {writes} | {cnt.get('read', 0) + cnt.get('exists', 0)} | "
              f"{cnt.get('listdir', 0)} | {size / 1e3:.0f} | {el:.1f} | {dec * 1e3:.0f} |")
    print(f"\nmanifest assembly on the coordinator from the gathered parts: {assemble_s * 1e3:.0f} ms;"
          f" results one rank sends ({args.tables} shard entries, pickled by DCP's gather): "
          f"{gathered_per_rank / 1e3:.1f} KB")
    print(f"gc keeping 1 of {args.commits} commits: {gc_s:.1f} s, requests {gc_counts}")
    # extrapolation to the target size
    shard_bytes = args.target_tb * 1e12 / n_shards
    chunks = math.ceil(shard_bytes / CHUNK_BYTES)
    objects = n_shards * (chunks + 1) + args.ranks + 2
    print(f"\nat {args.target_tb:g} TB of tables over the same shards: {shard_bytes / 1e9:.2f} GB "
          f"per shard = {chunks} chunks of 8 MiB; objects per full commit = shards x (chunks + "
          f"zarr.json) + packed arrays + manifest + ref = {objects:,} "
          f"({objects / args.ranks:,.0f} PUTs per rank); the manifest stays "
          f"{rows[-1][1] / 1e3:.0f} KB")


if __name__ == "__main__":
    main()
