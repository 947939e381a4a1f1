"""Sharded commits in one process: the format-2 manifest, reading pieces back, verify and gc,
hostile manifests, DCP without a process group, and no pickle on the DCP path."""

from __future__ import annotations

import math
import os
import pickle

import pytest
import torch
import torch.distributed.checkpoint as dcp

from ckptstore.dcp import StorageReader, StorageWriter
from ckptstore.errors import DistributedError, ManifestError, UnsupportedLeafError
from ckptstore.format.layout import manifest_key
from ckptstore.history.manifest import CHUNK_DIGESTS_VERSION, Layout, decode_manifest, encode_manifest
from ckptstore.policy import Policy, QuantSpec
from ckptstore.dcp.shards import LocalTensor, commit_shards

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def _rows(fqn: str, full: torch.Tensor, n: int) -> list[LocalTensor]:
    """``full`` split by rows over ``n`` ranks (torch.chunk sizes, as DTensor Shard(0))."""
    out, lo = [], 0
    for part in torch.chunk(full, n):
        out.append(LocalTensor(fqn, (lo, *[0] * (full.dim() - 1)), tuple(full.shape), part))
        lo += part.shape[0]
    return out


def _ranks(n: int, tables: dict[str, torch.Tensor], replicated: dict[str, torch.Tensor]
           ) -> list[list[LocalTensor]]:
    ranks: list[list[LocalTensor]] = [[] for _ in range(n)]
    for fqn, full in tables.items():
        for r, t in enumerate(_rows(fqn, full, n)):
            ranks[r].append(t)
    for i, (fqn, t) in enumerate(replicated.items()):  # each written by one rank
        ranks[i % n].append(LocalTensor(fqn, (0,) * t.dim(), tuple(t.shape), t))
    return ranks


@pytest.fixture
def tables():
    g = torch.Generator().manual_seed(0)
    return ({"emb.a": torch.randn(2001, 32, generator=g), "emb.b": torch.randn(7, 3, generator=g)},
            {"mlp.w": torch.randn(256, 128, generator=g), "mlp.b": torch.randn(64, generator=g)})


@pytest.mark.every_backend
def test_sharded_commit_reads_back_whole_and_by_piece(backend_store, tables):
    emb, mlp = tables
    m = commit_shards(backend_store, _ranks(4, emb, mlp), message="4 ranks")
    assert m.format_version == 2 and len(m.shards) == 8 and len(m.packs) >= 1
    assert [e.layout for e in m.tensors] == [Layout.SHARDED, Layout.SHARDED, Layout.ARRAY,
                                             Layout.PACKED]
    got = backend_store.checkout("main")
    for k, v in {**emb, **mlp}.items():
        assert torch.equal(got[k], v), k
    assert backend_store.verify().problems == []
    # DCP in one process: every stored piece copied into the whole tensor
    sd = {k: torch.zeros_like(v) for k, v in {**emb, **mlp}.items()}
    dcp.load(sd, storage_reader=StorageReader(backend_store))
    for k, v in {**emb, **mlp}.items():
        assert torch.equal(sd[k], v), k


def test_region_reads_only_the_overlapping_chunks(store, tables):
    emb, _ = tables
    big = torch.randn(40_000, 64)  # 10 MB: two shards of several chunks each
    m = commit_shards(store, [[t] for t in _rows("big", big, 2)],
                      policy=Policy())
    from ckptstore.checkout.reader import Reader
    reads = []
    real = store.storage.read_chunk
    store.storage.read_chunk = lambda key: reads.append(key) or real(key)
    shard = m.shards[m.tensors[0].pieces[1].entry]
    block = Reader(store.repo).region(shard, [0, 0], [10, 64])
    assert torch.equal(torch.from_numpy(block), big[20_000:20_010])
    assert len(reads) == 1, reads  # one chunk of one shard


def test_unsharded_commits_stay_format_1(store):
    info = store.commit({"w": torch.randn(10, 10)})
    raw = store.storage.read(manifest_key(info.id))
    assert raw[4] == 1 and b"shards" not in raw and b"pieces" not in raw
    assert encode_manifest(decode_manifest(raw)) == raw


def test_policy_per_shard_chains_and_quantization(store):
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(4096, 16, generator=g)
    policy = Policy(incremental="one-shot", min_rows=512)
    ranks = lambda t: [[x] for x in _rows("emb", t, 2)]  # noqa: E731
    m1 = commit_shards(store, ranks(emb), policy=policy)
    emb[[5, 3000]] += 1
    m2 = commit_shards(store, ranks(emb), policy=policy)
    assert [s.kind for s in m2.shards] == ["incremental", "incremental"]
    assert {s.base_commit for s in m2.shards} == {m1.id}
    assert torch.equal(store.checkout("main")["emb"], emb)
    q = Policy(quantize=QuantSpec(bits=8), min_quant_bytes=1024)
    commit_shards(store, ranks(emb), policy=q)
    got = store.checkout("main")["emb"]
    assert not torch.equal(got, emb) and (got - emb).abs().max() < 0.05
    d = Policy(quantize=QuantSpec(bits=8), delta=True, min_quant_bytes=1024)
    commit_shards(store, ranks(emb), policy=d)
    emb += 0.01
    m4 = commit_shards(store, ranks(emb), policy=d)
    assert [s.kind for s in m4.shards] == ["delta", "delta"]  # code deltas per shard
    assert (store.checkout("main")["emb"] - emb).abs().max() < 0.05
    store.gc(keep_last=1, grace_period=0)
    assert store.verify().problems == []


