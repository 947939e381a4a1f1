"""Resuming exactly: a data order that continues mid-epoch, and the random number generators.

Both are objects with ``state_dict()`` / ``load_state_dict()``, so they go into a commit like a
model does (their state is plain values and small tensors)::

    sampler = ResumableSampler(len(dataset), seed=0)
    loader = ResumableLoader(DataLoader(dataset, batch_size=64, sampler=sampler, num_workers=4))
    state = {"model": model, "optim": opt, "data": loader, "rng": RNGState()}
    store.checkout("main", into=state)      # after a failure: the epoch continues where it stopped
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import Sampler

__all__ = ["RNGState", "ResumableLoader", "ResumableSampler"]


class ResumableSampler(Sampler[int]):
    """A per-epoch permutation of ``range(n)`` fixed by ``(seed, epoch)``, resumable mid-epoch.

    ``position`` counts the indices handed out in the current epoch. With a DataLoader whose
    workers prefetch, the sampler runs ahead of training: wrap the loader in
    :class:`ResumableLoader`, which counts what the training loop actually received.
    """

    def __init__(self, n: int, seed: int = 0, shuffle: bool = True):
        if n < 0:
            raise ValueError("n must be >= 0")
        self.n, self.seed, self.shuffle = int(n), int(seed), bool(shuffle)
        self.epoch = 0
        self.position = 0

    def order(self, epoch: int) -> torch.Tensor:
        """The index order of ``epoch``."""
        if not self.shuffle:
            return torch.arange(self.n)
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        return torch.randperm(self.n, generator=g)

    def __iter__(self) -> Iterator[int]:
        epoch, start = self.epoch, self.position
        order = self.order(epoch).tolist()
        for i in range(start, self.n):
            self.position = i + 1
            yield order[i]
        self.epoch, self.position = epoch + 1, 0

    def __len__(self) -> int:
        return self.n

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.seed, "n": self.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("n", self.n) != self.n:
            raise ValueError(f"sampler state is for {state['n']} samples, this one has {self.n}")
        self.epoch, self.position = int(state["epoch"]), int(state["position"])
        self.seed = int(state.get("seed", self.seed))


class ResumableLoader:
    """Wraps a DataLoader over a :class:`ResumableSampler`; its state counts the samples the
    training loop received (not what workers prefetched)."""

    def __init__(self, loader: torch.utils.data.DataLoader):
        sampler = loader.sampler if isinstance(loader.sampler, ResumableSampler) else getattr(
            loader.batch_sampler, "sampler", None)
        if not isinstance(sampler, ResumableSampler) or loader.batch_size is None:
            raise TypeError("ResumableLoader needs DataLoader(..., batch_size=B, "
                            "sampler=ResumableSampler(...))")
        self.loader, self.sampler = loader, sampler
        self.epoch, self.position = sampler.epoch, sampler.position

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> Iterator[Any]:
        self.sampler.epoch, self.sampler.position = self.epoch, self.position
        bs, n = self.loader.batch_size, self.sampler.n
        for batch in self.loader:
            self.position = min(self.position + bs, n)
            yield batch
        self.epoch, self.position = self.epoch + 1, 0

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "seed": self.sampler.seed,
                "n": self.sampler.n}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)
        self.epoch, self.position = self.sampler.epoch, self.sampler.position


class RNGState:
    """The global generators of torch (CPU and every CUDA device), numpy and Python's random."""

    def state_dict(self) -> dict[str, Any]:
        state: dict[str, Any] = {"torch": torch.get_rng_state(),
                                 "numpy": np.random.get_state(), "python": random.getstate()}
        if torch.cuda.is_available():
            state["cuda"] = torch.cuda.get_rng_state_all()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        torch.set_rng_state(state["torch"])
        np.random.set_state(state["numpy"])
        random.setstate(state["python"])
        if "cuda" in state and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(state["cuda"])
