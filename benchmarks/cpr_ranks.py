"""CPR's emulation on 4 gloo ranks: embedding shards on their own processes, real per-rank
recovery.

Usage::

    .venv/bin/python benchmarks/cpr_ranks.py              # 4 ranks, PLS 0.02/0.1/0.2 (~10 min)
    .venv/bin/python benchmarks/cpr_ranks.py --quick --pls 0.1 0.2

The single-process emulation (benchmarks/cpr.py) with the tables really sharded: rank ``r``
holds rows ``[r N/4, (r+1) N/4)`` of every table of benchmarks/dlrm.py's DLRM in a local
``nn.Embedding`` (model parallel: an embedding parameter server per rank) and a replica of the
MLPs. Every step all ranks take the same batch; each looks up the rows it owns, an all-reduce
puts the embedding vectors together, every rank runs the (identical) MLPs, and the gradient of
the vectors flows back to the owners' rows. The state is committed with the collective
``Store.commit`` of DTensors over the local tables (``DTensor.from_local``), replicated MLPs
written once. The emulated failures of benchmarks/cpr.py (same seed, same schedule) strike one
rank: under partial recovery that rank alone restores its tables and their Adagrad state with
``store.checkout(ref, into=...)`` (no collective; it reads only its own chunks) while the others
keep their state; under full recovery every rank restores everything and the lost steps count as
recomputation, then redone (so full recovery ends with the AUC of a run without failures).
Overheads are CPR's model as in benchmarks/cpr.py; AUC is measured on the held-out set after
training.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import spawn_ranks  # noqa: E402
from cpr import (LABELS, N_EMB, R, Emulation, config, overhead, rows_to_save,  # noqa: E402
                 schedule)
from dlrm import ClickData, Config, Trainer, metrics  # noqa: E402

STRATEGIES = ("full", "vanilla", "mfu", "ssu")


def _rank(rank: int, world: int, cfg: Config, em: Emulation, strategy: str,
          pls_target: float | None, root: str) -> None:
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import ckptstore
    from ckptstore.tracking.hotrows import AccessCounts, SampledRows
    from ckptstore.policy import LostSamples, Policy
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore", "Sparse invariant checks", UserWarning)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=900))
    mesh = init_device_mesh("cpu", (world,))
    gen = ClickData(cfg)
    steps = cfg.intervals * cfg.steps
    data = gen.draw(steps * cfg.batch, stream=0)
    test = gen.draw(cfg.test, stream=1)
    full = Trainer(cfg)  # same seed on every rank: same initial tables and MLPs
    bounds = []
    local = torch.nn.ModuleList()
    for e in full.model.emb:
        n = e.weight.shape[0]
        lo, hi = rank * n // world, (rank + 1) * n // world
        if n % world:
            raise SystemExit("table rows must divide by the ranks")
        bounds.append((lo, hi))
        m = torch.nn.Embedding(hi - lo, cfg.dim, sparse=True)
        with torch.no_grad():
            m.weight.copy_(e.weight[lo:hi])
        local.append(m)
    model = full.model
    model.emb = torch.nn.ModuleList()  # the MLPs stay; the tables are the local shards
    opt_emb = torch.optim.Adagrad(local.parameters(), lr=cfg.lr_emb)
    opt_mlp = torch.optim.Adam(model.parameters(), lr=cfg.lr_mlp)

    def vectors(cats: torch.Tensor) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """Each table's embedding vectors for the batch: own rows looked up here, the rest
        from the other ranks (all-reduce); returns (local parts, full vectors)."""
        parts, fulls = [], []
        for i, (lo, hi) in enumerate(bounds):
            ids = cats[:, i]
            own = (ids >= lo) & (ids < hi)
            part = local[i]((ids - lo).clamp(0, hi - lo - 1)) * own.unsqueeze(1)
            v = part.detach().clone()
            dist.all_reduce(v)
            parts.append(part)
            fulls.append(v.requires_grad_())
        return parts, fulls

    def head(dense: torch.Tensor, rows: list[torch.Tensor]) -> torch.Tensor:
        z = model.bottom(dense)
        v = torch.stack([z] + rows, 1)
        inter = torch.bmm(v, v.transpose(1, 2))[:, model.li, model.lj]
        return model.top(torch.cat([z, inter], 1)).squeeze(1)

    def state() -> dict:
        sd: dict = {"mlp": model.state_dict(), "opt_mlp": opt_mlp.state_dict(), "step": step}
        for i, m in enumerate(local):
            sd[f"emb{i}"] = DTensor.from_local(m.weight.detach(), mesh, [Shard(0)])
            sd[f"sum{i}"] = DTensor.from_local(opt_emb.state[m.weight]["sum"], mesh, [Shard(0)])
        return sd

    sch = schedule(cfg, em, strategy, pls_target)
    prio = sch.prio_every is not None
    store = ckptstore.open(f"{root}/store")
    names = [str(i) for i in range(len(local))]
    counts = AccessCounts({t: m.weight.shape[0] for t, m in zip(names, local)}) \
        if strategy == "mfu" else None
    sampled = SampledRows(names, capacity=int(R * min(m.weight.shape[0] for m in local)),
                          rate=0.01) if strategy == "ssu" else None
    tracker = ckptstore.track(local, opt_emb) if prio else None
    consecutive = Policy(incremental="consecutive", min_rows=1024, max_chain=10_000)
    pls = LostSamples(steps * cfg.batch, N_EMB)
    saves, lost_hours, n_commits, step, replay_until = 0.0, 0.0, 0, 0, -1
    tables_of = ("emb", "sum")

    def commit(kind: str) -> None:
        nonlocal saves, n_commits
        n_commits += 1
        if tracker is None:
            store.commit(state(), policy=Policy())
            saves += 1
        else:
            tracker.clear()
            for t, m in zip(names, local):
                tracker.mark(m.weight, rows_to_save(kind, t, m.weight.shape[0], counts, sampled))
            store.commit(state(), policy=consecutive, tracker=tracker)
            saves += 1 if kind == "full" else R
        if kind == "full":
            pls.saved(step * cfg.batch)

    t0 = time.perf_counter()
    commit("full")
    fails = list(sch.fails)
    while step < steps:
        b = slice(step * cfg.batch, (step + 1) * cfg.batch)
        cats = data["cats"][b]
        for i, (lo, hi) in enumerate(bounds):
            mine = cats[:, i][(cats[:, i] >= lo) & (cats[:, i] < hi)] - lo
            if counts is not None:
                counts.record(str(i), mine)
            if sampled is not None:
                sampled.record(str(i), mine)
        parts, fulls = vectors(cats)
        loss = F.binary_cross_entropy_with_logits(head(data["dense"][b], fulls), data["y"][b])
        loss.backward()
        for part, v in zip(parts, fulls):
            part.backward(v.grad)
        opt_emb.step()
        opt_mlp.step()
        opt_emb.zero_grad(set_to_none=True)
        opt_mlp.zero_grad(set_to_none=True)
        step += 1
        if fails and step >= fails[0][0]:
            _, shard = fails.pop(0)
            if strategy == "full":  # every rank back to the last commit, lost steps redone
                last = int(store.manifest(store.resolve("main")).metadata.get("step", 0))
                live = state()
                store.checkout("main", into={"mlp": model, "opt_mlp": opt_mlp, **{
                    k: v for k, v in live.items() if k.startswith(tables_of)}})
                lost_hours += (step - last) / sch.per_hour
                replay_until, step = step, last
                continue
            if rank == shard:  # only the failed rank restores, reading its own chunks
                with torch.no_grad():
                    for m in local:
                        m.weight.zero_()  # its memory is gone
                live = state()
                store.checkout("main", paths=["emb*", "sum*"], into={
                    k: v for k, v in live.items() if k.startswith(tables_of)})
            pls.failed(step * cfg.batch, 1)
        if step <= replay_until:
            continue  # recomputing lost steps: their checkpoints were taken the first time
        if step % sch.full_every == 0:
            commit("full")
        elif prio and step % sch.prio_every == 0:
            commit("prio")
    seconds = time.perf_counter() - t0
    if tracker is not None:
        tracker.close()
    # held-out AUC: every rank takes part in the lookups
    logits = []
    with torch.no_grad():
        for i in range(0, cfg.test, 65536):
            sl = slice(i, i + 65536)
            _, fulls = vectors(test["cats"][sl])
            logits.append(head(test["dense"][sl], [v.detach() for v in fulls]))
    auc = metrics(torch.cat(logits).sigmoid().double().numpy(), test["y"].numpy())["auc"]
    store.close()
    if rank == 0:
        Path(root, "result.json").write_text(json.dumps({
            "label": LABELS[strategy], "pls_target": pls_target,
            "overhead": overhead(em, saves, lost_hours), "predicted": sch.predicted,
            "auc": auc, "pls": pls.pls, "commits": n_commits, "seconds": seconds}))
    dist.destroy_process_group()


def run(world: int, cfg: Config, em: Emulation, strategy: str, pls: float | None) -> dict:
    root = tempfile.mkdtemp(prefix="ckpt-cpr-")
    try:
        return spawn_ranks(_rank, world, (cfg, em, strategy, pls), root)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pls", type=float, nargs="+", default=[0.02, 0.1, 0.2])
    args = ap.parse_args()
    cfg = config(args.quick, rows=(100_000, 76_000, 52_000, 24_000))
    em = Emulation()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    print(f"DLRM {cfg.rows} x {cfg.dim} sharded by rows over {N_EMB} gloo ranks, "
          f"{cfg.intervals * cfg.steps} steps of {cfg.batch}; emulation as benchmarks/cpr.py\n")
    print("| strategy | target PLS | overhead | predicted | checkpoints | final PLS | AUC | "
          "run s |")
    print("|---|---|---|---|---|---|---|---|")
    jobs = [("full", None)] + [(s, p) for p in args.pls for s in STRATEGIES[1:]]
    for strategy, pls in jobs:
        r = run(N_EMB, cfg, em, strategy, pls)
        print(f"| {r['label']} | {pls if pls is not None else '-'} | {r['overhead']:.2%} | "
              f"{r['predicted']:.2%} | {r['commits']} | {r['pls']:.4f} | {r['auc']:.5f} | "
              f"{r['seconds']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
