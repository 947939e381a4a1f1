"""One table's touched-row bit-vector, kept on the table's device: marking rows (from lookups,
sparse or dense gradients), reading and clearing them without a host synchronisation per mark.

:class:`~ckptstore.tracking.rows.RowTracker` owns one :class:`TrackedTable` per tracked parameter and
decides what to mark; this module only keeps the bits.
"""

from __future__ import annotations

import threading

import torch
from torch import nn

__all__ = ["TrackedTable"]

_BIT_SHIFTS: dict[torch.device, torch.Tensor] = {}


def _shifts(device: torch.device) -> torch.Tensor:
    """``[0, 1, ..., 7]`` as uint8 on ``device`` (cached)."""
    shifts = _BIT_SHIFTS.get(device)
    if shifts is None:
        shifts = _BIT_SHIFTS[device] = torch.arange(8, dtype=torch.uint8, device=device)
    return shifts


class TrackedTable:
    """The touched-row bit-vector of one parameter (row ``r`` is bit ``r & 7`` of byte ``r >> 3``).

    Parameters
    ----------
    name : str
        Dotted name of the parameter, as in ``model.named_parameters()``.
    parameter : torch.nn.Parameter
        The table; its first dimension is the row.
    """

    def __init__(self, name: str, parameter: nn.Parameter) -> None:
        self.name = name
        self.parameter = parameter
        self.num_rows = int(parameter.shape[0])
        self._bits = torch.zeros((self.num_rows + 7) // 8, dtype=torch.uint8,
                                 device=parameter.device)
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"TrackedTable({self.name!r}, rows={self.num_rows})"

    @property
    def bitmap(self) -> torch.Tensor:
        """The live ``uint8`` bit-vector (``ceil(rows / 8)`` bytes on the table's device)."""
        return self._bits

    def _bitmap_on(self, device: torch.device) -> torch.Tensor:
        if self._bits.device != device:  # the parameter moved (model.to(...)) since tracking began
            self._bits = self._bits.to(device)
        return self._bits

    def mark(self, rows: torch.Tensor) -> None:
        """Mark row indices (any integer tensor, any shape, duplicates allowed) as touched.

        Out-of-range indices are clamped into the table (the lookup itself rejects them).
        """
        if self.num_rows == 0 or rows.numel() == 0:
            return
        with torch.no_grad(), self._lock:
            bits = self._bitmap_on(self.parameter.device)
            idx = rows.detach().reshape(-1).to(device=bits.device, dtype=torch.long)
            # Sort instead of torch.unique: same effect, no host synchronisation on accelerators.
            idx = torch.sort(idx.clamp(0, self.num_rows - 1)).values
            first = torch.ones_like(idx, dtype=torch.bool)
            first[1:] = idx[1:] != idx[:-1]
            byte = idx >> 3
            bit = torch.where(first, torch.ones_like(idx) << (idx & 7), 0).to(torch.uint8)
            # Distinct new bits of one byte sum to their OR; bits already set add nothing.
            bits.index_add_(0, byte, bit & ~bits[byte])

    def mark_mask(self, mask: torch.Tensor) -> None:
        """Mark the rows where a boolean vector of length ``rows`` is true."""
        if self.num_rows == 0:
            return
        with torch.no_grad(), self._lock:
            bits = self._bitmap_on(self.parameter.device)
            pad = torch.zeros(len(bits) * 8 - self.num_rows, dtype=torch.uint8, device=bits.device)
            flags = torch.cat([mask.detach().reshape(-1).to(bits.device, torch.uint8), pad])
            packed = (flags.view(-1, 8) << _shifts(bits.device)).sum(1).to(torch.uint8)
            bits.bitwise_or_(packed)

    def mark_all(self) -> None:
        """Mark every row (the table may have changed in ways the tracker did not see)."""
        with self._lock:
            bits = self._bitmap_on(self.parameter.device)
            bits.fill_(0xFF)
            if self.num_rows % 8:
                bits[-1] = (1 << (self.num_rows % 8)) - 1

    def mark_gradient(self, grad: torch.Tensor) -> None:
        """Mark the rows a gradient of this table can change: sparse indices, dense non-zero rows."""
        if grad.layout not in (torch.strided, torch.sparse_coo):
            grad = grad.to_sparse_coo()
        if grad.layout == torch.sparse_coo:
            if grad.sparse_dim() == 0:
                self.mark_all()
            else:  # uncoalesced is fine: duplicates are handled by mark()
                self.mark(grad._indices()[0])
        elif grad.dim() > 0 and grad.shape[0] == self.num_rows:
            self.mark_mask(grad.detach().reshape(self.num_rows, -1).ne(0).any(1))
        else:
            self.mark_all()

    def touched_rows(self) -> torch.Tensor:
        """Sorted ``int64`` indices (on the CPU) of the rows marked since the last clear."""
        with self._lock:
            return self._decode(self._bits)

    def consume(self) -> torch.Tensor:
        """:meth:`touched_rows`, then :meth:`clear` (atomically with respect to marking)."""
        with self._lock:
            bits = self._bits.clone()
            self._bits.zero_()
        self._mark_pending()
        return self._decode(bits)

    def clear(self) -> None:
        """Unmark every row, except rows of a pending ``.grad`` (they change at the next step)."""
        with self._lock:
            self._bits.zero_()
        self._mark_pending()

    def _mark_pending(self) -> None:
        grad = self.parameter.grad
        if grad is not None:
            self.mark_gradient(grad)

    @staticmethod
    def _decode(bits: torch.Tensor) -> torch.Tensor:
        nonzero = bits.nonzero().squeeze(1)
        flags = (bits[nonzero].unsqueeze(1) >> _shifts(bits.device)) & 1
        byte, bit = flags.nonzero(as_tuple=True)  # row-major: already sorted
        return (nonzero[byte] * 8 + bit).cpu()
