"""The row tracker never misses a touched row, and its rows cover every row training changes."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

from ckptstore.errors import CkptStoreError
from ckptstore.tracking.rows import NotTrackedError, RowTracker, TrackerWarning, track


def _rows(t: torch.Tensor) -> list[int]:
    assert t.dtype == torch.int64 and t.device.type == "cpu"
    return t.tolist()


def _changed_rows(now: torch.Tensor, before: torch.Tensor) -> set[int]:
    diff = (now.detach() != before).reshape(now.shape[0], -1).any(1)
    return set(diff.nonzero().squeeze(1).tolist())


# -- property: exactly the union of looked-up indices since the last consume ----------------------

_batch = st.integers(0, 12).flatmap(lambda n: st.lists(st.integers(0, 10**6), min_size=n,
                                                       max_size=n))
_op = st.one_of(st.tuples(st.just("emb"), _batch), st.tuples(st.just("bag"), _batch),
                st.tuples(st.just("consume"), st.none()))


@settings(max_examples=60, deadline=None)
@given(emb_rows=st.integers(1, 70), bag_rows=st.integers(1, 70), ops=st.lists(_op, max_size=12),
       two_d=st.booleans())
def test_touched_rows_is_the_union_of_lookups_since_consume(emb_rows, bag_rows, ops, two_d):
    model = nn.ModuleDict({"emb": nn.Embedding(emb_rows, 2), "bag": nn.EmbeddingBag(bag_rows, 2)})
    tracker = track(model)
    expect: dict[str, set[int]] = {"emb": set(), "bag": set()}
    for kind, raw in ops:
        if kind == "consume":
            for name in ("emb", "bag"):
                weight = model[name].weight
                assert _rows(tracker.consume(weight)) == sorted(expect[name])
                assert _rows(tracker.touched_rows(weight)) == []
                expect[name] = set()
            continue
        rows = emb_rows if kind == "emb" else bag_rows
        idx = torch.tensor([v % rows for v in raw], dtype=torch.long)
        if kind == "emb":
            model["emb"](idx.view(1, -1) if two_d else idx)
        elif two_d and len(idx) % 2 == 0:  # 2-D bags of two
            model["bag"](idx.view(-1, 2))
        else:  # 1-D input with offsets, bags of up to three indices
            model["bag"](idx, torch.arange(0, len(idx), 3, dtype=torch.long))
        expect[kind] |= set(idx.tolist())
        for name in ("emb", "bag"):
            state = model.state_dict()[f"{name}.weight"]
            assert _rows(tracker.touched_rows(state)) == sorted(expect[name])
    tracker.close()


def test_marks_int32_indices_kwargs_and_under_no_grad():
    model = nn.ModuleDict({"emb": nn.Embedding(9, 2), "bag": nn.EmbeddingBag(9, 2, mode="sum")})
    with track(model) as tracker:
        with torch.no_grad():
            model["emb"](torch.tensor([8, 8], dtype=torch.int32))
        with torch.inference_mode():
            model["bag"](input=torch.tensor([[2, 3]]), per_sample_weights=torch.ones(1, 2))
        assert _rows(tracker.touched_rows("emb.weight")) == [8]
        assert _rows(tracker.touched_rows("bag.weight")) == [2, 3]


def test_max_norm_renormalisation_under_no_grad_is_covered():
    torch.manual_seed(0)
    emb = nn.Embedding(40, 4, max_norm=0.5)
    with track(emb) as tracker:
        before = emb.weight.detach().clone()
        with torch.no_grad():
            emb(torch.tensor([3, 17, 17, 39]))
        changed = _changed_rows(emb.weight, before)
        assert changed and changed <= set(_rows(tracker.touched_rows(emb.weight)))


# -- training: every changed row (weight and optimizer state) is among the touched rows ----------

class _Recsys(nn.Module):
    def __init__(self, sparse: bool) -> None:
        super().__init__()
        self.emb = nn.Embedding(101, 8, sparse=sparse)
        self.bag = nn.EmbeddingBag(57, 8, mode="mean", sparse=sparse)
        self.head = nn.Linear(16, 1)

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.head(torch.cat([self.emb(a).mean(1), self.bag(b)], 1)).squeeze(1)


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.1),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1),
], ids=["sgd", "adagrad"])
@pytest.mark.parametrize("sparse", [True, False], ids=["sparse", "dense"])
@pytest.mark.filterwarnings("ignore:Sparse invariant checks:UserWarning")
def test_training_never_changes_an_unmarked_row(make_opt, sparse):
    torch.manual_seed(1)
    model = _Recsys(sparse)
    opt = make_opt(model.parameters())
    tables = [model.emb.weight, model.bag.weight]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrackerWarning)
        tracker = track(model, opt)
    g = torch.Generator().manual_seed(2)

    def snapshot():
        snap = [t.detach().clone() for t in tables]
        for t in tables:
            snap += [v.clone() for v in opt.state[t].values() if v.dim() > 0]
        return snap

    def state_tensors():
        out = list(tables)
        for t in tables:
            out += [v for v in opt.state[t].values() if v.dim() > 0]
        return out

    tracker.clear()
    before = snapshot()
    for interval in range(3):
        for _ in range(4):
            a = torch.randint(0, 101, (6, 3), generator=g) ** 2 % 101  # skewed, duplicates
            b = torch.randint(0, 57, (6, 2), generator=g)
            loss = F.mse_loss(model(a, b), torch.randn(6, generator=g))
            opt.zero_grad()
            loss.backward()
            opt.step()
        now = state_tensors()
        assert len(now) == len(before) > len(tables) or isinstance(opt, torch.optim.SGD)
        for tensor, old in zip(now, before):
            touched = set(_rows(tracker.touched_rows(tensor)))
            changed = _changed_rows(tensor, old)
            assert changed, "the test must change some rows"
            assert changed <= touched, f"interval {interval}: missed rows {changed - touched}"
        touched_weight = set(_rows(tracker.touched_rows(model.emb.weight)))
        assert len(touched_weight) < 101, "a subset of the table is touched"
        tracker.clear()
        before = snapshot()
    tracker.close()


def test_dense_adam_changes_rows_the_tracker_did_not_see():
    """Why check_optimizer warns: Adam's moments move rows that were not looked up."""
    torch.manual_seed(3)
    emb = nn.Embedding(30, 4)
    opt = torch.optim.Adam(emb.parameters(), lr=0.1)
    with pytest.warns(TrackerWarning, match="Adam"):
        tracker = track(emb, opt)
    for idx in ([0, 1, 2], [3, 4]):
        opt.zero_grad()
        emb(torch.tensor(idx)).sum().backward()
        opt.step()
    tracker.clear()
    before = emb.weight.detach().clone()
    opt.zero_grad()
    emb(torch.tensor([5])).sum().backward()
    opt.step()
    assert _changed_rows(emb.weight, before) - set(_rows(tracker.touched_rows(emb.weight)))


