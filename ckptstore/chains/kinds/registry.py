"""Chain kinds by manifest entry kind and by the policy's want (as chunk codecs are found by
id, :mod:`ckptstore.chunkcodec.registry`)."""

from __future__ import annotations

from typing import TypeVar

from ...errors import ManifestError
from ...history.manifest import Kind
from .base import ChainKind

__all__ = ["chain_kind", "chain_kinds", "kind_for_want", "register_chain_kind"]

K = TypeVar("K", bound=type[ChainKind])

_BY_KIND: dict[Kind, ChainKind] = {}
_BY_WANT: dict[str, ChainKind] = {}


def register_chain_kind(cls: K) -> K:
    """Register one instance of ``cls`` under its entry kinds and its want (a class
    decorator). Raises ``ValueError`` where another class holds one of them: a kind read from
    a manifest must always replay the same way."""
    kind = cls()
    for key, table in [*((k, _BY_KIND) for k in cls.kinds), (cls.want, _BY_WANT)]:
        held = table.get(key)
        if held is not None and type(held).__qualname__ != cls.__qualname__:
            raise ValueError(f"chain kind {key!s} is already registered to "
                             f"{type(held).__name__}")
        table[key] = kind
    return cls


def chain_kind(kind: Kind) -> ChainKind:
    """The chain kind owning a manifest entry kind."""
    try:
        return _BY_KIND[kind]
    except KeyError:
        raise ManifestError(f"unknown entry kind {kind!r}: the store was written by a newer "
                            "ckptstore; upgrade it") from None


def kind_for_want(want: str) -> ChainKind | None:
    """The chain kind a policy's want asks for (None: it asks for no chain)."""
    return _BY_WANT.get(want)


def chain_kinds() -> list[ChainKind]:
    """Every registered chain kind, the base case (full) first."""
    return sorted(set(_BY_KIND.values()), key=lambda k: (k.kinds[0] != Kind.FULL, k.want))
