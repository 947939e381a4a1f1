"""``ckpt show``: one commit's details, a table of its tensors and one of its plain values.

It reads manifests and store listings only, never a tensor, and needs no torch: sizes come from
dtype names (:mod:`ckptstore.format.dtypes`), the store's history from ``ctx.repo``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..format.dtypes import nbytes
from ..info import CommitInfo
from ..format.layout import PACKED_ARRAY
from ..history.manifest import Layout, Manifest
from ._context import AddVerb, Context
from ._output import human_size, plural, shape_text, short_value, table, utc_time

if TYPE_CHECKING:
    from ..maintenance.usage import StoredSizes

__all__ = ["register", "run"]


def register(add: AddVerb) -> None:
    p = add("show", "details of one commit and a table of its tensors")
    p.add_argument("ref", metavar="REF", nargs="?", default="main",
                   help="the commit (default: main)")
    p.add_argument("--paths", action="append", metavar="GLOB",
                   help="only entries whose dotted path matches (repeatable), e.g. 'model.*'")
    p.set_defaults(run=run)


def _rows(ctx: Context, m: Manifest, sizes: StoredSizes, wanted: set[int]) -> list[dict[str, Any]]:
    from ..chains.walk import Walk
    from ..maintenance.usage import entry_stored_bytes

    rows = []
    walk = Walk(ctx.repo.manifest)
    for i, e in enumerate(m.tensors):
        if i not in wanted:
            continue
        note = ""
        if e.layout == Layout.ALIAS:
            note = f"same tensor as {m.tensors[e.base].path}"
        elif e.layout == Layout.VIEW:
            note = f"view of {m.storages[e.base].path}"
        elif e.layout == Layout.CHAIN:  # stored: this commit's own parts; the rest is in the bases
            older = len(walk.entry_arrays(e)) - len(e.parts or {})
            note = (f"{e.kind} on {(e.base_commit or '?')[:10]}; "
                    f"reads {plural(older, 'older array')}")
        elif e.layout == Layout.SHARDED:
            note = f"{plural(len(e.pieces or ()), 'shard')}"
        if e.commit and e.commit != m.id:
            note = (note + "; " if note else "") + f"data of commit {e.commit[:10]}"
        rows.append({"path": e.path, "dtype": e.dtype, "shape": list(e.shape), "layout": e.layout,
                     "nbytes": nbytes(e.dtype, e.shape),
                     "stored_bytes": entry_stored_bytes(sizes, e, m.shards),
                     "commit": e.commit, "array": e.array, "note": note})
    return rows


def run(ctx: Context) -> int:
    from ..state.leaves import Leaves
    from ..maintenance.usage import StoredSizes

    repo, args = ctx.repo, ctx.args  # manifests and listings only: no tensor is read
    m = repo.manifest(repo.resolve(args.ref))
    info = CommitInfo.from_manifest(m)
    refs = repo.ref_names().get(m.id, [])
    sizes = StoredSizes(repo.storage)
    leaves = Leaves.of(m).select(args.paths)
    rows = _rows(ctx, m, sizes, set(leaves.tensors.values()))
    packed_stored = sizes.array_bytes(m.id, PACKED_ARRAY) if m.packed is not None else None
    if ctx.json:
        doc = info.to_json()
        doc.update(generation=m.generation, refs=refs, tensor_count=len(m.tensors),
                   tensors=rows, values=dict(leaves.values),
                   packed=None if m.packed is None else {"nbytes": m.packed.nbytes,
                                                         "stored_bytes": packed_stored})
        ctx.emit(doc)
        return 0

    head = [("commit", m.id), ("parent", m.parent or "-")]
    if refs:
        head.append(("refs", ", ".join(refs)))
    head += [("time", f"{utc_time(info.time)} UTC"), ("message", m.message or "-")]
    head += [(k, short_value(v)) for k, v in m.metadata.items()]
    head.append(("tensors", (f"{len(m.tensors)} ({human_size(m.logical_bytes)} in memory, "
                            f"{human_size(m.stored_bytes)} stored)")))
    if m.packed is not None:
        n_packed = sum(e.layout == Layout.PACKED for e in (*m.tensors, *m.storages))
        head.append(("packed", (f"{plural(n_packed, 'small tensor')} in one array, "
                               f"{human_size(packed_stored)} stored")))
    if m.shards:
        n_sharded = sum(e.layout == Layout.SHARDED for e in m.tensors)
        head.append(("sharded", (f"{plural(len(m.shards), 'shard')} of "
                                f"{plural(n_sharded, 'tensor')}, "
                                f"{plural(len(m.packs), 'packed array')} of ranks")))
    width = max(len(k) for k, _ in head)
    for k, v in head:
        ctx.print(f"{k.ljust(width)}  {v}")
    if rows:
        ctx.print()
        ctx.print(table(["PATH", "DTYPE", "SHAPE", "LAYOUT", "STORED", "NOTE"],
                        [[r["path"], r["dtype"], shape_text(r["shape"]), r["layout"],
                          human_size(r["stored_bytes"]), r["note"]] for r in rows],
                        right=("STORED",)))
    if leaves.values:
        ctx.print()
        ctx.print(table(["PATH", "VALUE"],
                        [[p, short_value(v)] for p, v in leaves.values.items()]))
    return 0
