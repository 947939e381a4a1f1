"""ExCP's joint shrinking (``Policy(shrink=Shrink.of(model, optimizer))``): weights as pruned,
quantized residuals against what checkout rebuilds (no drift), moments pruned jointly, chains
bounded and safe under gc, a lossless baseline, refused by older readers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_older_reader_refuses

import ckptstore
from ckptstore import Policy
from ckptstore.errors import CorruptionError
from ckptstore.history.manifest import HALF_RESIDUAL_VERSION, RESIDUAL_VERSION
from ckptstore.policy import Shrink
from ckptstore.policy.shrink import fisher_threshold, residual_mask, shrink_moments


def _model(seed=0, width=128):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(32, width), torch.nn.ReLU(),
                               torch.nn.Linear(width, 10))


def _train(model, opt, steps, seed, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(256, 32, generator=g).to(dtype)
    y = torch.randint(0, 10, (256,), generator=g)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()


def _kinds(store, info):
    return {e.path: (str(e.kind), e.chain) for e in store.manifest(info.id).tensors}


def _policy(model, opt, **kw):
    return Policy(shrink=Shrink.of(model, opt, **kw), max_chain=kw.pop("max_chain", 16))


def test_masks_follow_excp():
    rng = np.random.default_rng(0)
    r = rng.standard_normal(10_000).astype(np.float32)
    v = np.full(10_000, 1e-6, np.float32)
    keep = residual_mask(r, v, alpha=5e-5, cap=2.5)  # alpha / sqrt(1e-6) = 0.05 < cap
    np.testing.assert_array_equal(keep, np.abs(r) > 0.05 * np.median(np.abs(r)))
    capped = residual_mask(r, v, alpha=1.0, cap=2.5)
    np.testing.assert_array_equal(capped, np.abs(r) > 2.5 * np.median(np.abs(r)))
    assert 0.05 < capped.mean() < 0.15  # a normal residual above 2.5x its median: ~9 %
    m = rng.standard_normal(10_000).astype(np.float32)
    m2, v2 = shrink_moments(m, v * rng.random(10_000, dtype=np.float32), capped, 2.0, "mean")
    kept = (np.abs(m) > 2.0 * np.abs(m).mean()) & capped
    np.testing.assert_array_equal(m2 != 0, kept)
    assert np.all(v2[~kept] == v2[~kept][0]) and v2[~kept][0] > 0  # one positive fill value
    _, vz = shrink_moments(m, v, capped, 2.0, "zero")
    assert np.all(vz[~kept] == 0) and np.all(vz[kept] == v[kept])


def test_fisher_threshold_keeps_the_share_with_the_largest_saliency():
    rng = np.random.default_rng(1)
    pairs = [(rng.standard_normal(n).astype(np.float32), rng.random(n, dtype=np.float32))
             for n in (300_000, 2_000_000, 7)]
    cut = fisher_threshold(pairs, 0.05)
    kept = sum(int(np.count_nonzero(v * r * r > cut)) for r, v in pairs)
    assert abs(kept / sum(r.size for r, _ in pairs) - 0.05) < 0.003
    assert fisher_threshold(pairs, 1.0) < 0 and fisher_threshold([], 0.1) < 0
    dead = (np.ones(1000, np.float32), np.zeros(1000, np.float32))  # no gradient, ever
    assert fisher_threshold([dead], 0.5) == 0.0  # 0 > 0 is False: never kept


def test_fisher_never_stores_rows_only_weight_decay_moved(tmp_path):
    """An embedding whose unused rows move by AdamW's weight decay alone: ExCP's median threshold
    stores their largest values every commit, the Fisher criterion (v = 0 there) never does."""
    stored = {}
    for criterion in ("excp", "fisher"):
        torch.manual_seed(0)
        emb = torch.nn.Embedding(5000, 32)
        opt = torch.optim.AdamW(emb.parameters(), lr=1e-2, weight_decay=0.1)
        store = ckptstore.open(tmp_path / criterion)
        policy = lambda: Policy(shrink=Shrink.of(emb, opt, criterion=criterion, keep=0.05,  # noqa
                                                 alpha=1.0))
        store.commit({"model": emb}, policy=policy())
        for step in range(3):
            for _ in range(5):
                opt.zero_grad()
                emb(torch.arange(100)).pow(2).sum().backward()  # rows 0..99 only
                opt.step()
            info = store.commit({"model": emb, "optim": opt}, policy=policy())
        got = store.checkout(info.id)["model"]["weight"]
        prev = store.checkout(store.log()[1].id)["model"]["weight"]
        stored[criterion] = (got - prev)[100:].abs().max().item()
    assert stored["excp"] > 0 and stored["fisher"] == 0


def test_shrink_pairs_parameters_with_their_moments():
    model = _model()
    opt = torch.optim.AdamW([{"params": [model[0].weight]},
                             {"params": [model[0].bias, model[2].weight, model[2].bias]}])
    s = Shrink.of(model, opt, model_key="m", optim_key="o")
    assert s.pairs[0] == ("m.0.weight", "o.state.0.exp_avg", "o.state.0.exp_avg_sq")
    assert s.pairs[3] == ("m.2.bias", "o.state.3.exp_avg", "o.state.3.exp_avg_sq")
    with pytest.raises(ValueError, match="nothing to pair"):
        Shrink.of(model, torch.optim.SGD([torch.nn.Parameter(torch.ones(2))], lr=1))
    with pytest.raises(ValueError, match="bits"):
        Shrink((), bits=1)
    with pytest.raises(ValueError, match="criterion"):
        Shrink((), criterion="magnitude")
    with pytest.raises(ValueError, match="keep"):
        Shrink((), keep=0)


def test_residual_chain_rebuilds_what_the_writer_remembers(open_backend_store):
    model = _model()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = open_backend_store()
    first = store.commit({"model": model}, policy=_policy(model, opt))  # before any step
    assert _kinds(store, first)["model.0.weight"] == ("full", 0)
    infos = []
    for i in range(4):
        _train(model, opt, 10, i)
        infos.append(store.commit({"model": model, "optim": opt},
                                  policy=_policy(model, opt, keep=0.3)))
    kinds = _kinds(store, infos[-1])
    assert kinds["model.0.weight"] == ("residual", 4) and kinds["model.2.bias"] == ("residual", 4)
    assert store.manifest(infos[-1].id).format_version == RESIDUAL_VERSION
    # what the next residual is taken against is exactly what checkout rebuilds
    shadows = store._committer.chains._shadows
    got = store.checkout(infos[-1].id)
    for name in ("0.weight", "2.weight", "0.bias"):
        np.testing.assert_array_equal(shadows[("main", f"model.{name}")].values,
                                      got["model"][name].numpy())
    # pruning lags, never drifts: keeping 30 % a commit, the rebuilt weights are much closer to
    # the live ones than the baseline is (the stored residuals carry most of the change)
    live = model.state_dict()
    base = store.checkout(first.id)["model"]
    for name in ("0.weight", "2.weight"):
        lag = (got["model"][name] - live[name]).norm()
        moved = (base[name] - live[name]).norm()
        assert 0 < lag < 0.5 * moved
    logical = sum(t.numel() * 4 for t in live.values()) * 3
    assert infos[-1].stored_bytes < logical / 4
    assert store.verify().ok


def test_moments_are_pruned_jointly_and_fill_keeps_adam_bounded(tmp_path):
    model = _model(1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = ckptstore.open(tmp_path / "s")
    store.commit({"model": model}, policy=_policy(model, opt))
    _train(model, opt, 10, 0)
    info = store.commit({"model": model, "optim": opt},
                        policy=_policy(model, opt, beta=1.0, fill="mean"))
    got = store.checkout(info.id)["optim"]["state"][0]
    live = opt.state_dict()["state"][0]
    m, v = got["exp_avg"], got["exp_avg_sq"]
    kept = m != 0
    assert 0 < kept.float().mean() < 0.5
    assert torch.all(kept <= (live["exp_avg"].abs() > live["exp_avg"].abs().mean()))
    assert torch.all(v > 0)  # the pruned second moments hold the fill, never 0
    np.testing.assert_allclose(m[kept], live["exp_avg"][kept], rtol=0.3, atol=1e-6)
    # ExCP's zero fill, for comparison
    info = store.commit({"model": model, "optim": opt},
                        policy=_policy(model, opt, beta=1.0, fill="zero"))
    got = store.checkout(info.id)["optim"]["state"][0]
    assert torch.all((got["exp_avg_sq"] == 0) == (got["exp_avg"] == 0))


def test_lossless_patterns_win_and_max_chain_rebases(tmp_path):
    model = _model(2)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = ckptstore.open(tmp_path / "s")
    policy = lambda: Policy(shrink=Shrink.of(model, opt), lossless=("optim.*",), max_chain=2)  # noqa
    kinds = []
    for i in range(4):
        _train(model, opt, 5, i)
        info = store.commit({"model": model, "optim": opt}, policy=policy())
        kinds.append(_kinds(store, info)["model.0.weight"])
    assert kinds == [("full", 0), ("residual", 1), ("residual", 2), ("full", 0)]
    assert torch.equal(store.checkout(info.id)["model"]["0.weight"], model[0].weight)
    got = store.checkout(info.id)["optim"]["state"][0]["exp_avg"]
    assert torch.equal(got, opt.state_dict()["state"][0]["exp_avg"])


def test_resume_continues_the_chain_and_gc_keeps_it(tmp_path):
    model = _model(3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = ckptstore.open(tmp_path / "s")
    store.commit({"model": model}, policy=_policy(model, opt))
    for i in range(3):
        _train(model, opt, 5, i)
        store.commit({"model": model, "optim": opt}, policy=_policy(model, opt))
    state = store.checkout("main", for_resume=True)
    model, opt = _model(9), torch.optim.AdamW(_model(9).parameters(), lr=1e-3)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["optim"])
    _train(model, opt, 5, 7)
    info = store.commit({"model": model, "optim": opt}, policy=_policy(model, opt))
    assert _kinds(store, info)["model.0.weight"] == ("residual", 4)
    before = store.checkout(info.id)
    store.gc(keep_last=1, grace_period=0)
    after = store.checkout(info.id)
    for name, t in before["model"].items():
        assert torch.equal(after["model"][name], t)
    assert store.verify().ok
    again = ckptstore.open(tmp_path / "s")  # a new process has no reference: a full baseline
    info = again.commit({"model": model, "optim": opt}, policy=_policy(model, opt))
    assert _kinds(again, info)["model.0.weight"] == ("full", 0)


@pytest.mark.parametrize("background", ["thread", "process"])
def test_async_commits_equal_sync_ones(tmp_path, background):
    results = []
    for mode in ("sync", "async"):
        model = _model(4)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
        store = ckptstore.open(tmp_path / mode, background="thread" if mode == "sync" else
                               background)
        commit = store.commit if mode == "sync" else \
            (lambda s, **kw: store.commit_async(s, **kw).wait())
        commit({"model": model}, policy=_policy(model, opt))
        for i in range(3):
            _train(model, opt, 5, i)
            commit({"model": model, "optim": opt}, policy=_policy(model, opt))
        results.append(store.checkout("main"))
        store.close()
    for name, t in results[0]["model"].items():
        assert torch.equal(results[1]["model"][name], t)


def test_residual_arrays_refused_by_older_readers_and_checked(tmp_path):
    model = _model(5)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    store = ckptstore.open(tmp_path / "s")
    store.commit({"model": model}, policy=_policy(model, opt))
    _train(model, opt, 5, 0)
    info = store.commit({"model": model, "optim": opt}, policy=_policy(model, opt))
    entry = next(e for e in store.manifest(info.id).tensors if e.path == "model.0.weight")
    blob = entry.parts["residual"]
    # plain zarr reads the residual array: the pruned, dequantized residual
    import zarr

    arr = zarr.open_array(str(tmp_path / "s" / "data" / blob.commit / blob.array), mode="r")
    base = store.checkout(store.log()[1].id)["model"]["0.weight"]
    np.testing.assert_array_equal(arr[...] + base.numpy(),
                                  store.checkout(info.id)["model"]["0.weight"].numpy())
    assert_older_reader_refuses(store.manifest(info.id), 3)
    chunk = next((tmp_path / "s" / "data" / blob.commit / blob.array / "c").rglob("*"))
    if chunk.is_dir():
        chunk = next(p for p in chunk.rglob("*") if p.is_file())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0xFF
    chunk.write_bytes(bytes(data))
    with pytest.raises(CorruptionError):
        ckptstore.open(tmp_path / "s").checkout(info.id)
    assert not ckptstore.open(tmp_path / "s").verify().ok


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_training_state_shrinks(tmp_path, dtype):
    """bfloat16 and float16 weights and moments shrink as float32 ones do: the residual is taken
    in float32 and stored in the weight's dtype; what the writer keeps as the next reference is
    bit for bit what checkout rebuilds; a reader of format 6 refuses the chain (it would add
    the bits as integers)."""
    model = _model(6, width=1024).to(dtype)  # 44 k parameters: the arrays' metadata is small
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-4)  # moments in the same dtype
    store = ckptstore.open(tmp_path / "s")
    store.commit({"model": model}, policy=_policy(model, opt))
    infos = []
    for i in range(3):
        _train(model, opt, 5, i, dtype)
        infos.append(store.commit({"model": model, "optim": opt},
                                  policy=_policy(model, opt, keep=0.3)))
    m = store.manifest(infos[-1].id)
    assert _kinds(store, infos[-1])["model.0.weight"] == ("residual", 3)
    assert m.format_version == HALF_RESIDUAL_VERSION
    assert_older_reader_refuses(m, HALF_RESIDUAL_VERSION - 1)
    got = store.checkout(infos[-1].id)
    shadows = store._committer.chains._shadows
    for name in ("0.weight", "2.weight", "2.bias"):
        t = got["model"][name]
        assert t.dtype == dtype
        np.testing.assert_array_equal(shadows[("main", f"model.{name}")].values,
                                      t.view(torch.int16).numpy().view(shadows[(
                                          "main", f"model.{name}")].values.dtype))
    live = model.state_dict()
    base = store.checkout(store.log()[-1].id)["model"]
    for name in ("0.weight", "2.weight"):
        lag = (got["model"][name].float() - live[name].float()).norm()
        moved = (base[name].float() - live[name].float()).norm()
        assert 0 < lag < 0.6 * moved
    moments = got["optim"]["state"][0]
    assert moments["exp_avg"].dtype == dtype and 0 < (moments["exp_avg"] != 0).float().mean() < 1
    logical = sum(t.numel() * t.element_size() for t in live.values()) * 3
    assert infos[-1].stored_bytes < logical / 4
    # resumable: the optimizer takes the shrunk moments back
    opt2 = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-4)
    model.load_state_dict(got["model"])
    opt2.load_state_dict(got["optim"])
    _train(model, opt2, 1, 9, dtype)
    assert all(torch.isfinite(p).all() for p in model.parameters())
    assert store.verify().ok



def test_residuals_of_half_floats_add_in_float32():
    from ckptstore.format.floatbits import add_residual, float_values, from_values

    rng = np.random.default_rng(0)
    for dtype in ("bfloat16", "float16"):
        base = from_values(rng.standard_normal(1000).astype(np.float32), dtype)
        r = from_values(rng.standard_normal(1000).astype(np.float32) * 1e-2, dtype)
        want = from_values(float_values(base, dtype) + float_values(r, dtype), dtype)
        out = base.copy()
        assert add_residual(out, r, dtype, out=out) is out
        np.testing.assert_array_equal(out, want)
        assert not np.array_equal(out.view(np.uint16), (base.view(np.uint16) + r.view(np.uint16)))
    f = rng.standard_normal(10).astype(np.float32)
    np.testing.assert_array_equal(add_residual(f, f, "float32"), f + f)


@pytest.mark.parametrize("dtype,big", [(torch.float16, 40000.0), (torch.bfloat16, 2e38),
                                       (torch.float32, 2e38)])
def test_a_residual_too_large_for_the_dtype_never_checks_out_as_inf(tmp_path, dtype, big):
    """A weight that flips between two finite values whose difference the dtype cannot hold:
    the residual is clamped and the rebuilt sum saturates, checkout stays finite and equal to
    what the writer remembers, and the next commits carry the rest (the weight arrives)."""
    model = _model(3).to(dtype)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-4)
    _train(model, opt, 1, 0, dtype)
    store = ckptstore.open(tmp_path / "s")
    store.commit({"model": model, "optim": opt}, policy=_policy(model, opt, keep=1.0))
    shadows = store._committer.chains._shadows
    for value in (big, -big, -big, -big, -big):
        with torch.no_grad():
            model[0].weight[0, :4] = value
        info = store.commit({"model": model, "optim": opt}, policy=_policy(model, opt, keep=1.0))
        got = store.checkout(info.id)["model"]["0.weight"]
        assert torch.isfinite(got).all()
        np.testing.assert_array_equal(shadows[("main", "model.0.weight")].values,
                                      got.view(torch.int16).numpy().view(
                                          shadows[("main", "model.0.weight")].values.dtype)
                                      if dtype != torch.float32 else got.numpy())
    assert _kinds(store, info)["model.0.weight"] == ("residual", 5)
    np.testing.assert_allclose(got[0, :4].float().numpy(), -big, rtol=0.02)


def test_residual_arithmetic_saturates_finite_values_only():
    from ckptstore.format.floatbits import add_residual, float_values, from_values, residual_values

    for dtype, top in (("float16", 65504.0), ("bfloat16", 3.3895313892515355e38),
                       ("float32", float(np.finfo(np.float32).max))):
        big = top * 0.9
        v = np.array([big, -big, 1.0, np.inf, np.nan, 2.0], np.float32)
        ref = np.array([-big, big, 0.5, 1.0, 1.0, -np.inf], np.float32)
        r = residual_values(v, ref, dtype)
        np.testing.assert_array_equal(r[:4], [top / 2, -top / 2, 0.5, np.inf])
        assert np.isnan(r[4]) and r[5] == np.inf  # the weights' own infinities and NaNs pass
        base = from_values(np.array([big, -big, 1.0, np.inf, np.nan, 3.0], np.float32), dtype)
        res = from_values(np.array([big, -big, 2.0, 1.0, 1.0, -np.inf], np.float32), dtype)
        whole = float_values(add_residual(base, res, dtype), dtype)
        np.testing.assert_array_equal(whole[[0, 1, 2, 3, 5]], [top, -top, 3.0, np.inf, -np.inf])
        assert np.isnan(whole[4])
        # the same bits element by element, whether a call gets every row or a block of them
        halves = np.concatenate([add_residual(base[:3], res[:3], dtype),
                                 add_residual(base[3:], res[3:], dtype)])
        np.testing.assert_array_equal(halves.view(np.uint8), add_residual(
            base, res, dtype).view(np.uint8))
        small = from_values(np.array([1.0, 2.0], np.float32), dtype)
        out = small.copy()
        assert add_residual(out, small, dtype, out=out) is out
        np.testing.assert_array_equal(float_values(out, dtype), [2.0, 4.0])
