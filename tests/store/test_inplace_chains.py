"""``checkout(ref, into=...)`` of chain, packed and alias entries rebuilt straight into the live
tensors (issue 26, item 15): the baseline decoded into the destination, rows / XORs / residuals
/ code deltas applied there, no temporary of the tensor's size."""

from __future__ import annotations

import tracemalloc

import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, Policy, QuantSpec
from ckptstore.policy import Shrink

ROWS, COLS = 2048, 256  # 2 MiB of float32 per tensor


def _step(state: dict[str, torch.Tensor], seed: int, dense: bool) -> None:
    """A few rows changed (``dense``: then every value a little)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for v in state.values():
            if v.dim() == 2 and v.is_floating_point():
                v[torch.randint(0, v.shape[0], (8,), generator=g)] += 1
                if dense:
                    v.mul_(1 + 1e-3 * torch.rand(v.shape, generator=g, dtype=v.dtype))


def _chain_store(tmp_path, kind: str) -> tuple[ckptstore.Store, dict[str, object]]:
    """A store whose last commit holds ``kind`` chain entries (three links), and the part of
    its state that a checkout loads (the model only for ``residual``: its moments are full)."""
    opts = EncodingOptions(chunk_bytes=1 << 16)
    torch.manual_seed(0)
    if kind == "residual":
        model = torch.nn.Sequential(torch.nn.Linear(COLS, ROWS, bias=False))
        opt = torch.optim.Adam(model.parameters())
        store = ckptstore.open(str(tmp_path / "s"), options=opts, io_workers=2,
                               policy=Policy(shrink=Shrink.of(model, opt, min_bytes=1024)))
        x = torch.randn(16, COLS)
        for _ in range(4):
            opt.zero_grad()
            model(x).square().mean().backward()
            opt.step()
            store.commit({"model": model, "optim": opt})
        return store, {"model": model.state_dict()}
    policy = {"rows": Policy(incremental="consecutive", min_rows=16),
              "xor": Policy(delta=True, min_quant_bytes=1024),
              "codes": Policy(delta=True, quantize=QuantSpec(bits=8), min_quant_bytes=1024)}[kind]
    store = ckptstore.open(str(tmp_path / "s"), options=opts, policy=policy, io_workers=2)
    state = {"a": torch.randn(ROWS, COLS), "b": torch.randn(ROWS, COLS).bfloat16(),
             "small": torch.randn(7), "step": torch.tensor(3)}
    for seed in range(4):
        store.commit(state)
        _step(state, seed, dense=kind != "rows")
    return store, state


def _zeros_like(state: dict) -> dict:
    return {k: _zeros_like(v) if isinstance(v, dict) else torch.zeros_like(v)
            for k, v in state.items()}


def _flat(state: dict, prefix: str = "") -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for k, v in state.items():
        if isinstance(v, dict):
            out.update(_flat(v, f"{prefix}{k}."))
        else:
            out[prefix + k] = v
    return out


@pytest.mark.parametrize("kind", ["rows", "xor", "codes", "residual"])
def test_chains_rebuild_into_the_live_storage_bit_for_bit(tmp_path, kind):
    store, state = _chain_store(tmp_path, kind)
    m = store.manifest(store.resolve("main"))
    tensors = [e for e in m.tensors if e.layout == "chain"]
    assert tensors and all(e.chain for e in tensors), [(e.path, e.layout) for e in m.tensors]
    expected = _flat(store.checkout("main"))
    live = _zeros_like(state)
    ptrs = {k: v.data_ptr() for k, v in _flat(live).items()}
    store.checkout("main", into=live, paths=list(state))
    for k, v in _flat(live).items():
        assert v.data_ptr() == ptrs[k], k  # written where it was, not replaced
        assert torch.equal(v.view(torch.uint8) if v.dim() else v,
                           expected[k].view(torch.uint8) if v.dim() else expected[k]), k


def test_packed_and_alias_entries_rebuild_into_the_live_storage(tmp_path):
    store = ckptstore.open(str(tmp_path / "s"))
    w = torch.randn(64, 32)
    state = {"w": w, "tied": w, "small": torch.randn(5).bfloat16(), "scalar": torch.tensor(2.5),
             "n": torch.arange(6, dtype=torch.int16)}
    store.commit(state)
    layouts = {e.path: e.layout for e in store.manifest(store.resolve("main")).tensors}
    assert layouts["tied"] == "alias" and layouts["small"] == "packed", layouts
    # only the alias in the live state: it is rebuilt from its base, straight into it
    live = {k: torch.zeros_like(v) for k, v in state.items() if k != "w"}
    ptrs = {k: v.data_ptr() for k, v in live.items()}
    store.checkout("main", into=live, paths=list(live))
    for k, v in live.items():
        assert v.data_ptr() == ptrs[k] and torch.equal(v, state[k]), k


@pytest.mark.parametrize("kind", ["rows", "xor", "codes", "residual"])
def test_an_in_place_checkout_of_chains_allocates_no_tensor_copy(tmp_path, kind):
    """Before, every chain entry was rebuilt into a temporary of its size (tracemalloc saw
    4.5-6.7 MiB for 2 MiB tensors); now only chunks (64 KiB, a few in flight) and changed rows
    (0.2-0.5 MiB seen, once 1.5 MiB: threads' timing)."""
    store, state = _chain_store(tmp_path, kind)
    live = _zeros_like(state)
    paths = list(state)  # the residual store's moments are not loaded
    store.checkout("main", into=live, paths=paths)  # warm: imports, compiled kernels
    tracemalloc.start()
    try:
        store.checkout("main", into=live, paths=paths)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    tensor = ROWS * COLS * 4
    assert peak < tensor, f"{peak / 2**20:.2f} MiB allocated for {tensor / 2**20:.0f} MiB"
