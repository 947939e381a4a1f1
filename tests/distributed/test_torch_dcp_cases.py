"""torch's own DCP test cases (pytorch ``test/distributed/checkpoint/``) that apply to a storage
layer, run against ``ckptstore.dcp``: each test names the upstream test it mirrors. Cases that
are single-process upstream run single-process here; the multi-rank ones use our gloo harness
(``tests/dist_ranks.py``)."""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict_loader import _load_state_dict_from_keys

import ckptstore
from ckptstore.dcp import StorageReader, StorageWriter

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
    come back as lists."""
    store.commit({"layers": [torch.ones(2), torch.zeros(3)], "cfg": {"depth": 2}})
    got = _load_state_dict_from_keys(storage_reader=StorageReader(store))
    assert isinstance(got["layers"], list) and torch.equal(got["layers"][1], torch.zeros(3))
    assert got["cfg"] == {"depth": 2}
