"""Dangling commits: newer than a branch tip, continuing it, and named by no ref (git fsck's).

A branch's tip is its newest ref file. If that file is lost (deleted by hand or by a faulty
sync), or a commit stops between writing its manifest and moving the branch, the branch silently
points at the commit before: nothing fails, yet the newest state is out of every ref's reach, and
gc would delete it once it is older than the grace period. :func:`find_dangling` finds such
lines of commits, so that :func:`ckptstore.maintenance.verify.verify` reports them and gc keeps them.

A line is *explained*, not dangling, when one of the branch's older ref files still names it (a
``reset_branch`` back on purpose: its move is in the branch's ref history). Once the branch goes
on from its tip (a new commit, a reset elsewhere), the line no longer continues the tip and is an
ordinary unreferenced commit again: gc removes it after its grace period.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import CkptStoreError
from ..history.repository import Repository

__all__ = ["Dangling", "find_dangling"]


@dataclass(frozen=True)
class Dangling:
    """A line of commits past the tip of ``branch`` that no ref names."""

    branch: str
    tip: str  # the branch tip the line continues
    line: tuple[str, ...]  # the dangling commits, newest first: line[0] is the newest

    def problem(self) -> str:
        """One line for verify's report, saying what to do."""
        head, more = self.line[0], len(self.line)
        count = f" ({more} commits)" if more > 1 else ""
        return (f"commit {head} continues branch {self.branch!r} past its tip {self.tip[:12]}"
                f"{count} but no ref names it: the branch's newest ref file was lost, or a commit "
                "stopped before moving it. Restore it with "
                f"store.reset_branch({self.branch!r}, {head!r}); or, if the branch is where it "
                "should be, commit on it again (gc then removes the line after its grace period)")


def _parents(repo: Repository, commits: list[str]) -> dict[str, str | None]:
    """Parent of each commit whose manifest reads (a damaged one is verify's other business)."""
    out: dict[str, str | None] = {}
    for c in commits:
        try:
            out[c] = repo.summary(c).parent
        except CkptStoreError:
            continue
    return out


def _line_ends(parents: dict[str, str | None]) -> dict[str, str | None]:
    """For each commit of ``parents``: the first ancestor outside ``parents`` its first-parent
    line reaches (None for a root, or for a line that loops back on itself)."""
    end: dict[str, str | None] = {}
    for start in parents:
        path, c = [], start
        seen: set[str] = set()
        while c in parents and c not in end and c not in seen:
            seen.add(c)
            path.append(c)
            c = parents[c]
        found = end.get(c) if c in end else (None if c in seen else c)
        for p in path:
            end[p] = found
    return end


def find_dangling(repo: Repository, reachable: set[str] | None = None) -> list[Dangling]:
    """Every dangling line of the store (see the module docstring), newest commit first.

    ``reachable``: the commits branches and tags reach, when the caller has them already.
    """
    tips = {tip: name for name, tip in repo.refs.branches().items()}
    if reachable is None:
        reachable = set(repo.reachable())
    parents = _parents(repo, [c for c in repo.commit_ids() if c not in reachable])
    ends = _line_ends(parents)
    past_tip = {c: ends[c] for c in parents if ends[c] in tips}
    if not past_tip:
        return []
    explained: set[str] = set()
    for branch in {tips[t] for t in past_tip.values()}:
        for named in repo.refs.history(branch):
            c: str | None = named
            while c in past_tip and c not in explained:  # the move and the line below it
                explained.add(c)
                c = parents[c]
    lost = {c: t for c, t in past_tip.items() if c not in explained}
    below = {parents[c] for c in lost}
    out = []
    for head in sorted(c for c in lost if c not in below):
        line, c = [], head
        while c in lost and c not in line:
            line.append(c)
            c = parents[c]
        out.append(Dangling(tips[lost[head]], lost[head], tuple(line)))
    return out
