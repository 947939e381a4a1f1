"""Retention policies: which commits a store keeps, given once and applied after each commit.

``ckptstore.open(url, keep=LatestN(3) | BestN(2, "loss") | EveryN(1000, key="step"))`` keeps, on
every branch, the union of what each rule selects along the branch's first-parent line (as
torchtitan's ``keep_latest_k``, Orbax's ``max_to_keep`` / ``EveryNSteps`` / ``BestN`` and
Lightning's ``save_top_k``); branch tips and tagged commits are always kept, and so is every commit
a kept one builds on (chain bases, dedup'd data), as :func:`ckptstore.maintenance.gc.collect` marks them.

The store applies the policy right after each commit's ref moved (for ``commit_async``, on the
persist thread once that commit landed: it never lags behind). It removes only commits a branch
reaches that fall out of the policy; a writer in another process builds on a branch tip, and
everything a tip reads is kept. Commits no ref reaches (one in flight elsewhere, a crashed one)
are left to ``Store.gc`` and its grace period.
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from ..errors import CkptStoreError
from ..format.layout import data_dir, manifest_key

if TYPE_CHECKING:
    from ..history.repository import Repository

__all__ = ["AnyOf", "BestN", "Candidate", "EveryN", "LatestN", "Retention", "RetentionWarning",
           "apply_retention", "check_retention", "retain_after_commit"]


@dataclass(frozen=True)
class Candidate:
    """One commit of a branch's first-parent line, as a rule sees it."""

    id: str
    generation: int
    metadata: Mapping[str, object]


class Retention:
    """A rule: :meth:`select` returns the ids it keeps of a line (newest first). Rules compose
    with ``|`` (keep what any of them keeps)."""

    def select(self, line: Sequence[Candidate]) -> set[str]:
        raise NotImplementedError

    def __or__(self, other: Retention) -> AnyOf:
        if not isinstance(other, Retention):
            return NotImplemented
        left = self.rules if isinstance(self, AnyOf) else (self,)
        right = other.rules if isinstance(other, AnyOf) else (other,)
        return AnyOf((*left, *right))


def _positive(name: str, n: int) -> None:
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"{name}(n) needs a whole number of commits >= 1, not {n!r}")


@dataclass(frozen=True)
class LatestN(Retention):
    """The newest ``n`` commits of each branch (Orbax ``max_to_keep``, torchtitan
    ``keep_latest_k``).

    >>> LatestN(2).select([Candidate("c", 3, {}), Candidate("b", 2, {}), Candidate("a", 1, {})])
    {'b', 'c'}
    """

    n: int

    def __post_init__(self) -> None:
        _positive("LatestN", self.n)

    def select(self, line: Sequence[Candidate]) -> set[str]:
        return {c.id for c in line[: self.n]}


@dataclass(frozen=True)
class EveryN(Retention):
    """Every commit whose ``metadata[key]`` (``key=None``: its generation, the number of commits
    before it along the branch, 0 for the first) is a multiple of ``n`` (Orbax
    ``EveryNSteps``); commits without a whole number there are not kept by this rule."""

    n: int
    key: str | None = None

    def __post_init__(self) -> None:
        _positive("EveryN", self.n)

    def select(self, line: Sequence[Candidate]) -> set[str]:
        out = set()
        for c in line:
            v = c.generation if self.key is None else c.metadata.get(self.key)
            if isinstance(v, int) and not isinstance(v, bool) and v % self.n == 0:
                out.add(c.id)
        return out


@dataclass(frozen=True)
class BestN(Retention):
    """The ``n`` commits with the best finite number ``metadata[metric]`` (``mode="min"``: the
    smallest; ties go to the newer), as Orbax ``BestN`` / Lightning ``save_top_k``. Commits
    without the metric are not kept by this rule: give the metric with each commit
    (``store.commit(state, metadata={"loss": 0.3})``)."""

    n: int
    metric: str
    mode: Literal["min", "max"] = "min"

    def __post_init__(self) -> None:
        _positive("BestN", self.n)
        if self.mode not in ("min", "max"):
            raise ValueError(f"BestN mode must be 'min' or 'max', not {self.mode!r}")

    def select(self, line: Sequence[Candidate]) -> set[str]:
        scored = []
        for age, c in enumerate(line):
            v = c.metadata.get(self.metric)
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v):
                scored.append((v if self.mode == "min" else -v, age, c.id))
        return {cid for _, _, cid in sorted(scored)[: self.n]}


