"""The revision grammar: ``NAME`` then any of ``~N``, ``~``, ``^`` (git's first-parent walk).

``NAME`` is a branch, a tag, a full commit id or a unique prefix of one (4+ hex digits). A
branch or tag wins over a hex prefix of the same spelling, as in git.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from ..errors import ManifestError, RefNotFound

__all__ = ["Revision", "history_loop", "parse_revision"]

_REF_RE = re.compile(r"^(?P<name>[^~^\s]+)(?P<ops>(?:~\d*|\^\d*)*)$")
_OP_RE = re.compile(r"(~|\^)(\d*)")
HEX_PREFIX_RE = re.compile(r"[0-9a-f]{4,32}")


@dataclass(frozen=True)
class Revision:
    """A parsed revision: a name and how many first parents to walk back from it."""

    name: str
    back: int = 0

    def walk(self, commit_id: str, parent_of: Callable[[str], str | None], text: str) -> str:
        """Walk ``back`` first parents from ``commit_id``; a :class:`ManifestError` where the
        line loops back to a commit it passed (only a damaged or hostile manifest makes one)."""
        seen = {commit_id}
        for _ in range(self.back):
            parent = parent_of(commit_id)
            if parent is None:
                raise RefNotFound(f"{text!r} goes past the first commit of the history")
            if parent in seen:
                raise history_loop(commit_id, parent)
            seen.add(parent)
            commit_id = parent
        return commit_id


def history_loop(commit_id: str, parent: str) -> ManifestError:
    """The error of a first-parent line that comes back to ``parent``."""
    return ManifestError(
        f"the history loops back: the parent of commit {commit_id} is {parent}, which the line "
        "already passed (a damaged or hostile manifest); give commits by id, and restore the "
        f"manifest of {commit_id} from a backup")


def parse_revision(text: str) -> Revision:
    """``"main~2"`` -> ``Revision("main", 2)``; raises :class:`RefNotFound` if it does not parse.

    >>> parse_revision("main~2^")
    Revision(name='main', back=3)
    """
    if not isinstance(text, str) or not (match := _REF_RE.match(text)):
        raise RefNotFound(f"cannot parse ref {text!r}: use a branch, tag or commit id, "
                          "optionally followed by ~N")
    back = 0
    for op, num in _OP_RE.findall(match["ops"]):
        n = int(num) if num else 1
        if op == "^" and n > 1:
            raise RefNotFound(f"{text!r}: commits have a single parent (use ~N)")
        back += n if op == "~" else 1
    return Revision(match["name"], back)
