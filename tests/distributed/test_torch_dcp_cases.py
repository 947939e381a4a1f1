"""torch's own DCP test cases (pytorch ``test/distributed/checkpoint/``) that apply to a storage
layer, run against ``ckptstore.dcp``: each test names the upstream test it mirrors. Cases that
are single-process upstream run single-process here; the multi-rank ones use our gloo harness
(``tests/dist_ranks.py``)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

import ckptstore
from ckptstore.dcp import StorageReader, StorageWriter
from dist_ranks import check_ranks, run_ranks

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning",
                                        "ignore:torch.distributed is unavailable:UserWarning")


@pytest.fixture
def store(tmp_path):
    with ckptstore.open(tmp_path / "store") as s:
        yield s


def _save(sd, store, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        dcp.save(sd, storage_writer=StorageWriter(store, **kw), no_dist=True)


def _nested():
    return {"model": {"w": torch.arange(12.).reshape(3, 4), "b": torch.ones(4)},
            "optim": {"state": {"0": {"exp_avg": torch.full((3, 4), 2.)}},
                      "param_groups": [{"lr": 0.1, "params": [0]}]},
            "step": 7}


# -- test_format_utils.py / test_hf_storage.py: test_load_into_empty_dict ---------------------
def test_load_state_dict_from_keys_everything(store):
    """Mirrors ``test_hf_storage.py::test_load_into_empty_dict``: ``_load_state_dict_from_keys``
    with only a storage reader rebuilds the whole nested state (issue 26 item 13)."""
    sd = _nested()
    _save(sd, store)
    got = _load_state_dict_from_keys(storage_reader=StorageReader(store))
    assert torch.equal(got["model"]["w"], sd["model"]["w"])
    assert torch.equal(got["optim"]["state"]["0"]["exp_avg"], sd["optim"]["state"]["0"]["exp_avg"])
    assert got["optim"]["param_groups"] == sd["optim"]["param_groups"] and got["step"] == 7


def test_load_state_dict_from_keys_selects_a_subtree(store):
    """Mirrors ``_EmptyStateDictLoadPlanner``'s key selection (``test_planner.py``): keys name a
    flat key or any container above it (issue 26 item 13)."""
    sd = _nested()
    _save(sd, store)
    got = _load_state_dict_from_keys({"model"}, storage_reader=StorageReader(store))
    assert set(got) == {"model"} and set(got["model"]) == {"w", "b"}
    assert torch.equal(got["model"]["b"], sd["model"]["b"])
    got = _load_state_dict_from_keys("optim.state.0.exp_avg", storage_reader=StorageReader(store))
    assert set(got) == {"optim"} and torch.equal(got["optim"]["state"]["0"]["exp_avg"],
                                                  sd["optim"]["state"]["0"]["exp_avg"])


def test_load_state_dict_from_keys_of_a_plain_commit(store):
    """The same on a commit made by ``Store.commit`` (not by ``dcp.save``): lists of tensors
    come back as lists, int dict keys (an optimizer's state) as strings, as DCP keys them."""
    store.commit({"layers": [torch.ones(2), torch.zeros(3)], "cfg": {"depth": 2},
                  "optim": {"state": {0: {"m": torch.ones(2)}, 2: {"m": torch.full((2,), 2.)}}}})
    got = _load_state_dict_from_keys(storage_reader=StorageReader(store))
    assert isinstance(got["layers"], list) and torch.equal(got["layers"][1], torch.zeros(3))
    assert got["cfg"] == {"depth": 2}
    assert set(got["optim"]["state"]) == {"0", "2"}
    assert torch.equal(got["optim"]["state"]["2"]["m"], torch.full((2,), 2.))


# -- test_file_system_checkpoint_cpu.py (single process) --------------------------------------
class _MyTestModule(torch.nn.Module):
    """Upstream's ``MyTestModule``."""

    def __init__(self) -> None:
        super().__init__()
        self.linear_1 = torch.nn.Linear(5, 5)
        self.linear_2 = torch.nn.Linear(5, 1)
        self.emb = torch.nn.EmbeddingBag(5, 10)


class _BlobState:
    """Upstream's ``BlobState``: a Stateful holding raw bytes."""

    def __init__(self, value: bytes) -> None:
        self.state = {"blob": value}

    def state_dict(self) -> dict:
        return self.state

    def load_state_dict(self, state_dict: dict) -> None:
        self.state = state_dict


def _assert_equal(a: dict, b: dict) -> None:
    assert set(a) == set(b)
    for k, v in a.items():
        assert torch.equal(v, b[k]) if isinstance(v, torch.Tensor) else v == b[k], k


def test_read_write_only_tensor(store):
    """Mirrors ``TestDistributedStateDictSaveLoad.test_read_write_only_tensor``."""
    saved = _MyTestModule().state_dict()
    _save(saved, store)
    into = _MyTestModule().state_dict()
    assert not torch.equal(into["linear_1.weight"], saved["linear_1.weight"])
    dcp.load(into, storage_reader=StorageReader(store), no_dist=True)
    _assert_equal(into, saved)


def test_read_write_tensor_and_blob(store):
    """Mirrors ``TestDistributedStateDictSaveLoadRot13.test_read_write_tensor_and_blob`` (and
    the ZStandard variant) without the storage-side extension: a Stateful's raw bytes."""
    saved = _MyTestModule().state_dict()
    blob = _BlobState(b"SomeBlobForTesting")
    _save({**saved, "test_blob": blob}, store)
    into = {**_MyTestModule().state_dict(), "test_blob": _BlobState(b"")}
    dcp.load(into, storage_reader=StorageReader(store), no_dist=True)
    assert into["test_blob"].state == {"blob": b"SomeBlobForTesting"}
    _assert_equal({k: v for k, v in into.items() if k != "test_blob"}, saved)


def test_dtype_mismatch_casting(store):
    """Mirrors ``TestDistributedStateDictSaveLoad.test_dtype_mismatch_casting`` (torch 2.13's
    planner has no ``allow_unsafe_types``: the default casting both ways)."""
    w = torch.rand(4, 3)
    _save({"w": w}, store)
    narrow = {"w": torch.zeros(4, 3, dtype=torch.bfloat16)}
    dcp.load(narrow, storage_reader=StorageReader(store), no_dist=True)
    assert narrow["w"].dtype == torch.bfloat16 and torch.equal(narrow["w"], w.bfloat16())
    half = torch.rand(4, 3, dtype=torch.bfloat16)
    _save({"w": half}, store)
    wide = {"w": torch.zeros(4, 3)}
    dcp.load(wide, storage_reader=StorageReader(store), no_dist=True)
    assert wide["w"].dtype == torch.float32 and torch.equal(wide["w"], half.float())


# -- test_list_stored_state_dict.py (single process) -------------------------------------------
def test_list_stored_sd_metadata(store):
    """Mirrors ``TestListStateDict.test_list_stored_sd_metadata`` through what
    ``list_stored_state_dict`` wraps (torch 2.13 has no such function): the reader's metadata
    names each tensor's size and dtype, and a BytesIO value as bytes."""
    import io

    from torch.distributed.checkpoint.metadata import (BytesStorageMetadata,
                                                       TensorStorageMetadata)
    _save({"distributed_weight": torch.arange(16, dtype=torch.float).view(4, 4),
           "bytes_data": io.BytesIO(b"TrainingEpoch:4")}, store)
    md = StorageReader(store).read_metadata().state_dict_metadata
    assert isinstance(md["distributed_weight"], TensorStorageMetadata)
    assert md["distributed_weight"].size == torch.Size([4, 4])
    assert md["distributed_weight"].properties.dtype == torch.float32
    assert isinstance(md["bytes_data"], BytesStorageMetadata)


# -- test_save_load_api.py / e2e/test_e2e_save_and_load.py (single process) -------------------
def test_partial_load(store):
    """Mirrors ``TestE2ESaveAndLoad.test_partial_load``: a load asks for part of the state (only
    the model), and with ``allow_partial_load`` for keys the checkpoint does not have."""
    sd = _nested()
    _save(sd, store)
    model = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}}
    dcp.load(model, storage_reader=StorageReader(store), no_dist=True)
    assert torch.equal(model["model"]["w"], sd["model"]["w"])
    extra = {"model": {"w": torch.zeros(3, 4), "new": torch.zeros(2)}}
    with pytest.raises(CheckpointException, match="new"):  # a BaseException
        dcp.load(extra, storage_reader=StorageReader(store), no_dist=True)
    dcp.load(extra, storage_reader=StorageReader(store), no_dist=True,
             planner=dcp.DefaultLoadPlanner(allow_partial_load=True))
    assert torch.equal(extra["model"]["w"], sd["model"]["w"])
    assert torch.equal(extra["model"]["new"], torch.zeros(2))


