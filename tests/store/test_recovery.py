"""CPR's partial-recovery model: PLS accounting, the PLS interval, full vs partial choice."""

from __future__ import annotations

import math

import pytest

from ckptstore.policy import LostSamples, RecoveryCosts, cpr_interval, plan_recovery, pls_interval


def test_pls_grows_by_lost_samples_over_total_times_shards():
    pls = LostSamples(total_samples=1000, n_emb=4)
    pls.saved(100)
    assert pls.failed(300) == pytest.approx(200 / 4000)
    assert pls.failed(300, shards=2) == pytest.approx(200 / 4000 * 3)
    pls.saved(400)
    assert pls.failed(450) == pytest.approx(200 / 4000 * 3 + 50 / 4000)
    assert pls.failures == [(300, 1), (300, 2), (450, 1)]


def test_interval_for_target_pls_meets_the_expected_pls():
    t = pls_interval(0.1, n_emb=8, mtbf_seconds=3600)
    # E[PLS] = 0.5 * T_save / (T_fail * N_emb)
    assert 0.5 * t / (3600 * 8) == pytest.approx(0.1)
    with pytest.raises(ValueError):
        pls_interval(0.0, 8, 3600)


def test_partial_recovery_chosen_only_when_it_pays():
    costs = RecoveryCosts(save=60, load=60, reschedule=300)
    plan = plan_recovery(costs, mtbf_seconds=20 * 3600, n_emb=18, target_pls=0.1)
    t_full = cpr_interval(60, 20 * 3600)
    assert plan.full_interval == pytest.approx(t_full)
    assert plan.full_overhead == pytest.approx(60 / t_full + (60 + t_full / 2 + 300) / 72000)
    assert plan.partial_overhead == pytest.approx(60 / plan.partial_interval + 360 / 72000)
    assert plan.mode == "partial" and plan.interval == plan.partial_interval
    # one shard, tiny target PLS: saving that often costs more than it saves
    tight = plan_recovery(RecoveryCosts(save=600, load=1), mtbf_seconds=7200, n_emb=1,
                          target_pls=0.001)
    assert tight.mode == "full" and tight.interval == tight.full_interval
    assert math.isfinite(tight.partial_overhead)
