"""``paths=`` with exclusions (``"!optim"``), and patterns that select nothing or are not
understood refused with a word (issue 26, item 16)."""

from __future__ import annotations

import pytest
import torch

import ckptstore
from ckptstore import StateMismatchError
from ckptstore.state.leaves import matches


@pytest.fixture
def store(tmp_path):
    s = ckptstore.open(str(tmp_path / "s"))
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    s.commit({"model": model, "optim": opt, "step": 9})
    return s


@pytest.mark.parametrize("pattern", ["!optim.*", "!optim", "!opt*"])
def test_exclusion_loads_everything_but_the_optimizer(store, pattern):
    got = store.checkout("main", paths=[pattern])
    assert set(got) == {"model", "step"} and set(got["model"]) == {"weight", "bias"}
    assert got["step"] == 9


def test_exclusion_with_selection_and_into(store):
    got = store.checkout("main", paths=["model", "optim", "!optim.state", "!model.bias"])
    assert set(got["model"]) == {"weight"} and set(got["optim"]) == {"param_groups"}
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters(), lr=0.5)
    store.checkout("main", into={"model": model, "optim": opt}, paths=["!optim"])
    assert opt.param_groups[0]["lr"] == 0.5 and not opt.state  # left alone
    assert torch.equal(model.weight, store.checkout("main")["model"]["weight"])


def test_iter_tensors_and_matches_honour_exclusion(store):
    assert [p for p, _ in store.iter_tensors("main", paths=["!optim"])] == \
        ["model.weight", "model.bias"]
    assert matches("model.weight", ["!optim"]) and not matches("optim.state.0", ["!optim"])
    assert not matches("model.weight", ["model", "!model.weight"])


@pytest.mark.parametrize("paths", [["optimizer.*"], ["!*"], ["model.nothing"]])
def test_a_selection_of_nothing_is_refused(store, paths):
    with pytest.raises(StateMismatchError, match="select nothing"):
        store.checkout("main", paths=paths)


@pytest.mark.parametrize("paths", [[""], ["!"], ["!!model"], [3]])
def test_patterns_not_understood_are_refused(store, paths):
    with pytest.raises(StateMismatchError, match="pattern"):
        store.checkout("main", paths=paths)


def test_a_bare_string_is_one_pattern(store):
    assert set(store.checkout("main", paths="model")) == {"model"}


def test_iter_tensors_of_nothing_is_refused(store):
    with pytest.raises(StateMismatchError, match="select nothing"):
        list(store.iter_tensors("main", paths=["optimizer"]))
    assert list(store.iter_tensors("main", paths=["step"])) == []  # a value: selected