@dataclass(frozen=True)
class AnyOf(Retention):
    """What any of ``rules`` keeps (``LatestN(3) | BestN(1, "loss")``)."""

    rules: tuple[Retention, ...]

    def __post_init__(self) -> None:
        if not self.rules or not all(isinstance(r, Retention) for r in self.rules):
            raise ValueError("AnyOf needs retention rules (LatestN, EveryN, BestN)")

    def select(self, line: Sequence[Candidate]) -> set[str]:
        return set().union(*(r.select(line) for r in self.rules))


def apply_retention(repo: Repository, rule: Retention) -> list[str]:
    """Remove the commits branches reach that ``rule`` does not keep; return their ids.

    Kept: what the rule selects on each branch's first-parent line, every branch tip and tagged
    commit, and (transitively) every commit a kept one reads; data folders any remaining
    manifest reads stay. Manifests go first, then data, so an interruption leaves only more
    leftovers (``Store.gc`` removes them). Old ref files of each branch are pruned as gc prunes
    them (the newest 8 stay), so a store that relies on retention alone does not pile them up.
    """
    keep: set[str] = set()
    reachable: set[str] = set()
    for tip in repo.refs.branches().values():
        line = repo.reachable([tip])  # newest first along first parents
        reachable.update(line)
        keep.add(tip)
        keep |= rule.select([_candidate(repo, c) for c in line])
    keep.update(repo.refs.tags().values())
    stack = list(keep)
    while stack:  # the chains' bases, transitively (from summaries: no manifest decoded twice)
        for base in repo.summary(stack.pop()).base_commits - keep:
            keep.add(base)
            stack.append(base)
    drop = sorted(reachable - keep)
    for branch in repo.refs.branches():
        repo.refs.prune_moves(branch)
    if not drop:
        return []
    dropped = set(drop)
    live = _data_read(repo, (c for c in repo.commit_ids() if c not in dropped))
    for c in drop:
        repo.storage.delete(manifest_key(c))
        repo.forget(c)
    for c in drop:
        if c not in live:
            repo.storage.delete_tree(data_dir(c))
    return drop


def _candidate(repo: Repository, commit_id: str) -> Candidate:
    s = repo.summary(commit_id)
    return Candidate(commit_id, s.generation, dict(s.metadata))


def _data_read(repo: Repository, commits: Iterable[str]) -> set[str]:
    """The data folders the manifests of ``commits`` read (a manifest that vanished meanwhile,
    removed by another process's gc, reads nothing)."""
    out: set[str] = set()
    for c in commits:
        try:
            out |= repo.summary(c).data_commits
        except (FileNotFoundError, KeyError):
            continue
    return out


def check_retention(keep: object) -> None:
    """Refuse what is not a retention rule (``keep=3`` is refused: write ``keep=LatestN(3)``)."""
    if keep is not None and not isinstance(keep, Retention):
        raise TypeError(f"keep= takes a retention rule such as LatestN(3), EveryN(10) or "
                        f"BestN(2, 'loss') (combined with |), not {type(keep).__name__}")


class RetentionWarning(UserWarning):
    """The retention policy could not be applied after a commit (the commit itself landed)."""


def retain_after_commit(repo: Repository, rule: Retention, commit_id: str) -> list[str]:
    """:func:`apply_retention` after ``commit_id`` landed: a failure (a back-end fault, a commit
    another process removed meanwhile) is a :class:`RetentionWarning`, never the commit's error;
    the next commit applies the policy again."""
    try:
        return apply_retention(repo, rule)
    except (OSError, CkptStoreError, KeyError, ValueError) as e:
        warnings.warn(f"commit {commit_id[:12]} landed, but its retention policy could not be "
                      f"applied ({e}); the next commit tries again, or run store.gc()",
                      RetentionWarning, stacklevel=2)
        return []
