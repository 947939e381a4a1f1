"""Partial recovery of failed embedding shards (CPR, Maeng et al., MLSys 2021, section 4).

When one of ``N_emb`` embedding shards fails, partial recovery reloads only that shard from the
last checkpoint while the others keep their state; the updates the failed shard received since
the checkpoint are lost, not recomputed. CPR measures the loss as the *portion of lost samples*:

    PLS_i = PLS_{i-1} + (samples since the last save) / (total samples * N_emb)    per failed shard

so a target PLS gives the checkpoint interval ``T_save = 2 * PLS * N_emb * T_fail`` (the
expected PLS is ``0.5 * T_save / (T_fail * N_emb)`` per failure). Partial recovery is chosen
only where CPR's overhead model says it pays:

    full:     O_save * T / T_save_full + (O_load + O_lost + O_res) * T / T_fail
    partial:  O_save * T / T_save      + (O_load + O_res) * T / T_fail

with full recovery at its own optimum ``T_save_full = sqrt(2 * O_save * T_fail)`` and
``O_lost = T_save_full / 2`` (the expected recomputation after a failure). Restoring one shard
is ``store.checkout(ref, into=state)`` on the restarted rank alone (:mod:`ckptstore.dcp`), or
``Store.checkout(ref, paths=[...])`` of its tensors.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .frequency import cpr_interval

__all__ = ["LostSamples", "RecoveryCosts", "RecoveryPlan", "plan_recovery", "pls_interval"]


def pls_interval(target_pls: float, n_emb: int, mtbf_seconds: float) -> float:
    """CPR's checkpoint interval for a target PLS: ``2 * PLS * N_emb * T_fail`` seconds.

    >>> pls_interval(0.1, 8, 3600.0)
    5760.0
    """
    if not 0 < target_pls <= 1 or n_emb < 1 or mtbf_seconds <= 0:
        raise ValueError("pls_interval needs 0 < target_pls <= 1, n_emb >= 1, mtbf > 0")
    return 2.0 * target_pls * n_emb * mtbf_seconds


@dataclass(frozen=True)
class RecoveryCosts:
    """Seconds one checkpoint save (``save``), load (``load``) and a restart (``reschedule``)
    cost training; ``lost`` overrides the recomputation after a full recovery (default: half of
    full recovery's interval)."""

    save: float
    load: float
    reschedule: float = 0.0
    lost: float | None = None


@dataclass(frozen=True)
class RecoveryPlan:
    """What :func:`plan_recovery` chose, with the overheads it compared (fractions of the
    training time)."""

    mode: str                 # "partial" or "full"
    interval: float           # seconds between checkpoints for that mode
    full_overhead: float
    partial_overhead: float
    full_interval: float
    partial_interval: float


def plan_recovery(costs: RecoveryCosts, mtbf_seconds: float, n_emb: int, target_pls: float,
                  min_gain: float = 0.0) -> RecoveryPlan:
    """CPR's choice between full and partial recovery (Figure 5): partial only when its overhead
    is lower by more than ``min_gain`` (a fraction of the training time)."""
    t_full = cpr_interval(costs.save, mtbf_seconds)
    t_part = pls_interval(target_pls, n_emb, mtbf_seconds)
    lost = costs.lost if costs.lost is not None else t_full / 2.0
    full = costs.save / t_full + (costs.load + lost + costs.reschedule) / mtbf_seconds
    partial = costs.save / t_part + (costs.load + costs.reschedule) / mtbf_seconds
    mode = "partial" if partial + min_gain < full else "full"
    return RecoveryPlan(mode, t_part if mode == "partial" else t_full, full, partial, t_full,
                        t_part)


@dataclass
class LostSamples:
    """The PLS of a run (CPR equation 3): call :meth:`saved` after each checkpoint and
    :meth:`failed` when shards fail and are partially recovered."""

    total_samples: int
    n_emb: int
    pls: float = 0.0
    last_save: int = 0
    failures: list[tuple[int, int]] = field(default_factory=list)  # (sample, shards)

    def saved(self, samples_seen: int) -> None:
        self.last_save = samples_seen

    def failed(self, samples_seen: int, shards: int = 1) -> float:
        """Account for ``shards`` shards losing their updates since the last save; returns the
        new PLS."""
        lost = max(samples_seen - self.last_save, 0)
        self.pls += shards * lost / (self.total_samples * self.n_emb)
        self.failures.append((samples_seen, shards))
        return self.pls
