"""Chain kinds, one module each, behind one small protocol (:class:`ChainKind`: decide,
remember, reads, replay) and found through a registry by the manifest's entry kind or the
policy's want, as chunk codecs are found by id.

=========================  =========  ==================  ==============
entry kinds                want       class               module
=========================  =========  ==================  ==============
full                       full       Full                :mod:`.full`
incremental, consecutive   rows       Rows                :mod:`.rows`
delta                      codes      Codes               :mod:`.codes`
xor                        xor        Xor                 :mod:`.xor`
residual                   residual   Residual            :mod:`.residual`
=========================  =========  ==================  ==============

Adding a chain kind: add its member to ``history.manifest.Kind`` (and its parts to the
manifest's table of parts), its want to ``policy.Want`` (and the policy's rule that asks for
it), subclass :class:`ChainKind` in a module of this package (decide, write, remember, reads,
replay, check), decorate it with :func:`register_chain_kind` and import the module below. The
planner, persist, the chain memory, the walk, the reader, consistency and usage find it here;
only this package and the manifest name the kind.

May import: as ckptstore.chains.
"""

from .base import ChainKind, ChainSource, Kept, Remembered
from .registry import chain_kind, chain_kinds, kind_for_want, register_chain_kind
from . import codes, full, residual, rows, xor  # noqa: F401  (each registers its kind)

__all__ = ["ChainKind", "ChainSource", "Kept", "Remembered", "chain_kind", "chain_kinds",
           "kind_for_want", "register_chain_kind"]
