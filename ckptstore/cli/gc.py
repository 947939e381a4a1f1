"""``ckpt gc`` and ``ckpt rebase``: drop old commits and leftovers; end chains so gc can."""

from __future__ import annotations

from ..format.layout import data_dir
from ._context import AddVerb, Context, positive_int, seconds
from ._output import human_size, plural

__all__ = ["register", "run_gc", "run_rebase"]


def register(add: AddVerb) -> None:
    p = add("gc", "remove old commits and leftovers; print what goes and the bytes freed",
            "Keeps, per branch, the newest --keep-last commits (all if not given), every\n"
            "--keep-every-th commit, and tagged commits (unless --no-keep-tags). Leftovers of\n"
            "crashed commits are removed once older than --grace seconds. On a tiered store's\n"
            "local tier it collects that tier, or with --tier remote the remote its upload\n"
            "journal names; neither deletes what a commit not uploaded yet needs.")
    p.add_argument("--keep-last", type=positive_int, metavar="N",
                   help="keep the newest N commits of each branch")
    p.add_argument("--keep-every", type=positive_int, metavar="K",
                   help="also keep every commit whose generation is a multiple of K")
    p.add_argument("--no-keep-tags", action="store_true",
                   help="tags do not protect commits (tags of removed commits are deleted)")
    p.add_argument("--grace", type=seconds, default=3600.0, metavar="SECONDS",
                   help="unreferenced data younger than this is left alone (default 3600)")
    p.add_argument("--dry-run", "-n", action="store_true",
                   help="only print what would be removed")
    p.add_argument("--tier", choices=("local", "remote"),
                   help="STORE_URL being a tiered store's local tier: the tier to collect "
                        "(default: local)")
    p.set_defaults(run=run_gc)

    p = add("rebase", "write REF's state as a new full, lossless commit (ends its chains)",
            "Incremental, consecutive and delta commits keep their bases alive. A rebase\n"
            "writes the whole state again so that gc can collect the old chains.")
    p.add_argument("ref", metavar="REF", nargs="?", default="main", help="default: main")
    p.add_argument("--branch", help="branch to commit on (default: REF if it is a branch, else "
                   "main)")
    p.add_argument("--message", "-m", help="commit message (default: 'rebase of <id>')")
    p.set_defaults(run=run_rebase)


def run_gc(ctx: Context) -> int:
    from .tiers import is_local_tier, open_tiered

    args = ctx.args
    options = dict(keep_last=args.keep_last, keep_tags=not args.no_keep_tags,
                   keep_every=args.keep_every, dry_run=args.dry_run, grace_period=args.grace,
                   progress=ctx.progress)
    if args.tier is None and not is_local_tier(ctx):
        result = ctx.store.gc(**options)
    else:  # (--tier on another store: the CliError of open_tiered)
        with open_tiered(ctx)[1] as store:
            result = store.gc(tier=args.tier or "local", **options)
    if ctx.json:
        ctx.emit(result.to_json())
        return 0
    verb = "would remove" if result.dry_run else "removed"
    for c in result.commits_removed:
        ctx.print(f"{verb} commit {c}")
    for d in result.data_removed:
        ctx.print(f"{verb} data   {data_dir(d)}")
    for t in result.tags_removed:
        ctx.print(f"{verb} tag    {t}")
    summary = (f"{plural(len(result.commits_removed), 'commit')}, "
               f"{plural(len(result.data_removed), 'data folder')}, "
               f"{plural(len(result.tags_removed), 'tag')}")
    kept = plural(len(result.kept), "commit")
    if result.dry_run:
        ctx.print(f"dry run: would remove {summary} and free {human_size(result.bytes_freed)}; "
                  f"nothing was removed ({kept} kept)")
    else:
        ctx.print(f"removed {summary}, {plural(result.ref_files_removed, 'old ref file')}; "
                  f"freed {human_size(result.bytes_freed)} ({kept} kept)")
    return 0


def run_rebase(ctx: Context) -> int:
    args = ctx.args
    info = ctx.store.rebase(args.ref, branch=args.branch, message=args.message or "",
                            progress=ctx.progress)
    if ctx.json:
        ctx.emit(info.to_json())
    else:
        ctx.print(f"wrote full commit {info.short_id} ({human_size(info.stored_bytes)}) with the "
                  f"state of {args.ref}; `ckpt gc --keep-last 1` can now drop older chains")
    return 0
