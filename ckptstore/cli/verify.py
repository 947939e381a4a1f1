"""``ckpt verify``: check every chunk; exit status 1 if anything is wrong."""

from __future__ import annotations

from ._context import AddVerb, Context
from ._output import human_size, plural

__all__ = ["register", "run"]


def register(add: AddVerb) -> None:
    p = add("verify", "check every chunk (present, checksum); exit 1 and list problems if any")
    p.add_argument("ref", metavar="REF", nargs="?",
                   help="one commit (default: every commit reachable from a branch or tag)")
    p.set_defaults(run=run)


def run(ctx: Context) -> int:
    report = ctx.store.verify(ctx.args.ref, progress=ctx.progress)
    if ctx.json:
        ctx.emit(report.to_json())
    else:
        for p in report.problems:
            ctx.print(p)
        for d in report.dangling:
            ctx.print(f"dangling: {d}")
        what = (f"{plural(report.commits_checked, 'commit')}, "
                f"{plural(report.chunks_checked, 'chunk')}, {human_size(report.bytes_checked)}")
        if report.ok:
            ctx.print(f"ok: checked {what}")
        else:
            ctx.print(f"{plural(len(report.problems), 'problem')} in {what}")
    return 0 if report.ok else 1