@pytest.mark.parametrize("damage, message", [
    (lambda raw: raw["tensors"][0]["pieces"][0].update(entry=99), "missing shard"),
    (lambda raw: raw["tensors"][0]["pieces"][0].update(offsets=[5000, 0]), "does not fit"),
    (lambda raw: raw["tensors"][0]["pieces"].pop(), "cover the tensor"),
    (lambda raw: raw["tensors"][0]["pieces"][1].update(offsets=[0, 0]), "cover the tensor"),
    (lambda raw: raw["tensors"][0].update(pieces=[{"offsets": [0], "entry": 0}]), "dimensions"),
    (lambda raw: raw["shards"][0].update(array="..\\x"), "bad array name"),
    (lambda raw: raw["shards"][0].update(array="a\0b"), "bad array name"),
])
def test_hostile_sharded_manifests_are_refused(store, tables, damage, message):
    import hashlib

    import msgpack
    emb, mlp = tables
    m = commit_shards(store, _ranks(2, {"emb.a": emb["emb.a"]}, {}))
    key = manifest_key(m.id)
    data = store.storage.read(key)
    raw = msgpack.unpackb(data[37:], raw=False)
    if raw["shards"][0]["array"] is None and "array" in message:
        raw["shards"][0]["layout"] = "array"
    damage(raw)
    payload = msgpack.packb(raw, use_bin_type=True)
    with pytest.raises(ManifestError, match=message):
        decode_manifest(data[:5] + hashlib.sha256(payload).digest() + payload)


def test_dcp_in_one_process_round_trips_values_without_pickle(store):
    state = {"w": torch.randn(300, 40), "step": 12, "sched": {"last_epoch": 3, "lrs": [0.1, 0.2]},
             "blob": b"\x00\x01", "name": "run-7"}
    w = StorageWriter(store, message="dcp", tags=["t1"])
    dcp.save(state, storage_writer=w)
    assert w.last_commit is not None and store.resolve("t1") == w.last_commit.id
    loaded = {"w": torch.zeros(300, 40), "step": 0, "sched": None, "blob": None, "name": ""}
    dcp.load(loaded, storage_reader=StorageReader(store, "t1"))
    assert torch.equal(loaded["w"], state["w"])
    assert loaded["step"] == 12 and loaded["sched"] == state["sched"]
    assert loaded["blob"] == b"\x00\x01" and loaded["name"] == "run-7"
    assert store.checkout("t1")["sched"] == state["sched"]  # stored as plain values


class _Exploit:
    def __reduce__(self):
        return (os.system, ("touch /tmp/ckptstore-pwned",))


def test_dcp_refuses_objects_that_need_pickle(store):
    # DCP raises its CheckpointException (a BaseException) with our error inside
    with pytest.raises(BaseException, match="UnsupportedLeafError: cannot store .*'evil'"):
        dcp.save({"w": torch.zeros(3), "evil": _Exploit()}, storage_writer=StorageWriter(store))
    assert "main" not in store.refs.branches()
    with pytest.raises(UnsupportedLeafError, match="'evil'"):  # the Store verbs unwrap it
        from ckptstore.dcp.collective import _unwrapped
        with _unwrapped():
            dcp.save({"evil": _Exploit()}, storage_writer=StorageWriter(store))


def test_a_crafted_pickle_in_a_store_never_executes(store, tmp_path):
    marker = tmp_path / "pwned"
    payload = pickle.dumps(type("X", (), {"__reduce__": lambda self: (
        os.system, (f"touch {marker}",))})())
    # the only place a value can live is the manifest's msgpack tree: there it is bytes
    dcp.save({"w": torch.zeros(2), "v": payload}, storage_writer=StorageWriter(store))
    loaded = {"w": torch.zeros(2), "v": None}
    dcp.load(loaded, storage_reader=StorageReader(store))
    assert loaded["v"] == payload and not marker.exists()
    assert store.checkout("main")["v"] == payload and not marker.exists()


def test_reader_refuses_a_value_the_safe_loader_refuses(monkeypatch):
    import ckptstore.dcp.reader as cdcp
    monkeypatch.setattr(cdcp, "unflatten", lambda tree, tensors: _Exploit())
    with pytest.raises(DistributedError, match="without unpickling"):
        cdcp._safe_bytes({"x": {"value": 1}}, "x")


def test_a_part_missing_from_the_plan_fails_the_commit(store, tables):
    from ckptstore.dcp.shards import assemble_manifest
    with pytest.raises(DistributedError, match="no rank wrote"):
        assemble_manifest("0" * 32, None, "", {}, {"dict": []}, {"x": [3]}, [])
    assert "main" not in store.refs.branches()


