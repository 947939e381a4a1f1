"""The base case: a ``full`` entry stores the whole tensor and builds on nothing (a chain's
baseline)."""

from __future__ import annotations

from typing import TYPE_CHECKING, ClassVar

from ...history.manifest import Kind
from .base import ChainKind
from .registry import register_chain_kind

if TYPE_CHECKING:  # hints only: policy imports the walk, the walk these kinds
    from ...policy import Want

__all__ = ["Full"]


@register_chain_kind
class Full(ChainKind):
    """The whole tensor; no link, nothing remembered, nothing replayed."""

    kinds: ClassVar[tuple[Kind, ...]] = (Kind.FULL,)
    want: ClassVar[Want] = "full"
    remembers: ClassVar[bool] = False
    own_array: ClassVar[bool] = False
