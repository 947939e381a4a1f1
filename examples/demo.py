"""ckptstore demo: train, commit every N steps, tag the best, crash, resume, inspect history.

Trains an MLP on scikit-learn's bundled digits dataset (real data, no download) on the CPU. The run
is interrupted ("crash") and resumed from the store; the resumed loss curve must equal the one of
an uninterrupted run bit for bit (model, optimizer, data order and RNG state all come back).

    python examples/demo.py [--store ./demo-store] [--steps 300] [--every 50]
"""

from __future__ import annotations

import argparse
import io
import shutil
import time

import numpy as np
import torch
from sklearn.datasets import load_digits

import ckptstore


def load_data() -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    g = torch.Generator().manual_seed(0)
    perm = torch.randperm(len(x), generator=g)
    train, val = perm[:1500], perm[1500:]
    return x[train], y[train], x[val], y[val]


class EpochSampler:
    """Seeded shuffling with a resumable position: its state is a plain leaf of the commit."""

    def __init__(self, n: int, batch: int, seed: int = 0):
        self.n, self.batch, self.seed = n, batch, seed
        self.epoch, self.pos = 0, 0

    def next_batch(self) -> torch.Tensor:
        if self.pos + self.batch > self.n:
            self.epoch, self.pos = self.epoch + 1, 0
        order = torch.randperm(self.n, generator=torch.Generator().manual_seed(self.seed + self.epoch))
        idx = order[self.pos: self.pos + self.batch]
        self.pos += self.batch
        return idx

    def state_dict(self) -> dict:
        return {"epoch": self.epoch, "pos": self.pos, "seed": self.seed}

    def load_state_dict(self, state: dict) -> None:
        self.epoch, self.pos, self.seed = state["epoch"], state["pos"], state["seed"]


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                               torch.nn.Linear(256, 256), torch.nn.ReLU(),
                               torch.nn.Linear(256, 10))


def train(data, steps_from: int, steps_to: int, model, opt, sampler, store=None, every=50,
          crash_at=None) -> dict[int, float]:
    """Train from step ``steps_from`` to ``steps_to``; commit every ``every`` steps."""
    xt, yt, xv, yv = data
    losses: dict[int, float] = {}
    best = float("inf")
    if store is not None and "best" in store.tags():
        best = store.info("best").metadata["val_loss"]
    for step in range(steps_from + 1, steps_to + 1):
        if crash_at is not None and step > crash_at:
            print(f"  !! simulated crash at step {crash_at} (state in memory is lost)")
            break
        model.train()
        idx = sampler.next_batch()
        loss = torch.nn.functional.cross_entropy(model(xt[idx]), yt[idx])
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item()
        if store is not None and step % every == 0:
            model.eval()
            with torch.no_grad():
                val = torch.nn.functional.cross_entropy(model(xv), yv).item()
            state = {"model": model, "optim": opt, "sampler": sampler, "step": step,
                     "rng": torch.get_rng_state()}
            info = store.commit(state, message=f"step {step}: val loss {val:.4f}",
                                metadata={"val_loss": val})
            if val < best:
                best = val
                try:
                    store.delete_tag("best")
                except ckptstore.RefNotFound:
                    pass
                store.tag("best", info.id)
            print(f"  step {step:4d}  train loss {loss.item():.4f}  val loss {val:.4f}  "
                  f"-> commit {info.short_id} ({info.stored_bytes / 1024:.0f} KiB)")
    return losses


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{n:.0f} B"
        n /= 1024
    return str(n)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--store", default="./demo-store")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50)
    ap.add_argument("--crash-at", type=int, default=175)
    args = ap.parse_args()
    data = load_data()

    print("1) reference run without failures")
    model, sampler = make_model(), EpochSampler(len(data[0]), 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    reference = train(data, 0, args.steps, model, opt, sampler)

    shutil.rmtree(args.store, ignore_errors=True)
    store = ckptstore.open(args.store)
    print(f"\n2) training with a commit every {args.every} steps into {args.store}")
    model, sampler = make_model(), EpochSampler(len(data[0]), 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    torch.manual_seed(1)
    before = train(data, 0, args.steps, model, opt, sampler, store, args.every, args.crash_at)
    del model, opt, sampler

    print("\n3) resume from the store in a fresh process state")
    t0 = time.perf_counter()
    model, sampler = make_model(), EpochSampler(len(data[0]), 64)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    state = store.checkout("main", into={"model": model, "optim": opt, "sampler": sampler})
    torch.set_rng_state(state["rng"])
    step = state["step"]
    print(f"  resumed at step {step} from {store.info('main').short_id} in "
          f"{(time.perf_counter() - t0) * 1000:.0f} ms")
    after = train(data, step, args.steps, model, opt, sampler, store, args.every)
    resumed = {**{s: v for s, v in before.items() if s <= step}, **after}
    diff = max(abs(resumed[s] - reference[s]) for s in reference)
    print(f"  loss curve after resume vs uninterrupted run: max |difference| = {diff:.3g} "
          f"over {len(reference)} steps -> {'IDENTICAL' if diff == 0 else 'DIFFERENT'}")

    print("\n4) history (ckpt log)")
    tags = {}
    for name, commit in store.tags().items():
        tags.setdefault(commit, []).append(name)
    for c in store.log():
        print(f"  {c.short_id}  {c.time:%H:%M:%S}  step {c.step:>4}  {c.message:<28}"
              f"{' [' + ', '.join(tags[c.id]) + ']' if c.id in tags else ''}")
    print(f"\n5) sizes: {len(store.commit_ids())} commits")
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    info = store.info("main")
    print(f"  {'':24}{'logical':>12}{'stored':>12}")
    print(f"  {'torch.save (one ckpt)':24}{'':>12}{human(buf.tell()):>12}")
    print(f"  {'ckptstore (one commit)':24}{human(info.logical_bytes):>12}"
          f"{human(info.stored_bytes):>12}")
    total = sum(c.stored_bytes for c in store.log())
    print(f"  {'ckptstore (all history)':24}{'':>12}{human(total):>12}")
    best = store.info("best")
    print(f"\n  best commit: {best.short_id} ({best.message}); "
          f"verify: {'ok' if store.verify().ok else 'PROBLEMS'}")
    gc = store.gc(keep_last=2, dry_run=True)
    print(f"  gc --keep-last 2 --dry-run would remove {len(gc.commits_removed)} commits, "
          f"freeing {human(gc.bytes_freed)}")
    if diff != 0:
        raise SystemExit("resume did not reproduce the loss curve")


if __name__ == "__main__":
    main()