def test_async_save_then_load(store):
    """Mirrors ``TestE2ESaveAndLoad.test_e2e`` with ``async_save``: the future resolves once the
    commit landed; the state may change meanwhile without touching what was saved."""
    sd = _nested()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        fut = dcp.async_save(sd, storage_writer=StorageWriter(store, message="async"),
                             no_dist=True)
        saved = sd["model"]["w"].clone()
        sd["model"]["w"].add_(1)  # after staging: not in the commit
        fut.result()
    assert store.log()[0].message == "async"
    into = {"model": {"w": torch.zeros(3, 4), "b": torch.zeros(4)}}
    dcp.load(into, storage_reader=StorageReader(store), no_dist=True)
    assert torch.equal(into["model"]["w"], saved)


def test_save_twice_loads_the_latest_or_a_named_commit(store):
    """Mirrors ``test_save_load_api.py``'s repeated saves to one location (``overwrite``): each
    save is a new commit; a reader of ``main`` sees the newest, of an id the one it names."""
    _save({"w": torch.ones(3)}, store)
    first = store.resolve("main")
    _save({"w": torch.full((3,), 2.0)}, store)
    into = {"w": torch.zeros(3)}
    dcp.load(into, storage_reader=StorageReader(store), no_dist=True)
    assert torch.equal(into["w"], torch.full((3,), 2.0))
    dcp.load(into, storage_reader=StorageReader(store, first), no_dist=True)
    assert torch.equal(into["w"], torch.ones(3))


