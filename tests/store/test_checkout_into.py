"""``checkout(ref, into=...)`` the way ``dcp.load`` users call it (issue 26, items 11, 12, 15):
plain nested dicts filled in place, ``io.BytesIO`` values, and tensors decoded straight into
the live ones (no host copy of the whole state)."""

from __future__ import annotations

import io
import tracemalloc

import pytest
import torch

import ckptstore
from ckptstore import EncodingOptions, StateMismatchError


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.BatchNorm1d(4))


@pytest.mark.every_backend
def test_plain_state_dict_is_filled_in_place(store):
    model = _model()
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    store.commit({"model": model.state_dict(), "optim": opt.state_dict(), "step": 5,
                  "extra": torch.arange(3)})
    live = _model()
    with torch.no_grad():
        for p in live.parameters():
            p.zero_()
    sd = {"model": live.state_dict(), "step": 0}  # how dcp.load(state_dict) is called
    ptrs = {k: v.data_ptr() for k, v in sd["model"].items()}
    state = store.checkout("main", into=sd)
    assert sd["step"] == 5  # plain values replaced in the dict
    for k, v in model.state_dict().items():
        assert torch.equal(sd["model"][k], v), k
        assert sd["model"][k].data_ptr() == ptrs[k], k  # the same memory, filled in place
        assert torch.equal(live.state_dict()[k], v), k  # so the module holds the commit
    assert "optim" not in sd and torch.equal(state["extra"], torch.arange(3))  # nothing added
    assert state["model"]["0.weight"] is sd["model"]["0.weight"]


def test_plain_dict_with_lists_converted_dtypes_and_mismatches(tmp_path):
    store = ckptstore.open(str(tmp_path / "s"))
    store.commit({"a": [torch.ones(4), "x"], "b": torch.full((3,), 2.5), "c": {"d": 1}})
    sd = {"a": [torch.zeros(4), "y"], "b": torch.zeros(3, dtype=torch.float64), "c": None}
    store.checkout("main", into=sd)
    assert torch.equal(sd["a"][0], torch.ones(4)) and sd["a"][1] == "x"
    assert sd["b"].dtype == torch.float64 and torch.equal(sd["b"], torch.full((3,), 2.5).double())
    assert sd["c"] == {"d": 1}
    with pytest.raises(StateMismatchError, match="shape"):
        store.checkout("main", into={"b": torch.zeros(4)})
    with pytest.raises(StateMismatchError, match="'z'"):
        store.checkout("main", into={"z": torch.zeros(4)})
    # a live entry the commit lacks is left alone when paths= selects part of the commit
    other = {"b": torch.zeros(3), "z": torch.zeros(2)}
    store.checkout("main", into=other, paths=["b"])
    assert torch.equal(other["b"], torch.full((3,), 2.5)) and not other["z"].any()


def test_stateful_objects_still_get_load_state_dict(tmp_path):
    store = ckptstore.open(str(tmp_path / "s"))
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.randn(3, 8)).sum().backward()
    opt.step()
    store.commit({"model": model, "optim": opt, "step": 3})
    live, = [_model()]
    live_opt = torch.optim.SGD(live.parameters(), lr=0.5, momentum=0.9)  # no state yet
    weight = live[0].weight
    state = store.checkout("main", into={"model": live, "optim": live_opt})
    assert live[0].weight is weight and torch.equal(weight, model[0].weight)
    assert live_opt.param_groups[0]["lr"] == 0.1  # load_state_dict ran
    got = live_opt.state_dict()["state"][0]["momentum_buffer"]
    assert torch.equal(got, opt.state_dict()["state"][0]["momentum_buffer"])
    assert state["step"] == 3


@pytest.mark.every_backend
def test_bytesio_values_round_trip_as_bytes(store):
    raw = bytes(range(256)) * 3
    store.commit({"io": io.BytesIO(raw), "nested": [io.BytesIO(b"")]})
    got = store.checkout("main")
    assert isinstance(got["io"], io.BytesIO) and got["io"].getvalue() == raw
    assert got["io"].tell() == 0 and got["nested"][0].getvalue() == b""
    sd = {"io": io.BytesIO(b"old")}
    store.checkout("main", into=sd)
    assert sd["io"].getvalue() == raw


def test_in_place_checkout_allocates_no_copy_of_the_state(tmp_path):
    """The host memory an in-place checkout allocates is bounded by the chunks in flight,
    not by the state (tracemalloc sees numpy's allocations; the state is 32 MiB)."""
    store = ckptstore.open(str(tmp_path / "s"), options=EncodingOptions(chunk_bytes=1 << 20),
                           io_workers=2)
    state = {"w": torch.randn(4096, 1024), "h": torch.randn(2048, 1024).bfloat16(),
             "edge": torch.randn(1000, 1000)}  # rows that leave a padded edge chunk
    store.commit(state)
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    size = sum(v.numel() * v.element_size() for v in state.values())
    # the modules a first checkout imports (torch.distributed's, ~40 MiB of objects) are not the
    # state's: a test run alone, or first in its worker, would count them
    store.checkout("main", into={k: torch.zeros_like(v) for k, v in state.items()})
    tracemalloc.start()
    try:
        store.checkout("main", into=live)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    for k, v in state.items():
        assert torch.equal(live[k], v), k
    assert peak < size / 4, f"{peak / 2**20:.1f} MiB allocated for a {size / 2**20:.0f} MiB state"


