"""A ref file damaged into another well-formed commit id (found by the mutation campaign): the
history is not shown as empty, every read of the branch fails with a clear error, and
``reset_branch`` repairs it."""

from __future__ import annotations

import pytest
import torch

import ckptstore


def test_a_tip_naming_a_missing_commit_is_an_error_not_an_empty_history(tmp_path):
    store = ckptstore.open(tmp_path / "s")
    first = store.commit({"w": torch.ones(3)}).id
    second = store.commit({"w": torch.zeros(3)}).id
    key = tmp_path / "s" / "refs" / "heads" / "main" / "000000000001"
    damaged = ("0" if second[6] != "0" else "1").join((second[:6], second[7:]))
    key.write_text(damaged + "\n")
    with pytest.raises(ckptstore.RefNotFound, match="ref file is damaged"):
        store.log()
    with pytest.raises(ckptstore.RefNotFound):
        store.checkout("main")
    store.reset_branch("main", second)
    assert [c.id for c in store.log()] == [second, first]
    store.close()
