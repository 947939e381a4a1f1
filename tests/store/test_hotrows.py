"""Row access statistics: CPR-MFU counters, CPR-SSU sampled rows, the hot-row prediction of
touched rows and the rebase predictor built on it."""

from __future__ import annotations

import pytest
import torch

from ckptstore.hotrows import AccessCounts, HotRowRebase, SampledRows
from ckptstore.policy import Intermittent


def test_counts_most_used_and_clear():
    c = AccessCounts({"t": 10})
    c.record("t", torch.tensor([1, 1, 1, 4, 4, 7]))
    assert c.counts["t"].tolist() == [0, 3, 0, 0, 2, 0, 0, 1, 0, 0]
    assert c.most_used("t", 2).tolist() == [1, 4]
    assert c.most_used("t", 5).tolist() == [1, 4, 7]  # never more than the rows seen
    c.clear("t", torch.tensor([1]))
    assert c.most_used("t", 1).tolist() == [4]
    assert c.nbytes == 80


def test_expected_touched_matches_a_monte_carlo_estimate():
    g = torch.Generator().manual_seed(0)
    rows = 5000
    p = 1.0 / torch.arange(1, rows + 1).double() ** 1.1
    p /= p.sum()
    c = AccessCounts({"t": rows})
    c.record("t", torch.multinomial(p, 2_000_000, replacement=True, generator=g))
    n = 3000
    expected = c.expected_touched("t", n)
    seen = [torch.multinomial(p, n, replacement=True, generator=g).unique().numel()
            for _ in range(20)]
    assert expected == pytest.approx(sum(seen) / len(seen), rel=0.03)
    assert c.expected_touched("t", 0) == 0
    assert AccessCounts({"t": 3}).expected_touched("t", 10) == 0  # nothing recorded yet


def test_sampled_rows_bounded_with_random_eviction():
    s = SampledRows(["t"], capacity=50, rate=0.5, seed=1)
    for _ in range(20):
        s.record("t", torch.randint(0, 10_000, (1000,)))
        assert s.rows["t"].numel() <= 50 and s.rows["t"].unique().numel() == s.rows["t"].numel()
    got = s.take("t")
    assert got.numel() == 50 and torch.equal(got, got.sort().values)
    assert s.rows["t"].numel() == 0 and s.nbytes == 400
    with pytest.raises(ValueError):
        SampledRows(["t"], capacity=0)


def test_sampled_rows_keep_what_fits():
    s = SampledRows(["t"], capacity=100, rate=1.0)
    s.record("t", torch.tensor([3, 3, 5]))
    s.record("t", torch.tensor([5, 9]))
    assert s.take("t").tolist() == [3, 5, 9]


def test_hot_row_rebase_follows_checknrun_rule_on_predicted_sizes():
    rows = 1000
    c = AccessCounts({"t": rows})
    c.record("t", torch.arange(rows))  # uniform access
    pred = HotRowRebase(c, {"t": 200})
    s1 = pred.predicted(1)
    assert s1 == pytest.approx(1 - (1 - 1 / rows) ** 200, rel=1e-9)
    assert pred.predicted(2) > s1  # one-shot increments grow
    assert not pred.should_rebase([])
    # with fast growth the predictor rebases when Check-N-Run's rule would on the same sizes
    fast = HotRowRebase(c, {"t": 2000})
    sizes = [fast.predicted(j) for j in (1, 2, 3)]
    assert fast.should_rebase(sizes[:2]) == (1 + sum(sizes[:2]) <= sum(
        fast.predicted(j) for j in (3, 4, 5)))
    assert isinstance(Intermittent().should_rebase(sizes), bool)
