"""Run a function on N gloo ranks (spawned processes) and the rank functions the tests use.

Each rank writes its outcome to ``<out>/rank<r>.txt`` ("ok" or a traceback) so that a test sees
every rank's failure, and a rank that dies (on purpose, in the kill tests) is told apart from
one that raised.
"""

from __future__ import annotations

import datetime
import multiprocessing
import os
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

# -- the launcher --------------------------------------------------------------------------------


def _entry(fn: Callable[..., None], rank: int, world: int, out: str, args: tuple) -> None:
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ.update(LOCAL_RANK=str(rank), LOCAL_WORLD_SIZE=str(world))  # as torchrun does
    try:
        dist.init_process_group("gloo", init_method=f"file://{out}/pg", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=60))
        fn(rank, world, *args)
        Path(out, f"rank{rank}.txt").write_text("ok")
    except BaseException:  # noqa: BLE001 - reported to the test through the file
        Path(out, f"rank{rank}.txt").write_text(traceback.format_exc())
        raise SystemExit(1)
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_ranks(fn: Callable[..., None], world: int, out: Path, *args: Any,
              timeout: float = 240) -> list[str]:
    """Run ``fn(rank, world, *args)`` on ``world`` spawned gloo ranks; return each rank's
    outcome ("ok", a traceback, or "exit <code>" for a rank that died without a word)."""
    out.mkdir(parents=True, exist_ok=True)
    for f in out.glob("rank*.txt"):
        f.unlink()
    pg = out / "pg"
    if pg.exists():
        pg.unlink()
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_entry, args=(fn, r, world, str(out), args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout)
    for p in procs:
        if p.is_alive():
            p.kill()
            p.join()
    results = []
    for r, p in enumerate(procs):
        f = out / f"rank{r}.txt"
        results.append(f.read_text() if f.exists() else f"exit {p.exitcode}")
    return results


def check_ranks(results: list[str]) -> None:
    bad = [f"rank {r}:\n{t}" for r, t in enumerate(results) if t != "ok"]
    assert not bad, "\n".join(bad)


# -- the state the tests shard -------------------------------------------------------------------
def tables() -> dict[str, torch.Tensor]:
    """Full tensors of a small recommendation model (same on every rank)."""
    g = torch.Generator().manual_seed(0)
    return {"emb.user": torch.randn(1030, 16, generator=g),   # rows not divisible by 4
            "emb.item": torch.randn(64, 24, generator=g),     # sharded by columns
            "mlp.weight": torch.randn(16, 8, generator=g),    # replicated
            "mlp.bias": torch.randn(8, generator=g)}


def sharded_state(world: int, full: dict[str, torch.Tensor] | None = None) -> dict[str, Any]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
    full = full if full is not None else tables()
    mesh = init_device_mesh("cpu", (world,))
    return {"emb": {"user": distribute_tensor(full["emb.user"], mesh, [Shard(0)]),
                    "item": distribute_tensor(full["emb.item"], mesh, [Shard(1)])},
            "mlp": {"weight": distribute_tensor(full["mlp.weight"], mesh, [Replicate()]),
                    "bias": full["mlp.bias"].clone()},
            "step": 7, "param_groups": [{"lr": 0.1, "params": [0, 1]}]}


def zero_state(world: int) -> dict[str, Any]:
    return sharded_state(world, {k: torch.zeros_like(v) for k, v in tables().items()})


def assert_full(sd: dict[str, Any]) -> None:
    """``sd`` (as loaded) holds exactly :func:`tables`."""
    from torch.distributed.tensor import DTensor
    full = tables()
    got = {"emb.user": sd["emb"]["user"], "emb.item": sd["emb"]["item"],
           "mlp.weight": sd["mlp"]["weight"], "mlp.bias": sd["mlp"]["bias"]}
    for k, v in got.items():
        v = v.full_tensor() if isinstance(v, DTensor) else v
        assert torch.equal(v, full[k]), k
    assert sd["step"] == 7 and sd["param_groups"] == [{"lr": 0.1, "params": [0, 1]}]


# -- rank functions ------------------------------------------------------------------------------
def save_tables(rank: int, world: int, url: str, opts: dict, tag: str) -> None:
    import torch.distributed.checkpoint as dcp

    import ckptstore
    from ckptstore.dcp import StorageWriter
    with ckptstore.open(url, **opts) as store:
        writer = StorageWriter(store, message=f"saved on {world}", tags=[tag])
        dcp.save(sharded_state(world), storage_writer=writer)
        if rank == 0:
            assert writer.last_commit is not None and store.resolve(tag) == writer.last_commit.id


