"""``ckpt du``: stored bytes per commit (see :func:`ckptstore.maintenance.usage.disk_usage`), from
manifests and store listings: no tensor is read, torch is not imported."""

from __future__ import annotations

from ._context import AddVerb, Context, positive_int
from ._output import human_size, plural, table, utc_time

__all__ = ["register", "run"]


def register(add: AddVerb) -> None:
    p = add("du", "stored bytes per commit: its own data, data it reads from other commits",
            "OWN is the commit's data/<id>/ folder, SHARED the data of other commits it\n"
            "reads, TOTAL what restoring it needs. Without --ref: every commit in the store.")
    p.add_argument("--ref", help="only the history of REF")
    p.add_argument("--limit", "-n", type=positive_int, metavar="N", help="at most N commits")
    p.set_defaults(run=run)


def run(ctx: Context) -> int:
    from ..maintenance.usage import disk_usage

    report = disk_usage(ctx.repo, ctx.args.ref, limit=ctx.args.limit, progress=ctx.progress)
    if ctx.json:
        ctx.emit(report.to_json())
        return 0
    rows = []
    for r in report.commits:
        rows.append([r.id[:10], utc_time(r.time) if r.time else "-",
                     "-" if r.step is None else r.step, human_size(r.own_bytes),
                     human_size(r.shared_bytes), human_size(r.total_bytes),
                     ", ".join(r.refs) if r.error is None else "manifest unreadable"])
    for d, n in report.leftover_data:
        rows.append([d[:10], "-", "-", human_size(n), human_size(0), human_size(n),
                     "leftover data without a manifest (gc removes)"])
    ctx.print(table(["COMMIT", "TIME (UTC)", "STEP", "OWN", "SHARED", "TOTAL", "REFS"], rows,
                    right=("STEP", "OWN", "SHARED", "TOTAL")))
    ctx.print(f"total: {human_size(report.total_bytes)} to keep "
              f"{plural(len(report.commits), 'commit')} ({human_size(report.data_bytes)} data, "
              f"{human_size(report.manifest_bytes)} manifests)")
    if report.store_bytes is not None:
        ctx.print(f"store: {human_size(report.store_bytes)} in all (refs, leftovers and markers "
                  "included)")
    return 0
