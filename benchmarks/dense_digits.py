"""Headline 2: a dense model on scikit-learn's digits, committed every epoch as DynaQuant deltas.

Usage::

    .venv/bin/python benchmarks/dense_digits.py                 # 9 configurations x 2 seeds
    .venv/bin/python benchmarks/dense_digits.py --quick         # 3 configurations, 12 epochs
    .venv/bin/python benchmarks/dense_digits.py --out /tmp/dense_digits.json

What is measured
----------------
* Data: ``sklearn.datasets.load_digits`` (1797 real 8x8 images, bundled with scikit-learn, no
  download), pixels / 16, a stratified 75/25 split (1347 train, 450 test, ``random_state=0``).
* Model: MLP 64 -> 512 -> 512 -> 10 (ReLU), 301 066 float32 parameters (1.2 MB); Adam, batch 64,
  ``--epochs`` epochs (default 40), learning rate ``--lr`` (1e-3) with cosine decay set from the
  epoch number. The data order of epoch ``e`` comes from a generator seeded with ``(seed, e)``.
  Both make a resumed run see exactly the batches and learning rates of the uninterrupted one:
  the only difference between them is what the checkpoints lose.
* Every epoch commits the training state ``{"model", "optim", "epoch"}`` to a local store with
  ``Policy(quantize=QuantSpec(method="kmeans", ...), delta=True, min_quant_bytes=4096,
  max_chain=64)`` and ``EncodingOptions(pack_below=4096)``: the three weight matrices (128 KiB,
  1 MiB and 20 KiB) are quantized, the first commit in full and every later one as code deltas
  against the previous commit; the biases (2 KiB) and Adam's step counters stay lossless. The
  policy's default ``min_quant_bytes`` (64 KiB) would leave the 20 KiB output layer lossless, and
  tensors below ``EncodingOptions.pack_below`` (64 KiB) are packed lossless whatever the policy
  says, so both are lowered together. ``max_chain=64`` lets the 40 epochs form one chain.
* Adam's state (``exp_avg``, ``exp_avg_sq``: twice the model) is kept exact with
  ``lossless=("optim.*",)`` in the sweep; it then dominates the bytes of the training state. The
  chosen configuration is run again with Adam's state quantized by the same policy.
* Resumes: after ``--resumes`` evenly spaced epochs (default 10: after epochs 4, 7, 11, ..., 36
  of 40) the model and the optimizer are replaced by fresh objects loaded from
  ``store.checkout("main", for_resume=True)``; training continues. The reference is the same
  training without resumes (committing only reads the state; the script checks that a run that
  commits every epoch without resuming ends with exactly the reference accuracy). Accuracy is
  the test accuracy of the live model after the last epoch; ``last ckpt acc`` is that of the
  last commit checked out.
* Bytes: ``fp32`` is the logical size of every commit (what float32 checkpoints of every epoch
  hold). ``written`` sums ``CommitInfo.stored_bytes`` (chunks and array metadata, manifests
  excluded); the model part counts the arrays of ``model.*`` entries plus their share of the
  packed array. ``capacity`` is every file of the store folder (manifests and refs included)
  with all commits kept. Ratios over seeds are ratios of summed bytes.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import torch
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (
    command_line,
    dir_bytes,
    human_bytes,
    load_average,
    machine_description,
    markdown_table,
    write_text,
)

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec

MIN_QUANT = 4096
GOAL_RATIO, GOAL_LOSS = 39.0, 0.01


# -- data, model, training -------------------------------------------------------------------
def load_data() -> tuple[torch.Tensor, ...]:
    from sklearn.datasets import load_digits
    from sklearn.model_selection import train_test_split

    x, y = load_digits(return_X_y=True)
    x = (x / 16.0).astype(np.float32)
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    return tuple(torch.as_tensor(a) for a in (xtr, xte, ytr, yte))


def build_model(seed: int, hidden: int = 512) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 10))


def lr_at(epoch: int, epochs: int, lr: float) -> float:
    """Cosine decay over the epochs (a function of the epoch: nothing to checkpoint)."""
    return 0.5 * lr * (1 + math.cos(math.pi * (epoch - 1) / epochs))


def train_epoch(model: nn.Module, opt: torch.optim.Optimizer, data: tuple[torch.Tensor, ...],
                seed: int, epoch: int, epochs: int, lr: float, batch: int = 64) -> None:
    xtr, _, ytr, _ = data
    for group in opt.param_groups:
        group["lr"] = lr_at(epoch, epochs, lr)
    gen = torch.Generator().manual_seed(seed * 100_003 + epoch)
    perm = torch.randperm(len(xtr), generator=gen)
    model.train()
    for i in range(0, len(xtr), batch):
        idx = perm[i:i + batch]
        opt.zero_grad(set_to_none=True)
        nn.functional.cross_entropy(model(xtr[idx]), ytr[idx]).backward()
        opt.step()


def accuracy(model: nn.Module, data: tuple[torch.Tensor, ...]) -> float:
    _, xte, _, yte = data
    model.eval()
    with torch.no_grad():
        return (model(xte).argmax(1) == yte).float().mean().item()


def resume_epochs(epochs: int, resumes: int) -> list[int]:
    """``resumes`` epochs spread evenly inside ``1..epochs-1`` (after which training resumes)."""
    return sorted({max(1, min(epochs - 1, round(k * epochs / (resumes + 1))))
                   for k in range(1, resumes + 1)})


# -- configurations --------------------------------------------------------------------------
@dataclass(frozen=True)
class Config:
    name: str
    quant: QuantSpec
    optim: str = "lossless"  # lossless | quantized

    def policy(self) -> Policy:
        lossless = ("optim.*",) if self.optim == "lossless" else ()
        return Policy(quantize=self.quant, delta=True, min_quant_bytes=MIN_QUANT, max_chain=64,
                      lossless=lossless)


def K(bits: int, granularity: str = "tensor", **kw: Any) -> QuantSpec:
    return QuantSpec(method="kmeans", bits=bits, granularity=granularity, **kw)


SWEEP = [
    Config("kmeans 2b", K(2)),
    Config("kmeans 3b", K(3)),
    Config("kmeans 4b", K(4)),
    Config("kmeans 3b row", K(3, "row")),
    Config("kmeans 4b, 12 levels", K(4, levels=12)),
    Config("kmeans 3b protect 1%", K(3, protect=0.01)),
    Config("kmeans 4b protect 0.5%", K(4, protect=0.005)),
    Config("kmeans 3b prune 30%", K(3, prune=0.3)),
    Config("kmeans 4b prune 50%", K(4, prune=0.5)),
]
QUICK = [SWEEP[1], SWEEP[2], SWEEP[7]]


def spec_text(q: QuantSpec) -> str:
    parts = [f"{q.method} {q.bits}b {q.granularity}"]
    if q.levels:
        parts.append(f"levels={q.levels}")
    if q.protect:
        parts.append(f"protect={q.protect:g}")
    if q.prune:
        parts.append(f"prune={q.prune:g}")
    return ", ".join(parts)


# -- bytes per tensor ------------------------------------------------------------------------
def split_bytes(store: ckptstore.Store, commit_id: str) -> dict[str, int]:
    """Bytes this commit wrote for ``model.*`` tensors and for the rest (files under
    ``data/<commit>/<array>``; the packed array is shared out by logical size)."""
    m = store.manifest(commit_id)
    out = {"model": 0, "other": 0}
    packed: dict[str, int] = {"model": 0, "other": 0}
    for e in m.tensors:
        group = "model" if e.path.startswith("model.") else "other"
        arrays: list[str] = []
        if e.layout == "array" and e.commit == commit_id:
            arrays = [e.array]
        elif e.layout == "chain":
            arrays = [b.array for b in (e.parts or {}).values() if b.commit == commit_id]
        elif e.layout == "packed" and e.commit == commit_id:
            packed[group] += e.nbytes or 0
        for a in arrays:
            out[group] += sum(store.storage.walk_sizes(f"data/{commit_id}/{a}").values())
    if sum(packed.values()):
        total = sum(store.storage.walk_sizes(f"data/{commit_id}/_packed").values())
        for g, n in packed.items():
            out[g] += round(total * n / sum(packed.values()))
    return out


# -- one training run ------------------------------------------------------------------------
def reference_accuracy(data: tuple[torch.Tensor, ...], epochs: int, seed: int,
                       lr: float) -> float:
    model = build_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    for e in range(1, epochs + 1):
        train_epoch(model, opt, data, seed, e, epochs, lr)
    return accuracy(model, data)


def run(cfg: Config, data: tuple[torch.Tensor, ...], epochs: int, resumes: int, seed: int,
        lr: float, workdir: str) -> dict[str, Any]:
    t0 = time.perf_counter()
    path = tempfile.mkdtemp(dir=workdir)
    store = ckptstore.open(path, policy=cfg.policy(), options=EncodingOptions(pack_below=MIN_QUANT))
    model = build_model(seed)
    opt = torch.optim.Adam(model.parameters(), lr=lr)
    model_fp32 = sum(p.numel() * p.element_size() for p in model.state_dict().values())
    at = set(resume_epochs(epochs, resumes))
    logical = stored = model_stored = 0
    kinds: dict[str, int] = {}
    commit_s = 0.0
    for e in range(1, epochs + 1):
        train_epoch(model, opt, data, seed, e, epochs, lr)
        c0 = time.perf_counter()
        info = store.commit({"model": model, "optim": opt, "epoch": e}, message=f"epoch {e}")
        commit_s += time.perf_counter() - c0
        logical += info.logical_bytes
        stored += info.stored_bytes
        model_stored += split_bytes(store, info.id)["model"]
        for t in store.manifest(info.id).tensors:
            if t.path.startswith("model.") and t.path.endswith("weight"):
                kinds[t.kind] = kinds.get(t.kind, 0) + 1
        if e in at:  # resume: fresh objects, state from the store
            state = store.checkout("main", for_resume=True)
            model = build_model(seed + 1)
            model.load_state_dict(state["model"])
            opt = torch.optim.Adam(model.parameters(), lr=lr)
            opt.load_state_dict(state["optim"])
            assert state["epoch"] == e
    acc = accuracy(model, data)
    last = build_model(seed + 2)
    last.load_state_dict(store.checkout("main")["model"])
    ckpt_acc = accuracy(last, data)
    capacity = dir_bytes(path)
    restores = store.restore_count()
    store.close()
    shutil.rmtree(path, ignore_errors=True)
    return {
        "config": cfg.name, "spec": spec_text(cfg.quant), "optim": cfg.optim, "seed": seed,
        "epochs": epochs, "resumes": restores, "fp32_bytes": logical, "stored_bytes": stored,
        "model_fp32_bytes": model_fp32 * epochs, "model_stored_bytes": model_stored,
        "capacity_bytes": capacity, "state_ratio": logical / stored,
        "model_ratio": model_fp32 * epochs / model_stored, "capacity_ratio": logical / capacity,
        "accuracy": acc, "ckpt_accuracy": ckpt_acc, "weight_kinds": kinds,
        "commit_seconds": commit_s, "seconds": time.perf_counter() - t0,
    }


# -- tables ----------------------------------------------------------------------------------
def pct(x: float) -> str:
    return f"{100 * x:.2f}%"


def rel_loss(acc: float, ref: float) -> float:
    return (ref - acc) / ref


def mean(xs: list[float]) -> float:
    return sum(xs) / len(xs)


def summary(runs: list[dict[str, Any]], ref: dict[int, float]) -> dict[str, Any]:
    """Totals over seeds: ratios of summed bytes, mean accuracies, worst seed."""
    losses = [rel_loss(r["accuracy"], ref[r["seed"]]) for r in runs]
    tot = {k: sum(r[k] for r in runs) for k in ("fp32_bytes", "stored_bytes", "model_fp32_bytes",
                                                "model_stored_bytes", "capacity_bytes")}
    ref_acc = mean([ref[r["seed"]] for r in runs])
    acc = mean([r["accuracy"] for r in runs])
    out = {"config": runs[0]["config"], "spec": runs[0]["spec"], "optim": runs[0]["optim"],
           "seeds": [r["seed"] for r in runs], "resumes": runs[0]["resumes"], **tot,
           "model_ratio": tot["model_fp32_bytes"] / tot["model_stored_bytes"],
           "state_ratio": tot["fp32_bytes"] / tot["stored_bytes"],
           "capacity_ratio": tot["fp32_bytes"] / tot["capacity_bytes"],
           "ref_accuracy": ref_acc, "accuracy": acc,
           "ckpt_accuracy": mean([r["ckpt_accuracy"] for r in runs]),
           "rel_loss": rel_loss(acc, ref_acc), "worst_seed_loss": max(losses),
           "seconds": sum(r["seconds"] for r in runs)}
    out["goal"] = out["model_ratio"] >= GOAL_RATIO and out["rel_loss"] < GOAL_LOSS
    return out


def sweep_table(rows: list[dict[str, Any]]) -> str:
    body = [[r["config"], f"{r['model_ratio']:.1f}×", f"{r['state_ratio']:.2f}×",
             f"{r['capacity_ratio']:.2f}×", pct(r["ref_accuracy"]), pct(r["accuracy"]),
             pct(r["ckpt_accuracy"]), f"{100 * r['rel_loss']:+.2f}%",
             f"{100 * r['worst_seed_loss']:+.2f}%", "yes" if r["goal"] else "no",
             f"{r['seconds']:.0f}"] for r in rows]
    return markdown_table(
        ["configuration", "model ratio", "state ratio", "capacity ratio", "acc, no resume",
         f"acc, {rows[0]['resumes']} resumes", "last ckpt acc", "rel. loss", "worst seed",
         "goal", "s"], body)


def detail_table(rows: list[dict[str, Any]]) -> str:
    body = [[f"optim {r['optim']}, {r['resumes']} resumes", human_bytes(r["fp32_bytes"]),
             human_bytes(r["stored_bytes"]), human_bytes(r["model_fp32_bytes"]),
             human_bytes(r["model_stored_bytes"]), human_bytes(r["capacity_bytes"]),
             f"{r['model_ratio']:.1f}×", f"{r['state_ratio']:.2f}×",
             f"{r['capacity_ratio']:.2f}×", pct(r["ref_accuracy"]), pct(r["accuracy"]),
             f"{100 * r['rel_loss']:+.2f}%"] for r in rows]
    return markdown_table(
        ["run", "state fp32", "state written", "model fp32", "model written", "capacity",
         "model ratio", "state ratio", "capacity ratio", "acc, no resume", "acc", "rel. loss"],
        body)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=40)
    ap.add_argument("--resumes", type=int, default=10)
    ap.add_argument("--seeds", type=int, default=2, help="seeds per configuration (0..N-1)")
    ap.add_argument("--lr", type=float, default=1e-3, help="peak learning rate (cosine decay)")
    ap.add_argument("--quick", action="store_true",
                    help=f"{len(QUICK)} configurations, 1 seed, 12 epochs, 3 resumes")
    ap.add_argument("--out", help="write the results as JSON to this file")
    ap.add_argument("--dir", help="folder for the temporary stores (default: system temp)")
    args = ap.parse_args(argv)
    if args.quick:
        args.epochs, args.resumes, args.seeds = 12, 3, 1
    torch.set_num_threads(1)
    configs = QUICK if args.quick else SWEEP
    seeds = list(range(args.seeds))
    t_start = time.perf_counter()
    data = load_data()
    workdir = tempfile.mkdtemp(prefix="dense_digits-", dir=args.dir)
    runs: list[dict[str, Any]] = []

    def go(cfg: Config, seed: int, resumes: int) -> dict[str, Any]:
        r = run(cfg, data, args.epochs, resumes, seed, args.lr, workdir)
        runs.append(r)
        print(f"  {cfg.name}, optim {cfg.optim}, seed {seed}, {resumes} resumes: model "
              f"{r['model_ratio']:.1f}x state {r['state_ratio']:.2f}x acc {r['accuracy']:.4f} "
              f"(no resume {ref[seed]:.4f}) {r['seconds']:.1f}s", file=sys.stderr, flush=True)
        return r

    try:
        ref = {s: reference_accuracy(data, args.epochs, s, args.lr) for s in seeds}
        sweep = [summary([go(c, s, args.resumes) for s in seeds], ref) for c in configs]
        passing = [r for r in sweep if r["goal"] and r["worst_seed_loss"] < GOAL_LOSS]
        best = max(passing or sweep, key=lambda r: r["model_ratio"])
        chosen = next(c for c in configs if c.name == best["config"])
        detail = [best, summary([go(replace(chosen, optim="quantized"), s, args.resumes)
                                 for s in seeds], ref)]
        plain = [go(chosen, s, 0) for s in seeds[:1]]
        if plain[0]["accuracy"] != ref[0]:
            raise AssertionError("committing changed the training: accuracy without resumes "
                                 f"{plain[0]['accuracy']} != {ref[0]}")
        detail.append(summary(plain, ref))
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    wall = time.perf_counter() - t_start

    cmd = command_line("benchmarks/dense_digits.py", argv)
    lines = [
        (f"`{cmd.strip()}` -- {machine_description()}, load {load_average()}, "
        f"{wall:.0f} s wall."),
        "",
        (f"MLP 64-512-512-10 on sklearn digits, Adam (peak lr {args.lr:g}, cosine decay), "
        f"{args.epochs} epochs, one commit per epoch, {args.resumes} resumes (after epochs "
        f"{', '.join(map(str, resume_epochs(args.epochs, args.resumes)))}), seeds "
        f"{', '.join(map(str, seeds))} (bytes summed, accuracies averaged over seeds; 1 test "
        "image = 0.22%). Adam state lossless (`lossless=(\"optim.*\",)`). model ratio = fp32 "
        "bytes of the model at every epoch / bytes written for `model.*`; state ratio = fp32 "
        "bytes of the whole training state (model + Adam) / data written; capacity ratio = the "
        "same fp32 bytes / size of the store folder (manifests included); last ckpt acc = the "
        "last commit checked out."),
        "",
        sweep_table(sweep),
        "",
        ("Chosen (highest model ratio meeting the goal on the mean and on every seed"
        f"{'' if passing else ': none does'}): "
        f"**{best['config']}** ({best['spec']}). The same configuration with Adam's state "
        "quantized by the same policy, and without resumes (seed 0):"),
        "",
        detail_table(detail),
    ]
    text = "\n".join(lines)
    print(text)
    if args.out:
        write_text(args.out, json.dumps({"reference_accuracy": ref, "sweep": sweep,
                                         "chosen": best["config"], "detail": detail,
                                         "runs": runs, "seconds": wall,
                                         "command": cmd.strip()}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
