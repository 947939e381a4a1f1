"""Which rows of an embedding table changed: touched-row bit-vectors kept on the table's device.

An incremental commit writes only the rows of a table that changed since the commit it builds on.
:func:`track` installs hooks that mark, in one bit per row, every row of an embedding table that a
forward pass looked up or that received a gradient; a commit reads the marked rows of a table
(:meth:`RowTracker.touched_rows`) and clears them once the commit has its snapshot
(:meth:`RowTracker.clear`, or :meth:`RowTracker.consume` per table). Without a tracker the store
finds changed rows by comparing values with the last commit instead. This module decides what to
mark; each table's bits are a :class:`~ckptstore.tracking.rowbits.TrackedTable`.

What is tracked
---------------
- Every ``nn.Embedding`` and ``nn.EmbeddingBag`` submodule: a forward pre-hook marks every index in
  its ``input`` (``EmbeddingBag``: 1-D with ``offsets`` or 2-D; ``offsets`` and
  ``per_sample_weights`` play no part). Marking happens in every forward, under ``torch.no_grad()``
  and ``torch.inference_mode()`` too: a forward without gradients changes nothing, except that
  ``max_norm`` renormalises the looked-up rows in place, so marking always is both simpler and
  needed. ``padding_idx`` rows get no gradient and never change; marking them is harmless (the
  row is written again, unchanged).
- Every parameter with ``requires_grad`` gets a gradient hook (``Tensor.register_hook``). A sparse
  gradient marks its row indices, so a custom module calling ``F.embedding(idx, w, sparse=True)``
  is covered: its parameter becomes tracked at its first sparse gradient (if it had a dense
  gradient before that, all its rows are marked once). On a tracked table a dense gradient marks
  the rows where it is non-zero, which keeps tied weights (an embedding shared with an output
  layer) and ``weight[idx]`` indexing correct.
- Optimizer state follows its parameter: :meth:`RowTracker.lookup` maps a state tensor whose first
  dimension is the table's rows (and whose rows are at most as wide as the table's), such as
  Adagrad ``sum``, SparseAdam ``exp_avg``/``exp_avg_sq`` or a momentum buffer, to its table. It
  is resolved at lookup time, since optimizers create state lazily at the first step.

When the tracker is correct
---------------------------
Rows must change only through gradient updates of rows that had a (non-zero) gradient, that is,
under an optimizer whose update of a row is exactly zero when the row's gradient is zero:

- ``SGD`` without momentum and without weight decay (sparse or dense gradients);
- ``Adagrad`` without weight decay, ``SparseAdam``, and row-wise sparse optimizers
  (row-wise Adagrad) with sparse gradients.

Dense ``Adam``/``AdamW`` (moment decay moves every row with history), any momentum, or any weight
decay change rows that were not touched: the tracker is then NOT sufficient, and the store must
compare values (its default without a tracker). :meth:`RowTracker.check_optimizer` lists such
problems for the attached optimizers and :func:`track` warns (:class:`TrackerWarning`).

Also outside the tracker's view: changes made before :func:`track` was called (the first commit
after it must be a full one or compare values); writes that bypass gradients (``weight.data[...]
= ...``, ``nn.init``, ``load_state_dict``/checkout into the model: after loading, the next commit
must be full or compare values unless its parent is the commit just loaded, in which case call
:meth:`RowTracker.clear`); rows changed on other data-parallel replicas (each process only sees its
own lookups: OR the bit-vectors across ranks, or compare values); a ``requires_grad`` switched on
after :func:`track` for a parameter that is not an embedding module's weight.

Rows whose gradient is computed but not yet applied when a commit clears the bits (a commit
between ``backward()`` and ``optimizer.step()``) stay marked: clearing re-marks the rows of every
pending ``.grad`` of a tracked table.

Costs
-----
Memory: ``ceil(rows / 8)`` bytes per table on the table's device. Each forward: O(batch) device
work (a sort of the batch's indices, b log b, and one scatter), no host synchronisation (a sort
rather than ``torch.unique``, whose output size the host must wait for). Each backward:
O(nnz) for a sparse gradient; for a dense gradient of a tracked table, one pass over it (O(rows x
dim), the same order as the optimizer's own dense update). Reading the rows: O(rows / 8) plus
O(touched), then a copy of the row indices to the host.

Examples
--------
>>> import torch
>>> from torch import nn
>>> model = nn.Sequential(nn.Embedding(10, 4))
>>> with track(model) as tracker:
...     _ = model(torch.tensor([[3, 1, 3]]))
...     tracker.touched_rows(model.state_dict()["0.weight"]).tolist()
[1, 3]
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Iterable
from typing import Any

import torch
from torch import nn

from ..errors import CkptStoreError
from .rowbits import TrackedTable

__all__ = ["NotTrackedError", "RowTracker", "TrackedTable", "TrackerWarning", "track"]


class NotTrackedError(CkptStoreError, LookupError):
    """The tensor is neither a tracked table nor optimizer state of one, or the tracker is closed."""


class TrackerWarning(UserWarning):
    """The attached optimizer changes rows that had no gradient: commit without the tracker."""


def _storage_key(tensor: torch.Tensor) -> tuple[int, int, tuple[int, ...], str]:
    return (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),
            str(tensor.device))


class RowTracker:
    """Touched-row bit-vectors of embedding tables, on the parameter's device (rows/8 bytes).

    Parameters
    ----------
    model : torch.nn.Module
        Its ``nn.Embedding`` / ``nn.EmbeddingBag`` weights are tracked from the start, any other
        parameter from its first sparse gradient.
    optimizer : torch.optim.Optimizer or iterable of them, optional
        Whose state tensors :meth:`lookup` maps to their tables, and which
        :meth:`check_optimizer` inspects.

    Notes
    -----
    See the module docstring for when the tracked rows are complete and what it costs. The
    tracker is also a context manager that :meth:`close`\\ s on exit.
    """

    def __init__(self, model: nn.Module,
                 optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None
                 ) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"track() needs an nn.Module, got {type(model).__name__}")
        if optimizer is None:
            self._optimizers: list[torch.optim.Optimizer] = []
        elif isinstance(optimizer, torch.optim.Optimizer):
            self._optimizers = [optimizer]
        else:
            self._optimizers = list(optimizer)
        self._names = {id(p): name for name, p in model.named_parameters()}
        self._params = {id(p): p for p in model.parameters()}
        self._tables: dict[int, TrackedTable] = {}  # id(parameter) -> table
        self._dense_seen: set[int] = set()  # untracked parameters that had a dense gradient
        self._handles: list[Any] = []
        self._closed = False
        for module in model.modules():
            if isinstance(module, (nn.Embedding, nn.EmbeddingBag)):
                weight = module.weight
                if isinstance(weight, nn.Parameter) and id(weight) in self._names:
                    table = self._table(weight)
                    self._handles.append(module.register_forward_pre_hook(
                        self._lookup_hook(table), with_kwargs=True))
        for _, param in model.named_parameters():
            if param.requires_grad and param.dim() > 0:
                self._handles.append(param.register_hook(self._grad_hook(param)))

    # -- hooks ---------------------------------------------------------------------------------

    def _table(self, param: nn.Parameter) -> TrackedTable:
        table = self._tables.get(id(param))
        if table is None:
            table = self._tables[id(param)] = TrackedTable(self._names[id(param)], param)
        return table

    @staticmethod
    def _lookup_hook(table: TrackedTable):
        def hook(module: nn.Module, args: tuple, kwargs: dict) -> None:
            if module.weight is not table.parameter:  # a deep copy of the module (e.g. an EMA)
                return
            indices = args[0] if args else kwargs.get("input")
            if isinstance(indices, torch.Tensor) and not (
                    indices.is_floating_point() or indices.is_complex()):
                table.mark(indices)
        return hook

    def _grad_hook(self, param: nn.Parameter):
        def hook(grad: torch.Tensor) -> None:
            table = self._tables.get(id(param))
            if table is None:
                if grad.layout == torch.strided:
                    self._dense_seen.add(id(param))  # cheap: untracked dense tensors stay dense
                    return
                table = self._table(param)
                if id(param) in self._dense_seen:  # it changed before we knew it was a table
                    table.mark_all()
                problems = self._problems([param])
                if problems:
                    warnings.warn("; ".join(problems), TrackerWarning, stacklevel=2)
            table.mark_gradient(grad)
        return hook

    # -- queries -------------------------------------------------------------------------------

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called (then nothing is tracked any more)."""
        return self._closed

    def tracked(self) -> dict[str, nn.Parameter]:
        """Dotted name -> parameter of every tracked table (empty once closed)."""
        if self._closed:
            return {}
        tables = dict(self._tables)
        return {name: tables[i].parameter for i, name in self._names.items() if i in tables}

    def lookup(self, tensor: torch.Tensor) -> TrackedTable | None:
        """The tracked table ``tensor`` is, or is optimizer state of; ``None`` if none (or closed).

        Matches by storage (data pointer, offset, shape, device): the parameter, ``param.data``,
        the tensors of ``model.state_dict()`` and of ``optimizer.state_dict()``. An optimizer state
        tensor matches when its first dimension equals the table's rows and its rows are at most
        as wide as the table's (Adagrad ``sum``, row-wise state, moments; not a rows x rows
        preconditioner).
        """
        if self._closed or not isinstance(tensor, torch.Tensor) or tensor.is_sparse:
            return None
        key = _storage_key(tensor)
        tables = list(self._tables.values())  # a backward thread may add a table meanwhile
        for table in tables:
            if _storage_key(table.parameter) == key:
                return table
        if tensor.dim() == 0:
            return None
        for table in tables:
            if tensor.shape[0] != table.num_rows or \
                    math.prod(tensor.shape[1:]) > math.prod(table.parameter.shape[1:]):
                continue
            for opt in self._optimizers:
                for value in opt.state.get(table.parameter, {}).values():
                    if isinstance(value, torch.Tensor) and not value.is_sparse and \
                            value.dim() > 0 and _storage_key(value) == key:
                        return table
        return None

    def _require(self, tensor: torch.Tensor | str) -> TrackedTable:
        if self._closed:
            raise NotTrackedError("the RowTracker is closed and no longer sees changes; "
                                  "commit without it (values are compared) or call track() again")
        if isinstance(tensor, str):
            table = next((t for t in self._tables.values() if t.name == tensor), None)
        else:
            table = self.lookup(tensor)
        if table is None:
            what = repr(tensor) if isinstance(tensor, str) else \
                f"tensor {tuple(tensor.shape)} {tensor.dtype}"
            raise NotTrackedError(
                f"{what} is not a tracked embedding table nor row-aligned optimizer state of one "
                f"(tracked: {sorted(self.tracked())}); check with RowTracker.lookup() first")
        return table

    def touched_rows(self, tensor: torch.Tensor | str) -> torch.Tensor:
        """Sorted ``int64`` row indices (on the CPU) marked since the last clear; does not clear.

        ``tensor`` is a tracked table, its optimizer state (see :meth:`lookup`) or a dotted name.
        Raises :class:`NotTrackedError` for anything else.
        """
        return self._require(tensor).touched_rows()

    def consume(self, tensor: torch.Tensor | str) -> torch.Tensor:
        """:meth:`touched_rows`, then clear that table's bits.

        A table's weight and its optimizer state share one bit-vector: within one commit read
        every tensor of a table with :meth:`touched_rows`, then :meth:`clear` (or consume once).
        """
        return self._require(tensor).consume()

    def mark(self, tensor: torch.Tensor | str, rows: torch.Tensor) -> None:
        """Mark ``rows`` of a table as touched: rows written outside gradients, or the rows of a
        commit that failed after :meth:`consume` (so the next commit still writes them)."""
        self._require(tensor).mark(torch.as_tensor(rows))

    def clear(self) -> None:
        """Unmark every row of every table (rows of pending ``.grad`` stay marked)."""
        for table in list(self._tables.values()):
            table.clear()
        # An untracked parameter whose dense changes were just committed starts afresh, unless a
        # dense gradient of it is still pending.
        self._dense_seen = {i for i in self._dense_seen
                            if self._params[i].grad is not None and
                            self._params[i].grad.layout == torch.strided}

    # -- optimizer checks ----------------------------------------------------------------------

    def check_optimizer(self) -> list[str]:
        """Human-readable problems of the attached optimizers for the tracked tables: every
        configuration that changes rows which had no gradient (so the tracker would miss them)."""
        return self._problems([t.parameter for t in self._tables.values()])

    def _problems(self, params: list[nn.Parameter]) -> list[str]:
        wanted = {id(p): self._names[id(p)] for p in params}
        problems = []
        for opt in self._optimizers:
            kind = type(opt).__name__
            for group in opt.param_groups:
                names = sorted(wanted[id(p)] for p in group["params"] if id(p) in wanted)
                if not names:
                    continue
                where = f"{kind} on {', '.join(names)}"
                decay = group.get("weight_decay", 0) or 0
                if isinstance(opt, torch.optim.SGD):
                    if group.get("momentum", 0):
                        problems.append(f"{where}: momentum={group['momentum']} keeps moving rows "
                                        "after their gradient is gone")
                    if decay:
                        problems.append(f"{where}: weight_decay={decay} changes every row")
                elif isinstance(opt, torch.optim.Adagrad):
                    if decay:
                        problems.append(f"{where}: weight_decay={decay} changes every row")
                elif isinstance(opt, torch.optim.SparseAdam):
                    pass
                elif isinstance(opt, (torch.optim.Adam, torch.optim.AdamW)):
                    problems.append(
                        f"{where}: dense Adam moves every row with moment history, even without "
                        "a gradient" + (f", and weight_decay={decay} changes every row"
                                        if decay else "")
                        + " (use SparseAdam or Adagrad with sparse=True embeddings)")
                else:
                    problems.append(
                        f"{where}: ckptstore does not know whether {kind} leaves rows without a "
                        "gradient unchanged (SGD without momentum and weight decay, Adagrad and "
                        "SparseAdam do); if it does not, the tracker misses changed rows")
        if problems:
            problems.append("commit these tables without the tracker (values are compared)")
        return problems

    # -- lifetime ------------------------------------------------------------------------------

    def close(self) -> None:
        """Remove every hook. Afterwards nothing is tracked: :meth:`lookup` returns ``None``."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        self._closed = True

    def __enter__(self) -> RowTracker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"{len(self._tables)} tables"
        return f"RowTracker({state})"


def track(model: nn.Module,
          optimizer: torch.optim.Optimizer | Iterable[torch.optim.Optimizer] | None = None
          ) -> RowTracker:
    """Start tracking which embedding rows change; warns if ``optimizer`` breaks the assumption.

    Parameters
    ----------
    model : torch.nn.Module
        The model whose embedding tables (and sparse-gradient parameters) are tracked.
    optimizer : torch.optim.Optimizer or iterable of them, optional
        Its state follows the tables; it is checked with :meth:`RowTracker.check_optimizer`.

    Returns
    -------
    RowTracker
        Also a context manager that removes the hooks on exit.
    """
    tracker = RowTracker(model, optimizer)
    problems = tracker.check_optimizer()
    if problems:
        warnings.warn("row tracking is not sufficient: " + "; ".join(problems), TrackerWarning,
                      stacklevel=2)
    return tracker
