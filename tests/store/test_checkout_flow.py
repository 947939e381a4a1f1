"""``checkout.flow.checkout`` takes the Repository and what the store gives it (issue 27 item 3):
``settle`` runs before a load in place only, ``load_shards`` is called for DTensors only."""

from __future__ import annotations

import torch

import ckptstore
from ckptstore.checkout.flow import checkout


def test_flow_runs_on_a_repository_and_settles_only_before_a_load_in_place(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    info = store.commit({"w": torch.arange(6.0), "step": 3})
    calls: list[str] = []

    def settle() -> None:
        calls.append("settle")

    def load_shards(m, shards) -> None:  # no DTensor in this state: never called
        calls.append("shards")

    got = checkout(store.repo, info.id, settle=settle, load_shards=load_shards)
    assert calls == [] and torch.equal(got["w"], torch.arange(6.0)) and got["step"] == 3
    live = {"w": torch.zeros(6), "step": 0}
    checkout(store.repo, "main", into=live, settle=settle, load_shards=load_shards)
    assert calls == ["settle"]
    assert torch.equal(live["w"], torch.arange(6.0)) and live["step"] == 3
    store.close()
