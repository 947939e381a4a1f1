"""``ckpt diff``: tensors and values changed, added or removed between two commits."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ._context import AddVerb, Context
from ._output import plural, shape_text, short_value, table

if TYPE_CHECKING:
    from ..maintenance.diff import DiffResult, TensorSpec

__all__ = ["register", "run"]


def register(add: AddVerb) -> None:
    p = add("diff", "tensors changed, added or removed between two commits, with max |a-b|")
    p.add_argument("ref1", metavar="REF1")
    p.add_argument("ref2", metavar="REF2")
    p.add_argument("--paths", action="append", metavar="GLOB",
                   help="only entries whose dotted path matches (repeatable)")
    p.add_argument("--exit-code", action="store_true",
                   help="exit with status 1 if the commits differ")
    p.set_defaults(run=run)


def _spec(s: TensorSpec) -> str:
    return f"{s.dtype} {shape_text(s.shape)}"


def _rows(d: DiffResult) -> list[list[str]]:
    rows = []
    for c in d.changed:
        what = _spec(c.new) if _spec(c.old) == _spec(c.new) else f"{_spec(c.old)} -> {_spec(c.new)}"
        mad = c.max_abs_diff
        rows.append(["changed", c.path, what, "-" if mad is None else f"{mad:.6g}"])
    for kind, specs in (("added", d.added), ("removed", d.removed)):
        rows += [[kind, s.path, _spec(s), "-"] for s in specs]
    for v in d.values_changed:
        rows.append(["changed", v.path,
                     f"{short_value(v.old, 30)} -> {short_value(v.new, 30)}", "-"])
    for kind, values in (("added", d.values_added), ("removed", d.values_removed)):
        rows += [[kind, p, short_value(v, 40), "-"] for p, v in values]
    return rows


def run(ctx: Context) -> int:
    args = ctx.args
    d = ctx.store.diff(args.ref1, args.ref2, paths=args.paths, progress=ctx.progress)
    status = 1 if (args.exit_code and d.differs) else 0
    if ctx.json:
        ctx.emit(d.to_json())
        return status
    rows = _rows(d)
    if rows:
        ctx.print(table(["STATUS", "PATH", "WHAT", "MAX ABS DIFF"], rows,
                        right=("MAX ABS DIFF",)))
    ctx.print(f"{d.ref1[:10]} -> {d.ref2[:10]}: {plural(len(d.changed), 'tensor')} changed, "
              f"{len(d.added)} added, {len(d.removed)} removed, {d.unchanged} unchanged; "
              f"{plural(len(d.values_changed), 'value')} changed, {len(d.values_added)} added, "
              f"{len(d.values_removed)} removed")
    return status
