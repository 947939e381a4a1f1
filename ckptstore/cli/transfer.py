"""``ckpt import``: commit a safetensors, torch.save, Hugging Face or DCP checkpoint; and the
``--format hf|dcp`` targets of ``ckpt export``."""

from __future__ import annotations

from ._context import AddVerb, Context
from ._output import human_size

__all__ = ["register", "run", "run_export"]

FORMATS = ("safetensors", "torch", "hf", "dcp")  # ckptstore.importing.FORMATS (it imports torch)


def register(add: AddVerb) -> None:
    p = add("import", "commit a checkpoint written by another tool",
            "SOURCE is a safetensors file, a torch.save file (loaded with weights_only=True;\n"
            "one that needs pickle is refused), a Hugging Face model folder (config.json +\n"
            "weights) or a torch.distributed.checkpoint folder. A new store is created where none is.")
    p.add_argument("source", metavar="SOURCE")
    p.add_argument("--format", choices=("auto", *FORMATS), default="auto",
                   help="format of SOURCE (default: detected)")
    p.add_argument("--under", metavar="KEY",
                   help="nest the tensors under KEY (default: 'model' for safetensors and model "
                        "folders, the root for torch.save and DCP; '' for the root)")
    p.add_argument("--message", "-m", default="", help="commit message")
    p.add_argument("--branch", default="main", help="branch to commit on (default: main)")
    p.add_argument("--tag", action="append", default=[], metavar="NAME",
                   help="tag the commit (repeatable)")
    p.set_defaults(run=run)


def run(ctx: Context) -> int:
    from ..importing import import_checkpoint  # imports torch

    args = ctx.args
    info = import_checkpoint(ctx.store, args.source, format=args.format, under=args.under,
                             message=args.message, branch=args.branch, tags=args.tag)
    if ctx.json:
        ctx.emit({"id": info.id, "format": info.metadata.get("import.format"),
                  "logical_bytes": info.logical_bytes, "stored_bytes": info.stored_bytes})
    else:
        ctx.print(f"imported {args.source} ({info.metadata.get('import.format')}) as commit "
                  f"{info.id[:10]} on {args.branch}: {human_size(info.logical_bytes)}")
    return 0


def run_export(ctx: Context) -> int:
    """``ckpt export --format hf|dcp``: FILE is a folder."""
    from ..export import to_dcp, to_hf_directory  # imports torch

    args = ctx.args
    if args.format == "hf":
        prefix = "model." if args.strip_prefix is None else args.strip_prefix
        result = to_hf_directory(ctx.store, args.ref, args.file, prefix=prefix,
                                 overwrite=args.force, progress=ctx.progress)
    else:
        result = to_dcp(ctx.store, args.ref, args.file, paths=args.paths, overwrite=args.force)
    if ctx.json:
        ctx.emit(result.to_json())
    else:
        ctx.print(f"wrote {args.file} ({args.format}): {result.tensors} tensors, "
                  f"{human_size(result.nbytes)} from commit {result.commit[:10]}")
    return 0
