"""The ``ckpt`` command: inspect and maintain a ckptstore from the shell.

::

    ckpt VERB STORE_URL [ARGS] [--json] [--storage-option KEY=VALUE ...] [--progress]

Verbs: ``log``, ``show``, ``tag``, ``branch``, ``gc``, ``rebase``, ``verify``, ``du``, ``diff``,
``export``, ``status``, ``push``, one module each (or per group) with ``register(add)`` and
``run(ctx)``: a call into the library plus rendering. Every verb prints aligned tables with human
sizes, or with ``--json`` one JSON document on stdout and nothing else. Progress bars (verify,
diff, export, du, gc, rebase) go to stderr, shown when stderr is a terminal or with ``--progress``.

Exit statuses are defined in :mod:`ckptstore.cli._exit` (0 ok, 1 verify/diff found
something, 2 usage or other error, 3 not found, 4 corrupted store, 5 storage failed, 130
interrupted). An error is one line on stderr, ``ckpt: error: <message>``, never a traceback
(``CKPT_TRACEBACK=1`` shows it); with ``--json`` it is one JSON object on stderr instead
(``{"error": {"type", "message", "exit_status"}}``) and stdout stays empty. Ctrl-C anywhere in a
verb ends it as ``ckpt: interrupted`` (130): the queued chunk I/O is dropped, and a failure to
close the store afterwards is not reported over it.
The store is opened with ``create=False`` (a mistyped URL is an error, never a new store), except
by ``ckpt import``, which starts one where none is.

Start-up: ``log``, ``tag``, ``branch``, ``show`` and ``du`` must not import torch (``tests/cli``
checks each): they use ``ctx.repo``, never ``ctx.store``. Verb modules import the library they
call (``..store``, ``..usage``, ``..diff``, ``..export``) inside ``run``, never at the top.

May import: everything (it is the top layer); verbs import torch-bound modules inside ``run``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any, TextIO

from .._version import __version__
from ..errors import CkptStoreError
from . import diff, du, export, gc, log, refs, show, tiers, transfer, verify
from ._context import AddVerb, CliError, Context, Parser, UsageError
from ._exit import (
    EXIT_CORRUPT,
    EXIT_DIFFERS,
    EXIT_ERROR,
    EXIT_INTERRUPTED,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_PIPE,
    EXIT_STORAGE,
    EXIT_USAGE,
    exit_status,
)
from ._open import open_existing

__all__ = ["EXIT_CORRUPT", "EXIT_DIFFERS", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_NOT_FOUND",
           "EXIT_OK", "EXIT_STORAGE", "EXIT_USAGE", "build_parser", "main",
           "parse_storage_options"]

# in the order of `ckpt --help`
_VERBS = (log, show, refs, gc, verify, du, diff, export, transfer, tiers)

_EPILOG = """\
examples:
  ckpt log ./ckpts --limit 5
  ckpt show s3://bucket/run main~2 --storage-option client_kwargs.endpoint_url=http://minio:9000
  ckpt tag ./ckpts best main~3
  ckpt gc ./ckpts --keep-last 5 --keep-every 10 --dry-run
  ckpt diff ./ckpts main~1 main --paths 'model.*'
  ckpt export ./ckpts v1.0 model.safetensors --paths 'model.*' --strip-prefix model.