def load_tables(rank: int, world: int, url: str, opts: dict, tag: str) -> None:
    import torch.distributed.checkpoint as dcp

    import ckptstore
    from ckptstore.dcp import StorageReader
    with ckptstore.open(url, create=False, **opts) as store:
        sd = zero_state(world)
        sd["step"], sd["param_groups"] = 0, None
        dcp.load(sd, storage_reader=StorageReader(store, tag))
        assert_full(sd)


def die_while_writing(rank: int, world: int, url: str, opts: dict) -> None:
    """Rank 1 dies in the middle of writing its chunks; rank 0 must see the save fail."""
    import torch.distributed.checkpoint as dcp

    import ckptstore
    import ckptstore.commit.pipeline as sharded  # where a rank's write calls persist
    from ckptstore.dcp import StorageWriter
    real = sharded.persist

    def dying_persist(*a: Any, **k: Any) -> Any:
        out = real(*a, **k)  # its chunks are written; the rank dies before reporting them
        os._exit(3)
        return out

    if rank == 1:
        sharded.persist = dying_persist
    with ckptstore.open(url, **opts) as store:
        before = store.resolve("main")
        try:
            dcp.save(sharded_state(world), storage_writer=StorageWriter(store, message="doomed"))
        except Exception as e:  # noqa: BLE001 - what a surviving rank sees
            assert store.resolve("main") == before, "the ref moved after a failed commit"
            Path(url, "..", "survivor.txt").resolve().write_text(type(e).__name__)
            return
        raise AssertionError("the save succeeded although a rank died")