# -- multi-rank cases (gloo ranks, our harness) -----------------------------------------------
def _gathered(st) -> torch.Tensor | None:
    """A ShardedTensor gathered on rank 0 (upstream's ``load_tensor``)."""
    import torch.distributed as dist
    out = torch.zeros(st.shape) if dist.get_rank() == 0 else None
    st.gather(out=out)
    return out


def _sharded_tensor_cases(rank: int, world: int, url: str) -> None:
    """test_file_system_checkpoint_cpu.py: ``test_read_write_shard_tensor``,
    ``test_load_with_different_shard_plan``, ``test_load_rowwise_to_colwise``,
    ``test_save_load_bytes``, ``test_switch_between_sharded_tensor_to_tensor`` (upstream's
    specs, on CPU)."""
    import torch.distributed as dist
    from torch.distributed._shard import sharded_tensor
    from torch.distributed._shard.sharding_spec import (ChunkShardingSpec,
                                                        EnumerableShardingSpec, ShardMetadata)
    warnings.filterwarnings("ignore", category=FutureWarning)  # "Please use DTensor instead"

    def chunk(dim: int, ranks: list[int]) -> ChunkShardingSpec:
        return ChunkShardingSpec(dim=dim, placements=[f"rank:{r}/cpu" for r in ranks])

    def enum(*shards: tuple[list[int], list[int], int]) -> EnumerableShardingSpec:
        return EnumerableShardingSpec([ShardMetadata(o, s, f"rank:{r}/cpu")
                                       for o, s, r in shards])

    def roundtrip(save: dict, load: dict) -> None:
        dcp.save(save, storage_writer=StorageWriter(store))
        dcp.load(load, storage_reader=StorageReader(store))

    with ckptstore.open(url) as store:
        specs = [chunk(0, [0, 1]), chunk(0, [0, 1, 1, 0]),
                 enum(([0, 0], [2, 20], 0), ([2, 0], [1, 20], 1), ([3, 0], [3, 20], 0),
                      ([6, 0], [3, 20], 1), ([9, 0], [1, 20], 0)),
                 enum(([0, 0], [8, 20], 1), ([8, 0], [2, 20], 0))]
        for s0 in specs:  # test_load_with_different_shard_plan (and, s0 == s1, read_write)
            saved = {"sharded_tensor": sharded_tensor.rand(s0, 10, 20, init_rrefs=False)}
            dcp.save(saved, storage_writer=StorageWriter(store))  # one save, every load plan
            a = _gathered(saved["sharded_tensor"])
            for s1 in specs:
                into = {"sharded_tensor": sharded_tensor.zeros(s1, 10, 20, init_rrefs=False)}
                dcp.load(into, storage_reader=StorageReader(store))
                b = _gathered(into["sharded_tensor"])
                assert rank != 0 or torch.equal(a, b), (s0, s1)
        saved = {"sharded_tensor": sharded_tensor.rand(chunk(0, [0, 1]), 10, 20)}
        into = {"sharded_tensor": sharded_tensor.zeros(chunk(1, [0, 1]), 10, 20)}
        roundtrip(saved, into)  # test_load_rowwise_to_colwise
        a, b = _gathered(saved["sharded_tensor"]), _gathered(into["sharded_tensor"])
        assert rank != 0 or torch.equal(a, b)
        into = {"bytes0": [2], "bytes1": "other"}
        roundtrip({"bytes0": [1], "bytes1": "string"}, into)  # test_save_load_bytes
        assert into == {"bytes0": [1], "bytes1": "string"}
        n = 32  # test_switch_between_sharded_tensor_to_tensor
        specs = [chunk(0, [0, 1]), chunk(0, [0, 1, 1, 0]),
                 enum(([0], [8], 1), ([8], [n - 8], 0)), enum(([0], [10], 0), ([10], [n - 10], 1))]
        for save_spec in specs:
            saved = {"sharded": sharded_tensor.rand(save_spec, n), "replicated": torch.rand(n)}
            dist.broadcast(saved["replicated"], src=0)
            dcp.save(saved, storage_writer=StorageWriter(store))
            a = _gathered(saved["sharded"])
            for load_spec in specs:  # "Freaky Friday the tensors"
                into = {"sharded": torch.zeros(n), "replicated": sharded_tensor.zeros(load_spec, n)}
                dcp.load(into, storage_reader=StorageReader(store))
                b = _gathered(into["replicated"])
                assert rank != 0 or (torch.equal(a, into["sharded"])
                                     and torch.equal(saved["replicated"], b))


