"""Rank functions for tests/tiers/test_tier_ranks.py: 2 gloo ranks committing to a tiered store
(each rank a local tier of its own, the moto S3 server behind), run by ``dist_ranks.run_ranks``.

Faults are injected in the rank's own process, as tier_child.py does: an upload paused on an
event, or a SIGKILL at one remote write.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path
from typing import Any

import torch

W_ROWS, W_COLS = 1030, 16  # rows not divisible by 2 ranks' chunks


def full(step: int) -> dict[str, torch.Tensor]:
    """The whole tensors of step ``step`` (same on every rank and in the test)."""
    g = torch.Generator().manual_seed(step)
    return {"emb": torch.randn(W_ROWS, W_COLS, generator=g),
            "item": torch.randn(64, 24, generator=g)}


def mesh(world: int) -> Any:
    """The ranks' device mesh (a collective: every rank makes it)."""
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh("cpu", (world,))


def sharded(mesh: Any, step: int) -> dict[str, Any]:
    """``full(step)`` as DTensors: ``emb`` by rows, ``item`` by columns; nothing replicated, so
    each rank's part is a real share of the commit. No collective: every rank has the whole."""
    from torch.distributed.tensor import Shard, distribute_tensor

    t = full(step)
    return {"emb": distribute_tensor(t["emb"], mesh, [Shard(0)], src_data_rank=None),
            "item": distribute_tensor(t["item"], mesh, [Shard(1)], src_data_rank=None),
            "step": step}


def local_tier(root: str, rank: int) -> str:
    return os.path.join(root, f"local{rank}")


def open_rank(url: str, opts: dict, root: str, rank: int) -> Any:
    import ckptstore

    return ckptstore.open(url, local=local_tier(root, rank), **opts)


def _record(root: str, rank: int, commit: str) -> None:
    with open(os.path.join(root, f"ids{rank}.txt"), "a") as f:
        f.write(commit + "\n")


def returned(root: str, rank: int) -> list[str]:
    """The commits that returned on ``rank``, in order."""
    path = Path(root, f"ids{rank}.txt")
    return path.read_text().split() if path.exists() else []


def _recover(store: Any, mesh: Any, step: int) -> None:
    """CPR partial recovery: this rank's shards of the branch tip, read from its local tier
    alone (no read of the remote)."""
    sd = sharded(mesh, step)
    mine = {k: sd[k].to_local().clone() for k in ("emb", "item")}
    for k in mine:
        sd[k].to_local().zero_()
    remote_reads: list[str] = []
    remote = store.storage.remote
    real = remote.read_chunk
    remote.read_chunk = lambda key: remote_reads.append(key) or real(key)
    try:
        out = store.checkout("main", into={"emb": sd["emb"], "item": sd["item"]})
    finally:
        remote.read_chunk = real
    assert out["step"] == step
    assert all(torch.equal(sd[k].to_local(), mine[k]) for k in mine)
    assert remote_reads == [], remote_reads


def paused_part(rank: int, world: int, url: str, opts: dict, root: str) -> None:
    """Two sharded commits (``commit``, ``commit_async``); rank 1's uploads wait on an event: the coordinator's push fails naming rank 1 and the
    remote shows nothing; gc on either tier deletes nothing not published; rank 1 recovers its
    shards locally meanwhile. Then rank 1's uploads go on and the coordinator publishes."""
    import torch.distributed as dist

    import ckptstore
    from ckptstore.storage import FsspecStorage

    gate = threading.Event()
    if rank == 1:
        real = FsspecStorage.put_chunk

        def paused(self: FsspecStorage, key: str, data: Any) -> None:
            gate.wait()
            real(self, key, data)

        FsspecStorage.put_chunk = paused  # type: ignore[method-assign]
    m = mesh(world)
    with open_rank(url, opts, root, rank) as store:
        store.tiers.uploader.part_timeout = 1.0
        ids = [store.commit(sharded(m, 0), message="s0").id,  # and one commit_async
               store.commit_async(sharded(m, 1), message="s1").wait().id]
        for c in ids:
            _record(root, rank, c)
        assert store.resolve("main") == ids[1]  # on every rank's local tier (adopted)
        gone = store.gc(tier="local", keep_last=1, grace_period=0)
        assert not gone.commits_removed and not gone.data_removed, gone
        if rank == 1:
            _recover(store, m, step=1)  # nothing of it is on the remote yet
            assert [u.state for u in store.uploads] == ["uploading", "local-only"]
        else:
            try:
                store.push()
                raise AssertionError("the coordinator published without rank 1's part")
            except ckptstore.UploadError as e:
                assert "rank(s) [1] of 2" in str(e), e
            reader = ckptstore.open(url, create=False, skip_instance_cache=True, **opts)
            assert reader.branches() == {} and reader.commit_ids() == []
            gone = store.gc(tier="remote", keep_last=1, grace_period=0)
            assert not gone.data_removed, gone  # its own parts, uploaded, wait for rank 1's
        dist.barrier()
        if rank == 1:
            gate.set()
            store.push()
        dist.barrier()
        if rank == 0:
            store.push()


def _kill_at(cls: type, name: str, match: str, after: bool) -> None:
    """SIGKILL this process at the first call of ``cls.name`` on a key containing ``match``."""
    real = getattr(cls, name)

    def hooked(self: Any, key: str, *args: Any, **kwargs: Any) -> Any:
        if match in key and not after:
            os.kill(os.getpid(), signal.SIGKILL)
        out = real(self, key, *args, **kwargs)
        if match in key:
            os.kill(os.getpid(), signal.SIGKILL)
        return out

    setattr(cls, name, hooked)


def killed_before_publish(rank: int, world: int, url: str, opts: dict, root: str) -> None:
    """Rank 1 is killed right after its completion object is up (its journal record not yet
    dropped), the coordinator right before it puts the remote manifest."""
    from ckptstore.storage import FsspecStorage

    if rank == 1:
        _kill_at(FsspecStorage, "put_if_absent", "/.parts/", after=True)
    else:
        _kill_at(FsspecStorage, "put_if_absent", "commits/", after=False)
    m = mesh(world)
    store = open_rank(url, opts, root, rank)
    _record(root, rank, store.commit(sharded(m, 0), message="s0").id)
    store.push()
    raise AssertionError("not killed")