def test_pending_gradient_stays_marked_across_a_clear():
    emb = nn.Embedding(20, 3, sparse=True)
    opt = torch.optim.SGD(emb.parameters(), lr=0.5)
    tracker = track(emb, opt)
    emb(torch.tensor([4, 11])).sum().backward()
    assert _rows(tracker.consume(emb.weight)) == [4, 11]
    before = emb.weight.detach().clone()
    opt.step()  # applies the gradient computed before the commit
    assert _changed_rows(emb.weight, before) == {4, 11}
    assert _rows(tracker.touched_rows(emb.weight)) == [4, 11]
    opt.zero_grad()
    tracker.clear()
    assert _rows(tracker.touched_rows(emb.weight)) == []


def test_tied_weights_dense_gradient_marks_its_nonzero_rows():
    torch.manual_seed(4)
    emb = nn.Embedding(25, 6)
    out = nn.Linear(6, 25, bias=False)
    out.weight = emb.weight
    model = nn.ModuleDict({"emb": emb, "out": out})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    tracker = track(model, opt)
    assert list(tracker.tracked()) == ["emb.weight"]
    before = emb.weight.detach().clone()
    logits = out(emb(torch.tensor([2, 5])))
    F.cross_entropy(logits, torch.tensor([1, 7])).backward()
    opt.step()
    changed = _changed_rows(emb.weight, before)
    assert len(changed) > 2 and changed <= set(_rows(tracker.touched_rows(emb.weight)))


