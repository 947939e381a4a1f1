"""The tier-kills and tier-rank-kills campaigns of benchmarks/reliability.py (issue 29), short
runs: a child committing to a tiered store (local tier + moto S3), or one of 2 gloo ranks
committing sharded states to theirs, SIGKILLed at one point of each kind, then fresh processes
resume the journals and push; nothing that returned is lost, the remote never shows a commit
whose data is not all there."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), os.pardir, os.pardir, "benchmarks"))

import hostile_tier_kills  # noqa: E402


@pytest.mark.s3
@pytest.mark.slow  # 8 kills, two Python processes importing torch each: 1-3 min
def test_a_kill_of_each_kind_loses_nothing():
    kinds = hostile_tier_kills.KINDS
    result = hostile_tier_kills.campaign(len(kinds), seed=5, kinds=kinds)
    assert result["failures"] == []
    assert result["tried"] == len(kinds)
    assert result["kills"] >= len(kinds) - 2  # a kill point past the child's work: it finished
    assert (result["lost"], result["remote_missing_data"], result["raw"], result["hangs"]) == (
        0, 0, 0, 0)


@pytest.mark.s3
def test_a_kill_after_the_remote_ref_loses_nothing():
    """The quick case in the default run (two child processes, ~15 s): killed after the remote
    ref moved, before the journal record went; the next open uploads it again (a no-op) and
    drops the record."""
    result = hostile_tier_kills.campaign(1, seed=7, kinds=("after-ref",))
    assert result["failures"] == [] and result["kills"] == 1
    assert (result["lost"], result["remote_missing_data"]) == (0, 0)


@pytest.mark.s3
def test_a_kill_while_the_persist_process_persists_loses_nothing():
    """Killed right after a commit_async returned, its persist in flight in the store's persist
    process: that process finishes the commit on the local tier, the next open uploads it."""
    result = hostile_tier_kills.campaign(2, seed=11, kinds=("process",))
    assert result["failures"] == [] and result["kills"] == 2
    assert (result["lost"], result["remote_missing_data"], result["raw"], result["hangs"]) == (
        0, 0, 0, 0)


@pytest.mark.s3
@pytest.mark.slow  # 9 kills, each 2 gloo ranks then 2 resuming processes: 2-4 min
def test_a_rank_killed_at_each_kind_of_point_loses_nothing():
    """The tier-rank-kills campaign, short: one of 2 gloo ranks committing sharded states to
    tiered stores SIGKILLed at one point of each kind, both journals resumed."""
    import hostile_tier_rank_kills

    kinds = hostile_tier_rank_kills.KINDS
    result = hostile_tier_rank_kills.campaign(len(kinds), seed=3, kinds=kinds)
    assert result["failures"] == []
    assert result["tried"] == len(kinds)
    assert (result["lost"], result["remote_missing_data"], result["raw"], result["hangs"]) == (
        0, 0, 0, 0)
