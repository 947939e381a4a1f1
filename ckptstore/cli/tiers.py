"""``ckpt status`` and ``ckpt push``: the uploads of a tiered store's local tier.

STORE_URL is the local tier (``ckptstore.open(url, local=PATH)``'s ``PATH``); the remote is
the one its upload journal names, with the storage options recorded there (no credentials:
those come from the environment or ``--storage-option``, which also override the recorded
ones). The library is imported inside ``run_*`` (torch-free start-up).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ._context import AddVerb, CliError, Context
from ._open import open_existing
from ._output import human_size, plural, table

__all__ = ["is_local_tier", "open_tiered", "register", "run_push", "run_status"]

if TYPE_CHECKING:
    from ..store import Store
    from ..tiers import Upload



def register(add: AddVerb) -> None:
    p = add("status", "a tiered store's commits not yet uploaded to its remote, with progress")
    p.add_argument("--offline", action="store_true",
                   help="read the local journal only (do not ask the remote for progress)")
    p.set_defaults(run=run_status)
    p = add("push", "upload every commit of a tiered store's local tier the remote lacks "
                    "(before shutting the machine down); exit 5 if an upload fails")
    p.add_argument("--timeout", type=float, metavar="SECONDS",
                   help="give up after this long (default: wait)")
    p.set_defaults(run=run_push)


def _remote(ctx: Context) -> tuple[str, dict[str, Any]]:
    from ..tiers import Journal
    from . import parse_storage_options

    found = Journal(ctx.storage).remote()
    if found is None:
        raise CliError(f"{ctx.args.store} is not the local tier of a tiered store (it has no "
                       "upload journal): open it with ckptstore.open(remote_url, local=PATH)")
    url, recorded = found
    return url, {**recorded, **parse_storage_options(ctx.args.storage_options)}


def is_local_tier(ctx: Context) -> bool:
    """Whether STORE_URL is the local tier of a tiered store (it has an upload journal)."""
    from ..tiers import Journal

    return Journal(ctx.storage).remote() is not None


def open_tiered(ctx: Context) -> tuple[str, Store]:
    """``(remote URL, the tiered store)`` of the local tier STORE_URL, opened as the library
    opens it: the uploads its journal holds resume while it is open (``close()`` stops them
    after the keys under way). Its uploads stay on the upload thread: nothing here trains, and
    an upload process would add its start to the command's time."""
    from ..opening import open as open_store

    url, options = _remote(ctx)
    return url, open_store(url, create=False, local=ctx.args.store, background="thread",
                           **options)


def run_status(ctx: Context) -> int:
    from ..tiers import Journal, pending_uploads

    url, options = _remote(ctx)
    remote = None if ctx.args.offline else open_existing(url, options)
    pending = pending_uploads(Journal(ctx.storage), remote)
    if ctx.json:
        ctx.emit({"remote": url, "pending": [vars(u) for u in pending]})
        return 0
    if not pending:
        ctx.print(f"everything is uploaded to {url}")
        return 0
    rows = [[u.commit[:12], _what(u), u.state, human_size(u.bytes),
             "-" if remote is None else human_size(u.sent), u.error or ""] for u in pending]
    ctx.print(table(["COMMIT", "BRANCH", "STATE", "SIZE", "UPLOADED", "ERROR"], rows,
                    right=("SIZE", "UPLOADED")))
    total = sum(u.bytes for u in pending)
    ctx.print(f"{plural(len(pending), 'commit')} ({human_size(total)}) not yet on {url}")
    return 0


def _what(u: Upload) -> str:
    """The BRANCH column: a commit's branch, a replayed change, or a rank's part."""
    if u.op == "commit":
        return u.branch
    if u.op == "part":
        return f"part {u.rank}/{u.world} {u.branch}"
    return f"{u.op} {u.branch}"


def run_push(ctx: Context) -> int:
    url, store = open_tiered(ctx)
    with store:
        queued = [u.commit for u in store.uploads]
        store.push(ctx.args.timeout)
    if ctx.json:
        ctx.emit({"remote": url, "uploaded": queued})
    else:
        ctx.print(f"{plural(len(queued), 'commit')} uploaded to {url}" if queued
                  else f"nothing to upload: {url} has every commit")
    return 0
