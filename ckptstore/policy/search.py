"""Quality-guided choice of the quantization (DynaQuant section 5).

The user scores a state (e.g. the loss on one held-out batch; lower is better). Given candidate
encodings ordered from most to least compressive, :class:`QualitySearch` returns the most
compressive one whose dequantized state scores within ``max_degradation`` (relative) of the
exact state. Between commits the weights move little, so the search starts at the last choice and
walks to its neighbours: usually one or two scorings per commit instead of one per candidate.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from .encoding import QuantSpec

__all__ = ["QualitySearch", "simulate"]

_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)


def simulate(state: Mapping[str, Any], spec: QuantSpec, min_bytes: int = 64 * 1024,
             chunk_bytes: int | None = None) -> dict[str, Any]:
    """The state as a checkout would return it after committing with ``spec``: every float
    tensor of at least ``min_bytes`` quantized and dequantized chunk by chunk, like the store."""
    from ..format.arrays import CHUNK_BYTES, ChunkGrid, dtype_name, host_to_tensor, tensor_to_host
    from ..chunkcodec import QuantizedLossy

    out: dict[str, Any] = {}
    for name, t in state.items():
        if not (isinstance(t, torch.Tensor) and t.dtype in _FLOATS
                and t.numel() * t.element_size() >= min_bytes):
            out[name] = t
            continue
        dtype = dtype_name(t.dtype)
        codec = QuantizedLossy(spec.codec_kwargs(dtype), entropy=False)
        host = tensor_to_host(t)
        grid = ChunkGrid.for_array(host.shape, host.dtype.itemsize, chunk_bytes or CHUNK_BYTES)
        res = np.empty_like(host)
        for _, key, lo, hi in grid:
            part = np.zeros(grid.chunks, host.dtype)
            part[: hi - lo] = host[lo:hi]
            dec = np.empty_like(part)
            codec.decode(b"".join(codec.encode(part)), dec, key)
            res[lo:hi] = dec[: hi - lo]
        out[name] = host_to_tensor(res, dtype).to(t.device)
    return out


@dataclass
class QualitySearch:
    """Pick the most compressive candidate whose quality loss stays under a threshold.

    Parameters
    ----------
    candidates
        Encodings, most compressive first (e.g. 2, 3, 4, 8 bits).
    score
        ``score(state_dict) -> float``, lower is better (a loss).
    max_degradation
        Allowed relative increase of the score over the exact state's.
    min_bytes
        Tensors smaller than this stay exact (as the policy's ``min_quant_bytes``).
    """

    candidates: Sequence[QuantSpec]
    score: Callable[[Mapping[str, Any]], float]
    max_degradation: float = 0.01
    min_bytes: int = 64 * 1024
    last: int | None = None
    evaluations: int = field(default=0, init=False)

    def __post_init__(self) -> None:
        if not self.candidates:
            raise ValueError("QualitySearch needs at least one candidate")

    def _ok(self, state: Mapping[str, Any], i: int, limit: float) -> bool:
        self.evaluations += 1
        return float(self.score(simulate(state, self.candidates[i], self.min_bytes))) <= limit

    def choose(self, state: Mapping[str, Any]) -> QuantSpec | None:
        """The chosen candidate for ``state`` (a flat state dict), or None if none passes."""
        base = float(self.score(state))
        limit = base + abs(base) * self.max_degradation
        n = len(self.candidates)
        i = self.last if self.last is not None else n - 1
        if self._ok(state, i, limit):
            while i > 0 and self._ok(state, i - 1, limit):  # try more compressive neighbours
                i -= 1
        else:
            i += 1
            while i < n and not self._ok(state, i, limit):
                i += 1
            if i == n:
                self.last = n - 1
                return None
        self.last = i
        return self.candidates[i]
