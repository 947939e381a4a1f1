"""What every verb gets (:class:`Context`), how verbs are added to the parser, and the argument
types they share."""

from __future__ import annotations

import argparse
import json
from functools import cached_property
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from ..history.repository import Repository
from ..storage import Storage
from ._output import jsonable

if TYPE_CHECKING:
    from ..store import Store

__all__ = ["AddVerb", "CliError", "Context", "Parser", "UsageError", "positive_int", "seconds"]


class CliError(Exception):
    """A problem with the command line itself (bad option value, conflicting arguments)."""


class UsageError(Exception):
    """A command line argparse rejected; ``usage`` is the verb's usage line."""

    def __init__(self, message: str, usage: str, prog: str):
        super().__init__(message)
        self.usage, self.prog = usage, prog


class Parser(argparse.ArgumentParser):
    """An argument parser that raises :class:`UsageError` instead of printing and exiting, so
    that ``main`` reports it like any error (as JSON with ``--json``)."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(message, self.format_usage(), self.prog)


class Context:
    """Parsed arguments, the store's storage, and the output streams of one ``ckpt`` run.

    ``repo`` (history and refs) needs no torch; ``store`` (the full :class:`Store`, for verbs that
    read tensors or commit) imports it on first use.
    """

    def __init__(self, args: argparse.Namespace, storage: Storage, out: TextIO, err: TextIO):
        self.args, self.storage, self.out, self.err = args, storage, out, err

    @cached_property
    def store(self) -> Store:
        from ..store import Store

        return Store(self.storage)

    @cached_property
    def repo(self) -> Repository:
        return self.store.repo if "store" in self.__dict__ else Repository(self.storage)

    def close(self, interrupted: bool = False) -> None:
        """Release the worker threads of what was opened.

        After Ctrl-C (``interrupted``) the queued chunk reads and writes are dropped first, so
        only those under way are waited for, and a failure to close is not reported: the command
        ends as interrupted.
        """
        try:
            if interrupted:  # (ctx.repo is the store's when both were opened)
                repos = [self.store.repo] if "store" in self.__dict__ else []
                repos += [self.repo] if "repo" in self.__dict__ else []
                for repo in repos:
                    repo.executor.shutdown(wait=False, cancel_futures=True)
            try:
                if "store" in self.__dict__:
                    self.store.close()
            finally:
                if "repo" in self.__dict__:
                    self.repo.close()
        except Exception:
            if not interrupted:
                raise

    @property
    def json(self) -> bool:
        """``--json``: one JSON document on stdout and nothing else."""
        return bool(self.args.json)

    @property
    def progress(self) -> bool:
        """Progress bars on stderr: ``--progress``, else when stderr is a terminal and the output
        is not ``--json``."""
        p = self.args.progress
        return bool(p) if p is not None else (not self.json and self.err.isatty())

    def print(self, *parts: object) -> None:
        print(*parts, file=self.out)

    def note(self, text: str) -> None:
        """One ``ckpt: ...`` line on stderr."""
        print(f"ckpt: {text}", file=self.err)

    def emit(self, doc: Any) -> None:
        """The ``--json`` document."""
        json.dump(jsonable(doc), self.out, indent=2, allow_nan=False)
        self.out.write("\n")


class AddVerb:
    """Adds one verb's subparser, with the options every verb takes."""

    def __init__(self, subparsers: argparse._SubParsersAction, common: argparse.ArgumentParser):
        self.subparsers, self.common = subparsers, common
        self.parsers: dict[str, argparse.ArgumentParser] = {}

    def __call__(self, name: str, help: str, description: str | None = None
                 ) -> argparse.ArgumentParser:
        p = self.subparsers.add_parser(name, parents=[self.common], help=help,
                                       description=description or help,
                                       formatter_class=argparse.RawDescriptionHelpFormatter)
        self.parsers[name] = p
        return p


def _number(text: str, cast: type, what: str) -> float:
    try:
        return cast(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not {what}") from None


def positive_int(text: str) -> int:
    """argparse type: a whole number of at least 1."""
    n = int(_number(text, int, "a whole number"))
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return n


def seconds(text: str) -> float:
    """argparse type: a number of seconds, not negative."""
    s = _number(text, float, "a number of seconds")
    if not s >= 0:
        raise argparse.ArgumentTypeError("the grace period cannot be negative")
    return s
