"""Retention of a tiered store, tier by tier: what each tier's rules and gc may never delete.

- **Local tier** (``local_keep=``, ``store.gc(tier="local")``): never a commit not uploaded yet,
  nor what it reads -- its only copy is there, and an upload copies a base (or the manifest of
  a commit whose data it shares) the remote lacks from there.
- **Remote** (``keep=``, ``store.gc(tier="remote")``): never what a commit not uploaded yet
  reads (chain bases, the data folders its entries point into, those of a partial upload), nor
  what a local branch tip reads (the next commit builds on its tip or on what the tip reads,
  even while its record is not queued yet). Remote collection runs between two uploads, never
  during one: the upload thread applies the rule after each upload lands, and ``store.gc``
  holds the uploader's lock (:attr:`~ckptstore.tiers.uploader.Uploader.busy`), so an upload
  never copies a commit whose base is being deleted, and never takes a base it checked as
  present for granted while gc removes it.

Tags are kept on both tiers by the rules (and by gc unless ``keep_tags=False``); unreferenced
data younger than gc's grace period (a remote reader's or another writer's) is left alone as on
any store.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from ..errors import RefNotFound
from ..history.repository import Repository
from ..policy.retention import Candidate, Retention

__all__ = ["Protect", "reads"]


class Protect(Retention):
    """``rule`` plus the ``protected`` commits of each line (their bases follow, as for any
    kept commit)."""

    def __init__(self, rule: Retention, protected: set[str]):
        self.rule, self.protected = rule, protected

    def select(self, line: Sequence[Candidate]) -> set[str]:
        return self.rule.select(line) | {c.id for c in line if c.id in self.protected}


def reads(view: Repository, commits: Iterable[str]) -> set[str]:
    """``commits`` and, transitively, every commit they read: chain bases (their manifests)
    and the commits whose data folders their entries point into. ``view`` reads each manifest
    where it is (a tiered store's: the local tier first, then the remote)."""
    out: set[str] = set()
    walked: set[str] = set()
    stack = list(commits)
    while stack:
        commit = stack.pop()
        if commit in walked:
            continue
        walked.add(commit)
        try:
            s = view.summary(commit)  # no manifest decoded again (history/summary.py)
        except RefNotFound:  # a rank's part whose manifest is on neither tier yet
            out.add(commit)
            continue
        out |= {commit} | s.data_commits  # data folders only: no manifest needed there
        stack.extend(s.base_commits - walked)  # chain bases: their manifests, transitively
    return out
