"""Incremental, consecutive, intermittent and delta chains: exact where lossless, equal to an
independent dequantize where quantized, and never broken by gc or rebase."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_bit_exact
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ckptstore
from ckptstore import BitWidth, MaxChain, Policy, QuantSpec

ROWS, DIM = 4096, 16


def _kinds(store, info):
    return {e.path: e.kind for e in store.manifest(info.id).tensors}


@pytest.mark.parametrize("mode,kind", [("one-shot", "incremental"),
                                       ("consecutive", "consecutive"),
                                       ("intermittent", "incremental")])
def test_row_chains_are_exact(open_backend_store, mode, kind):
    store = open_backend_store(policy=Policy(incremental=mode))
    g = torch.Generator().manual_seed(0)
    emb, dense = torch.randn(ROWS, DIM, generator=g), torch.randn(300, 300, generator=g)
    history = []
    for step in range(6):
        rows = torch.randint(0, ROWS, (300,), generator=g)
        emb[rows] += 1.0
        dense += 0.5
        info = store.commit({"emb": emb, "dense": dense, "step": step})
        history.append((info, {"emb": emb.clone(), "dense": dense.clone(), "step": step}))
    assert [_kinds(store, i)["emb"] for i, _ in history] == ["full"] + [kind] * 5
    assert all(_kinds(store, i)["dense"] == "full" for i, _ in history)
    for info, state in history:
        assert_bit_exact(store.checkout(info.id), state)
    def emb_bytes(info):
        files = store.storage.walk_sizes(f"data/{info.id}")
        return sum(n for k, n in files.items() if k.split("/")[2].startswith("emb"))

    assert emb_bytes(history[1][0]) < 0.15 * emb_bytes(history[0][0])  # ~7% of rows changed
    assert store.verify().ok


def test_intermittent_rebases_when_predicted(open_backend_store):
    store = open_backend_store(policy=Policy(incremental="intermittent"))
    emb = torch.zeros(ROWS, DIM)
    kinds = []
    for step in range(8):
        emb[step * 600:(step + 1) * 600] += 1  # every interval touches new rows: increments grow
        kinds.append(_kinds(store, store.commit({"emb": emb}))["emb"])
    fr = [e.fractions for e in store.manifest(store.resolve("main~1")).tensors][0]
    assert "full" in kinds[2:], (kinds, fr)


def test_max_chain_bounds_consecutive(open_backend_store):
    store = open_backend_store(policy=Policy(incremental="consecutive", max_chain=2))
    emb = torch.zeros(ROWS, DIM)
    kinds = []
    for step in range(6):
        emb[step] += 1
        kinds.append(_kinds(store, store.commit({"emb": emb}))["emb"])
    assert kinds == ["full", "consecutive", "consecutive", "full", "consecutive", "consecutive"]
    assert MaxChain(3).should_rebase([0.1, 0.1, 0.1])


def test_new_process_starts_with_a_baseline(open_backend_store):
    policy = Policy(incremental="one-shot")
    emb = torch.randn(ROWS, DIM)
    a = open_backend_store(policy=policy)
    a.commit({"emb": emb})
    emb[0] += 1
    assert _kinds(a, a.commit({"emb": emb}))["emb"] == "incremental"
    b = open_backend_store(policy=policy)  # "restarted": no reference in memory
    emb[1] += 1
    info = b.commit({"emb": emb})
    assert _kinds(b, info)["emb"] == "full"
    assert_bit_exact(b.checkout("main")["emb"], emb)


ops = st.lists(st.one_of(
    st.tuples(st.just("update"), st.integers(0, ROWS - 1), st.integers(1, 400)),
    st.tuples(st.just("commit"), st.sampled_from(["one-shot", "consecutive", "intermittent",
                                                  "off"])),
    st.tuples(st.just("gc"), st.integers(1, 3)),
    st.tuples(st.just("tag"), st.integers(0, 5)),
    st.just(("rebase",))), min_size=3, max_size=25)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=ops)
def test_property_gc_and_rebase_never_break_a_retained_commit(ops):
    """Random commit/update/tag/gc/rebase sequences: every commit gc keeps checks out exactly.
    memory:// only: hypothesis runs many sequences (one store each); the fixed chains in this
    module run on every back-end."""
    import uuid
    store = ckptstore.open(f"memory://prop-{uuid.uuid4().hex}")
    emb = torch.zeros(ROWS, DIM)
    expected: dict[str, torch.Tensor] = {}
    for op in ops:
        if op[0] == "update":
            emb[op[1]: op[1] + op[2]] += 1
        elif op[0] == "commit":
            info = store.commit({"emb": emb}, policy=Policy(incremental=op[1], max_chain=4))
            expected[info.id] = emb.clone()
        elif op[0] == "gc" and expected:
            store.gc(keep_last=op[1], grace_period=0)
        elif op[0] == "tag" and expected:
            try:
                store.tag(f"t{op[1]}", "main")
            except ckptstore.RefExists:
                pass
        elif op[0] == "rebase" and expected:
            info = store.rebase("main")
            expected[info.id] = expected[info.parent].clone()
    alive = set(store.commit_ids())
    for commit_id, value in expected.items():
        if commit_id in alive:
            assert torch.equal(store.checkout(commit_id)["emb"], value)
    assert store.verify().ok


def test_quantized_incremental_matches_independent_dequantize(open_backend_store):
    from ckptcodecs import dequantize, quantize

    spec = QuantSpec(method="adaptive-asymmetric", bits=4, granularity="row", entropy=True)
    store = open_backend_store(policy=Policy(incremental="one-shot", quantize=spec))
    g = torch.Generator().manual_seed(1)
    base = torch.randn(ROWS, DIM, generator=g)
    store.commit({"emb": base})
    cur = base.clone()
    rows = torch.unique(torch.randint(0, ROWS, (500,), generator=g))
    cur[rows] += torch.randn(len(rows), DIM, generator=g)
    store.commit({"emb": cur})

    def qdq(x: torch.Tensor) -> torch.Tensor:
        codes, params = quantize(x.numpy(), "adaptive-asymmetric", 4, granularity="row")
        return torch.from_numpy(dequantize(codes, params).reshape(x.shape))

    expected = qdq(base)
    expected[rows] = qdq(cur[rows])
    got = store.checkout("main")["emb"]
    assert torch.equal(got, expected)
    assert float((got - cur).abs().max()) < 0.6


def test_delta_chain_matches_independent_dequantize(open_backend_store):
    from ckptcodecs import dequantize, quantize

    spec = QuantSpec(method="kmeans", bits=4, granularity="tensor", protect=0.01)
    store = open_backend_store(policy=Policy(quantize=spec, delta=True))
    g = torch.Generator().manual_seed(2)
    w = torch.randn(256, 256, generator=g)
    sizes = []
    for step in range(5):
        w += torch.where(torch.rand(w.shape, generator=g) < 0.05, 0.01, 0.0)
        info = store.commit({"w": w})
        sizes.append(info.stored_bytes)
        codes, params = quantize(w.numpy(), "kmeans", 4, granularity="tensor", protect=0.01)
        expected = dequantize(codes, params).reshape(w.shape)
        assert np.array_equal(store.checkout("main")["w"].numpy(), expected)
    assert [e.kind for e in store.manifest(info.id).tensors] == ["delta"]
    assert max(sizes[1:]) < sizes[0] / 3
    assert store.verify().ok


def test_bitwidth_follows_restores(open_backend_store):
    spec = QuantSpec(method="uniform-asymmetric", bits=8)
    store = open_backend_store(policy=Policy(
        quantize=spec, bitwidth=BitWidth(expected_restores=1)))
    w = torch.randn(200, 128)

    def bits() -> int:
        info = store.commit({"w": w})
        return store.manifest(info.id).tensors[0].codec["quantize"]["bits"]

    assert bits() == 2
    store.checkout("main", for_resume=True)
    assert store.restore_count() == 1 and bits() == 2
    store.checkout("main", for_resume=True)
    assert bits() == 8  # more restores than expected: fall back to the safe width


def test_tracker_rows_drive_increments(open_backend_store):
    emb = torch.nn.Embedding(ROWS, DIM, sparse=True)
    model = torch.nn.ModuleDict({"emb": emb})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = ckptstore.track(model, opt)
    store = open_backend_store(policy=Policy(incremental="one-shot"))
    store.commit({"model": model}, tracker=tracker)
    touched = set()
    for _ in range(3):
        idx = torch.randint(0, ROWS, (64,))
        touched.update(idx.tolist())
        emb(idx).sum().backward()
        opt.step()
        opt.zero_grad()
    info = store.commit({"model": model}, tracker=tracker)
    entry = store.manifest(info.id).tensors[0]
    assert entry.kind == "incremental" and entry.parts["rows"].shape == [len(touched)]
    assert_bit_exact(store.checkout("main")["model"], model.state_dict())


def test_quality_search_picks_most_compressive_passing():
    from ckptstore import QualitySearch
    from ckptstore.policy import simulate

    g = torch.Generator().manual_seed(3)
    state = {"w": torch.randn(256, 256, generator=g), "b": torch.randn(10, generator=g)}

    def score(s) -> float:  # a "loss" of 1.0 that grows with the weights' error
        return 1.0 + float((s["w"] - state["w"]).abs().mean())

    specs = [QuantSpec(method="uniform-asymmetric", bits=b) for b in (2, 3, 4, 8)]
    search = QualitySearch(specs, score, max_degradation=0.15, min_bytes=1024)
    chosen = search.choose(state)
    passing = [s.bits for s in specs if score(simulate(state, s, 1024)) <= 1.15]
    assert passing == [4, 8] and chosen.bits == 4
    assert torch.equal(simulate(state, specs[0], 1024)["b"], state["b"])  # small: exact
    calls = search.evaluations
    assert search.choose(state).bits == 4
    assert search.evaluations - calls == 2  # starts from the last choice: 4 passes, 3 fails
    strict = QualitySearch(specs, score, max_degradation=0.0, min_bytes=1024)
    assert strict.choose(state) is None


def test_per_path_overrides_and_small_quantized_tensors(open_backend_store):
    policy = Policy(quantize=QuantSpec(bits=8), min_quant_bytes=1024,
                    overrides=(("model.emb*", QuantSpec(bits=2)), ("optim.*", None)))
    store = open_backend_store(policy=policy)
    state = {"model": {"emb": torch.randn(300, 16), "fc": torch.randn(64, 16)},
             "optim": {"m": torch.randn(300, 16)}}
    info = store.commit(state)  # all three are under pack_below (64 KiB)
    codecs = {e.path: (e.codec or {}).get("quantize", {}).get("bits")
              for e in store.manifest(info.id).tensors}
    assert codecs == {"model.emb": 2, "model.fc": 8, "optim.m": None}
    out = store.checkout("main")
    assert torch.equal(out["optim"]["m"], state["optim"]["m"])
    assert not torch.equal(out["model"]["emb"], state["model"]["emb"])


def test_intermittent_rebases_every_table_together(open_backend_store):
    """Check-N-Run decides per checkpoint: tables that change at different rates rebase in the
    same commit, so gc frees each old baseline as a whole."""
    store = open_backend_store(policy=Policy(incremental="intermittent"))
    a, b = torch.zeros(ROWS, DIM), torch.zeros(ROWS, DIM)
    kinds = []
    for step in range(10):
        a[step * 400:(step + 1) * 400] += 1  # a grows fast, b slowly
        b[step * 20:(step + 1) * 20] += 1
        info = store.commit({"a": a, "b": b})
        kinds.append(tuple(e.kind for e in store.manifest(info.id).tensors))
        store.gc(keep_last=1, grace_period=0)
        assert len(store.commit_ids()) <= 2  # the baseline and the tip, never more
    assert all(len(set(k)) == 1 for k in kinds), kinds  # every commit: all full or all incremental
    assert kinds.count(("full", "full")) >= 2
    assert torch.equal(store.checkout("main")["a"], a) and torch.equal(store.checkout("main")["b"], b)
