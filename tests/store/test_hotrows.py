"""Row access statistics: CPR-MFU counters, CPR-SSU sampled rows, the hot-row prediction of
touched rows and the rebase predictor built on it."""

from __future__ import annotations

import pytest
import torch

from ckptstore.tracking.hotrows import AccessCounts, HotRowRebase, SampledRows
from ckptstore.policy import Intermittent


def test_counts_most_used_and_clear():
    c = AccessCounts({"t": 10})
    c.record("t", torch.tensor([1, 1, 1, 4, 4, 7]))
    assert c.counts["t"].tolist() == [0, 3, 0, 0, 2, 0, 0, 1, 0, 0]
    assert c.most_used("t", 2).tolist() == [1, 4]
    assert c.most_used("t", 5).tolist() == [1, 4, 7]  # never more than the rows seen
    c.clear("t", torch.tensor([1]))
    assert c.most_used("t", 1).tolist() == [4]
    assert c.nbytes == 80  # 8 bytes a row


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


def _zipf_stream(rows: int, n: int, seed: int) -> torch.Tensor:
    p = 1.0 / torch.arange(1, rows + 1).double() ** 1.1
    return torch.multinomial(p / p.sum(), n, replacement=True,
                             generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("ahead", [1, 3])  # t <= 1 (Good-Toulmin) and t > 1 (smoothed)
def test_expected_new_predicts_the_rows_more_lookups_add(ahead):
    rows, per = 50_000, 20_000
    seen_so_far = _zipf_stream(rows, 2 * per, 0)
    c = AccessCounts({"t": rows})
    c.record("t", seen_so_far)
    future = _zipf_stream(rows, ahead * per, 1)
    actual = int((~torch.isin(future.unique(), seen_so_far.unique())).sum())
    assert c.expected_new("t", ahead * per) == pytest.approx(actual, rel=0.1)
    assert c.expected_new("t", 0) == 0 and c.seen("t") == seen_so_far.unique().numel()


def test_hot_row_rebase_predicts_one_shot_sizes_and_applies_checknrun_rule():
    rows, per = 20_000, 5_000
    c = AccessCounts({"t": rows})
    hist = [_zipf_stream(rows, per, s) for s in range(3)]
    for h in hist:
        c.record("t", h)
    pred = HotRowRebase(c)
    seen = torch.cat(hist).unique()
    nxt = _zipf_stream(rows, per, 9)
    actual = torch.cat([seen, nxt]).unique().numel() / rows
    assert pred.predicted(1, 3) == pytest.approx(actual, rel=0.02)
    assert pred.predicted(2, 3) > pred.predicted(1, 3) > seen.numel() / rows
    assert not pred.should_rebase([])
    sizes = [0.5, 0.6, 0.7]  # big increments: Fc = 2.8, far below 4 predicted ones of ~0.3+
    assert pred.should_rebase(sizes) == (2.8 <= sum(pred.predicted(j, 3) for j in range(1, 5)))
    assert Intermittent().should_rebase(sizes)
    c.clear("t")
    assert c.lookups["t"] == 0 and c.seen("t") == 0


def test_expected_new_is_bounded_monotone_and_cheap_with_hot_rows():
    c = AccessCounts({"t": 1000})
    c.record("t", torch.arange(1000))  # every row seen once: nothing new can come
    assert c.expected_new("t", 5000) == 0
    c = AccessCounts({"t": 1000})
    c.record("t", torch.arange(940))
    c.counts["t"][0] = 3 * 10**8  # a very hot row: no array as long as its count is built
    c.lookups["t"] += 3 * 10**8
    got = [c.expected_new("t", n) for n in (10**6, 10**8, 10**9, 10**12)]
    assert all(0 <= g <= 60 for g in got) and got == sorted(got)
