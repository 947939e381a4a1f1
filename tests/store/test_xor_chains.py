"""Lossless XOR deltas (``Policy(delta=True)`` without quantize): exact on every dtype, smaller
than full commits, bounded by ``max_chain``, safe under gc, refused by older readers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_bit_exact, assert_older_reader_refuses

from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.history.manifest import BASE_VERSION, XOR_VERSION, encode_manifest


def _kinds(store, info):
    return {e.path: (str(e.kind), e.chain) for e in store.manifest(info.id).tensors}


def _walk(g, w, step=1e-3):
    return w - step * torch.randn(w.shape, generator=g)


def test_xor_chain_is_exact_and_smaller(open_backend_store):
    store = open_backend_store(policy=Policy(delta=True, max_chain=4))
    g = torch.Generator().manual_seed(0)
    w = torch.randn(256, 128, generator=g)
    ids, states, sizes, kinds = [], [], [], []
    for _ in range(6):
        w = _walk(g, w)
        state = {"w": w.clone(), "count": torch.arange(20_000),
                 "half": w.to(torch.bfloat16), "bias": torch.randn(16, generator=g)}
        info = store.commit(state)
        ids.append(info.id)
        states.append(state)
        sizes.append(info.stored_bytes)
        kinds.append(_kinds(store, info))
    assert [k["w"] for k in kinds] == [("full", 0), ("xor", 1), ("xor", 2), ("xor", 3),
                                       ("xor", 4), ("full", 0)]
    assert kinds[1]["half"] == ("xor", 1) and kinds[1]["count"] == ("xor", 1)
    assert kinds[1]["bias"] == ("full", 0)  # small: packed, never a chain
    for cid, state in zip(ids, states):
        assert_bit_exact(store.checkout(cid), state)
    assert max(sizes[1:5]) < sizes[0] / 1.3
    assert store.verify().ok


def test_xor_entries_need_format_3(open_backend_store):
    store = open_backend_store(policy=Policy(delta=True))
    w = torch.randn(200, 100)
    first = store.commit({"w": w})
    second = store.commit({"w": w + 1})
    assert store.manifest(first.id).format_version == BASE_VERSION
    assert store.manifest(second.id).format_version == XOR_VERSION
    assert encode_manifest(store.manifest(second.id))[4] == XOR_VERSION
    assert_older_reader_refuses(store.manifest(second.id), 2)


def test_every_dtype_xors_exactly(tmp_path):
    import ckptstore

    store = ckptstore.open(tmp_path / "s", policy=Policy(delta=True, min_quant_bytes=1024),
                           options=EncodingOptions(chunk_bytes=16 * 1024))
    g = torch.Generator().manual_seed(1)
    base = torch.randn(300, 40, generator=g)
    dtypes = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64,
              torch.int8, torch.complex64, torch.complex128]
    states = []
    for step in range(3):
        x = base + step * 0.01
        state = {str(d): (x * 50).to(d) if not d.is_complex else torch.complex(x, -x).to(d)
                 for d in dtypes}
        state["nan"] = torch.where(x > 1, torch.nan, x)
        states.append((store.commit(state).id, state))
    last = _kinds(store, store.log()[0])
    assert set(last) == set(states[0][1]) and all(kind == "xor" for kind, _ in last.values())
    for cid, state in states:
        assert_bit_exact(store.checkout(cid), state)


def test_gc_keeps_what_a_retained_xor_commit_needs(open_backend_store):
    store = open_backend_store(policy=Policy(delta=True, max_chain=8))
    w = torch.randn(128, 128)
    states = []
    for i in range(5):
        states.append({"w": w + i})
        store.commit(states[-1])
    store.gc(keep_last=1, grace_period=0)
    assert len(store.log()) >= 1
    assert_bit_exact(store.checkout("main"), states[-1])
    assert store.verify().ok


def test_quantized_tensors_keep_code_deltas_and_lossless_ones_xor(tmp_path):
    import ckptstore

    policy = Policy(quantize=QuantSpec(bits=8), delta=True, overrides=(("ids", None),),
                    min_quant_bytes=1024)
    store = ckptstore.open(tmp_path / "s", policy=policy)
    state = {"w": torch.randn(64, 64), "ids": torch.randn(64, 64)}
    store.commit(state)
    info = store.commit({k: v + 0.5 for k, v in state.items()})
    kinds = _kinds(store, info)
    assert kinds["w"][0] == "delta" and kinds["ids"][0] == "xor"
    assert torch.equal(store.checkout(info.id)["ids"], state["ids"] + 0.5)


def test_a_new_process_starts_with_a_full_baseline(tmp_path):
    import ckptstore

    w = torch.randn(200, 100)
    ckptstore.open(tmp_path / "s", policy=Policy(delta=True)).commit({"w": w})
    again = ckptstore.open(tmp_path / "s", policy=Policy(delta=True))
    info = again.commit({"w": w + 1})  # no host reference in this process: no guessing
    assert _kinds(again, info)["w"] == ("full", 0)
    info = again.commit({"w": w + 2})
    assert _kinds(again, info)["w"] == ("xor", 1)
    np.testing.assert_array_equal(again.checkout(info.id)["w"].numpy(), (w + 2).numpy())


@pytest.mark.parametrize("mode", ["one-shot", "consecutive", "intermittent"])
def test_changed_rows_are_stored_as_xor_of_their_old_values(open_backend_store, mode):
    store = open_backend_store(policy=Policy(incremental=mode, max_chain=8))
    g = torch.Generator().manual_seed(3)
    emb = torch.randn(4096, 16, generator=g)
    states = []
    for step in range(4):
        rows = torch.randperm(4096, generator=g)[:200]
        emb[rows] += 1e-3 * torch.randn(200, 16, generator=g)
        states.append((store.commit({"emb": emb}), emb.clone()))
    parts = [set(store.manifest(info.id).tensors[0].parts or {}) for info, _ in states]
    assert parts[0] == set() and all(p == {"rows", "xvalues"} for p in parts[1:])
    for info, expect in states:
        assert torch.equal(store.checkout(info.id)["emb"], expect)
        assert store.manifest(info.id).format_version == (
            BASE_VERSION if info is states[0][0] else XOR_VERSION)
    # a small step keeps sign and exponent: XORed rows shrink well below raw float bytes
    last = store.manifest(states[-1][0].id).tensors[0]
    assert last.parts["xvalues"].codec["id"] == "planes"
    assert store.verify().ok


def test_tracked_and_quantized_rows_keep_plain_values(tmp_path):
    import ckptstore

    emb = torch.nn.Embedding(4096, 16, sparse=True)
    model = torch.nn.ModuleDict({"emb": emb})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = ckptstore.track(model, opt)
    store = ckptstore.open(tmp_path / "s", policy=Policy(incremental="one-shot"))
    store.commit({"model": model}, tracker=tracker)
    emb(torch.arange(10)).sum().backward()
    opt.step()
    info = store.commit({"model": model}, tracker=tracker)
    assert set(store.manifest(info.id).tensors[0].parts) == {"rows", "values"}  # no old values
    quant = ckptstore.open(tmp_path / "q", policy=Policy(incremental="consecutive",
                                                         quantize=QuantSpec(bits=8)))
    w = torch.randn(4096, 16)
    quant.commit({"w": w})
    w[:5] += 1
    info = quant.commit({"w": w})
    assert set(quant.manifest(info.id).tensors[0].parts) == {"rows", "values"}


@pytest.mark.parametrize("mode", ["one-shot", "consecutive", "intermittent"])
def test_tracked_rows_with_delta_are_xored(tmp_path, mode):
    """Issue 26 item 14: ``Policy(incremental=..., delta=True)`` with a tracker kept no old bits
    and stored the changed rows plain (delta silently dropped); now they are XOR-ed and exact,
    and (consecutive) no larger than the dense XOR of ``delta=True`` alone."""
    import ckptstore

    def run(policy):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(4096, 16, sparse=True)
        model = torch.nn.ModuleDict({"emb": emb})
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
        tracker = ckptstore.track(model, opt)
        store = ckptstore.open(tmp_path / f"s{id(policy)}", policy=policy)
        infos = [store.commit({"model": model}, tracker=tracker)]
        g = torch.Generator().manual_seed(1)
        for _ in range(3):
            emb(torch.randperm(4096, generator=g)[:800]).pow(2).sum().backward()
            opt.step()
            opt.zero_grad()
            infos.append(store.commit({"model": model}, tracker=tracker))
        assert_bit_exact(store.checkout("main")["model"], model.state_dict())
        return store, infos

    store, infos = run(Policy(incremental=mode, delta=True))
    for info in infos[1:]:
        assert set(store.manifest(info.id).tensors[0].parts) == {"rows", "xvalues"}
    assert store.verify().ok
    if mode != "consecutive":
        return  # one-shot rows accumulate since the baseline: no match for a step-by-step XOR
    _, dense = run(Policy(delta=True))
    assert sum(i.stored_bytes for i in infos[1:]) <= sum(i.stored_bytes for i in dense[1:])


@pytest.mark.parametrize("mode", ["one-shot", "consecutive"])
def test_rows_on_a_lossy_base_are_never_xored(tmp_path, mode):
    """Review finding: xvalues XOR the store's exact host copy, so a chain whose rebuilt base is
    dequantized must store plain values."""
    import ckptstore

    store = ckptstore.open(tmp_path / "s")
    emb = torch.randn(4096, 32)
    store.commit({"emb": emb}, policy=Policy(incremental=mode, quantize=QuantSpec(bits=8)))
    for offset in (0, 1):
        emb = emb.clone()
        rows = torch.arange(offset, 4096, 64)
        emb[rows] += 0.5
        info = store.commit({"emb": emb}, policy=Policy(incremental=mode))
        assert set(store.manifest(info.id).tensors[0].parts) == {"rows", "values"}
        got = store.checkout(info.id)["emb"]
        assert torch.equal(got[rows], emb[rows])


def test_a_row_chain_on_an_xor_entry_is_refused(tmp_path):
    import hashlib

    import msgpack

    import ckptstore
    from ckptstore.errors import ManifestError
    from ckptstore.format.layout import manifest_key

    store = ckptstore.open(tmp_path / "s", policy=Policy(delta=True))
    w = torch.randn(4096, 16)
    ids = [store.commit({"w": w + i}).id for i in range(3)]
    key = manifest_key(ids[2])
    raw = msgpack.unpackb(store.storage.read(key)[37:], strict_map_key=False)
    entry = raw["tensors"][0]
    entry["kind"] = "consecutive"
    entry["parts"] = {"rows": entry["parts"]["xor"], "values": entry["parts"]["xor"]}
    payload = msgpack.packb(raw, use_bin_type=True)
    store.storage.put(key, b"CKPT\x03" + hashlib.sha256(payload).digest() + payload)
    with pytest.raises(ManifestError, match="mixes kinds"):
        ckptstore.open(tmp_path / "s", create=False).checkout(ids[2])
