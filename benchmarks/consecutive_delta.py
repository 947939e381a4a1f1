"""Consecutive increments with ``delta=True`` on a tracked embedding table (issue 26 item 14).

A 200,000 x 64 fp32 ``nn.Embedding`` (sparse SGD, lr 1e-3, a ``ckptstore.track`` row tracker);
each interval looks up 60,000 ids drawn from a Zipf-like law (p ~ 1/k^0.6 over a fixed
permutation of the rows), touching ~22 % of the rows; 4 intervals, one commit each to an
in-memory store. Prints the raw table bytes over each increment's stored bytes (mean of the 4)
under ``Policy(incremental="consecutive", delta=True)``, ``Policy(incremental="consecutive")``
and ``Policy(delta=True)``, and zstd-3 of the byte-grouped XOR of consecutive versions
(``benchmarks/lossless.py``'s reference).

    .venv/bin/python benchmarks/consecutive_delta.py
"""

from __future__ import annotations

import statistics
import sys
import uuid
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).parent))

ROWS, DIM, INTERVALS, LOOKUPS = 200_000, 64, 4, 60_000


def lookups() -> list[torch.Tensor]:
    rng = np.random.default_rng(0)
    perm = rng.permutation(ROWS)
    p = 1.0 / np.arange(1, ROWS + 1) ** 0.6
    p /= p.sum()
    return [torch.from_numpy(perm[rng.choice(ROWS, LOOKUPS, p=p)]) for _ in range(INTERVALS)]


def run(policy, ids: list[torch.Tensor]) -> tuple[list[int], list[np.ndarray]]:
    """Stored bytes of each commit and the table after each interval."""
    import ckptstore

    torch.manual_seed(0)
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    with torch.no_grad():
        emb.weight.mul_(0.01)
    model = torch.nn.ModuleDict({"emb": emb})
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    tracker = ckptstore.track(model, opt)
    store = ckptstore.open(f"memory://consecutive-delta-{uuid.uuid4().hex}", policy=policy)
    sizes = [store.commit({"model": model}, tracker=tracker).stored_bytes]
    states = [emb.weight.detach().numpy().copy()]
    for batch in ids:
        emb(batch).pow(2).sum().backward()
        opt.step()
        opt.zero_grad()
        sizes.append(store.commit({"model": model}, tracker=tracker).stored_bytes)
        states.append(emb.weight.detach().numpy().copy())
    return sizes, states


def main() -> None:
    from lossless import zstd3_grouped_xor

    from ckptstore import Policy

    ids = lookups()
    raw = ROWS * DIM * 4
    print("| encoding | ratio per interval |\n|:--|--:|")
    states: list[np.ndarray] = []
    for label, policy in (
            ("Policy(incremental='consecutive', delta=True)",
             Policy(incremental="consecutive", delta=True)),
            ("Policy(incremental='consecutive')", Policy(incremental="consecutive")),
            ("Policy(delta=True)", Policy(delta=True))):
        sizes, states = run(policy, ids)
        print(f"| {label} | {statistics.mean(raw / s for s in sizes[1:]):.1f}× |")
    ref = [zstd3_grouped_xor({"e": states[i]}, {"e": states[i - 1]})
           for i in range(1, INTERVALS + 1)]
    print(f"| zstd-3 of the byte-grouped XOR | {statistics.mean(raw / s for s in ref):.1f}× |")
    touched = [float(np.any(b != a, axis=1).mean()) for a, b in zip(states, states[1:])]
    print("rows touched per interval: " + ", ".join(f"{100 * t:.1f} %" for t in touched))


if __name__ == "__main__":
    main()
