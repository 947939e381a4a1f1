"""``store.checkout(ref, into=sd)`` under a process group with ``sd`` a plain nested dict of
DTensors, tensors and values -- how ``dcp.load(state_dict)`` is called (issue 26, item 11):
each rank's shards filled in place, plain values replaced in the dict, no collective."""

from __future__ import annotations

import pytest
import torch

from dist_ranks import assert_full, check_ranks, run_ranks, sharded_state, tables, \
    zero_state

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")


def plain_dict_of_dtensors(rank: int, world: int, url: str) -> None:
    import torch.distributed as dist

    import ckptstore
    from ckptstore import StateMismatchError
    with ckptstore.open(url) as store:
        info = store.commit(sharded_state(world))  # collective
        sd = zero_state(world)
        sd["step"], sd["param_groups"] = 0, None
        ptrs = {k: v.to_local().data_ptr() for k, v in sd["emb"].items()}
        bias = sd["mlp"]["bias"]
        state = store.checkout(info.id, into=sd)  # no collective: each rank its own chunks
        assert_full(sd)
        assert {k: v.to_local().data_ptr() for k, v in sd["emb"].items()} == ptrs
        assert sd["mlp"]["bias"] is bias and state["emb"]["user"] is sd["emb"]["user"]
        part = zero_state(world)
        store.checkout(info.id, into={"emb": part["emb"]}, paths=["emb"])
        assert torch.equal(part["emb"]["user"].full_tensor(), sd["emb"]["user"].full_tensor())
        wrong = zero_state(world)
        wrong["emb"]["extra"] = torch.zeros(2)
        try:
            store.checkout(info.id, into=wrong)
        except StateMismatchError as e:
            assert "extra" in str(e)
        else:
            raise AssertionError("a live entry the commit lacks was not reported")
        dist.barrier()


def test_plain_dict_of_dtensors_is_filled_in_place(tmp_path):
    import ckptstore
    check_ranks(run_ranks(plain_dict_of_dtensors, 2, tmp_path / "ranks", str(tmp_path / "s")))
    with ckptstore.open(str(tmp_path / "s"), create=False) as store:  # one process: the pieces
        full = tables()  # of row- and column-sharded tables decoded into plain tensors
        sd = {"emb": {"user": torch.zeros(1030, 16), "item": torch.zeros(64, 24)},
              "mlp": {"weight": torch.zeros(16, 8)}}
        store.checkout("main", into=sd)
        assert torch.equal(sd["emb"]["user"], full["emb.user"])
        assert torch.equal(sd["emb"]["item"], full["emb.item"])
        assert torch.equal(sd["mlp"]["weight"], full["mlp.weight"])
