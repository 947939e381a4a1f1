"""DynaQuant's sensitivity ranking against magnitude ranking, side by side on one trained model.

Usage::

    .venv/bin/python benchmarks/sensitivity.py
    .venv/bin/python benchmarks/sensitivity.py --seeds 3 --prune 0.3 0.5 0.7 0.8 --bits 3 4

What is measured
----------------
* A real task: scikit-learn's bundled digits (1,797 8x8 images; 70/30 split), an MLP
  64-512-512-10 trained with Adam (lr 1e-3, batches of 64) for ``--epochs`` epochs. A
  :class:`ckptstore.GradientEMA` (beta 0.9) records ``|grad|`` over the last 50 batches only
  (DynaQuant's window; paused before).
* The trained state is committed once per configuration: k-means ``--bits`` per tensor
  (DynaQuant's quantizer), a ``--prune`` share pruned and 0.1 % protected, ranked by magnitude
  (``Policy(quantize=...)``) or by sensitivity (``Policy(quantize=..., sensitivity=ema)``); the
  checkout is evaluated on the held-out 30 %.
* Printed per configuration: test accuracy and loss of each ranking, their difference, and the
  stored bytes (the same format: the ranking changes which values are pruned, not the size).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile

import numpy as np
import torch

import ckptstore
from ckptstore import GradientEMA, Policy, QuantSpec


def _data(seed: int):
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    rng = np.random.default_rng(seed)
    order = rng.permutation(len(x))
    x = torch.tensor(x[order] / 16.0, dtype=torch.float32)
    y = torch.tensor(y[order])
    cut = int(0.7 * len(x))
    return x[:cut], y[:cut], x[cut:], y[cut:]


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(64, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 512), torch.nn.ReLU(),
                               torch.nn.Linear(512, 10))


def _evaluate(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, float]:
    with torch.no_grad():
        out = model(x)
        return (float((out.argmax(1) == y).float().mean()) * 100,
                float(torch.nn.functional.cross_entropy(out, y)))


def _train(seed: int, epochs: int, window: int):
    xtr, ytr, xte, yte = _data(seed)
    model = _model(seed)
    emas = {kind: GradientEMA(model, beta=0.9, score=kind) for kind in ("fisher", "taylor")}
    for ema in emas.values():
        ema.pause()
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(seed)
    batches = [(xtr[i], ytr[i]) for _ in range(epochs)
               for i in torch.randperm(len(xtr), generator=g).split(64)]
    for step, (xb, yb) in enumerate(batches):
        if step == max(0, len(batches) - window):
            for ema in emas.values():  # DynaQuant records the last ~50 batches before a checkpoint
                ema.resume()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(xb), yb).backward()
        opt.step()
    return model, emas, xte, yte


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--epochs", type=int, default=20)
    p.add_argument("--bits", type=int, nargs="+", default=[3, 4])
    p.add_argument("--prune", type=float, nargs="+", default=[0.3, 0.5, 0.7, 0.8])
    p.add_argument("--protect", type=float, default=0.001)
    p.add_argument("--window", type=int, default=50,
                   help="batches before the checkpoint that the gradient averages see")
    args = p.parse_args()
    rows: dict[tuple[int, float], dict[str, list[float]]] = {}
    refs = []
    for seed in range(args.seeds):
        model, emas, xte, yte = _train(seed, args.epochs, args.window)
        refs.append(_evaluate(model, xte, yte))
        with tempfile.TemporaryDirectory() as d:
            store = ckptstore.open(d)
            for bits in args.bits:
                for prune in args.prune:
                    spec = QuantSpec("kmeans", bits, "tensor", prune=prune, protect=args.protect)
                    r = rows.setdefault((bits, prune), {})
                    policies = {"magnitude": Policy(quantize=spec, min_quant_bytes=0)}
                    policies |= {kind: Policy(quantize=spec, min_quant_bytes=0, sensitivity=ema)
                                 for kind, ema in emas.items()}
                    for name, policy in policies.items():
                        info = store.commit({"model": model}, policy=policy)
                        restored = _model(seed)
                        store.checkout(info.id, into={"model": restored})
                        acc, loss = _evaluate(restored, xte, yte)
                        r.setdefault(f"{name} acc", []).append(acc)
                        r.setdefault(f"{name} loss", []).append(loss)
                        r.setdefault(f"{name} bytes", []).append(info.stored_bytes)
    ref_acc = statistics.mean(a for a, _ in refs)
    ref_loss = statistics.mean(lo for _, lo in refs)
    print(f"reference (no checkpoint), mean of {args.seeds} seeds: accuracy {ref_acc:.2f} %, "
          f"loss {ref_loss:.4f}\n")
    names = ("magnitude", "fisher", "taylor")
    print("| bits | pruned | " + " | ".join(f"{n} acc %" for n in names) + " | "
          + " | ".join(f"{n} loss" for n in names) + " | stored KB (" + " / ".join(names) + ") |")
    print("|--:|--:|" + "--:|" * (2 * len(names) + 1))
    m = statistics.mean
    for (bits, prune), r in rows.items():
        print(f"| {bits} | {prune:.0%} | "
              + " | ".join(f"{m(r[f'{n} acc']):.2f}" for n in names) + " | "
              + " | ".join(f"{m(r[f'{n} loss']):.4f}" for n in names) + " | "
              + " / ".join(f"{m(r[f'{n} bytes']) / 1024:.1f}" for n in names) + " |")


if __name__ == "__main__":
    main()