def fsdp_commit_checkout(rank: int, world: int, url: str, opts: dict) -> None:
    """FSDP2 model + optimizer: collective Store.commit, local checkout into live DTensors,
    commit_async, and a single-process full checkout on rank 0."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import ckptstore

    def build() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
        torch.manual_seed(1)
        model = torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.ReLU(),
                                    torch.nn.Linear(32, 5))
        mesh = init_device_mesh("cpu", (world,))
        for layer in (model[0], model[2]):
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
        return model, torch.optim.Adam(model.parameters(), lr=1e-2)

    model, opt = build()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(rank))
    model(x).sum().backward()
    opt.step()
    with ckptstore.open(url, **opts) as store:
        info = store.commit({"model": model, "optim": opt, "step": 1}, message="fsdp")
        ids = [None] * world
        dist.all_gather_object(ids, info.id)
        assert len(set(ids)) == 1, ids
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        if rank == 0:  # one process, no collective: full tensors of the sharded commit
            got = store.checkout(info.id)
            for k, v in full.items():
                assert torch.equal(got["model"][k], v), k
        local = {k: v.to_local().clone() for k, v in model.state_dict().items()}
        moments = {k: v["exp_avg"].to_local().clone() for k, v in opt.state_dict()["state"].items()}
        model2, opt2 = build()
        model2(x).sum().backward()
        opt2.step()
        opt2.step()  # different optimizer state
        state = store.checkout(info.id, into={"model": model2, "optim": opt2})
        assert state["step"] == 1
        for k, v in model2.state_dict().items():
            assert torch.equal(v.to_local(), local[k]), k
        for k, v in opt2.state_dict()["state"].items():
            assert torch.equal(v["exp_avg"].to_local(), moments[k]), k
        opt2.step()
        pending = store.commit_async({"model": model2, "optim": opt2, "step": 2})
        info2 = pending.wait(120)
        assert info2.parent == info.id and store.resolve("main") == info2.id


def _fsdp_mlp(world: int, seed: int) -> torch.nn.Module:
    """A 32-128-4 MLP whose layers FSDP2 shards over the ``world`` CPU ranks."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(32, 128), torch.nn.ReLU(), torch.nn.Linear(128, 4))
    mesh = init_device_mesh("cpu", (world,))
    for layer in (model[0], model[2]):
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def fsdp_shrink_commits(rank: int, world: int, url: str, opts: dict) -> None:
    """ExCP's Shrink through the collective Store.commit of an FSDP2 model and AdamW: each rank
    stores its blocks of the weights as residual chains, moments pruned with them; a whole
    checkout on rank 0 is close to the live weights."""
    import torch.distributed as dist

    import ckptstore
    from ckptstore.history.manifest import Kind
    from ckptstore.policy import Policy, Shrink

    model = _fsdp_mlp(world, seed=2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    policy = Policy(shrink=Shrink.of(model, opt, keep=0.5))
    g = torch.Generator().manual_seed(rank)
    with ckptstore.open(url, **opts) as store:
        if opts.get("background") == "auto":  # in the persist process from the first commit
            store.reserve({"model": model, "optim": opt}).result()
            assert store.committer.way == "process"
        first = store.commit({"model": model, "optim": opt}, policy=policy)
        for step in range(3):
            for _ in range(5):
                opt.zero_grad()
                model(torch.randn(64, 32, generator=g)).pow(2).mean().backward()
                opt.step()
            state = {"model": model, "optim": opt}
            info = (store.commit_async(state, policy=policy).wait(120) if step == 1
                    else store.commit(state, policy=policy))  # a collective commit_async too
        m = store.manifest(info.id)
        kinds = {e.path.split("@")[0]: (e.kind, e.chain) for e in m.shards}
        assert kinds["model.0.weight"] == (Kind.RESIDUAL, 3), kinds
        full = {k: v.full_tensor() for k, v in model.state_dict().items()}
        dist.barrier()
        if rank == 0:
            got, base = store.checkout(info.id)["model"], store.checkout(first.id)["model"]
            for k in ("0.weight", "2.weight"):
                lag, moved = (got[k] - full[k]).norm(), (base[k] - full[k]).norm()
                assert lag < 0.7 * moved, (k, float(lag), float(moved))  # lags, never drifts
            assert store.verify().ok
        dist.barrier()


def fsdp_sensitivity_commit(rank: int, world: int, url: str, opts: dict) -> None:
    """GradientEMA on an FSDP2 model (DTensor averages of the DTensor parameters) and a
    collective Store.commit with Policy(sensitivity=...): each rank prunes the smallest
    w**2 * E[g**2] of its block."""
    import torch.distributed as dist
    from torch.distributed.tensor import DTensor

    import ckptstore
    from ckptstore import GradientEMA
    from ckptstore.policy import Policy, QuantSpec

    model = _fsdp_mlp(world, seed=3)
    ema = GradientEMA(model)
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        opt.zero_grad()
        model(torch.randn(64, 32, generator=g)).pow(2).mean().backward()
        opt.step()
    avg = ema.average("model.0.weight")
    assert isinstance(avg, DTensor), type(avg)
    spec = QuantSpec("kmeans", 4, "tensor", prune=0.3)
    with ckptstore.open(url, **opts) as store:
        info = store.commit({"model": model}, policy=Policy(quantize=spec, min_quant_bytes=0,
                                                             sensitivity=ema))
        w = model.state_dict()["0.weight"].full_tensor()
        score = w * w * avg.full_tensor()
        dist.barrier()
        if rank == 0:
            got = store.checkout(info.id)["model"]["0.weight"]
            rows = got.shape[0] // world
            for r in range(world):
                pruned, s = got[r * rows:(r + 1) * rows] == 0, score[r * rows:(r + 1) * rows]
                assert abs(pruned.float().mean().item() - 0.3) < 0.01
                assert s[pruned].max() <= s[~pruned].min() + 1e-9, r
        dist.barrier()


def policy_commits(rank: int, world: int, url: str, opts: dict) -> None:
    """Per-rank policies through the collective Store.commit: one-shot increments of each
    rank's shard (exact), then an 8-bit commit."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckptstore
    from ckptstore.policy import Policy, QuantSpec
    mesh = init_device_mesh("cpu", (world,))
    full = torch.randn(4096, 16, generator=torch.Generator().manual_seed(5))
    policy = Policy(incremental="one-shot", min_rows=256)
    with ckptstore.open(url, **opts) as store:
        ids = []
        for step in range(3):
            full[step * 1500: step * 1500 + 3] += 1.0  # rows on different ranks each time
            emb = distribute_tensor(full, mesh, [Shard(0)])
            ids.append(store.commit({"emb": emb, "step": step}, policy=policy).id)
        m = store.manifest(ids[-1])
        assert [s.kind for s in m.shards] == ["incremental"] * world, m.shards
        assert {s.base_commit for s in m.shards} == {ids[0]}
        if rank == 0:
            assert torch.equal(store.checkout(ids[-1])["emb"], full)
        back = distribute_tensor(torch.zeros_like(full), mesh, [Shard(0)])
        store.checkout(ids[-1], into={"emb": back})
        assert torch.equal(back.to_local(), emb.to_local())
        q = store.commit({"emb": emb, "step": 9},
                         policy=Policy(quantize=QuantSpec(bits=8), min_quant_bytes=1024))
        m = store.manifest(q.id)
        assert all(s.codec["id"] == "quantize" for s in m.shards), [s.codec for s in m.shards]
        if rank == 0:
            err = (store.checkout(q.id)["emb"] - full).abs().max().item()
            assert 0 < err < 0.05, err


def one_rank_recovers(rank: int, world: int, url: str, opts: dict) -> None:
    """A collective commit; then one rank loses its shard and restores it alone (no
    collective), reading only its own chunks (CPR's partial recovery)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckptstore
    mesh = init_device_mesh("cpu", (world,))
    full = torch.randn(40_000, 64, generator=torch.Generator().manual_seed(3))  # 10 MB
    emb = distribute_tensor(full, mesh, [Shard(0)])
    with ckptstore.open(url, **opts) as store:
        info = store.commit({"emb": emb, "step": 5})
        dist.barrier()
        if rank == world - 1:
            mine = emb.to_local().clone()
            emb.to_local().zero_()  # this rank's embedding server failed
            reads: list[str] = []
            real = store.storage.read_chunk
            store.storage.read_chunk = lambda key: reads.append(key) or real(key)
            state = store.checkout(info.id, into={"emb": emb})
            assert torch.equal(emb.to_local(), mine) and state["step"] == 5
            data = [k for k in reads if "/data/" in f"/{k}"]
            assert data and all(f"/r{rank}." in k for k in data), data
        dist.barrier()  # the other ranks never joined a collective for the recovery
        assert torch.equal(emb.full_tensor(), full)


def tracked_shards(rank: int, world: int, url: str, opts: dict) -> None:
    """Each rank trains its own rows of a table in a local module (model parallel) exposed as
    a DTensor over the same memory; its tracker gives the increments of its shard."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import ckptstore
    from ckptstore.errors import DistributedError
    from ckptstore.policy import Policy
    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(rank)
    local = torch.nn.Embedding(5000, 16, sparse=True)
    opt = torch.optim.SGD(local.parameters(), lr=0.1)
    tracker = ckptstore.track(local, opt)
    state = {"emb": DTensor.from_local(local.weight.detach(), mesh, [Shard(0)])}
    policy = Policy(incremental="one-shot", min_rows=1000)
    with ckptstore.open(url, **opts) as store:
        store.commit(state, policy=policy, tracker=tracker)
        local(torch.tensor([rank + 1, 7, 42])).sum().backward()
        opt.step()
        tracker.mark(local.weight, torch.tensor([100]))  # unchanged: only the tracker says so
        info = store.commit(state, policy=policy, tracker=tracker)
        m = store.manifest(info.id)
        assert [s.kind for s in m.shards] == ["incremental"] * world, m.shards
        # 4 rows: the tracker's (comparing values would have found the 3 that changed)
        assert all(s.fractions == [4 / 5000] for s in m.shards), [s.fractions for s in m.shards]
        got = store.checkout(info.id)["emb"]  # one process, no collective
        assert torch.equal(got[rank * 5000:(rank + 1) * 5000], local.weight.detach())
        try:
            store.commit_async(state, tracker=tracker)
        except DistributedError as e:
            assert "takes no tracker" in str(e)
        else:
            raise AssertionError("commit_async accepted a tracker under a process group")


def async_errors(rank: int, world: int, url: str, opts: dict) -> None:
    """Failures of a collective commit_async come out as ckptstore errors, not DCP's
    CheckpointException (a BaseException); a staging budget over on one rank is refused on
    all."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckptstore
    from ckptstore.errors import RefExists
    mesh = init_device_mesh("cpu", (world,))
    state = {"emb": distribute_tensor(torch.randn(64, 4), mesh, [Shard(0)])}
    with ckptstore.open(url, **opts) as store:
        first = store.commit_async(state, tags=["t"]).wait(120)
        try:
            store.commit_async(state, tags=["t"]).wait(120)
        except RefExists:
            pass
        else:
            raise AssertionError("a second commit with tag 't' went through")
        assert store.resolve("main") == first.id
    # staging_budget: rank 0's shard (512 bytes) is over its budget, rank 1 has none; both
    # refuse before writing anything (no rank is left waiting in DCP's collectives)
    from ckptstore.errors import StagingBudgetError
    with ckptstore.open(url, staging_budget=100 if rank == 0 else None, **opts) as store:
        try:
            store.commit_async(state)
        except StagingBudgetError as e:
            assert "nothing was written on any rank" in str(e), e
        else:
            raise AssertionError("commit_async went over rank 0's staging budget")
        assert store.resolve("main") == first.id


def sharded_tensor_round_trip(rank: int, world: int, url: str, opts: dict) -> None:
    """The older ShardedTensor (ChunkShardingSpec) saves through DCP into a store and loads
    back into a DTensor."""
    import warnings

    import torch.distributed.checkpoint as dcp
    from torch.distributed._shard import shard_parameter
    from torch.distributed._shard.sharding_spec import ChunkShardingSpec
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckptstore
    from ckptstore.dcp import StorageReader, StorageWriter
    warnings.filterwarnings("ignore", category=FutureWarning)  # "Please use DTensor instead"
    full = torch.randn(10, 6, generator=torch.Generator().manual_seed(0))
    lin = torch.nn.Linear(6, 10, bias=False)
    with torch.no_grad():
        lin.weight.copy_(full)
    shard_parameter(lin, "weight", ChunkShardingSpec(
        dim=0, placements=[f"rank:{r}/cpu" for r in range(world)]))
    with ckptstore.open(url, **opts) as store:
        dcp.save({"w": lin.weight}, storage_writer=StorageWriter(store))
        if rank == 0:
            assert torch.equal(store.checkout("main")["w"], full)
        mesh = init_device_mesh("cpu", (world,))
        back = {"w": distribute_tensor(torch.zeros(10, 6), mesh, [Shard(1)])}
        dcp.load(back, storage_reader=StorageReader(store))
        assert torch.equal(back["w"].full_tensor(), full)


def parts_in_persist_process(rank: int, world: int, url: str, opts: dict) -> None:
    """Collective commits whose rank parts the persist process writes (``background="auto"``):
    ``reserve`` starts it; ``commit_async`` copies the local shards into its shared file and
    keeps the values of the call while training changes the tensors; ``commit`` and a further
    ``commit_async`` go there too, one-shot increments of each rank's shard across them (its
    chain memory); the part entries travel back for the coordinator's merge."""
    import os

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    import ckptstore
    from ckptstore.policy import Policy

    state = sharded_state(world)
    full = torch.randn(4096, 16, generator=torch.Generator().manual_seed(5))
    emb = state["emb"]["user"] = distribute_tensor(full, init_device_mesh("cpu", (world,)),
                                                   [Shard(0)])
    policy = Policy(incremental="one-shot", min_rows=256)
    with ckptstore.open(url, **opts) as store:
        assert store.reserve(state).result() > 0
        committer = store._committer
        assert committer.way == "process", committer.way
        pid = committer.call_stats() is not None and committer._worker.proc.pid
        assert pid != os.getpid()
        pending = store.commit_async(state, message="one", policy=policy)
        with torch.no_grad():  # training goes on at once: the commit keeps the call's values
            emb.to_local().add_(1.0)
        first = pending.wait(120)
        with torch.no_grad():
            emb.to_local()[:3].add_(1.0)  # three rows of each rank's shard change
        boosted = committer.call_stats()["boosted"]
        second = store.commit(state, message="two", policy=policy)
        assert committer.call_stats()["boosted"] == boosted + 1  # the caller waited: raised
        with torch.no_grad():
            emb.to_local()[5:7].add_(1.0)
        third = store.commit_async(state, message="three", policy=policy).wait(120)
        assert committer.way == "process" and committer._worker.proc.pid == pid
        assert [third.parent, second.parent] == [second.id, first.id]
        m = store.manifest(third.id)
        assert [s.kind.value for s in m.shards if s.path.startswith("emb.user@")] == \
            ["incremental"] * world, m.shards
        now = emb.full_tensor()
        dist.barrier()
        if rank == 0:
            assert torch.equal(store.checkout(first.id)["emb"]["user"], full)
            got = store.checkout(third.id)
            assert torch.equal(got["emb"]["user"], now)
            assert torch.equal(got["emb"]["item"], tables()["emb.item"])
            assert torch.equal(got["mlp"]["weight"], tables()["mlp.weight"])
            assert got["step"] == 7
            assert store.verify().problems == []


def offset_shards_async(rank: int, world: int, url: str, opts: dict) -> None:
    """``commit_async`` of DTensors whose local shards start past their storage's beginning
    (``DTensor.from_local`` over views: a transposed block of rows, and a slice; one of them
    at two paths), on each way: the commit holds the call's values while training changes the
    shards. DCP's own stager (the thread's way) failed on them before: "copy_() on an invalid
    python storage"."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import DTensor, Shard

    import ckptstore

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(3)
    base, flat = torch.randn(6, 5 * world, generator=g), torch.randn(64, generator=g)
    rows = DTensor.from_local(base.t()[5 * rank:5 * rank + 5], mesh, [Shard(0)],
                              run_check=False, shape=torch.Size([5 * world, 6]), stride=(6, 1))
    sliced = DTensor.from_local(flat[8 + 4 * rank:8 + 4 * rank + 4].view(2, 2), mesh,
                                [Shard(0)], run_check=False)
    state = {"rows": rows, "sliced": sliced, "again": sliced}
    with ckptstore.open(url, **opts) as store:
        want = {k: v.full_tensor().clone() for k, v in state.items()}
        pending = store.commit_async(state)
        with torch.no_grad():
            base.add_(1.0)
            flat.add_(1.0)
        info = pending.wait(120)
        dist.barrier()
        if rank == 0:
            got = store.checkout(info.id)
            assert all(torch.equal(got[k], v) for k, v in want.items()), got
            assert store.verify().problems == []


def one_rank_cannot_copy(rank: int, world: int, url: str, opts: dict) -> None:
    """background="thread": rank 1's staging copy fails (out of memory, here made to): every
    rank raises at once -- rank 1 its error, the others DistributedError -- instead of the
    others waiting in the save's first collective, and nothing is written."""
    import time

    import ckptstore
    from ckptstore.dcp import collective
    from ckptstore.errors import DistributedError

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    def no_memory(tensors):
        raise MemoryError("no memory for the staging copy (made to fail)")

    if rank == 1:
        collective._copies = no_memory
    mesh = init_device_mesh("cpu", (world,))
    state = {"w": distribute_tensor(torch.randn(8, 4, generator=torch.Generator().manual_seed(0)),
                                    mesh, [Shard(0)])}
    with ckptstore.open(url, background="thread") as store:
        t0 = time.perf_counter()
        try:
            store.commit_async(state)
        except (MemoryError, DistributedError) as e:
            assert isinstance(e, MemoryError) == (rank == 1), e
        else:
            raise AssertionError("commit_async went on past rank 1's failed copy")
        assert time.perf_counter() - t0 < 20
        assert store.refs.branches() == {}


def one_rank_cannot_stage(rank: int, world: int, url: str, opts: dict) -> None:
    """Rank 1's snapshot does not fit its staging_budget (the shared file's aligned layout is
    larger than its raw bytes): every rank raises StagingBudgetError at once, before the save's
    first collective (no rank waits for the one that failed), and nothing is written."""
    import time

    import ckptstore
    from ckptstore.errors import StagingBudgetError

    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    g = torch.Generator().manual_seed(0)  # rank 1 holds one row (20 bytes) of each
    state = {k: distribute_tensor(torch.randn(3, 5, generator=g), mesh, [Shard(0)])
             for k in ("a", "b")}
    budget = 40 if rank == 1 else None  # its raw bytes: 84 in the file (64-byte aligned)
    with ckptstore.open(url, background="process", staging_budget=budget) as store:
        t0 = time.perf_counter()
        try:
            store.commit_async(state)
        except StagingBudgetError as e:
            assert ("another rank" in str(e)) == (rank == 0), e
        else:
            raise AssertionError("commit_async went over rank 1's shared staging budget")
        assert time.perf_counter() - t0 < 20
        assert store.refs.branches() == {}  # nothing committed
