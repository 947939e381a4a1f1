"""The one commit pipeline: prepare -> capture -> write -> publish.

Every commit runs these steps, in this order, through one :class:`Pipeline` (the store's
:class:`~ckptstore.commit.committer.Committer` is one)::

    1. prepare  names checked, tags free, tip + parent read,    -> CommitJob   (:meth:`prepare`)
                flatten, plan (the policy and the chain memory
                decide), gradient averages captured
    2. capture  placement chosen, snapshot into staging        -> Snapshot    (:meth:`capture`)
                -- commit_async returns here; training may modify the state --
    3. write    settle, shrink, score (each a new Snapshot),   -> Written     (:meth:`write`)
                persist
    4. publish  manifest, then ref, then chain memory updated,  -> Manifest    (:mod:`.publish`)
                then tags, then retention

A sharded commit is a FORK of that one transaction (Icechunk's ``Session.fork()``): each rank
runs steps 1-3 over its own tensors (:meth:`fork`: array names of its own, policies seeing a
block's path as its tensor's) and remembers its chains right after its write, since only the
coordinator knows when the ref moves; the coordinator's assembly of the parts and step 4 are
the MERGE (:func:`ckptstore.dcp.shards.merge`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import Executor
from dataclasses import dataclass

from ..chains.memory import ChainMemory
from .dedup import Dedup
from ..format.layout import PACKED_ARRAY, check_ref_name
from ..history.manifest import Manifest
from .pending import Progress
from .placement import place
from .plan import CommitPlan, EncodingOptions, plan_commit
from ..policy import Policy
from ..policy.retention import Retention
from ..policy.shrink import Shrink
from .publish import Target, check_tags_free, tag_names
from ..history.refs import Tip
from ..history.repository import Repository
from .sensitivity import Block, Gradients, capture_gradients, score_snapshot
from .shrinking import shrink_snapshot
from .snapshot import Snapshot, snapshot
from .staging import StagingPool
from ..state.tree import Leaf, Tree, check_text, flatten
from ..tracking.rows import RowTracker
from .persist import Persisted, persist

__all__ = ["CommitJob", "Metadata", "Pipeline", "Written", "plain_metadata"]

Metadata = dict[str, object]  # plain values only: None, bool, int, float, str
_PLAIN = (type(None), bool, int, float, str)


@dataclass(frozen=True, eq=False)
class CommitJob:
    """What step 1 decided: a planned commit (or a rank's fork of one) before its snapshot."""

    branch: str
    tags: tuple[str, ...]
    message: str
    metadata: Metadata
    tree: Tree
    plan: CommitPlan
    tip: Tip | None
    parent: Manifest | None
    tracker: RowTracker | None
    shrink: Shrink | None = None
    gradients: Gradients | None = None  # Policy(sensitivity=...): gradient averages by item
    # a rank's fork: its rank, packed array, policy's name of a block, paths it deduplicates
    rank: int | None = None
    packed_name: str = PACKED_ARRAY
    policy_path: Callable[[str], str] | None = None
    dedup_paths: frozenset[str] | None = None

    @property
    def fork(self) -> bool:
        """True for a rank's part of a sharded commit (it publishes nothing itself)."""
        return self.rank is not None

    @property
    def target(self) -> Target:
        return Target(self.branch, self.tip, self.tags)


@dataclass(frozen=True, eq=False)
class Written:
    """What step 3 wrote: commit ``commit_id``'s arrays of ``job``, ``done`` per item."""

    commit_id: str
    job: CommitJob
    snap: Snapshot
    done: Persisted


class Pipeline:
    """The steps of a commit over the store's chain memory and staging buffers."""

    retention: Retention | None = None  # open(keep=...): applied by publish once a commit landed

    def __init__(self, repo: Repository, options: EncodingOptions,
                 staging_budget: int | None = None):
        self.repo = repo
        self.options = options
        self.chains = ChainMemory()
        self.staging = StagingPool(staging_budget)
        # encoded chunks in memory at once: enough to keep the workers busy, at most ~64 MiB
        self.max_inflight = max(2, min(2 * repo.io_workers, (64 << 20) // options.chunk_bytes))

    def resolve_bits(self, policy: Policy) -> Policy:
        """The policy with a restore-driven bit width fixed from the store's restore records."""
        if policy.bitwidth is None:
            return policy
        return policy.with_bits(policy.bitwidth.bits(self.repo.restore_count()))

    # -- 1. prepare ------------------------------------------------------------------------
    def prepare(self, state: object, message: str, branch: str, tags: str | Sequence[str],
                metadata: Metadata | None, policy: Policy,
                tracker: RowTracker | None) -> CommitJob:
        """Check names (tags free), flatten, read tip and parent, plan.

        A policy with a restore-driven bit width is resolved here, after the wait for the
        previous commit (it lists the store's restore records: part of the stall)."""
        policy = self.resolve_bits(policy)
        tags, metadata = self.check_names(state, message, branch, tags, metadata)
        tree, leaves = flatten(state)
        tip = self.repo.refs.tip(branch)
        parent = self.repo.manifest(tip[1]) if tip else None
        plan, gradients = self._plan(leaves, policy, branch, parent, tracker)
        return CommitJob(branch, tags, message, metadata, tree, plan, tip, parent, tracker,
                         policy.shrink, gradients)

    def check_names(self, state: object, message: str, branch: str,
                    tags: str | Sequence[str], metadata: Metadata | None
                    ) -> tuple[tuple[str, ...], Metadata]:
        """A commit's names checked before anything is copied (the branch, tags free, the
        message): its tags and its plain metadata (``step``/``epoch`` of a dict state added)."""
        check_ref_name(branch, "branch")
        tags = tag_names(tags)
        check_tags_free(self.repo, tags)
        check_text(message, "message")
        return tags, plain_metadata(metadata, state)

    def fork(self, rank: int, leaves: list[Leaf], policy: Policy, branch: str,
             parent_id: str | None, tracker: RowTracker | None, array_prefix: str,
             packed_name: str, block_of: Callable[[str], Block]) -> CommitJob:
        """Step 1 of rank ``rank``'s part of a sharded commit on ``parent_id``: its ``leaves``
        (paths ``<fqn>@<offsets>`` for blocks, ``block_of`` giving ``(fqn, offsets, global
        shape)``) planned into arrays named ``<array_prefix><name>`` and ``packed_name``.

        The parent's manifest (every rank's entries: megabytes at a thousand ranks) is read only
        when the policy builds chains or the store deduplicates."""
        policy = self.resolve_bits(policy)
        wants_chains = policy.incremental != "off" or policy.delta or policy.shrink is not None
        parent = (self.repo.manifest(parent_id)
                  if parent_id and (wants_chains or self.options.dedup) else None)
        paths = {leaf.path for leaf in leaves}

        def policy_path(path: str) -> str:  # a block's path, <fqn>@<offsets>, is <fqn> to policies
            return block_of(path)[0] if path in paths else path

        plan, gradients = self._plan(leaves, policy, branch, parent, tracker, policy_path,
                                     array_prefix, block_of)
        return CommitJob(branch, (), "", {}, {}, plan, None, parent, tracker, policy.shrink,
                         gradients, rank, packed_name, policy_path, frozenset(paths))

    def _plan(self, leaves: list[Leaf], policy: Policy, branch: str, parent: Manifest | None,
              tracker: RowTracker | None, policy_path: Callable[[str], str] | None = None,
              array_prefix: str = "", block_of: Callable[[str], Block] | None = None
              ) -> tuple[CommitPlan, Gradients | None]:
        """The plan (the policy and the chain memory decide) and the gradient averages."""
        decide = self.chains.decider(policy, branch, parent, tracker, policy_path=policy_path)
        plan = plan_commit(leaves, self.options, decide, array_prefix=array_prefix)
        gradients = (capture_gradients(plan, policy.sensitivity, block_of)
                     if policy.sensitivity is not None else None)
        return plan, gradients

    # -- 2. capture ------------------------------------------------------------------------
    def capture(self, job: CommitJob, pool: StagingPool | None = None) -> Snapshot:
        """Snapshot the planned tensors (into ``pool``'s buffers: training may go on); the
        tracker's rows are in the plan, so it starts over (kept as unsaved until the ref
        moves)."""
        # a rank's fork, Shrink and sensitivity rework the values on the host
        host_values = job.fork or job.shrink is not None or job.gradients is not None
        placements = place(job.plan, self.options.device_encode, pooled=pool is not None,
                           host_values=host_values, dedup=self.options.dedup)
        snap = snapshot(job.plan, placements, pool)
        if job.tracker is not None:
            job.tracker.clear()
        return snap

    # -- 3. write --------------------------------------------------------------------------
    def write(self, job: CommitJob, snap: Snapshot, commit_id: str,
              executor: Executor | None = None, progress: Progress | None = None) -> Written:
        """Settle, shrink, score and persist into ``data/<commit_id>/``; ``executor``: the I/O
        pool (default: the store's). A fork remembers its chains at once: a reference names
        this commit, so if it never becomes the tip the next commit finds no matching base and
        writes a full one; a whole commit remembers them once its ref moved
        (:meth:`remember`, publish's ``landed``)."""
        snap = snap.settle(self.staging)  # device-staged, not quantized there: to the host
        if job.shrink is not None:  # a rank shrinks its blocks (its own Fisher threshold)
            snap, _ = shrink_snapshot(job.plan, snap, job.shrink, policy_path=job.policy_path)
        if job.gradients is not None and job.gradients.averages:
            snap = score_snapshot(snap, job.gradients)
        dedup = Dedup.against(job.parent, job.dedup_paths) if self.options.dedup else None
        done = persist(self.repo.storage, commit_id, job.plan, snap,
                       executor or self.repo.executor, self.max_inflight,
                       self.options.chunk_bytes, progress, packed_name=job.packed_name,
                       dedup=dedup)
        written = Written(commit_id, job, snap, done)
        if job.fork:
            self.remember(written)
        return written

    def remember(self, written: Written) -> None:
        """Update the chain memory with what ``written`` stored (the next commit's bases)."""
        job, items, results = written.job, written.snap.items, written.done.results
        self.chains.commit_done(job.branch, written.commit_id, job.plan, written.snap.arrays,
                                {i: r.codes for i, r in results.items()}, job.tracker,
                                {i: r.rebuilt for i, r in results.items()},
                                {i: c.next_reference for i, c in items.items()
                                 if c.next_reference is not None},
                                {i for i, c in items.items() if c.rows is not None})


def plain_metadata(metadata: Metadata | None, state: object) -> Metadata:
    """A commit's metadata: plain values under str keys, with ``step``/``epoch`` of a dict
    ``state`` added unless given; raises ``TypeError`` for anything else."""
    out = dict(metadata or {})
    if isinstance(state, dict):
        for key in ("step", "epoch"):
            if key in state and key not in out and isinstance(state[key], (int, float)):
                out[key] = state[key]
    for k, v in out.items():
        if not isinstance(k, str) or not isinstance(v, _PLAIN):
            raise TypeError(f"metadata[{k!r}] must be a str key with a plain value "
                            "(None, bool, int, float, str)")
        check_text(k, "metadata")
        check_text(v, f"metadata[{k!r}]")
    return out