def test_tied_weights_and_chains_load_in_place(tmp_path):
    from ckptstore import Policy
    store = ckptstore.open(str(tmp_path / "s"), policy=Policy(incremental="consecutive"))
    emb = torch.nn.Embedding(4096, 64)
    head = torch.nn.Linear(64, 4096, bias=False)
    head.weight = emb.weight  # tied, as language models do
    model = torch.nn.ModuleDict({"emb": emb, "head": head})
    store.commit({"model": model})
    with torch.no_grad():
        emb.weight[3] += 1
    info = store.commit({"model": model})
    layouts = {e.path: e.layout for e in store.manifest(info.id).tensors}
    assert layouts == {"model.emb.weight": "chain", "model.head.weight": "alias"}, layouts
    live_emb = torch.nn.Embedding(4096, 64)
    live_head = torch.nn.Linear(64, 4096, bias=False)
    live_head.weight = live_emb.weight
    live = torch.nn.ModuleDict({"emb": live_emb, "head": live_head})
    store.checkout("main", into={"model": live})
    assert torch.equal(live_emb.weight, emb.weight) and live_head.weight is live_emb.weight
    sd = {"model": {"emb.weight": torch.zeros(4096, 64), "head.weight": torch.zeros(4096, 64)}}
    store.checkout("main", into=sd)  # untied live tensors both get the values
    assert torch.equal(sd["model"]["head.weight"], emb.weight)
    assert torch.equal(sd["model"]["emb.weight"], emb.weight)


def test_bytesio_through_dcp_save_and_load(tmp_path):
    import torch.distributed.checkpoint as dcp

    from ckptstore.dcp import StorageReader, StorageWriter
    store = ckptstore.open(str(tmp_path / "s"))
    with pytest.warns(UserWarning, match="single process"):
        dcp.save({"w": torch.ones(3), "b": io.BytesIO(b"xyz")}, storage_writer=StorageWriter(store))
    assert store.checkout("main")["b"].getvalue() == b"xyz"
    sd = {"w": torch.zeros(3), "b": io.BytesIO()}
    with pytest.warns(UserWarning, match="single process"):
        dcp.load(sd, storage_reader=StorageReader(store))
    assert sd["b"].getvalue() == b"xyz" and torch.equal(sd["w"], torch.ones(3))


def test_strided_and_channels_last_live_tensors(tmp_path):
    store = ckptstore.open(str(tmp_path / "s"), options=EncodingOptions(chunk_bytes=1 << 12))
    w = torch.randn(300, 40)
    conv = torch.randn(8, 3, 5, 5).contiguous(memory_format=torch.channels_last)
    store.commit({"w": w, "conv": conv})
    live = {"w": torch.zeros(40, 300).t(), "conv": torch.zeros(8, 3, 5, 5)}
    store.checkout("main", into=live)  # a transposed view, a dim order the live one lacks
    assert torch.equal(live["w"], w) and torch.equal(live["conv"], conv)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_live_tensors_are_filled_in_place(tmp_path):
    store = ckptstore.open(str(tmp_path / "s"))
    w = torch.randn(1000, 64)
    store.commit({"w": w})
    live = {"w": torch.zeros(1000, 64, device="cuda")}
    ptr = live["w"].data_ptr()
    store.checkout("main", into=live)
    assert live["w"].data_ptr() == ptr and torch.equal(live["w"].cpu(), w)


def test_quantized_and_delta_chains_decode_in_place_as_without_into(tmp_path):
    from ckptstore import Policy, QuantSpec
    store = ckptstore.open(str(tmp_path / "s"), options=EncodingOptions(chunk_bytes=1 << 14),
                           policy=Policy(quantize=QuantSpec(bits=8), delta=True))
    w = torch.randn(1000, 64)
    store.commit({"w": w})
    info = store.commit({"w": w + 0.01})  # a code delta on the quantized baseline
    assert [e.layout for e in store.manifest(info.id).tensors] == ["chain"]
    assert [e.layout for e in store.manifest(info.parent).tensors] == ["array"]
    want = store.checkout("main")["w"]
    live = {"w": torch.zeros(1000, 64)}
    store.checkout("main", into=live)
    assert torch.equal(live["w"], want)
    store.checkout("main~1", into=live)  # the full quantized array, chunk by chunk
    assert torch.equal(live["w"], store.checkout("main~1")["w"])
