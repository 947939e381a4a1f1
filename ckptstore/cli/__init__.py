"""The ``ckpt`` command: inspect and maintain a ckptstore from the shell.

::

    ckpt VERB STORE_URL [ARGS] [--json] [--storage-option KEY=VALUE ...] [--progress]

Verbs: ``log``, ``show``, ``tag``, ``branch``, ``gc``, ``rebase``, ``verify``, ``du``, ``diff``,
``export``, one module each (or per group) with ``register(add)`` and ``run(ctx)``: a call into
the library plus rendering. Every verb prints aligned tables with human sizes, or with ``--json``
one JSON document on stdout and nothing else. Progress bars (verify, diff, export) go to stderr,
shown when stderr is a terminal or with ``--progress``.

Exit status: 0 success; 1 ``verify`` found problems (or ``diff --exit-code`` found differences);
2 an error (``ckpt: error: <message>`` on stderr, no traceback) or bad usage; 130 interrupted.
The store is always opened with ``create=False``: a mistyped URL is an error, never a new store.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

from .._version import __version__
from ..errors import CkptStoreError
from ..store import open as open_store
from . import diff, du, export, gc, log, refs, show, verify
from ._context import AddVerb, CliError, Context

__all__ = ["EXIT_DIFFERS", "EXIT_ERROR", "EXIT_INTERRUPTED", "EXIT_OK", "build_parser", "main",
           "parse_storage_options"]

EXIT_OK = 0
EXIT_DIFFERS = 1  # verify found problems; diff --exit-code found differences
EXIT_ERROR = 2
EXIT_INTERRUPTED = 130
_EXIT_BROKEN_PIPE = 141

_VERBS = (log, show, refs, gc, verify, du, diff, export)  # in the order of `ckpt --help`

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
--exit-code found differences), 2 an error.
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
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("store", metavar="STORE_URL",
                        help="store location: a local path, memory://name, s3://bucket/prefix, ...")
    opts = common.add_argument_group("common options")
    opts.add_argument("--json", action="store_true",
                      help="print one JSON document on stdout (for scripts)")
    opts.add_argument("--storage-option", "-o", action="append", metavar="KEY=VALUE",
                      dest="storage_options",
                      help="fsspec option for remote stores (repeatable); VALUE is JSON if it "
                           "parses, else a string; nested keys as client_kwargs.endpoint_url=URL")
    opts.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                      help="progress bars on stderr (default: when stderr is a terminal)")
    return common


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    parser = argparse.ArgumentParser(
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``ckpt`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, verbs = _build()
    try:
        if argv and argv[0] in verbs:
            # intermixed: optional positionals (REF, NAME) may follow options, as in
            # `ckpt verify URL --json main`
            args = verbs[argv[0]].parse_intermixed_args(argv[1:])
            args.verb = argv[0]
        else:
            args = parser.parse_args(argv)
    except SystemExit as e:  # --help, --version, usage errors
        return e.code if isinstance(e.code, int) else (EXIT_OK if e.code is None else EXIT_ERROR)
    out, err = sys.stdout, sys.stderr
    try:
        options = parse_storage_options(args.storage_options)
        with open_store(args.store, create=False, **options) as store:
            return args.run(Context(args, store, out, err))
    except (CkptStoreError, CliError) as e:
        print(f"ckpt: error: {e}", file=err)
        return EXIT_ERROR
    except BrokenPipeError:  # `ckpt log ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        return _EXIT_BROKEN_PIPE
    except OSError as e:  # permissions, disk full, unreachable endpoints
        print(f"ckpt: error: {e}", file=err)
        return EXIT_ERROR
    except KeyboardInterrupt:
        print("ckpt: interrupted", file=err)
        return EXIT_INTERRUPTED
