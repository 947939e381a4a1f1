"""What every fault test asserts afterwards: only complete commits visible, each bit-exact,
``verify`` clean, and gc leaving nothing a commit does not need."""

from __future__ import annotations

from helpers import assert_bit_exact
from workers import build_state

import ckptstore


def commit_seed(store: ckptstore.Store, seed: int, profile: str = "crash", **kwargs: object
                ) -> ckptstore.CommitInfo:
    """Commit ``build_state(seed, profile)`` (tests/workers.py) with its seed and profile."""
    return store.commit(build_state(seed, profile), message=f"seed {seed}",
                        metadata={"seed": seed, "profile": profile}, **kwargs)


def check_store(store: ckptstore.Store, expected: list[str], branch: str = "main") -> None:
    """The branch is exactly ``expected`` (oldest first), each commit bit-exact; verify is clean;
    gc(grace_period=0) removes every leftover of failed commits and nothing else."""
    ids = [c.id for c in store.log(branch)] if expected else []
    assert ids == list(reversed(expected)), (ids, expected)
    for c in store.log(branch) if expected else []:
        assert_bit_exact(build_state(c.metadata["seed"], c.metadata["profile"]),
                         store.checkout(c.id))
    report = store.verify()
    assert report.ok, report.problems
    store.gc(grace_period=0)
    assert sorted(store.commit_ids()) == sorted(expected)
    needed = set().union(set(), *(store.manifest(c).data_commits() for c in expected))
    assert set(store.storage.listdir("data")) == needed
    assert store.verify().ok