# -- sparse gradients of custom modules -----------------------------------------------------------

class _CustomTable(nn.Module):
    def __init__(self, rows: int) -> None:
        super().__init__()
        self.table = nn.Parameter(torch.randn(rows, 3))
        self.dense = False

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        if self.dense:
            return self.table[idx]
        return F.embedding(idx, self.table, sparse=True)


def test_custom_module_with_sparse_gradient_is_tracked_from_its_first_gradient():
    model = nn.Sequential(_CustomTable(23), nn.Linear(3, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    tracker = track(model, opt)
    assert tracker.tracked() == {}
    assert tracker.lookup(model[0].table) is None
    before = model[0].table.detach().clone()
    model(torch.tensor([[1, 22], [9, 1]])).sum().backward()
    opt.step()
    assert list(tracker.tracked()) == ["0.table"]
    assert _rows(tracker.touched_rows(model.state_dict()["0.table"])) == [1, 9, 22]
    assert _changed_rows(model[0].table, before) == {1, 9, 22}
    assert tracker.lookup(model[1].weight) is None  # dense layers stay untracked


def test_custom_parameter_with_dense_then_sparse_gradients_marks_every_row_once():
    model = _CustomTable(19)
    opt = torch.optim.SGD(model.parameters(), lr=0.3)
    tracker = track(model, opt)
    model.dense = True
    model(torch.tensor([0, 3])).sum().backward()
    opt.step()
    opt.zero_grad()
    model.dense = False
    model(torch.tensor([5])).sum().backward()  # its first sparse gradient: tracked from now
    assert _rows(tracker.consume("table")) == list(range(19))
    assert _rows(tracker.touched_rows("table")) == [5]  # its gradient is pending
    opt.step()
    opt.zero_grad()
    tracker.clear()
    model(torch.tensor([6])).sum().backward()
    assert _rows(tracker.touched_rows("table")) == [6]


# -- lookup ---------------------------------------------------------------------------------------

def test_lookup_matches_parameter_state_dict_and_optimizer_state_only():
    model = nn.ModuleDict({"emb": nn.Embedding(12, 4, sparse=True),
                           "bag": nn.EmbeddingBag(12, 4, sparse=True),
                           "lin": nn.Linear(4, 12)})
    sparse = torch.optim.SparseAdam([model["emb"].weight], lr=0.01)
    adagrad = torch.optim.Adagrad([model["bag"].weight], lr=0.01)
    tracker = track(model, [sparse, adagrad])
    emb, bag = model["emb"].weight, model["bag"].weight
    assert tracker.lookup(emb).parameter is emb
    assert tracker.lookup(emb.data).name == "emb.weight"
    assert tracker.lookup(model.state_dict()["bag.weight"]).parameter is bag
    assert tracker.lookup(adagrad.state[bag]["sum"]).parameter is bag
    assert tracker.lookup(emb.detach().clone()) is None  # same shape, other storage
    assert tracker.lookup(emb[1:]) is None
    assert tracker.lookup(model["lin"].weight) is None
    assert tracker.lookup(torch.zeros(12, 4)) is None
    assert tracker.lookup(adagrad.state[bag]["step"]) is None

    assert not sparse.state  # SparseAdam creates its state at the first step
    (model["emb"](torch.tensor([3, 7])).sum() + model["bag"](torch.tensor([[1]])).sum()).backward()
    sparse.step()
    adagrad.step()
    for key in ("exp_avg", "exp_avg_sq"):
        assert tracker.lookup(sparse.state_dict()["state"][0][key]).parameter is emb
        assert _rows(tracker.touched_rows(sparse.state[emb][key])) == [3, 7]
    assert tracker.lookup(sparse.state[emb]["step"]) is None
    with pytest.raises(NotTrackedError, match="not a tracked embedding table") as err:
        tracker.touched_rows(model["lin"].weight)
    assert isinstance(err.value, CkptStoreError) and isinstance(err.value, LookupError)


def test_lookup_ignores_a_square_preconditioner_of_the_same_rows():
    emb = nn.Embedding(6, 2)
    opt = torch.optim.SGD(emb.parameters(), lr=0.1)
    tracker = RowTracker(emb, opt)
    opt.state[emb.weight]["precond"] = torch.eye(6)
    opt.state[emb.weight]["rowwise"] = torch.zeros(6)
    assert tracker.lookup(opt.state[emb.weight]["precond"]) is None
    assert tracker.lookup(opt.state[emb.weight]["rowwise"]).parameter is emb.weight


# -- optimizer checks -----------------------------------------------------------------------------

@pytest.mark.parametrize("make_opt,match", [
    (lambda ps: torch.optim.Adam(ps, lr=0.1), "Adam"),
    (lambda ps: torch.optim.AdamW(ps, lr=0.1), "weight_decay"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, weight_decay=1e-4), "weight_decay=0.0001"),
    (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9), "momentum=0.9"),
    (lambda ps: torch.optim.Adagrad(ps, lr=0.1, weight_decay=0.1), "weight_decay"),
    (lambda ps: torch.optim.RMSprop(ps, lr=0.1), "does not know whether RMSprop"),
])
def test_check_optimizer_warns_for_updates_of_rows_without_gradient(make_opt, match):
    model = nn.Sequential(nn.Embedding(10, 2), nn.Linear(2, 1))
    opt = make_opt(model.parameters())
    with pytest.warns(TrackerWarning, match=match):
        tracker = track(model, opt)
    problems = tracker.check_optimizer()
    assert any(match in p for p in problems) and "0.weight" in problems[0]
    assert not any("1.weight" in p for p in problems)  # dense layers are not tracked