REF is a branch, a tag, a commit id or a unique prefix of one (4+ hex digits), optionally followed
by ~N (N commits back) or ^ (the parent). Exit status: 0 ok, 1 verify found problems (or diff
--exit-code found differences), 2 bad usage or an error, 3 store or ref not found, 4 corrupted
store, 5 storage unreachable or failing, 130 interrupted.
"""


def parse_storage_options(items: Sequence[str] | None) -> dict[str, Any]:
    """``["key=secret", "client_kwargs.endpoint_url=http://h:9000", "anon=true"]`` ->
    nested fsspec options; values are JSON when they parse as JSON, else strings.

    >>> parse_storage_options(["anon=true", "client_kwargs.region_name=eu-west-1"])
    {'anon': True, 'client_kwargs': {'region_name': 'eu-west-1'}}
    """
    out: dict[str, Any] = {}
    for item in items or ():
        key, sep, raw = item.partition("=")
        if not sep or not key or any(not part for part in key.split(".")):
            raise CliError(f"--storage-option {item!r}: expected KEY=VALUE "
                           "(nested keys as a.b=VALUE)")
        try:
            value = json.loads(raw)
        except ValueError:
            value = raw
        node = out
        *parents, leaf = key.split(".")
        for i, p in enumerate(parents):
            node = node.setdefault(p, {})
            if not isinstance(node, dict):
                raise CliError(f"--storage-option {item!r}: "
                               f"{'.'.join(parents[: i + 1])} is already set to a value")
        if isinstance(node.get(leaf), dict) and not isinstance(value, dict):
            raise CliError(f"--storage-option {item!r}: {key} already holds nested options")
        node[leaf] = value
    return out


def _common_options() -> argparse.ArgumentParser:
    common = Parser(add_help=False)
    common.add_argument("store", metavar="STORE_URL",
                        help="store location: a local path, memory://name, s3://bucket/prefix, ...")
    opts = common.add_argument_group("common options")
    opts.add_argument("--json", action="store_true",
                      help="print one JSON document on stdout (for scripts); errors as one "
                           "JSON object on stderr")
    opts.add_argument("--storage-option", "-o", action="append", metavar="KEY=VALUE",
                      dest="storage_options",
                      help="fsspec option for remote stores (repeatable); VALUE is JSON if it "
                           "parses, else a string; nested keys as client_kwargs.endpoint_url=URL")
    opts.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="progress bars on stderr (default: when stderr is a terminal, "
                           "except with --json)")
    return common


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = Parser(
        prog="ckpt", description="Inspect and maintain a ckptstore: a versioned store of "
        "PyTorch checkpoints.", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"ckpt (ckptstore) {__version__}")
    add = AddVerb(parser.add_subparsers(dest="verb", metavar="VERB", required=True),
                  _common_options())
    for verb in _VERBS:
        verb.register(add)
    return parser, add.parsers


def build_parser() -> argparse.ArgumentParser:
    """The ``ckpt`` argument parser: one subcommand per verb."""
    return _build()[0]


def _report(e: BaseException, status: int, as_json: bool, err: TextIO) -> None:
    """One line on stderr: ``ckpt: error: ...``, or with ``--json`` one JSON object."""
    message = " ".join(str(e).split()) or type(e).__name__
    if isinstance(e, KeyboardInterrupt):
        message = "interrupted"
    elif status == EXIT_ERROR and not isinstance(e, (CkptStoreError, CliError, UsageError)):
        message = f"{type(e).__name__}: {message} (CKPT_TRACEBACK=1 shows where)"
    if as_json:
        doc = {"error": {"type": type(e).__name__, "message": message, "exit_status": status}}
        err.write(json.dumps(doc) + "\n")
    elif isinstance(e, UsageError):
        err.write(e.usage + f"{e.prog}: error: {message}\n")
    else:
        err.write(f"ckpt: {'' if status == EXIT_INTERRUPTED else 'error: '}{message}\n")


def _parse(argv: list[str]) -> argparse.Namespace:
    parser, verbs = _build()
    if argv and argv[0] in verbs:
        # intermixed: optional positionals (REF, NAME) may follow options, as in
        # `ckpt verify URL --json main`
        args = verbs[argv[0]].parse_intermixed_args(argv[1:])
        args.verb = argv[0]
        return args
    return parser.parse_args(argv)


def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    options = parse_storage_options(args.storage_options)
    if getattr(args, "verb", None) == "import":  # the one verb that may start a store
        from ..opening import open as open_store

        open_store(args.store, **options).close()
    storage = open_existing(args.store, options)
    ctx = Context(args, storage, out, err)
    interrupted = False
    try:
        return args.run(ctx)
    except KeyboardInterrupt:
        interrupted = True
        raise
    finally:
        ctx.close(interrupted)


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ckpt`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    out, err = sys.stdout, sys.stderr
    as_json = "--json" in argv
    try:
        return _run(_parse(argv), out, err)
    except SystemExit as e:  # --help, --version
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_USAGE)
    except BrokenPipeError:  # `ckpt log ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        return EXIT_PIPE
    except (Exception, KeyboardInterrupt) as e:  # one line, never a traceback
        if os.environ.get("CKPT_TRACEBACK") and not isinstance(e, KeyboardInterrupt):
            raise
        status = EXIT_USAGE if isinstance(e, (UsageError, CliError)) else exit_status(e)
        _report(e, status, as_json, err)
        return status
