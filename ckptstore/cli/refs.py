"""``ckpt tag`` and ``ckpt branch``: list, create, move or delete refs."""

from __future__ import annotations

import argparse
import datetime as _dt
from collections.abc import Callable
from typing import Any

from ..errors import CkptStoreError
from ..info import CommitInfo
from ..format.layout import check_ref_name
from ..history.repository import Repository
from ._context import AddVerb, CliError, Context
from ._output import one_line, table, utc_time

__all__ = ["register", "run_branch", "run_tag"]


def _ref_verb(add: AddVerb, kind: str, help: str, usage: str) -> argparse.ArgumentParser:
    """``ckpt tag`` / ``ckpt branch``: the arguments they share (NAME, REF, --delete NAME)."""
    p = add(kind, help, usage)
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("ref", metavar="REF", nargs="?")
    p.add_argument("--delete", "-d", metavar="NAME", help=f"delete {kind} NAME")
    return p


def register(add: AddVerb) -> None:
    p = _ref_verb(add, "tag", "list, create or delete tags",
                  "ckpt tag URL              list tags\n"
                  "ckpt tag URL NAME [REF]   tag REF (default main) as NAME\n"
                  "ckpt tag URL --delete NAME")
    p.set_defaults(run=run_tag)

    p = _ref_verb(add, "branch", "list, create, move or delete branches",
                  "ckpt branch URL                     list branches with their tips\n"
                  "ckpt branch URL NAME [REF]          create branch NAME at REF (default main)\n"
                  "ckpt branch URL NAME REF --force    move an existing branch to REF\n"
                  "ckpt branch URL --delete NAME")
    p.add_argument("--force", "-f", action="store_true",
                   help="move NAME to REF if the branch exists")
    p.set_defaults(run=run_branch)


def _ref_rows(repo: Repository, refs: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for name, c in sorted(refs.items()):
        row: dict[str, Any] = {"name": name, "id": c}
        try:
            info = CommitInfo.from_manifest(repo.manifest(c))
            row.update(time=info.time.isoformat(), step=info.step, message=info.message)
        except CkptStoreError:
            row.update(time=None, step=None, message=None, missing=True)
        rows.append(row)
    return rows


def _print_refs(ctx: Context, rows: list[dict[str, Any]], what: str) -> None:
    if not rows:
        ctx.print(f"no {what}")
        return
    out = []
    for r in rows:
        when = utc_time(_dt.datetime.fromisoformat(r["time"])) if r["time"] else "-"
        msg = "(commit missing)" if r.get("missing") else one_line(r["message"] or "")
        out.append([r["name"], r["id"][:10], when, "-" if r["step"] is None else r["step"], msg])
    ctx.print(table(["NAME", "COMMIT", "TIME (UTC)", "STEP", "MESSAGE"], out, right=("STEP",)))


def _list_or_delete(ctx: Context, kind: str, refs: dict[str, str],
                    delete: Callable[[str], None]) -> bool:
    """Handle ``--delete NAME`` and the no-name listing; False when the verb has more to do."""
    args = ctx.args
    if args.delete is not None:
        if args.name is not None:
            raise CliError(f"{kind} --delete NAME takes no other names")
        commit_id = refs.get(args.delete)
        delete(args.delete)
        if ctx.json:
            ctx.emit({"deleted": args.delete, "id": commit_id})
        else:
            ctx.print(f"deleted {kind} {args.delete} "
                      f"(was {commit_id[:10] if commit_id else '?'})")
        return True
    if args.name is None:
        rows = _ref_rows(ctx.repo, refs)
        if ctx.json:
            ctx.emit(rows)
        else:
            _print_refs(ctx, rows, "tags" if kind == "tag" else "branches")
        return True
    return False


def run_tag(ctx: Context) -> int:
    refs, args = ctx.repo.refs, ctx.args  # refs only: no torch
    if _list_or_delete(ctx, "tag", refs.tags(), refs.delete_tag):
        return 0
    check_ref_name(args.name, "tag")
    commit_id = ctx.repo.resolve(args.ref or "main")
    refs.create_tag(args.name, commit_id)
    if ctx.json:
        ctx.emit({"tag": args.name, "id": commit_id})
    else:
        ctx.print(f"tagged {commit_id[:10]} as {args.name}")
    return 0


def run_branch(ctx: Context) -> int:
    refs, args = ctx.repo.refs, ctx.args  # refs only: no torch
    if _list_or_delete(ctx, "branch", refs.branches(), refs.delete_branch):
        return 0
    moving = args.force and args.name in refs.branches()
    if not moving:
        check_ref_name(args.name, "branch")
    commit_id = ctx.repo.resolve(args.ref or "main")
    if moving:
        refs.reset_branch(args.name, commit_id)
    else:
        refs.create_branch(args.name, commit_id)
    verb = "moved" if moving else "created"
    if ctx.json:
        ctx.emit({"branch": args.name, "id": commit_id, "action": verb})
    else:
        ctx.print(f"{verb} branch {args.name} {'to' if verb == 'moved' else 'at'} "
                  f"{commit_id[:10]}")
    return 0
