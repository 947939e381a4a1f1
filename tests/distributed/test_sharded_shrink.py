"""ExCP's joint shrinking in sharded commits: each rank's block of a weight is a pruned,
quantized residual against what checkout rebuilds of that block, its moments' blocks at the same
offsets are pruned with it, and the whole reads back like a one-process commit."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import ckptstore
from ckptstore import Policy
from ckptstore.history.manifest import Layout
from ckptstore.policy import Shrink
from ckptstore.dcp.shards import LocalTensor, commit_shards

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

RANKS = 2


def _model() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 10))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)


def _train(model: torch.nn.Module, opt: torch.optim.Optimizer, seed: int, steps: int = 10,
           dtype: torch.dtype = torch.float32) -> None:
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(256, 64, generator=g).to(dtype), torch.randint(0, 10, (256,), generator=g)
    for _ in range(steps):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x).float(), y).backward()
        opt.step()


def _state(model: torch.nn.Module, opt: torch.optim.Optimizer) -> dict[str, torch.Tensor]:
    """Flat fqn -> tensor: the weights and, once there are any, the AdamW moments."""
    out = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    for i, p in enumerate(model.parameters()):
        for name in ("exp_avg", "exp_avg_sq"):
            if name in opt.state.get(p, {}):
                out[f"optim.state.{i}.{name}"] = opt.state[p][name].clone()
    return out


def _shards(state: dict[str, torch.Tensor]) -> list[list[LocalTensor]]:
    """Every tensor split by rows over the ranks (as FSDP2 shards parameters and moments)."""
    ranks: list[list[LocalTensor]] = [[] for _ in range(RANKS)]
    for fqn, full in state.items():
        lo = 0
        for r, part in enumerate(torch.chunk(full, RANKS)):
            offsets = (lo, *[0] * (full.dim() - 1))
            ranks[r].append(LocalTensor(fqn, offsets, tuple(full.shape), part))
            lo += part.shape[0]
    return ranks


def test_sharded_shrink_stores_residual_blocks_that_rebuild_without_drift(tmp_path):
    model, opt = _model()
    policy = Policy(shrink=Shrink.of(model, opt, keep=0.3), max_chain=16)
    sharded = ckptstore.open(tmp_path / "sharded")
    whole = ckptstore.open(tmp_path / "whole")
    lossless = ckptstore.open(tmp_path / "lossless")
    first = commit_shards(sharded, _shards(_state(model, opt)), policy=policy)
    whole.commit(_state(model, opt), policy=policy)
    lossless.commit(_state(model, opt))
    for step in range(3):
        _train(model, opt, step)
        last = commit_shards(sharded, _shards(_state(model, opt)), policy=policy)
        one = whole.commit(_state(model, opt), policy=policy)
        plain = lossless.commit(_state(model, opt))
    kinds = {e.path: (str(e.kind), e.chain) for e in last.shards}
    assert kinds["model.0.weight@0,0"] == ("residual", 3)
    assert kinds["model.0.weight@128,0"] == ("residual", 3)
    assert all(e.layout == Layout.SHARDED for e in last.tensors)
    # the next residual of each block is taken against exactly what checkout rebuilds
    got = sharded.checkout(last.id)
    shadows = sharded._committer.chains._shadows
    np.testing.assert_array_equal(shadows[("main", "model.0.weight@128,0")].values,
                                  got["model.0.weight"][128:].numpy())
    # pruning lags, never drifts: the rebuilt weights are as close to the live ones as a
    # one-process commit's, and much closer than the baseline
    live, base = model.state_dict(), sharded.checkout(first.id)
    single = whole.checkout(one.id)
    for name in ("0.weight", "2.weight"):
        lag = (got[f"model.{name}"] - live[name]).norm()
        assert lag < 0.5 * (base[f"model.{name}"] - live[name]).norm()
        assert lag < 1.5 * (single[f"model.{name}"] - live[name]).norm()
    # the moments' blocks were pruned with their weights' blocks
    m = got["optim.state.0.exp_avg"]
    assert 0.3 < float((m == 0).float().mean()) < 1.0
    assert last.stored_bytes < plain.stored_bytes / 4
    assert sharded.verify().ok


def test_sharded_bf16_shrink_rebuilds_what_the_writer_keeps(tmp_path):
    """bfloat16 weights and moments in a sharded commit: each block's residual is taken in
    float32 and rounded back, and the next reference of a block is bit for bit what checkout
    rebuilds of it (format version 7)."""
    from ckptstore.history.manifest import HALF_RESIDUAL_VERSION

    model, _ = _model()
    model = model.to(torch.bfloat16)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-4)
    policy = Policy(shrink=Shrink.of(model, opt, keep=0.3), max_chain=16)
    store = ckptstore.open(tmp_path / "s")
    commit_shards(store, _shards(_state(model, opt)), policy=policy)
    for step in range(2):
        _train(model, opt, step, steps=5, dtype=torch.bfloat16)
        last = commit_shards(store, _shards(_state(model, opt)), policy=policy)
    kinds = {e.path: (str(e.kind), e.chain) for e in last.shards}
    assert kinds["model.0.weight@128,0"] == ("residual", 2)
    assert store.manifest(last.id).format_version == HALF_RESIDUAL_VERSION
    got = store.checkout(last.id)
    assert got["model.0.weight"].dtype == torch.bfloat16
    shadows = store._committer.chains._shadows
    for block, rows in (("@0,0", slice(0, 128)), ("@128,0", slice(128, 256))):
        np.testing.assert_array_equal(shadows[("main", f"model.0.weight{block}")].values,
                                      got["model.0.weight"][rows].view(torch.uint16).numpy())
    m = got["optim.state.0.exp_avg"]
    assert m.dtype == torch.bfloat16 and 0.3 < float((m == 0).float().mean()) < 1.0
    assert store.verify().ok


def test_sharded_sensitivity_ranks_each_block_by_its_own_scores(tmp_path):
    """``Policy(sensitivity=GradientEMA(model))`` in a sharded commit: each rank's block of a
    weight prunes the smallest ``w**2 * E[g**2]`` of that block (the average sliced at the
    block's offsets), not the smallest magnitudes."""
    from ckptstore import GradientEMA, QuantSpec

    model, opt = _model()
    ema = GradientEMA(model)
    _train(model, opt, 0)
    spec = QuantSpec("kmeans", 4, "tensor", prune=0.3)
    store = ckptstore.open(tmp_path / "s")
    state = {f"model.{k}": v.detach().clone() for k, v in model.state_dict().items()}
    by_mag = commit_shards(store, _shards(state), policy=Policy(quantize=spec, min_quant_bytes=0))
    policy = Policy(quantize=spec, min_quant_bytes=0, sensitivity=ema)
    by_sens = commit_shards(store, _shards(state), policy=policy)
    w, g = state["model.0.weight"], ema.average("model.0.weight")
    score = w * w * g
    got = store.checkout(by_sens.id)["model.0.weight"]
    magnitude = store.checkout(by_mag.id)["model.0.weight"]
    for lo, hi in ((0, 128), (128, 256)):  # the two ranks' blocks
        pruned, s = got[lo:hi] == 0, score[lo:hi]
        assert pruned.float().mean().item() == pytest.approx(0.3, abs=0.01)
        assert s[pruned].max() <= s[~pruned].min() + 1e-9
        assert not torch.equal(pruned, magnitude[lo:hi] == 0)
