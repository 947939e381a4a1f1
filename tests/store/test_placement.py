"""The placement of each plan item, chosen once (:mod:`ckptstore.commit.placement`), the frozen
:class:`~ckptstore.commit.snapshot.Snapshot` that later steps replace instead of mutating, and the
room rule of device buffers (:mod:`ckptstore.device.memory`). CI has no GPU: the device strategies
run on CPU tensors under ``device_encode="always"``."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.commit.placement import Capture, place
from ckptstore.commit.snapshot import snapshot
from ckptstore.commit.staging import StagingPool
from ckptstore.device.memory import allocate_if_room, has_room

QUANT = Policy(quantize=QuantSpec("uniform-asymmetric", 4), min_quant_bytes=1)


def _state(step: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    emb = torch.randn(2000, 16, generator=g)
    emb[: 10 * step] += step
    return {"w": torch.randn(256, 64, generator=g), "emb": emb, "small": torch.arange(5)}


def _job(store: ckptstore.Store, state: object, policy: Policy, tracker=None):
    return store.committer.prepare(state, "", "main", (), None, policy, tracker)


def _captures(store, job, **kw) -> dict[str, Capture]:
    got = place(job.plan, store.committer.options.device_encode, **kw)
    return {job.plan.items[i].path: where.capture for i, where in got.items()}


@pytest.mark.parametrize("mode", ["always", "auto", "off"])
def test_each_item_is_placed_once_by_the_rule(tmp_path, mode):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode=mode,
                                                                    pack_below=1024))
    job = _job(store, _state(), QUANT)
    device = mode == "always"  # "auto": CPU tensors stay on the host
    quantized = Capture.ENCODE if device else Capture.HOST
    assert _captures(store, job, pooled=False) == {
        "w": quantized, "emb": quantized, "small": Capture.HOST}
    # commit_async: the rest is staged on the device too (CPU tensors are never packed there)
    staged = Capture.STAGE if device else Capture.HOST
    assert _captures(store, job, pooled=True, host_values=True) == {
        "w": staged, "emb": staged, "small": Capture.HOST}
    lossless = _job(store, _state(), Policy())
    assert _captures(store, lossless, pooled=True)["w"] == staged
    assert _captures(store, lossless, pooled=False)["w"] == Capture.HOST
    store.close()


def test_increments_are_compared_where_their_reference_is_kept(tmp_path):
    """A baseline of an increment is kept on its device (``keep``); the next increment is
    compared there (COMPARE, XOR-ed: lossless and exact); with ``"off"`` both on the host."""
    policy = Policy(incremental="consecutive", max_chain=5)
    for mode in ("always", "off"):
        store = ckptstore.open(tmp_path / mode, options=EncodingOptions(device_encode=mode,
                                                                        pack_below=1024))
        first = _job(store, _state(0), policy)
        base = place(first.plan, mode, pooled=True)[first.plan.items[1].index]
        store.commit(_state(0), policy=policy)
        job = _job(store, _state(1), policy)
        emb = job.plan.items[1]
        assert emb.path == "emb"
        where = place(job.plan, mode, pooled=False)[emb.index]
        if mode == "always":
            assert (base.capture, base.keep) == (Capture.STAGE, True)
            assert where.capture is Capture.COMPARE and where.against[1] is True
            assert where.against[0].shape == emb.source.shape
        else:
            assert (base.capture, base.keep, where.capture) == (Capture.HOST, False, Capture.HOST)
            assert where.against is None
        store.close()


def test_tracked_rows_are_staged_alone_with_a_pool(tmp_path):
    torch.manual_seed(0)
    emb = torch.nn.Embedding(4000, 8, sparse=True)
    model = torch.nn.ModuleDict({"emb": emb})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = ckptstore.track(model, opt)
    policy = Policy(incremental="one-shot")
    store = ckptstore.open(tmp_path / "s", policy=policy)
    store.commit({"model": model}, tracker=tracker)
    emb(torch.tensor([3, 7, 3])).sum().backward()
    opt.step()
    job = _job(store, {"model": model}, policy, tracker)
    item = job.plan.items[0]
    where = place(job.plan, "auto", pooled=True)[item.index]
    assert where.capture is Capture.ROWS and where.rows.tolist() == [3, 7]
    assert place(job.plan, "auto", pooled=False)[item.index].capture is Capture.HOST
    store.close()


def test_a_snapshot_is_frozen_and_settle_returns_a_new_one(tmp_path):
    """Staged on the device (CPU tensors under ``"always"``), settled to the host into a new
    snapshot; the first is left as it was, and no step may assign to either."""
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="always",
                                                                    pack_below=1024))
    state = _state()
    job = _job(store, state, Policy())
    pool = StagingPool()
    snap = snapshot(job.plan, place(job.plan, "always", pooled=True), pool)
    w = job.plan.items[0].index
    assert snap.items[w].device is not None and snap.items[w].host is None
    settled = snap.settle(pool)
    assert settled is not snap
    assert snap.items[w].device is not None and snap.items[w].host is None
    assert settled.items[w].device is None
    np.testing.assert_array_equal(settled.items[w].host, state["w"].numpy())
    assert settled.nbytes == snap.nbytes
    with pytest.raises(dataclasses.FrozenInstanceError):
        settled.packed = None  # type: ignore[misc]
    scored = settled.with_scores({w: np.ones((256, 64), np.float32)})
    assert scored.items[w].score is not None and settled.items[w].score is None
    store.close()


def test_a_device_quantized_item_stays_on_its_device_through_settle(tmp_path):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(device_encode="always"))
    job = _job(store, _state(), QUANT)
    pool = StagingPool()
    placements = place(job.plan, "always", pooled=True)
    settled = snapshot(job.plan, placements, pool).settle(pool)
    encoded = [i for i, where in placements.items() if where.capture is Capture.ENCODE]
    assert len(encoded) == 2  # w and emb
    for i in encoded:
        assert settled.items[i].device is not None and settled.items[i].host is None
    store.close()


def test_the_room_rule_off_cuda_and_out_of_memory():
    cpu = torch.device("cpu")
    assert has_room(cpu, 1 << 40)  # CPU tensors take the device path only in tests
    assert allocate_if_room(cpu, 16, lambda: torch.empty(4)).shape == (4,)

    def oom() -> torch.Tensor:
        raise torch.cuda.OutOfMemoryError("no room")

    assert allocate_if_room(cpu, 16, oom) is None
