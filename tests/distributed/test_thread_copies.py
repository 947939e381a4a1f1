"""A thread's staging copy of a collective ``commit_async`` (``ckptstore.dcp.collective._copies``):
the values of the call, independent of the tensors after it, in as few bytes as the tensors
read -- one copy a storage (tied weights from ``state_dict()``), expanded tensors kept
expanded, views of a large storage copied alone."""

from __future__ import annotations

import torch

from ckptstore.dcp.collective import _copies, _copyable


def _storage_bytes(tensors: list[torch.Tensor]) -> int:
    seen = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}
    return sum(seen.values())


def test_copies_hold_the_values_and_read_no_more_than_the_tensors_do():
    big, small = torch.randn(1000, 1000), torch.randn(50, 50)
    weight = torch.nn.Linear(64, 64).weight
    tied = torch.nn.ModuleDict({"a": torch.nn.Linear(64, 64), "b": torch.nn.Linear(64, 64)})
    tied.b.weight = tied.a.weight
    sd = tied.state_dict()  # two tensor objects over one storage
    raw = torch.arange(10, dtype=torch.float32)
    cplx = torch.randn(8, dtype=torch.complex64)
    tensors = [big[10:12],                       # a view of a large storage: its rows alone
               small.t()[3:5],                   # a transposed view
               torch.ones(1).expand(1 << 20),    # expanded: stays 4 bytes
               sd["a.weight"], sd["b.weight"],   # tied
               weight,                           # a Parameter
               raw[1:5].view(torch.int32),       # another dtype over part of a storage
               raw[3:7],                         # the same storage again
               cplx.conj(),                      # a conjugate view: resolved
               torch.empty(0, 3)]                # empty
    want = [t.clone() for t in tensors]
    got = _copies(tensors)
    with torch.no_grad():
        for t in (big, small, weight, raw, cplx):
            t.add_(1)  # training goes on: the copies keep the call's values
    assert all(torch.equal(g, w) and g.shape == w.shape for g, w in zip(got, want))
    assert got[3].untyped_storage().data_ptr() == got[4].untyped_storage().data_ptr()
    assert got[6].untyped_storage().data_ptr() == got[7].untyped_storage().data_ptr()
    assert got[2].stride() == (0,) and got[2].untyped_storage().nbytes() == 4
    assert got[0].untyped_storage().nbytes() == 2 * 1000 * 4
    assert not got[8].is_conj()
    assert _storage_bytes(got) < 1_000_000  # not the large storage, nor the expanded tensor
    assert _copyable({"a": big, "b": weight}) and not _copyable({"a": big.to_sparse()})
