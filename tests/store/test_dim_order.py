"""Memory layouts survive checkout: channels_last weights, transposed matrices, permuted and
Fortran-ordered arrays come back with their strides (values stored in logical order, so every
policy works unchanged); layouts that are not a dense permutation come back C-contiguous."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from helpers import assert_older_reader_refuses

import ckptstore
from ckptstore import Policy, QuantSpec
from ckptstore.format.dimorder import dim_order_of, with_dim_order
from ckptstore.errors import ManifestError
from ckptstore.history.manifest import (BASE_VERSION, DIM_ORDER_VERSION, TensorEntry, decode_manifest,
                                encode_manifest)


def _strides(v):
    return v.strides if isinstance(v, np.ndarray) else v.stride()


def _laid_out_state():
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 16, 3).to(memory_format=torch.channels_last)
    return {
        "conv": conv.weight.detach(),                                # NCHW stored as NHWC
        "linear_t": torch.randn(300, 200).t(),                       # a big transposed matrix
        "small_t": torch.randn(3, 2).t(),                            # packed with small tensors
        "bf16_t": torch.randn(40, 8, dtype=torch.bfloat16).t(),      # a bit-view dtype
        "perm": torch.randn(2, 3, 4).permute(2, 0, 1),
        "fortran": np.asfortranarray(np.random.default_rng(0).random((5, 7))),
        "batch1_cl": torch.randn(1, 4, 5, 6).to(memory_format=torch.channels_last),
    }


def test_layouts_come_back_with_their_strides(open_backend_store):
    store = open_backend_store()
    state = _laid_out_state()
    store.commit(state)
    out = store.checkout("main")
    for key, value in state.items():
        assert _strides(out[key]) == _strides(value), key
        if isinstance(value, np.ndarray):
            np.testing.assert_array_equal(out[key], value)
        else:
            assert torch.equal(out[key], value), key
    assert out["conv"].is_contiguous(memory_format=torch.channels_last)
    assert store.verify("main").ok


def test_layouts_survive_async_and_lossy_chains(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    w = torch.randn(512, 256).t()
    spec = QuantSpec(bits=8)
    store.commit_async({"w": w}, policy=Policy(quantize=spec, delta=True)).wait()
    w2 = (w + 0.01 * torch.randn_like(w))  # keeps the transposed strides
    assert w2.stride() == w.stride()
    info = store.commit_async({"w": w2}, policy=Policy(quantize=spec, delta=True)).wait()
    assert store.manifest(info.id).tensors[0].layout == "chain"
    got = store.checkout(info.id)["w"]
    assert got.stride() == w.stride()
    assert torch.allclose(got, w2, atol=0.05)


def test_ambiguous_and_non_dense_layouts_come_back_c_contiguous(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    state = {"col": torch.randn(1, 9).t(),                        # (9, 1): C order already
             "expanded": torch.randn(4, 1).expand(4, 6),          # stride 0
             "sliced": torch.randn(8, 10)[:, ::2],                # not dense
             "scalar": torch.tensor(3.0)}
    info = store.commit(state)
    assert all(e.dim_order is None for e in store.manifest(info.id).tensors)
    assert store.manifest(info.id).format_version == BASE_VERSION  # nothing new recorded
    out = store.checkout("main")
    for key, value in state.items():
        assert out[key].is_contiguous() and torch.equal(out[key], value), key


def test_dim_order_of_matches_torch():
    t = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    assert dim_order_of(t) == tuple(t.dim_order()) == (0, 2, 3, 1)
    assert dim_order_of(torch.randn(3, 4)) is None
    assert dim_order_of(torch.randn(3, 4).t()) == (1, 0)
    assert dim_order_of(torch.randn(3, 4)[:, ::2]) is None
    a = np.arange(24.0).reshape(2, 3, 4)
    assert dim_order_of(np.asfortranarray(a)) == (2, 1, 0)
    back = with_dim_order(np.ascontiguousarray(a), (2, 1, 0))
    assert back.flags.f_contiguous and np.array_equal(back, a)


def test_older_readers_refuse_and_hostile_orders_are_manifest_errors(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    info = store.commit({"w": torch.randn(64, 32).t()})
    m = store.manifest(info.id)
    assert m.format_version == DIM_ORDER_VERSION and m.tensors[0].dim_order == [1, 0]
    assert_older_reader_refuses(m, DIM_ORDER_VERSION - 1)
    entry = m.tensors[0].model_dump()
    for bad in ([0, 0], [1], [0, 2], [-1, 0]):
        with pytest.raises(ValueError, match="dim_order"):
            TensorEntry.model_validate({**entry, "dim_order": bad})
    forged = m.model_copy(update={"tensors": [m.tensors[0].model_copy(
        update={"dim_order": [2, 0]})]})  # model_copy skips validation: decode must catch it
    with pytest.raises(ManifestError, match="dim_order"):
        decode_manifest(encode_manifest(forged))