@pytest.mark.parametrize("rows, ranks", [(1, 2), (2, 4), (3, 4)])
def test_ranks_holding_nothing_of_a_tensor_take_no_part(store, rows, ranks):
    """DTensor gives a rank with no rows an empty shard at the dimension's end (regression)."""
    full = torch.arange(rows * 4, dtype=torch.float32).reshape(rows, 4)
    parts, lo = [], 0
    for r in range(ranks):
        n = max(0, min(rows - lo, -(-rows // ranks)))  # torch.chunk's sizes
        parts.append([LocalTensor("t", (lo, 0), (rows, 4), full[lo:lo + n])])
        lo += n
    m = commit_shards(store, parts)
    assert torch.equal(store.checkout("main")["t"], full)
    assert all(math.prod(s.shape) for s in m.shards)


def test_overlapping_shards_are_refused(store):
    t = torch.arange(4.0)
    with pytest.raises(DistributedError, match="exactly once"):
        commit_shards(store, [[LocalTensor("e", (0,), (4,), t[:2])],
                              [LocalTensor("e", (1,), (4,), t[1:3])]])
    assert "main" not in store.refs.branches()


def test_dcp_load_converts_into_a_target_of_another_dtype(store):
    w = torch.full((300, 200), 2.0, dtype=torch.bfloat16)  # an array of its own (uint16 bits)
    dcp.save({"w": w}, storage_writer=StorageWriter(store))
    got = {"w": torch.zeros(300, 200, dtype=torch.float32)}
    dcp.load(got, storage_reader=StorageReader(store))
    assert torch.equal(got["w"], w.float())
    if hasattr(torch, "uint16"):
        bits = {"w": torch.zeros(300, 200, dtype=torch.uint16)}
        dcp.load(bits, storage_reader=StorageReader(store))
        assert int(bits["w"][0, 0]) == 2  # the value, not the bit pattern 16384


def test_sharded_commits_dedup_unchanged_blocks(tmp_path, tables):
    import ckptstore
    from ckptstore import EncodingOptions

    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(dedup=True))
    emb, mlp = tables
    first = commit_shards(store, _ranks(2, emb, mlp))
    changed = {"emb.a": emb["emb.a"].clone(), "emb.b": emb["emb.b"]}
    changed["emb.a"][-5:] += 1  # only the last rank's block of emb.a changes
    second = commit_shards(store, _ranks(2, changed, mlp))
    assert second.format_version == CHUNK_DIGESTS_VERSION  # shards record their chunks' digests
    owner = {s.path: s.commit for s in second.shards if s.layout == Layout.ARRAY}
    assert owner["emb.a@0,0"] == first.id and owner["emb.a@1001,0"] == second.id
    assert next(e for e in second.tensors if e.path == "mlp.w").commit == first.id
    got = store.checkout(second.id)
    assert torch.equal(got["emb.a"], changed["emb.a"]) and torch.equal(got["mlp.w"], mlp["mlp.w"])
    store.gc(keep_last=1, grace_period=0)
    assert store.verify().ok and torch.equal(store.checkout("main")["emb.a"], changed["emb.a"])


def test_dcp_load_of_a_hostile_grid_lists_once_instead_of_reading_every_chunk(tmp_path):
    """A manifest (valid checksum) whose array claims far more chunks than the store holds is
    refused after one listing, before any chunk is requested or copied into DCP's targets."""
    import hashlib

    import msgpack

    import ckptstore
    from ckptstore.commit.plan import EncodingOptions
    store = ckptstore.open(tmp_path / "s", options=EncodingOptions(pack_below=0, chunk_bytes=4096))
    dcp.save({"w": torch.randn(8192, 1)}, storage_writer=StorageWriter(store))
    m = store.manifest(store.resolve("main"))
    key = manifest_key(m.id)
    data = store.storage.read(key)
    raw = msgpack.unpackb(data[37:], raw=False)
    entry = next(e for e in raw["tensors"] if e["path"] == "w")
    assert entry["layout"] == "array" and entry["chunks"] == [1024, 1]
    entry["shape"] = [1024 * 1100, 1]  # 1,100 chunks of which the store holds 8
    payload = msgpack.packb(raw, use_bin_type=True)
    store.storage.put(key, data[:5] + hashlib.sha256(payload).digest() + payload)
    fresh = ckptstore.open(tmp_path / "s")  # no manifest cached
    reads = []
    real_read, real_chunk = fresh.storage.read, fresh.storage.read_chunk
    fresh.storage.read = lambda k: reads.append(k) or real_read(k)
    fresh.storage.read_chunk = lambda k: reads.append(k) or real_chunk(k)
    target = {"w": torch.zeros(1024 * 1100, 1)}
    with pytest.raises(BaseException, match="missing"):
        dcp.load(target, storage_reader=StorageReader(fresh, "main"))
    assert not [k for k in reads if "/c/" in k]  # no chunk was requested
    assert not target["w"].any()
