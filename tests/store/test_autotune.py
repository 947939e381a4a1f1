"""Check-N-Run auto-tuning: the fewest bits within the error budget, the cheapest search close to
the best, and a policy that commits each table with its choice."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ckptstore
from ckptcodecs import Quantize
from ckptstore.policy import Policy, QuantSpec, autotune
from ckptstore.policy.autotune import relative_error


def _tables() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    scale = torch.rand(4000, 1, generator=g) + 0.1
    heavy = torch.distributions.StudentT(2.5).sample((3000, 32))
    return {"emb.a": torch.randn(4000, 32, generator=g) * scale, "emb.b": heavy}


def test_fewest_bits_within_budget_and_search_near_best():
    tables = _tables()
    loose = autotune(tables, max_error=0.5, sample_rows=256, num_bins=(10, 25, 45),
                     ratios=(0.5, 1.0))
    strict = autotune(tables, max_error=0.05, sample_rows=256, num_bins=(10, 25, 45),
                      ratios=(0.5, 1.0))
    for path in tables:
        lo, hi = loose.choices[path], strict.choices[path]
        assert lo.spec.bits < hi.spec.bits
        assert lo.best_error <= 0.5 and hi.best_error <= 0.05 or hi.spec.bits == 8
        for c in (lo, hi):  # within the tolerance of the best, and better than no search
            assert c.error <= c.best_error * 1.01 + 1e-12
            assert c.error <= c.plain_error
            assert c.spec.method == "adaptive-asymmetric" and c.evaluated == 7
    assert loose.seconds > 0 and loose.sample_rows == 256


def test_cheapest_of_equally_good_settings():
    x = torch.randn(300, 16, generator=torch.Generator().manual_seed(1))
    t = autotune({"t": x}, bits=(8,), num_bins=(5, 50), ratios=(0.2, 1.0), tolerance=1.0)
    assert (t.choices["t"].spec.num_bins, t.choices["t"].spec.ratio) == (5, 0.2)


def test_tuned_policy_commits_each_table_with_its_spec(tmp_path):
    tables = _tables()
    tuning = autotune(tables, bits=(3,), sample_rows=128, num_bins=(10, 45), ratios=(0.4, 1.0))
    store = ckptstore.open(tmp_path / "s", policy=tuning.policy(min_quant_bytes=1024))
    info = store.commit(tables)
    got = store.checkout(info.id)
    for e in store.manifest(info.id).tensors:
        spec = tuning.choices[e.path].spec
        q = e.codec["quantize"]
        assert (q["bits"], q.get("num_bins"), q.get("ratio", 1.0)) == (
            3, spec.num_bins, spec.ratio)
        x = tables[e.path].numpy()
        err = np.linalg.norm(got[e.path].numpy() - x) / np.linalg.norm(x)
        assert err == pytest.approx(relative_error(x, spec), rel=1e-5)


def test_quant_spec_passes_search_settings_to_the_codec():
    kw = QuantSpec(num_bins=12, ratio=0.5).codec_kwargs("float32")
    assert kw["num_bins"] == 12 and kw["ratio"] == 0.5
    assert "num_bins" not in QuantSpec().codec_kwargs("float32")


def test_auto_method_is_check_n_runs_choice(tmp_path):
    """``method="auto"``: the adaptive search up to 4 bits, plain uniform asymmetric above (Check-N-
    Run section 5.2) unless the search is tuned; the stored codec config names the method used."""
    assert [QuantSpec(bits=b).resolved_method for b in (2, 3, 4, 5, 8)] == [
        "adaptive-asymmetric"] * 3 + ["uniform-asymmetric"] * 2
    assert QuantSpec(bits=8, num_bins=60).resolved_method == "adaptive-asymmetric"
    assert QuantSpec(bits=8, ratio=0.5).resolved_method == "adaptive-asymmetric"
    assert QuantSpec("kmeans", bits=8).resolved_method == "kmeans"
    w = torch.randn(256, 64)
    for bits, method in ((4, "adaptive-asymmetric"), (8, "uniform-asymmetric")):
        store = ckptstore.open(tmp_path / str(bits))
        store.commit({"w": w}, policy=Policy(quantize=QuantSpec(bits=bits), min_quant_bytes=1))
        entry = store.manifest(store.resolve("main")).tensors[0]
        assert entry.codec["quantize"]["method"] == method
        ref = Quantize(method=method, bits=bits)
        want = np.frombuffer(ref.decode(ref.encode(w.numpy())), np.float32).reshape(256, 64)
        assert torch.equal(store.checkout("main")["w"], torch.from_numpy(want.copy()))
