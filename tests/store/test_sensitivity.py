"""DynaQuant's sensitivity ranking: ``Policy(sensitivity=GradientEMA(model))`` protects the
largest magnitudes and sensitivities ``|w * g|`` and prunes the smallest sensitivities; the
stored format is unchanged, and without gradients the ranking is by magnitude."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore import GradientEMA, Policy, QuantSpec
from ckptcodecs import CodecError


def test_quantize_ranks_protect_and_prune_by_score():
    from ckptcodecs import dequantize, quantize

    rng = np.random.default_rng(0)
    x = rng.standard_normal(4096).astype(np.float32)
    score = rng.random(4096).astype(np.float32)
    codes, p = quantize(x, "kmeans", 4, granularity="tensor", protect=0.01, prune=0.3,
                        score=score)
    pruned = codes == p.prune_code
    protected = codes == p.protect_code
    assert pruned.sum() == pytest.approx(0.3 * 4096, abs=2)
    # pruned: the smallest scores (not the smallest magnitudes)
    assert score[pruned].max() <= np.sort(score[~protected])[int(pruned.sum())]
    # protected: the union of the largest magnitudes and the largest scores
    top_mag = np.argsort(-np.abs(x))[:41]
    top_score = np.argsort(-score)[:41]
    assert protected[top_mag].all() and protected[top_score].all()
    out = dequantize(codes, p)
    np.testing.assert_array_equal(out[pruned], 0)
    np.testing.assert_allclose(out[protected], x[protected], rtol=1e-2)  # bfloat16
    with pytest.raises(CodecError, match="score"):
        quantize(x, "kmeans", 4, granularity="tensor", prune=0.3, score=score[:10])
    # non-finite scores rank highest; non-finite values stay protected
    x[5], score[7], score[9] = np.nan, np.nan, np.inf
    codes, p = quantize(x, "kmeans", 4, granularity="tensor", prune=0.5, score=score)
    assert codes[5] == p.protect_code and codes[7] != p.prune_code and codes[9] != p.prune_code


def _model_and_batches(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(),
                                torch.nn.Linear(256, 10))
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(512, 64, generator=g)
    y = torch.randint(0, 10, (512,), generator=g)
    return model, x, y


def _train(model, x, y, steps):
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        opt.step()


def test_gradient_ema_follows_gradients_and_can_pause():
    model, x, y = _model_and_batches()
    ema = GradientEMA(model, beta=0.5, score="taylor")
    fisher = GradientEMA(model, beta=0.5)  # the default: squares
    assert ema.average("model.0.weight") is None
    torch.nn.functional.cross_entropy(model(x), y).backward()
    first = model[0].weight.grad.abs()
    torch.testing.assert_close(ema.average("model.0.weight"), 0.5 * first)
    torch.testing.assert_close(fisher.average("model.0.weight"), 0.5 * first * first)
    with ema.paused():
        model.zero_grad()
        torch.nn.functional.cross_entropy(model(x[:7]), y[:7]).backward()
    torch.testing.assert_close(ema.average("model.0.weight"), 0.5 * first)
    ema.close()
    model.zero_grad()
    torch.nn.functional.cross_entropy(model(x), y).backward()
    torch.testing.assert_close(ema.average("model.0.weight"), 0.5 * first)
    with pytest.raises(ValueError, match="beta"):
        GradientEMA(model, beta=1.0)
    with pytest.raises(ValueError, match="score"):
        GradientEMA(model, score="hessian")


def test_sparse_embedding_gradients_update_their_rows():
    emb = torch.nn.Embedding(100, 8, sparse=True)
    ema = GradientEMA(torch.nn.ModuleDict({"emb": emb}), beta=0.9)
    emb(torch.tensor([3, 3, 7])).sum().backward()
    avg = ema.average("model.emb.weight")
    touched = avg.abs().sum(1).nonzero().flatten().tolist()
    assert touched == [3, 7]
    torch.testing.assert_close(avg[3], torch.full((8,), 0.4))  # two lookups: grad 2, squared, * 0.1


@pytest.mark.parametrize("async_,score", [(False, "fisher"), (True, "fisher"), (False, "taylor")])
def test_commit_prunes_by_sensitivity_where_gradients_were_seen(tmp_path, async_, score):
    model, x, y = _model_and_batches()
    ema = GradientEMA(model, score=score)
    _train(model, x, y, 20)
    spec = QuantSpec("kmeans", 4, "tensor", prune=0.3, protect=0.001)
    store = ckptstore.open(tmp_path / "s")
    state = {"model": model}
    by_mag = store.commit(state, policy=Policy(quantize=spec, min_quant_bytes=0))
    policy = Policy(quantize=spec, min_quant_bytes=0, sensitivity=ema)
    by_sens = (store.commit_async(state, policy=policy).wait() if async_
               else store.commit(state, policy=policy))
    w = model[0].weight.detach()
    g = ema.average("model.0.weight")
    s = w * w * g if score == "fisher" else w.abs() * g
    got_mag = store.checkout(by_mag.id)["model"]["0.weight"]
    got_sens = store.checkout(by_sens.id)["model"]["0.weight"]
    pruned = got_sens == 0
    assert pruned.float().mean().item() == pytest.approx(0.3, abs=0.01)
    # what sensitivity pruned has smaller |w*g| than what it kept; magnitude pruned otherwise
    assert s[pruned].max() <= s[~pruned].min() + 1e-6
    assert not torch.equal(pruned, got_mag == 0)
    # the estimated loss of what was pruned is lower under sensitivity ranking
    assert s[pruned].sum() < s[got_mag == 0].sum()
    # a plain reader (the same format) reads it; the policy does not change the codec config
    e_mag = store.manifest(by_mag.id).tensors
    e_sens = store.manifest(by_sens.id).tensors
    assert [e.codec for e in e_mag] == [e.codec for e in e_sens]


def test_without_gradients_ranking_is_by_magnitude(tmp_path):
    model, *_ = _model_and_batches()
    spec = QuantSpec("kmeans", 4, "tensor", prune=0.3)
    store = ckptstore.open(tmp_path / "s")
    a = store.commit({"model": model}, policy=Policy(quantize=spec, min_quant_bytes=0))
    b = store.commit({"model": model}, policy=Policy(quantize=spec, min_quant_bytes=0,
                                                      sensitivity=GradientEMA(model)))
    ta, tb = store.checkout(a.id)["model"], store.checkout(b.id)["model"]
    assert all(torch.equal(ta[k], tb[k]) for k in ta)


class _Fixed:
    """Gradient averages given outright: any ``GradientAverages`` may stand for GradientEMA."""

    def __init__(self, averages, score):
        self.averages, self.score = averages, score

    def average(self, path):
        return self.averages.get(path)


def test_policy_takes_any_gradient_averages(tmp_path):
    from ckptstore.tracking.gradients import GradientEMA as Hook

    assert GradientEMA is Hook  # the hook is tracking's; the policy only names what it reads
    model, x, y = _model_and_batches()
    ema = GradientEMA(model, score="taylor")
    _train(model, x, y, 5)
    fixed = _Fixed({"model.0.weight": ema.average("model.0.weight").clone()}, "taylor")
    spec = QuantSpec("kmeans", 4, "tensor", prune=0.3)
    store = ckptstore.open(tmp_path / "s")
    a = store.commit({"model": model}, policy=Policy(quantize=spec, min_quant_bytes=0,
                                                      sensitivity=ema))
    b = store.commit({"model": model}, policy=Policy(quantize=spec, min_quant_bytes=0,
                                                      sensitivity=fixed))
    ta, tb = store.checkout(a.id)["model"], store.checkout(b.id)["model"]
    assert torch.equal(ta["0.weight"], tb["0.weight"])
    plain = store.checkout(store.commit({"model": model}, policy=Policy(
        quantize=spec, min_quant_bytes=0)).id)["model"]
    assert not torch.equal(ta["0.weight"], plain["0.weight"])  # ranked by the averages
    assert torch.equal(tb["2.weight"], plain["2.weight"])  # no average: by magnitude