@pytest.mark.parametrize("make_opt", [
    lambda ps: torch.optim.SGD(ps, lr=0.1),
    lambda ps: torch.optim.Adagrad(ps, lr=0.1),
    lambda ps: torch.optim.SparseAdam(ps, lr=0.1),
])
def test_check_optimizer_accepts_row_sparse_optimizers(make_opt):
    emb = nn.Embedding(10, 2, sparse=True)
    dense = nn.Linear(2, 1)
    opts = [make_opt(emb.parameters()), torch.optim.AdamW(dense.parameters())]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrackerWarning)
        tracker = track(nn.ModuleList([emb, dense]), opts)
    assert tracker.check_optimizer() == []


# -- lifetime -------------------------------------------------------------------------------------

def test_close_removes_every_hook():
    model = nn.Sequential(nn.Embedding(16, 2, sparse=True), _CustomTable(5))
    tracker = track(model)
    model[0](torch.tensor([1]))
    table = tracker.lookup(model[0].weight)
    tracker.close()
    assert tracker.closed and tracker.tracked() == {} and tracker.lookup(model[0].weight) is None
    model[0](torch.tensor([2, 3])).sum().backward()
    model[1](torch.tensor([4])).sum().backward()
    assert _rows(table.touched_rows()) == [1]
    with pytest.raises(NotTrackedError, match="closed"):
        tracker.touched_rows(model[0].weight)


def test_context_manager_and_deep_copies_do_not_mark_the_original():
    model = nn.Sequential(nn.Embedding(16, 2))
    with track(model) as tracker:
        ema = copy.deepcopy(model)
        ema(torch.tensor([9]))
        assert _rows(tracker.touched_rows(model[0].weight)) == []
        model(torch.tensor([0, 15]))
        assert _rows(tracker.touched_rows(model[0].weight)) == [0, 15]
        tracker.mark(model[0].weight, torch.tensor([7]))  # e.g. the rows of a failed commit
        assert _rows(tracker.consume("0.weight")) == [0, 7, 15]
    assert tracker.closed


def test_bitmap_is_rows_over_eight_bytes_on_the_parameter_device():
    model = nn.ModuleList([nn.Embedding(n, 1) for n in (1, 8, 9, 1000)])
    tracker = track(model)
    sizes = [tracker.lookup(m.weight).bitmap.numel() for m in model]
    assert sizes == [1, 1, 2, 125]
    assert all(tracker.lookup(m.weight).bitmap.dtype == torch.uint8 for m in model)
    model[3](torch.tensor([999, 0, 8]))
    bitmap = tracker.lookup(model[3].weight).bitmap
    assert bitmap[0].item() == 1 and bitmap[1].item() == 1 and bitmap[124].item() == 0x80
