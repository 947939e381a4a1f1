"""CPR's emulation: partial recovery of failed embedding shards on the DLRM benchmark.

Usage::

    .venv/bin/python benchmarks/cpr.py                 # default run (a few minutes)
    .venv/bin/python benchmarks/cpr.py --quick         # smoke run
    .venv/bin/python benchmarks/cpr.py --plot docs/cpr_overhead.png

What is measured
----------------
CPR (Maeng et al., MLSys 2021) evaluates partial recovery in an emulation framework: a DLRM
trained on one machine, a 56-hour production job scaled down onto the training run, 2 failures
injected at random times, each clearing a fraction of the embedding tables (25 % here: one of
``N_emb = 4`` embedding shards; a row belongs to shard ``row % 4``), checkpoint overheads taken
from production and scaled with the run. This script does the same with benchmarks/dlrm.py's
synthetic DLRM (Zipf categorical features, a hidden teacher):

* Emulated job: ``--hours`` (56) hours = the whole training run; MTBF ``--mtbf`` (28 h, so 2
  failures, at seeded uniform random times); overheads ``O_save = O_load = 0.07 h`` (full
  recovery's optimal interval ``sqrt(2 O_save T_fail)`` is then 2 h, the production interval CPR
  reports) and ``O_res = 0.25 h`` rescheduling per failure.
* Strategies (every checkpoint is a real ckptstore commit; every recovery a real checkout):
  - *full*: commit every ``sqrt(2 O_save T_fail)``; a failure restores the whole state and
    recomputes the lost iterations (the overhead counts them; accuracy equals no failure);
  - *partial*: same interval, but only the failed shard's rows (weights and Adagrad state) are
    restored from the last commit; nothing is recomputed; PLS grows (CPR's baseline partial);
  - *CPR-vanilla*: partial recovery with ``T_save = 2 PLS N_emb T_fail`` for the target PLS;
  - *CPR-MFU* / *CPR-SSU*: CPR's prioritisation -- commits 8 times as often, each storing only
    ``r = 1/8`` of every table's rows: the most used since they were last saved
    (:class:`ckptstore.tracking.hotrows.AccessCounts`) or those in a bounded list of rows sampled from
    1 % of accesses (:class:`ckptstore.tracking.hotrows.SampledRows`); stored as consecutive increments
    (a :func:`ckptstore.track` tracker re-marked with just those rows), with a full commit at the
    CPR-vanilla interval.
* Overhead (% of the emulated job): saves x ``O_save`` (prioritised saves count ``r`` of it) +
  failures x (``O_load`` + ``O_res`` + recomputed hours for full recovery).
  :func:`ckptstore.policy.plan_recovery`'s prediction is printed beside it.
* Accuracy: held-out AUC at the end against the run without failures; final PLS, counted from
  the last full save (for MFU/SSU an upper bound: their prioritised saves keep the hottest rows
  fresher than that).
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from dataclasses import dataclass

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from dlrm import ClickData, Config, Trainer  # noqa: E402

import ckptstore  # noqa: E402
from ckptstore.tracking.hotrows import AccessCounts, SampledRows  # noqa: E402
from ckptstore.policy import (LostSamples, Policy, RecoveryCosts, cpr_interval,  # noqa: E402
                              plan_recovery, pls_interval)

N_EMB = 4
R = 1 / 8  # CPR's r: a prioritised save stores 1/8 of the rows, 8 times as often


@dataclass(frozen=True)
class Emulation:
    hours: float = 56.0
    mtbf: float = 28.0
    o_save: float = 0.07
    o_load: float = 0.07
    o_res: float = 0.25
    failures: int = 2
    seed: int = 7


@dataclass
class Outcome:
    label: str
    pls_target: float | None
    overhead: float
    predicted: float
    auc: float
    pls: float
    saves: int
    seconds: float


def _shard_rows(rows: int, shard: int) -> torch.Tensor:
    return torch.arange(shard, rows, N_EMB)


def _restore_shard(trainer: Trainer, saved: dict, shard: int) -> None:
    """Partial recovery: the failed shard's rows of every table (weights, Adagrad sums) go back
    to their values in the last commit; the other shards and the MLPs keep their state."""
    states = trainer.opt_emb.state
    with torch.no_grad():
        for i, e in enumerate(trainer.model.emb):
            rows = _shard_rows(e.weight.shape[0], shard)
            e.weight[rows] = saved["model"][f"emb.{i}.weight"][rows]
            st = states[e.weight]
            st["sum"][rows] = saved["opt_emb"]["state"][i]["sum"][rows]


@dataclass(frozen=True)
class Schedule:
    """When a strategy checkpoints and when the emulated failures strike (in steps)."""

    fails: tuple[tuple[int, int], ...]   # (step, failed shard)
    full_every: int
    prio_every: int | None
    per_hour: float
    predicted: float                     # plan_recovery's overhead for this strategy


def schedule(cfg: Config, em: Emulation, strategy: str, pls_target: float | None) -> Schedule:
    steps = cfg.intervals * cfg.steps
    per_hour = steps / em.hours
    rng = np.random.default_rng(em.seed)
    fail_steps = sorted(int(x) for x in rng.uniform(0.05, 0.95, em.failures) * steps)
    fail_shards = [int(x) for x in rng.integers(0, N_EMB, em.failures)]
    t_full = cpr_interval(em.o_save, em.mtbf)
    costs = RecoveryCosts(save=em.o_save, load=em.o_load, reschedule=em.o_res)
    if strategy in ("full", "partial") or pls_target is None:
        interval_h = t_full
    else:
        interval_h = pls_interval(pls_target, N_EMB, em.mtbf)
    prio = strategy in ("mfu", "ssu")
    plan = plan_recovery(costs, em.mtbf, N_EMB, pls_target or 0.1)
    predicted = plan.full_overhead if strategy == "full" else (
        costs.save / interval_h + (costs.load + costs.reschedule) / em.mtbf)
    return Schedule(tuple(zip(fail_steps, fail_shards)), max(1, round(interval_h * per_hour)),
                    max(1, round(interval_h / 8 * per_hour)) if prio else None, per_hour,
                    predicted)


def rows_to_save(kind: str, table: str, rows: int, counts: AccessCounts | None,
                 sampled: SampledRows | None) -> torch.Tensor:
    """The rows of a table a save stores: all of them (a full save resets the statistics), or
    CPR-MFU's ``r * N`` most used (their counters cleared), or CPR-SSU's sampled list."""
    if kind == "full":
        if counts is not None:
            counts.clear(table)
        elif sampled is not None:
            sampled.take(table)
        return torch.arange(rows)
    if counts is not None:
        chosen = counts.most_used(table, int(R * rows))
        counts.clear(table, chosen)
        return chosen
    return sampled.take(table)


def config(quick: bool, rows: tuple[int, ...] = (100_000, 75_000, 50_000, 25_000)) -> Config:
    """The DLRM of the emulations: 28 intervals of 20 batches of 1024 (``quick``: small)."""
    if quick:
        return Config(rows=(8000, 6000, 4000, 2000), intervals=14, steps=8, batch=512,
                      test=20_000, accuracy=False)
    return Config(rows=rows, intervals=28, steps=20, batch=1024, test=100_000, accuracy=False)


LABELS = {"full": "full recovery", "partial": "partial (full's interval)",
          "vanilla": "CPR-vanilla", "mfu": "CPR-MFU", "ssu": "CPR-SSU"}


def overhead(em: Emulation, saves: float, lost_hours: float) -> float:
    """The emulated job's checkpoint-related overhead (a fraction of its length)."""
    return (saves * em.o_save + em.failures * (em.o_load + em.o_res) + lost_hours) / em.hours


