"""Bugs a review found once; each test failed before its fix."""

from __future__ import annotations

import hashlib
import time

import msgpack
import numpy as np
import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy
from ckptstore.chunkcodec import BloscLossless
from ckptstore.errors import CorruptedChunkError, ManifestError, UnsupportedLeafError
from ckptstore.format.layout import manifest_key


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


def test_verify_reports_a_broken_chain_and_still_checks_the_other_entries(tmp_path):
    """A missing chain base hid every array of the commit from verify (review of issue 9)."""
    root = tmp_path / "s"
    policy = ckptstore.Policy(incremental="consecutive", min_rows=1024, min_quant_bytes=0)
    store = ckptstore.open(root, options=ckptstore.EncodingOptions(pack_below=512))
    state = {"emb": torch.zeros(4096, 4), "w": torch.randn(256, 64)}
    base = store.commit(state, policy=policy).id
    state["emb"][3] += 1
    top = store.commit(state, policy=policy).id
    w = next(e for e in store.manifest(top).tensors if e.path == "w")
    chunk = root / "data" / top / w.array / "c" / "0" / "0"
    data = bytearray(chunk.read_bytes())
    data[20:24] = b"\xff\xff\xff\xff"
    chunk.write_bytes(bytes(data))
    (root / "commits" / f"{base}.msgpack").unlink()
    report = ckptstore.open(root, create=False).verify(top)
    assert not report.ok and report.commits_checked == 1
    assert any("'emb'" in p and base in p for p in report.problems)
    assert any(f"data/{top}/w/c/0/0" in p and "crc32c" in p for p in report.problems)


def test_a_chunk_codec_id_that_is_not_a_string_is_a_manifest_error():
    from ckptstore.chunkcodec import codec_from_config

    for config in ({"id": ["blosc"]}, {"id": None}, ["blosc"]):
        with pytest.raises(ManifestError, match="unknown chunk codec"):
            codec_from_config(config)
    with pytest.raises(ManifestError, match="upgrade"):
        codec_from_config({"id": "raw", "level": 3})


def test_diff_of_states_with_an_empty_tensor():
    store = ckptstore.open("memory://diff-empty")
    a = store.commit({"w": torch.ones(3), "empty": torch.empty(0)}).id
    b = store.commit({"w": torch.zeros(3), "empty": torch.empty(0)}).id
    result = store.diff(a, b)
    assert [c.path for c in result.changed] == ["w"] and result.unchanged == 1


def test_commit_async_stall_includes_resolving_a_restore_driven_bit_width():
    """The restore count (a listing of the store) is taken inside the timed stall."""
    store = ckptstore.open("memory://stall-bitwidth", policy=ckptstore.Policy(
        quantize=ckptstore.QuantSpec(bits=8), bitwidth=ckptstore.BitWidth(expected_restores=1)))
    slow = 0.2
    listdir = store.storage.listdir

    def slow_listdir(key):
        if key.startswith("stats"):
            time.sleep(slow)
        return listdir(key)

    store.storage.listdir = slow_listdir
    pending = store.commit_async({"w": torch.randn(64, 64)})
    pending.wait()
    assert pending.stall_seconds >= slow
