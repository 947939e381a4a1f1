"""Bugs a review found once; each test failed before its fix."""

from __future__ import annotations

import hashlib

import msgpack
import numpy as np
import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy
from ckptstore.chunkcodec import BloscLossless
from ckptstore.errors import CorruptedChunkError, ManifestError, UnsupportedLeafError
from ckptstore.layout import manifest_key


@pytest.mark.parametrize("state", [{"a.b": torch.ones(3), "a": {"b": torch.zeros(3)}},
                                   {1: torch.ones(3), "1": torch.zeros(3)},
                                   {"x.y": 1, "x": {"y": 2}}])
def test_colliding_dotted_paths_are_refused(tmp_path, state):
    store = ckptstore.open(tmp_path / "s")
    with pytest.raises(UnsupportedLeafError, match="dotted path"):
        store.commit(state)
    assert store.commit_ids() == []


def test_tracker_shared_by_two_branches_misses_no_row():
    emb = torch.nn.Embedding(4096, 8, sparse=True)
    model = torch.nn.ModuleDict({"emb": emb})
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    tracker = ckptstore.track(model, opt)
    store = ckptstore.open("memory://two-branches", policy=Policy(incremental="consecutive"))

    def touch(rows):
        emb(torch.tensor(rows)).sum().backward()
        opt.step()
        opt.zero_grad()

    store.commit({"model": model}, tracker=tracker)
    store.branch("dev", "main")
    touch([1, 2, 3])
    store.commit({"model": model}, tracker=tracker)
    touch([10, 11])
    store.commit({"model": model}, branch="dev", tracker=tracker)
    touch([20])
    store.commit({"model": model}, tracker=tracker)
    assert torch.equal(store.checkout("main")["model"]["emb.weight"], emb.weight.detach())


def test_checkout_into_waits_for_the_commit_in_flight():
    model = torch.nn.Linear(64, 64)
    store = ckptstore.open("memory://into-inflight", policy=Policy(incremental="consecutive",
                                                                   min_rows=32,
                                                                   min_quant_bytes=1024))
    first = store.commit({"m": model})
    with torch.no_grad():
        model.weight[5] += 1
    pending = store.commit_async({"m": model})
    store.checkout(first.id, into={"m": model})  # roll back while the commit persists
    assert pending.done()
    with torch.no_grad():
        model.weight[9] += 1
    info = store.commit({"m": model})
    assert torch.equal(store.checkout(info.id)["m"]["weight"], model.weight.detach())


def test_short_blosc_chunk_is_corruption_not_garbage():
    codec = BloscLossless()
    data = b"".join(codec.encode(np.arange(100, dtype=np.float32)))
    with pytest.raises(CorruptedChunkError, match="decodes to 400 bytes"):
        codec.decode(data, np.empty(200, np.float32), "x")


def test_zero_d_tensor_in_its_own_array(tmp_path):
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(pack_below=0))
    store.commit({"x": torch.tensor(3.0), "n": np.array(2.5)})
    out = store.checkout("main")
    assert out["x"].shape == () and float(out["x"]) == 3.0 and out["n"].shape == ()


def test_rebase_of_an_ancestor():
    store = ckptstore.open("memory://rebase-anc")
    a = store.commit({"w": torch.zeros(3)})
    store.commit({"w": torch.ones(3)})
    info = store.rebase("main~1")
    assert store.resolve("main") == info.id
    assert torch.equal(store.checkout("main")["w"], torch.zeros(3)) and info.parent != a.id


def _rewrite_manifest(store, commit_id, edit):
    key = manifest_key(commit_id)
    raw = msgpack.unpackb(store.storage.read(key)[37:], strict_map_key=False)
    edit(raw)
    payload = msgpack.packb(raw, use_bin_type=True)
    store.storage.put(key, b"CKPT\x01" + hashlib.sha256(payload).digest() + payload)


@pytest.mark.parametrize("edit", [
    lambda m: m["tensors"][0].__setitem__("chunks", [10**13]),
    lambda m: m.__setitem__("tree", None),
])
def test_hostile_manifest_fields(tmp_path, edit):
    store = ckptstore.open(tmp_path / "s")
    info = store.commit({"w": torch.randn(100_000)})
    _rewrite_manifest(store, info.id, edit)
    with pytest.raises(ManifestError):
        ckptstore.open(tmp_path / "s", create=False).checkout("main")


def test_view_outside_its_storage(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    base = torch.randn(100)
    info = store.commit({"a": base[:60], "b": base[40:]})

    def stretch(m):
        for t in m["tensors"]:
            if t["layout"] == "view":
                t["storage_offset"] = 95
    _rewrite_manifest(store, info.id, stretch)
    with pytest.raises(ManifestError, match="outside its storage"):
        ckptstore.open(tmp_path / "s", create=False).checkout("main")


def test_deleted_branch_cannot_be_moved_by_a_stale_writer():
    store = ckptstore.open("memory://tombstone")
    a = store.commit({"w": torch.zeros(2)}, branch="dev")
    stale = store.refs.tip("dev")
    b = store.commit({"w": torch.ones(2)}, branch="dev")
    store.delete_branch("dev")
    assert "dev" not in store.branches()
    with pytest.raises(ckptstore.ConcurrentUpdateError):
        store.refs.advance("dev", stale, b.id)  # saw the branch before it was deleted
    assert "dev" not in store.branches()
    store.branch("dev", a.id)  # re-created: numbers go on above the tombstone
    assert store.resolve("dev") == a.id
    with pytest.raises(ckptstore.ConcurrentUpdateError):
        store.refs.advance("dev", stale, b.id)
    assert store.resolve("dev") == a.id