def run(cfg: Config, em: Emulation, data: dict, test: dict, strategy: str,
        pls_target: float | None, root: str) -> Outcome:
    steps = cfg.intervals * cfg.steps
    sch = schedule(cfg, em, strategy, pls_target)
    per_hour, full_every, prio_every, predicted = (sch.per_hour, sch.full_every,
                                                   sch.prio_every, sch.predicted)
    prio = prio_every is not None

    trainer = Trainer(cfg)
    store = ckptstore.open(os.path.join(root, f"{strategy}-{pls_target}"))
    tables = {str(i): e.weight.shape[0] for i, e in enumerate(trainer.model.emb)}
    counts = AccessCounts(tables) if strategy == "mfu" else None
    sampled = SampledRows(list(tables), capacity=max(1, int(R * min(tables.values()))),
                          rate=0.01) if strategy == "ssu" else None
    tracker = ckptstore.track(trainer.model, trainer.opt_emb) if prio else None
    consecutive = Policy(incremental="consecutive", min_rows=1024, max_chain=10_000)
    pls = LostSamples(steps * cfg.batch, N_EMB)
    saves = 0.0
    lost_hours = 0.0
    n_commits = 0
    t0 = time.perf_counter()

    def commit(kind: str) -> None:
        """A full save, or a prioritised one. With prioritisation every commit is a consecutive
        increment of the tracked tables (a full save marks every row), so the chain of
        prioritised saves always has its reference."""
        nonlocal saves, n_commits
        n_commits += 1
        if tracker is None:
            store.commit(trainer.state(), policy=Policy())
            saves += 1
        else:
            tracker.clear()
            for i, e in enumerate(trainer.model.emb):
                tracker.mark(e.weight, rows_to_save(kind, str(i), e.weight.shape[0], counts,
                                                    sampled))
            store.commit(trainer.state(), policy=consecutive, tracker=tracker)
            saves += 1 if kind == "full" else R
        if kind == "full":  # PLS counts from the last full save (conservative for MFU/SSU)
            pls.saved(trainer.step * cfg.batch)

    commit("full")
    fails = list(sch.fails)
    while trainer.step < steps:
        s = trainer.step
        b = slice(s * cfg.batch, (s + 1) * cfg.batch)
        for i in range(len(tables)):
            if counts is not None:
                counts.record(str(i), data["cats"][b, i])
            if sampled is not None:
                sampled.record(str(i), data["cats"][b, i])
        trainer.train(data, 1)
        s = trainer.step
        if fails and s >= fails[0][0]:
            _, shard = fails.pop(0)
            if strategy == "full":  # everything back to the last commit, lost steps redone
                last = store.manifest(store.resolve("main")).metadata.get("step", 0)
                restored = Trainer.from_state(cfg, store.checkout("main"))
                lost_hours += (s - last) / per_hour
                # recomputing reproduces the same state: keep the live one (same data, same seed)
                del restored
            else:
                _restore_shard(trainer, store.checkout("main", paths=["model.emb.*",
                                                                        "opt_emb.*"]), shard)
                pls.failed(s * cfg.batch, 1)
        if s % full_every == 0:
            commit("full")
        elif prio_every and s % prio_every == 0:
            commit("prio")
    seconds = time.perf_counter() - t0
    if tracker is not None:
        tracker.close()
    store.close()
    return Outcome(LABELS[strategy], pls_target, overhead(em, saves, lost_hours), predicted,
                   trainer.evaluate(test)["auc"], pls.pls, n_commits, seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--pls", type=float, nargs="+", default=[0.02, 0.1, 0.2])
    ap.add_argument("--plot", default=None, help="write a PNG of overhead against PLS")
    args = ap.parse_args()
    cfg = config(args.quick)
    torch.set_num_threads(1)
    em = Emulation()
    print(f"command: {' '.join([os.path.basename(sys.executable), *sys.argv])}")
    gen = ClickData(cfg)
    steps = cfg.intervals * cfg.steps
    data = gen.draw(steps * cfg.batch, stream=0)
    test = gen.draw(cfg.test, stream=1)
    ref = Trainer(cfg)
    ref.train(data, steps)
    base_auc = ref.evaluate(test)["auc"]
    print(f"DLRM {cfg.rows} x {cfg.dim}, {steps} steps of {cfg.batch}; emulated job {em.hours} h, "
          f"MTBF {em.mtbf} h ({em.failures} failures, each of 1 of {N_EMB} shards), O_save = "
          f"O_load = {em.o_save} h, O_res = {em.o_res} h; AUC without failures {base_auc:.5f}\n")
    out: list[Outcome] = []
    with tempfile.TemporaryDirectory() as root:
        out.append(run(cfg, em, data, test, "full", None, root))
        out.append(run(cfg, em, data, test, "partial", None, root))
        for p in args.pls:
            for strategy in ("vanilla", "mfu", "ssu"):
                out.append(run(cfg, em, data, test, strategy, p, root))
    print("| strategy | target PLS | overhead | predicted (plan_recovery) | checkpoints | "
          "final PLS | AUC | AUC vs no failure | run s |")
    print("|---|---|---|---|---|---|---|---|---|")
    for o in out:
        print(f"| {o.label} | {o.pls_target if o.pls_target is not None else '-'} | "
              f"{o.overhead:.2%} | {o.predicted:.2%} | {o.saves} | {o.pls:.4f} | {o.auc:.5f} | "
              f"{(o.auc - base_auc) / base_auc:+.4%} | {o.seconds:.1f} |")
    plan = plan_recovery(RecoveryCosts(em.o_save, em.o_load, em.o_res), em.mtbf, N_EMB, 0.1)
    print(f"\nplan_recovery at PLS 0.1: {plan.mode} (full {plan.full_overhead:.2%} every "
          f"{plan.full_interval:.1f} h, partial {plan.partial_overhead:.2%} every "
          f"{plan.partial_interval:.1f} h)")
    if args.plot:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        fig, ax = plt.subplots(figsize=(6, 4))
        full = next(o for o in out if o.label == "full recovery")
        ax.axhline(100 * full.overhead, color="k", ls="--", label="full recovery")
        for label, marker in (("CPR-vanilla", "o"), ("CPR-MFU", "s"), ("CPR-SSU", "^")):
            pts = [(o.pls_target, 100 * o.overhead) for o in out if o.label == label]
            ax.plot(*zip(*pts), marker=marker, label=label)
        ax.set_xlabel("target PLS")
        ax.set_ylabel("training-time overhead (%)")
        ax.set_title("CPR emulation on the DLRM benchmark")
        ax.legend()
        fig.tight_layout()
        fig.savefig(args.plot, dpi=120)
        print(f"plot: {args.plot}")


if __name__ == "__main__":
    main()
