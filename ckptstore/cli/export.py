"""``ckpt export``: a commit's tensors as a plain safetensors file."""

from __future__ import annotations

from ._context import AddVerb, Context
from ._output import human_size

__all__ = ["register", "run"]


def register(add: AddVerb) -> None:
    p = add("export", "write a commit's tensors to a plain safetensors file",
            "Keys are dotted paths; plain values (step, lr, ...) go into the file's\n"
            "__metadata__ as JSON strings when short. Dtypes are kept (bfloat16 included).")
    p.add_argument("ref", metavar="REF")
    p.add_argument("file", metavar="FILE", help="output .safetensors file (local path)")
    p.add_argument("--paths", action="append", metavar="GLOB",
                   help="only entries whose dotted path matches (repeatable)")
    p.add_argument("--strip-prefix", metavar="PREFIX",
                   help="remove PREFIX from keys (e.g. 'model.' for a model-only file)")
    p.add_argument("--force", "-f", action="store_true", help="overwrite FILE")
    p.add_argument("--format", choices=("safetensors", "hf", "dcp"), default="safetensors",
                   help="safetensors file (default); hf: a folder with config.json and "
                        "model.safetensors (keys under --strip-prefix, default 'model.'); dcp: a "
                        "torch.distributed.checkpoint folder")
    p.set_defaults(run=run)


def run(ctx: Context) -> int:
    from ..export import to_safetensors  # imports torch

    args = ctx.args
    if args.format != "safetensors":
        from .transfer import run_export
        return run_export(ctx)
    result = to_safetensors(ctx.store, args.ref, args.file, paths=args.paths,
                            strip_prefix=args.strip_prefix, overwrite=args.force,
                            progress=ctx.progress)
    for item in result.skipped:
        ctx.note(f"export skipped {item}")
    if ctx.json:
        ctx.emit(result.to_json())
    else:
        skipped = len(result.skipped)
        ctx.print(f"wrote {args.file}: {result.tensors} tensors, {human_size(result.nbytes)} "
                  f"from commit {result.commit[:10]}"
                  + (f" ({skipped} entries skipped, see stderr)" if skipped else ""))
    return 0