def test_sharded_tensor_save_load_and_reshard(tmp_path):
    """The ShardedTensor cases of upstream ``test_file_system_checkpoint_cpu.py`` on 2 ranks."""
    check_ranks(run_ranks(_sharded_tensor_cases, 2, tmp_path / "ranks", str(tmp_path / "s")))


def _dtensor_cases(rank: int, world: int, url: str) -> None:
    """test_dtensor_resharding.py: ``test_1d_to_1d_reshard_placement_change``,
    ``test_2d_to_2d_reshard_placement_change``, ``test_1d_to_2d_reshard_mesh_change``,
    ``test_2d_to_1d_reshard_mesh_change`` (upstream needs 2 GPUs; here gloo on CPU)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, zeros

    one_d = [[Shard(0)], [Replicate()]]
    two_d = [[Replicate(), Replicate()], [Replicate(), Shard(0)], [Shard(0), Replicate()],
             [Shard(0), Shard(0)]]
    full = torch.arange(16, dtype=torch.float).view(4, 4)
    mesh_1d = init_device_mesh("cpu", (world,))
    mesh_2d = init_device_mesh("cpu", (2, world // 2))
    with ckptstore.open(url) as store:
        def check(mesh, saved: list, loads: list) -> None:
            dt = distribute_tensor(full, mesh[0], placements=saved)
            dcp.save({"dtensor": dt}, storage_writer=StorageWriter(store))
            for m, placements in loads:
                into = {"dtensor": zeros([4, 4], device_mesh=m, placements=placements)}
                dcp.load(into, storage_reader=StorageReader(store))
                assert torch.equal(into["dtensor"].full_tensor(), full), (saved, placements)

        for a in one_d:  # one save each, loaded by 1d -> 1d and 1d -> 2d
            check((mesh_1d,), a, [(mesh_1d, b) for b in one_d if b != a]
                  + [(mesh_2d, b) for b in two_d])
        for a in two_d:  # 2d -> 2d and 2d -> 1d
            check((mesh_2d,), a, [(mesh_2d, b) for b in two_d if b != a]
                  + [(mesh_1d, b) for b in one_d])
        # e2e/test_e2e_save_and_load.py ``test_e2e`` with ``async_op=True``: async_save on every
        # rank, the state changed while it persists, then a resharded load
        dt = distribute_tensor(full.clone(), mesh_1d, placements=[Shard(0)])
        fut = dcp.async_save({"dtensor": dt}, storage_writer=StorageWriter(store))
        dt.to_local().add_(100)  # training goes on: the save holds its staged copy
        fut.result()
        into = {"dtensor": zeros([4, 4], device_mesh=mesh_2d, placements=[Shard(0), Shard(0)])}
        dcp.load(into, storage_reader=StorageReader(store))
        assert torch.equal(into["dtensor"].full_tensor(), full)


def test_dtensor_resharding(tmp_path):
    """The DTensor placement and mesh changes of upstream ``test_dtensor_resharding.py`` on 4
    ranks (2-D meshes of 2 x 2), and a collective ``async_save``."""
    check_ranks(run_ranks(_dtensor_cases, 4, tmp_path / "ranks", str(tmp_path / "s")))
