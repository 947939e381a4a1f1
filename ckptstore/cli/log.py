"""``ckpt log``: history, newest first."""

from __future__ import annotations

from ._context import AddVerb, Context, positive_int
from ._output import human_size, one_line, table, utc_time

__all__ = ["register", "run"]


def register(add: AddVerb) -> None:
    p = add("log", "history, newest first: id, time, step, stored size, message")
    p.add_argument("--ref", default="main", help="where the history starts (default: main)")
    p.add_argument("--limit", "-n", type=positive_int, metavar="N", help="show at most N commits")
    p.set_defaults(run=run)


def run(ctx: Context) -> int:
    repo, args = ctx.repo, ctx.args  # history and refs only: no torch
    if args.ref == "main" and not repo.refs.branches():
        commits = []  # a store without commits: empty history, not an error
    else:
        commits = list(repo.iter_log(args.ref, limit=args.limit))
    names = repo.ref_names()
    if ctx.json:
        ctx.emit([{**c.to_json(), "refs": names.get(c.id, [])} for c in commits])
        return 0
    if not commits:
        ctx.print("no commits")
        return 0
    rows = []
    for c in commits:
        refs = names.get(c.id)
        message = (f"({', '.join(refs)}) " if refs else "") + one_line(c.message)
        rows.append([c.short_id, utc_time(c.time), "-" if c.step is None else c.step,
                     human_size(c.stored_bytes), message])
    ctx.print(table(["COMMIT", "TIME (UTC)", "STEP", "STORED", "MESSAGE"], rows,
                    right=("STEP", "STORED")))
    return 0
