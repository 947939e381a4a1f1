"""ckptstore demo: train, commit in the background, tag the best, crash, resume, inspect history.

Trains an MLP on scikit-learn's bundled digits dataset (real data, no download) on the CPU. Commits
run asynchronously (the loop only waits for the snapshot). The run is interrupted ("crash") and
resumed from the store; the resumed loss curve must equal that of an uninterrupted run bit for bit
(model, optimizer, mid-epoch data order and RNG state all come back). Finally the same state is
committed under compressing policies to show what they save.

    python examples/demo.py [--store ./demo-store] [--steps 300] [--every 50] [--crash-at 175]
"""

from __future__ import annotations

import argparse
import io
import shutil
import time

import torch
from sklearn.datasets import load_digits
from torch.utils.data import DataLoader, TensorDataset

import ckptstore
from ckptstore import Policy, QuantSpec, ResumableLoader, ResumableSampler, RNGState


def load_data() -> tuple[torch.Tensor, ...]:
    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x / 16.0, dtype=torch.float32)
    y = torch.tensor(y)
    perm = torch.randperm(len(x), generator=torch.Generator().manual_seed(0))
    train, val = perm[:1500], perm[1500:]
    return x[train], y[train], x[val], y[val]


def make_run(data):
    """A fresh model, optimizer and resumable loader (what a restarted process builds)."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Dropout(0.1),
                                torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    # the loader gets its own generator: creating an iterator must not draw from the global RNG
    loader = ResumableLoader(DataLoader(TensorDataset(data[0], data[1]), batch_size=64,
                                        sampler=ResumableSampler(len(data[0]), seed=0),
                                        generator=torch.Generator()))
    return model, opt, loader


def train(data, step: int, last: int, model, opt, loader, store=None, every=50,
          crash_at=None) -> dict[int, float]:
    """Train from ``step`` to ``last``; commit asynchronously every ``every`` steps."""
    _, _, xv, yv = data
    losses: dict[int, float] = {}
    best = store.info("best").metadata["val_loss"] if store and "best" in store.tags() else 1e9
    pending = None
    while step < last:
        for xb, yb in loader:
            step += 1
            if crash_at is not None and step > crash_at:
                print(f"  !! simulated crash at step {crash_at}: everything in memory is lost")
                if pending is not None:
                    pending.wait()
                return losses
            model.train()
            loss = torch.nn.functional.cross_entropy(model(xb), yb)
            opt.zero_grad()
            loss.backward()
            opt.step()
            losses[step] = loss.item()
            if store is not None and step % every == 0:
                model.eval()
                with torch.no_grad():
                    val = torch.nn.functional.cross_entropy(model(xv), yv).item()
                if pending is not None:
                    pending.wait()
                state = {"model": model, "optim": opt, "data": loader, "rng": RNGState(),
                         "step": step}
                pending = store.commit_async(state, message=f"step {step}: val loss {val:.4f}",
                                             metadata={"val_loss": val})
                print(f"  step {step:4d}  train loss {loss.item():.4f}  val loss {val:.4f}  "
                      f"commit (training waited {pending.stall_seconds * 1000:.1f} ms)")
                if val < best:
                    best = val
                    info = pending.wait()
                    if "best" in store.tags():
                        store.delete_tag("best")
                    store.tag("best", info.id)
            if step >= last:
                break
    if pending is not None:
        pending.wait()
    return losses


def human(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
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
    model, opt, loader = make_run(data)
    torch.manual_seed(1)
    reference = train(data, 0, args.steps, model, opt, loader)

    shutil.rmtree(args.store, ignore_errors=True)
    store = ckptstore.open(args.store)
    print(f"\n2) training with an asynchronous commit every {args.every} steps into {args.store}")
    model, opt, loader = make_run(data)
    torch.manual_seed(1)
    before = train(data, 0, args.steps, model, opt, loader, store, args.every, args.crash_at)
    del model, opt, loader

    print("\n3) resume from the store, as a restarted process would")
    t0 = time.perf_counter()
    model, opt, loader = make_run(data)
    state = store.checkout("main", into={"model": model, "optim": opt, "data": loader,
                                         "rng": RNGState()}, for_resume=True)
    step = state["step"]
    print(f"  resumed at step {step} (epoch {loader.epoch}, sample {loader.position}) from "
          f"{store.info('main').short_id} in {(time.perf_counter() - t0) * 1000:.0f} ms")
    after = train(data, step, args.steps, model, opt, loader, store, args.every)
    resumed = {**{s: v for s, v in before.items() if s <= step}, **after}
    diff = max(abs(resumed[s] - reference[s]) for s in reference)
    print(f"  loss curve after resume vs uninterrupted run: max |difference| = {diff:.3g} "
          f"over {len(reference)} steps -> {'IDENTICAL' if diff == 0 else 'DIFFERENT'}")

    print("\n4) history (as `ckpt log` shows it)")
    tags: dict[str, list[str]] = {}
    for name, commit in store.tags().items():
        tags.setdefault(commit, []).append(name)
    for c in store.log():
        label = f" [{', '.join(tags[c.id])}]" if c.id in tags else ""
        print(f"  {c.short_id}  {c.time:%H:%M:%S}  step {c.step:>4}  {c.message:<26}"
              f"{human(c.stored_bytes):>10}{label}")

    print("\n5) one training state (model + Adam state + data position + RNG), stored bytes")
    final = {"model": model, "optim": opt, "data": loader, "rng": RNGState(), "step": args.steps}
    buf = io.BytesIO()
    torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, buf)
    rows = [("torch.save", buf.tell(), "")]
    policies = {
        "ckptstore lossless": Policy(),
        "8-bit adaptive": Policy(quantize=QuantSpec(bits=8), min_quant_bytes=16 * 1024),
        "4-bit k-means + 1% protected": Policy(quantize=QuantSpec(
            method="kmeans", bits=4, granularity="tensor", protect=0.01),
            min_quant_bytes=16 * 1024),
    }
    for name, policy in policies.items():
        with ckptstore.open(f"memory://demo-{name}", policy=policy) as s:
            info = s.commit(final)
            back = s.checkout("main")["model"]
            err = max(float((back[k] - v).abs().max()) for k, v in model.state_dict().items())
            rows.append((name, info.stored_bytes, f"max |error| {err:.2g}"))
    for name, size, note in rows:
        print(f"  {name:<30}{human(size):>10}{buf.tell() / size:>7.1f}x  {note}")

    best = store.info("best")
    print(f"\n  best commit: {best.short_id} ({best.message}); "
          f"verify: {'ok' if store.verify().ok else 'PROBLEMS'}")
    gc = store.gc(keep_last=2, dry_run=True)
    print(f"  gc --keep-last 2 --dry-run would remove {len(gc.commits_removed)} commits, "
          f"freeing {human(gc.bytes_freed)}")
    store.close()
    if diff != 0:
        raise SystemExit("resume did not reproduce the loss curve")


if __name__ == "__main__":
    main()
