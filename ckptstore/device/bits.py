"""Bit packing with torch ops, on any device: the layout of :func:`ckptcodecs.pack_bits` (code
``i`` in bits ``[i*bits, (i+1)*bits)`` of a little-endian bit stream), so that quantized codes
cross PCIe packed -- half a byte a value at 4 bits -- in both directions (issue 11).

Eight codes of ``bits`` bits fill exactly ``bits`` bytes, so both directions work on groups of
eight: the codes of a group are shifted into one 64-bit word, whose bytes are the group's packed
bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

__all__ = ["PackedCodes", "pack_on_device", "unpack_on_device"]


@dataclass(frozen=True)
class PackedCodes:
    """``count`` codes of ``bits`` bits, packed (``data``: uint8, on the host)."""

    data: np.ndarray
    count: int
    bits: int

    def unpack(self) -> np.ndarray:
        from ckptcodecs import unpack_bits

        return unpack_bits(self.data, self.bits, self.count)


def _shifts(step: int, n: int, device: torch.device) -> torch.Tensor:
    return torch.arange(n, device=device, dtype=torch.int64) * step


def pack_on_device(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """``codes`` (flat, each below ``2**bits``) packed: ``ceil(n * bits / 8)`` uint8 values on
    the codes' device."""
    n = codes.numel()
    groups = -(-n // 8)
    c = torch.zeros(groups * 8, dtype=torch.int64, device=codes.device)
    c[:n] = codes.reshape(-1)
    words = (c.view(groups, 8) << _shifts(bits, 8, c.device)).sum(dim=1)  # disjoint fields
    out = (words[:, None] >> _shifts(8, bits, c.device)) & 0xFF
    return out.reshape(-1)[: (n * bits + 7) // 8].to(torch.uint8)


def unpack_on_device(packed: torch.Tensor, bits: int, count: int) -> torch.Tensor:
    """The ``count`` codes of ``packed`` (uint8, as :func:`pack_on_device` makes them) as int64
    on its device."""
    groups = -(-count // 8)
    b = torch.zeros(groups * bits, dtype=torch.int64, device=packed.device)
    b[: packed.numel()] = packed.reshape(-1)[: groups * bits]
    words = (b.view(groups, bits) << _shifts(8, bits, b.device)).sum(dim=1)
    mask = (1 << bits) - 1
    return ((words[:, None] >> _shifts(bits, 8, b.device)) & mask).reshape(-1)[:count]
