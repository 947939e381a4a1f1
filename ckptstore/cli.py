"""The ``ckpt`` command: inspect and maintain a ckptstore from the shell.

::

    ckpt VERB STORE_URL [ARGS] [--json] [--storage-option KEY=VALUE ...] [--progress]

Verbs: ``log``, ``show``, ``tag``, ``branch``, ``gc``, ``verify``, ``du``, ``diff``, ``export``.
Every verb prints aligned tables with human sizes, or with ``--json`` one JSON document on stdout
and nothing else. Progress bars (verify, diff, export) go to stderr, shown when stderr is a
terminal or with ``--progress``.

Exit status: 0 success; 1 ``verify`` found problems (or ``diff --exit-code`` found differences);
2 an error (``ckpt: error: <message>`` on stderr, no traceback) or bad usage; 130 interrupted.
The store is always opened with ``create=False``: a mistyped URL is an error, never a new store.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import fnmatch
import hashlib
import json
import math
import os
import re
import struct
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from typing import Any, TextIO

import numpy as np
import torch

from ._version import __version__
from . import open as open_store
from .arrays import storage_dtype, tensor_to_host, torch_dtype
from .errors import CkptStoreError, ManifestError
from .layout import COMMITS, DATA, is_commit_id
from .manifest import Manifest, TensorEntry
from .plan import PACKED_ARRAY
from .state import flatten, tree_paths
from .ids import commit_time
from .store import Store

__all__ = ["build_parser", "human_size", "main", "parse_storage_options"]

BATCH_BYTES = 256 * 2**20  # tensors read per round trip by diff and export
MAX_METADATA_VALUE = 1024  # longest JSON text of a plain leaf that export puts in __metadata__

# torch dtype name (as in manifests) -> safetensors dtype code
SAFETENSORS_DTYPES = {
    "float64": "F64", "float32": "F32", "float16": "F16", "bfloat16": "BF16",
    "int64": "I64", "int32": "I32", "int16": "I16", "int8": "I8",
    "uint64": "U64", "uint32": "U32", "uint16": "U16", "uint8": "U8", "bool": "BOOL",
    "float8_e4m3fn": "F8_E4M3", "float8_e5m2": "F8_E5M2",
    "float8_e4m3fnuz": "F8_E4M3FNUZ", "float8_e5m2fnuz": "F8_E5M2FNUZ",
    "complex64": "C64",
}


class CliError(Exception):
    """A problem with the command line itself (bad option value, existing output file)."""


# -- formatting ----------------------------------------------------------------------------------
def human_size(n: int | None) -> str:
    """``1536`` -> ``"1.5 KiB"``; bytes below 1 KiB are exact (``"512 B"``).

    >>> human_size(512), human_size(1536), human_size(3 * 2**30)
    ('512 B', '1.5 KiB', '3.0 GiB')
    """
    if n is None:
        return "-"
    if abs(n) < 1024:
        return f"{n} B"
    value = float(n)
    for unit in ("KiB", "MiB", "GiB", "TiB", "PiB"):
        value /= 1024
        if abs(value) < 1024 or unit == "PiB":
            return f"{value:.1f} {unit}"
    raise AssertionError("unreachable")


def _n(count: int, noun: str) -> str:
    """``_n(1, "commit")`` -> ``"1 commit"``, ``_n(2, "commit")`` -> ``"2 commits"``."""
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def _time(t: _dt.datetime) -> str:
    return t.astimezone(_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _shape(shape: Sequence[int]) -> str:
    return "[" + ", ".join(map(str, shape)) + "]"


def _one_line(text: str, width: int = 72) -> str:
    line = text.splitlines()[0] if text else ""
    return line if len(line) <= width else line[: width - 3] + "..."


def _short_value(v: Any, width: int = 60) -> str:
    if isinstance(v, bytes):
        return f"<{len(v)} bytes>"
    return _one_line(repr(v), width)


def table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: str = "") -> str:
    """Aligned text table; ``right`` holds the header names of right-aligned (numeric) columns.

    The last column is not padded, so lines carry no trailing blanks.
    """
    cells = [[str(h) for h in headers]] + [["" if c is None else str(c) for c in r] for r in rows]
    widths = [max(len(r[i]) for r in cells) for i in range(len(headers))]
    lines = []
    for r in cells:
        parts = []
        for i, c in enumerate(r):
            last = i == len(r) - 1
            if headers[i] in right:
                parts.append(c.rjust(widths[i]))
            else:
                parts.append(c if last else c.ljust(widths[i]))
        lines.append("  ".join(parts).rstrip())
    return "\n".join(lines)


def _jsonable(v: Any) -> Any:
    """Plain JSON: non-finite floats become strings, bytes become their length and sha256."""
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, bytes):
        return {"bytes": len(v), "sha256": hashlib.sha256(v).hexdigest()}
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, _dt.datetime):
        return v.isoformat()
    return v


# -- options -------------------------------------------------------------------------------------
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


def _positive_int(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError(f"{text} must be at least 1")
    return n


def _seconds(text: str) -> float:
    try:
        s = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not s >= 0:
        raise argparse.ArgumentTypeError("the grace period cannot be negative")
    return s


# -- shared helpers ------------------------------------------------------------------------------
class Context:
    """What every verb gets: parsed arguments, the open store, output streams."""

    def __init__(self, args: argparse.Namespace, store: Store, out: TextIO, err: TextIO):
        self.args, self.store, self.out, self.err = args, store, out, err

    @property
    def json(self) -> bool:
        return bool(self.args.json)

    @property
    def progress(self) -> bool:
        p = self.args.progress
        return bool(p) if p is not None else self.err.isatty()

    def print(self, *parts: Any) -> None:
        print(*parts, file=self.out)

    def note(self, text: str) -> None:
        print(f"ckpt: {text}", file=self.err)

    def emit(self, doc: Any) -> None:
        json.dump(_jsonable(doc), self.out, indent=2, allow_nan=False)
        self.out.write("\n")

    def bar(self, total: int, desc: str, unit: str = "B") -> Any:
        from tqdm import tqdm
        scale = {"unit_scale": True, "unit_divisor": 1024} if unit == "B" else {}
        return tqdm(total=total, desc=desc, unit=unit, file=self.err, disable=not self.progress,
                    leave=False, **scale)


def _decorations(store: Store) -> dict[str, list[str]]:
    """``{commit id: ["main", "tag: v1"]}`` from branches and tags."""
    out: dict[str, list[str]] = {}
    for name, c in sorted(store.branches().items()):
        out.setdefault(c, []).append(name)
    for name, c in sorted(store.tags().items()):
        out.setdefault(c, []).append(f"tag: {name}")
    return out


def _leaves(m: Manifest) -> tuple[dict[str, int], dict[str, Any]]:
    """``({dotted path: tensor index}, {dotted path: plain value})`` of a commit's state."""
    tensors: dict[str, int] = {}
    values: dict[str, Any] = {}
    for path, node in tree_paths(m.tree).items():
        if "tensor" in node:
            tensors[path] = node["tensor"]
        elif "value" in node:
            values[path] = node["value"]
        elif "bigint" in node:
            values[path] = int(node["bigint"])
    return tensors, values


def _entry_bytes(e: TensorEntry) -> int:
    """Bytes of a tensor in memory (what it costs to read it)."""
    return math.prod(e.shape) * storage_dtype(torch_dtype(e.dtype)).itemsize


def _as_tensor(value: Any) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value
    a = np.asarray(value)  # (np.ascontiguousarray would make a 0-d array 1-d)
    return torch.from_numpy(a if a.flags.c_contiguous else a.copy())


def _glob_escape(path: str) -> str:
    """A glob that matches exactly ``path`` (``*``, ``?`` and ``[`` made literal)."""
    return re.sub(r"([*?[])", r"[\1]", path)


def iter_tensors(store: Store, commit_id: str, paths: Sequence[str], sizes: Sequence[int],
                 everything: bool = False) -> Iterator[torch.Tensor]:
    """The tensors at dotted ``paths`` of a commit, in that order, checked out about
    :data:`BATCH_BYTES` at a time (``sizes`` are their bytes), so a large state is never in
    memory at once. ``everything``: ``paths`` are all the commit's tensors (one checkout of the
    whole state when it fits in a batch)."""
    batch: list[str] = []
    size = 0
    for n, (path, nbytes) in enumerate(zip(paths, sizes)):
        batch.append(path)
        size += nbytes
        if size < BATCH_BYTES and n < len(paths) - 1:
            continue
        whole = everything and len(batch) == len(paths)
        state = store.checkout(commit_id, paths=None if whole else [_glob_escape(p)
                                                                      for p in batch])
        found = {leaf.path: leaf.value for leaf in flatten(state)[1]}
        for p in batch:
            if p not in found:
                raise CliError(f"commit {commit_id[:10]}: cannot read {p!r} on its own (another "
                               "entry has the same dotted path)")
            yield _as_tensor(found[p])
        batch, size = [], 0


def _select(paths: dict[str, Any], patterns: Sequence[str] | None) -> dict[str, Any]:
    """Entries whose dotted path, or one of its containers, matches a glob (as checkout's
    ``paths=``: ``"model"`` selects everything under ``model``)."""
    if not patterns:
        return paths

    def hit(path: str) -> bool:
        prefixes = [path[:k] for k, ch in enumerate(path) if ch == "."] + [path]
        return any(fnmatch.fnmatchcase(x, pat) for x in prefixes for pat in patterns)

    return {p: v for p, v in paths.items() if hit(p)}


# -- log -----------------------------------------------------------------------------------------
def cmd_log(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    if args.ref == "main" and not store.branches():
        commits = []  # a store without commits: empty history, not an error
    else:
        commits = store.log(args.ref, limit=args.limit)
    decor = _decorations(store)
    if ctx.json:
        ctx.emit([{**c.to_json(), "refs": decor.get(c.id, [])} for c in commits])
        return 0
    if not commits:
        ctx.print("no commits")
        return 0
    rows = []
    for c in commits:
        refs = decor.get(c.id)
        message = (f"({', '.join(refs)}) " if refs else "") + _one_line(c.message)
        rows.append([c.short_id, _time(c.time), "-" if c.step is None else c.step,
                     human_size(c.stored_bytes), message])
    ctx.print(table(["COMMIT", "TIME (UTC)", "STEP", "STORED", "MESSAGE"], rows,
                    right=("STEP", "STORED")))
    return 0


# -- show ----------------------------------------------------------------------------------------
class DataIndex:
    """Stored sizes of ``data/<commit>/`` folders and their arrays, and which arrays an entry
    reads (following a chain entry into its base commits down to the full baseline)."""

    def __init__(self, store: Store):
        self.store = store
        self._folders: dict[str, int] = {}
        self._arrays: dict[str, dict[str, int]] = {}
        self._paths: dict[str, dict[str, TensorEntry]] = {}

    def add(self, key: str, size: int) -> None:
        """Count one file ``data/<commit>/...`` (from a listing of the store)."""
        parts = key.split("/")
        if len(parts) < 3 or parts[0] != DATA:
            return
        self._folders[parts[1]] = self._folders.get(parts[1], 0) + size
        arrays = self._arrays.setdefault(parts[1], {})
        if len(parts) >= 4:  # data/<commit>/<array>/...; data/<commit>/zarr.json is the group
            arrays[parts[2]] = arrays.get(parts[2], 0) + size

    def _walk(self, commit: str) -> None:
        if commit not in self._folders:
            self._folders[commit] = 0
            self._arrays[commit] = {}
            for key, n in self.store.storage.walk_sizes(f"{DATA}/{commit}").items():
                self.add(key, n)

    def folder_bytes(self, commit: str) -> int:
        self._walk(commit)
        return self._folders[commit]

    def folders(self) -> dict[str, int]:
        return dict(self._folders)

    def array_bytes(self, commit: str, array: str) -> int | None:
        self._walk(commit)
        return self._arrays[commit].get(array)

    def reads(self, e: TensorEntry) -> list[tuple[str, str]]:
        """``(commit, array)`` of every stored array rebuilding entry ``e`` reads."""
        out: list[tuple[str, str]] = []
        for _ in range(10_000):
            if e.layout == "array":
                out.append((e.commit, e.array))
            elif e.layout == "packed":
                out.append((e.commit, PACKED_ARRAY))
            out.extend((b.commit, b.array) for b in (getattr(e, "parts", None) or {}).values())
            base = getattr(e, "base_commit", None)
            if e.kind == "full" or base is None:
                return out
            if base not in self._paths:
                self._paths[base] = {t.path: t for t in self.store.manifest(base).tensors}
            if e.path not in self._paths[base]:
                raise ManifestError(f"base commit {base} has no tensor {e.path!r}")
            e = self._paths[base][e.path]
        raise ManifestError(f"the chain of {e.path!r} does not end (a cycle?)")

    def commit_reads(self, m: Manifest) -> set[tuple[str, str]]:
        """Every ``(commit, array)`` checking out all of ``m`` reads."""
        out = {r for e in (*m.tensors, *m.storages) for r in self.reads(e)}
        if m.packed is not None:
            out.add((m.id, PACKED_ARRAY))
        return out


def cmd_show(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    commit_id = store.resolve(args.ref)
    m = store.manifest(commit_id)
    info = store.info(commit_id)
    refs = _decorations(store).get(commit_id, [])
    index = DataIndex(store)
    tensor_paths, values = _leaves(m)
    wanted = set(_select(tensor_paths, args.paths).values())
    values = _select(values, args.paths)

    rows = []
    for i, e in enumerate(m.tensors):
        if i not in wanted:
            continue
        stored: int | None = None
        note = ""
        if e.layout == "array":
            stored = index.array_bytes(e.commit, e.array)
        elif e.layout == "alias":
            note = f"same tensor as {m.tensors[e.base].path}"
        elif e.layout == "view":
            note = f"view of {m.storages[e.base].path}"
        elif e.layout == "chain":  # stored: this commit's own parts; the rest is in the bases
            parts = (getattr(e, "parts", None) or {}).values()
            stored = sum(index.array_bytes(b.commit, b.array) or 0 for b in parts)
            base = getattr(e, "base_commit", None) or "?"
            more = len(index.reads(e)) - len(parts)
            note = f"{e.kind} on {base[:10]}; reads {_n(more, 'older array')}"
        if e.commit and e.commit != m.id:
            note = (note + "; " if note else "") + f"data of commit {e.commit[:10]}"
        rows.append({"path": e.path, "dtype": e.dtype, "shape": list(e.shape), "layout": e.layout,
                     "nbytes": _entry_bytes(e), "stored_bytes": stored, "commit": e.commit,
                     "array": e.array, "note": note})
    packed_stored = index.array_bytes(m.id, PACKED_ARRAY) if m.packed is not None else None

    if ctx.json:
        doc = info.to_json()
        doc.update(generation=m.generation, refs=refs, tensor_count=len(m.tensors),
                   tensors=rows, values=values,
                   packed=None if m.packed is None else {"nbytes": m.packed.nbytes,
                                                         "stored_bytes": packed_stored})
        ctx.emit(doc)
        return 0

    head = [("commit", m.id), ("parent", m.parent or "-")]
    if refs:
        head.append(("refs", ", ".join(refs)))
    head += [("time", f"{_time(info.time)} UTC"), ("message", m.message or "-")]
    for k, v in m.metadata.items():
        head.append((f"{k}", _short_value(v)))
    head.append(("tensors", (f"{len(m.tensors)} ({human_size(m.logical_bytes)} in memory, "
                            f"{human_size(m.stored_bytes)} stored)")))
    if m.packed is not None:
        n_packed = sum(e.layout == "packed" for e in (*m.tensors, *m.storages))
        head.append(("packed", (f"{_n(n_packed, 'small tensor')} in one array, "
                               f"{human_size(packed_stored)} stored")))
    width = max(len(k) for k, _ in head)
    for k, v in head:
        ctx.print(f"{k.ljust(width)}  {v}")
    if rows:
        ctx.print()
        ctx.print(table(["PATH", "DTYPE", "SHAPE", "LAYOUT", "STORED", "NOTE"],
                        [[r["path"], r["dtype"], _shape(r["shape"]), r["layout"],
                          human_size(r["stored_bytes"]), r["note"]] for r in rows],
                        right=("STORED",)))
    if values:
        ctx.print()
        ctx.print(table(["PATH", "VALUE"], [[p, _short_value(v)] for p, v in values.items()]))
    return 0


# -- tag / branch --------------------------------------------------------------------------------
def _ref_rows(store: Store, refs: dict[str, str]) -> list[dict[str, Any]]:
    rows = []
    for name, c in sorted(refs.items()):
        row: dict[str, Any] = {"name": name, "id": c}
        try:
            info = store.info(c)
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
        when = _time(_dt.datetime.fromisoformat(r["time"])) if r["time"] else "-"
        msg = "(commit missing)" if r.get("missing") else _one_line(r["message"] or "")
        out.append([r["name"], r["id"][:10], when, "-" if r["step"] is None else r["step"], msg])
    ctx.print(table(["NAME", "COMMIT", "TIME (UTC)", "STEP", "MESSAGE"], out, right=("STEP",)))


def _list_or_delete(ctx: Context, kind: str, refs: dict[str, str],
                    delete: Callable[[str], None]) -> bool:
    """Handle ``--delete NAME`` and the no-name listing of ``ckpt tag`` / ``ckpt branch``;
    False when the verb has more to do."""
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
        rows = _ref_rows(ctx.store, refs)
        if ctx.json:
            ctx.emit(rows)
        else:
            _print_refs(ctx, rows, "tags" if kind == "tag" else "branches")
        return True
    return False


def cmd_tag(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    if _list_or_delete(ctx, "tag", store.tags(), store.delete_tag):
        return 0
    commit_id = store.tag(args.name, args.ref or "main")
    if ctx.json:
        ctx.emit({"tag": args.name, "id": commit_id})
    else:
        ctx.print(f"tagged {commit_id[:10]} as {args.name}")
    return 0


def cmd_branch(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    if _list_or_delete(ctx, "branch", store.branches(), store.delete_branch):
        return 0
    ref = args.ref or "main"
    if args.force and args.name in store.branches():
        commit_id, verb = store.reset_branch(args.name, ref), "moved"
    else:
        commit_id, verb = store.branch(args.name, ref), "created"
    if ctx.json:
        ctx.emit({"branch": args.name, "id": commit_id, "action": verb})
    else:
        ctx.print(f"{verb} branch {args.name} {'to' if verb == 'moved' else 'at'} "
                  f"{commit_id[:10]}")
    return 0


# -- gc ------------------------------------------------------------------------------------------
def cmd_gc(ctx: Context) -> int:
    args = ctx.args
    result = ctx.store.gc(keep_last=args.keep_last, keep_tags=not args.no_keep_tags,
                          keep_every=args.keep_every, dry_run=args.dry_run,
                          grace_period=args.grace)
    if ctx.json:
        ctx.emit(result.to_json())
        return 0
    verb = "would remove" if result.dry_run else "removed"
    for c in result.commits_removed:
        ctx.print(f"{verb} commit {c}")
    for d in result.data_removed:
        ctx.print(f"{verb} data   {DATA}/{d}")
    for t in result.tags_removed:
        ctx.print(f"{verb} tag    {t}")
    summary = (f"{_n(len(result.commits_removed), 'commit')}, "
               f"{_n(len(result.data_removed), 'data folder')}, "
               f"{_n(len(result.tags_removed), 'tag')}")
    if result.dry_run:
        ctx.print(f"dry run: would remove {summary} and free {human_size(result.bytes_freed)}; "
                  f"nothing was removed ({_n(len(result.kept), 'commit')} kept)")
    else:
        ctx.print(f"removed {summary}, {_n(result.ref_files_removed, 'old ref file')}; "
                  f"freed {human_size(result.bytes_freed)} ({_n(len(result.kept), 'commit')} "
                  "kept)")
    return 0


# -- rebase --------------------------------------------------------------------------------------
def cmd_rebase(ctx: Context) -> int:
    args = ctx.args
    info = ctx.store.rebase(args.ref, branch=args.branch, message=args.message or "")
    if ctx.json:
        ctx.emit(info.to_json())
    else:
        ctx.print(f"wrote full commit {info.short_id} ({human_size(info.stored_bytes)}) with the "
                  f"state of {args.ref}; `ckpt gc --keep-last 1` can now drop older chains")
    return 0


# -- verify --------------------------------------------------------------------------------------
def cmd_verify(ctx: Context) -> int:
    report = ctx.store.verify(ctx.args.ref, progress=ctx.progress)
    if ctx.json:
        ctx.emit(report.to_json())
    else:
        for p in report.problems:
            ctx.print(p)
        what = (f"{_n(report.commits_checked, 'commit')}, "
                f"{_n(report.chunks_checked, 'chunk')}, {human_size(report.bytes_checked)}")
        if report.ok:
            ctx.print(f"ok: checked {what}")
        else:
            ctx.print(f"{_n(len(report.problems), 'problem')} in {what}")
    return 0 if report.ok else 1


# -- du ------------------------------------------------------------------------------------------
def cmd_du(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    storage = store.storage
    index = DataIndex(store)
    manifest_bytes: dict[str, int] = {}
    store_total = None
    if args.ref is None:  # the whole store, from one listing
        store_total = 0
        for key, n in storage.walk_sizes("").items():
            store_total += n
            index.add(key, n)
            parts = key.split("/")
            if parts[0] == COMMITS and len(parts) == 2 and parts[1].endswith(".msgpack"):
                manifest_bytes[parts[1][: -len(".msgpack")]] = n
        ids = sorted((c for c in manifest_bytes if is_commit_id(c)), key=commit_time,
                     reverse=True)[: args.limit]
    else:
        ids = [c.id for c in store.log(args.ref, limit=args.limit)]

    decor = _decorations(store)
    rows: list[dict[str, Any]] = []
    outside: set[tuple[str, str]] = set()  # arrays of commits not listed that listed ones read
    for c in ids:
        row: dict[str, Any] = {"id": c, "refs": decor.get(c, [])}
        try:
            m = store.manifest(c)
            shared = {r for r in index.commit_reads(m) if r[0] != c}
            row.update(time=_dt.datetime.fromtimestamp(m.time, _dt.timezone.utc).isoformat(),
                       step=m.metadata.get("step"), message=m.message)
        except CkptStoreError as e:
            shared = set()
            row.update(time=None, step=None, message=None, error=str(e))
        if c not in manifest_bytes:
            manifest_bytes[c] = storage.size(f"{COMMITS}/{c}.msgpack")
        row.update(own_bytes=index.folder_bytes(c),
                   shared_bytes=sum(index.array_bytes(*r) or 0 for r in shared),
                   reads=sorted({r[0] for r in shared}), manifest_bytes=manifest_bytes[c])
        row["total_bytes"] = row["own_bytes"] + row["shared_bytes"]
        outside |= shared
        rows.append(row)
    listed = set(ids)
    data_total = (sum(index.folder_bytes(c) for c in ids)
                  + sum(index.array_bytes(*r) or 0 for r in outside if r[0] not in listed))
    manifests_total = sum(manifest_bytes[c] for c in ids)
    leftovers = [] if args.ref is not None else [
        {"id": d, "own_bytes": n} for d, n in sorted(index.folders().items())
        if d not in manifest_bytes and is_commit_id(d)]
    doc = {"commits": rows, "leftover_data": leftovers, "data_bytes": data_total,
           "manifest_bytes": manifests_total, "total_bytes": data_total + manifests_total,
           "store_bytes": store_total}
    if ctx.json:
        ctx.emit(doc)
        return 0
    out = []
    for r in rows:
        when = _time(_dt.datetime.fromisoformat(r["time"])) if r["time"] else "-"
        note = ", ".join(r["refs"]) if "error" not in r else "manifest unreadable"
        out.append([r["id"][:10], when, "-" if r["step"] is None else r["step"],
                    human_size(r["own_bytes"]), human_size(r["shared_bytes"]),
                    human_size(r["total_bytes"]), note])
    for d in leftovers:
        out.append([d["id"][:10], "-", "-", human_size(d["own_bytes"]), human_size(0),
                    human_size(d["own_bytes"]), "leftover data without a manifest (gc removes)"])
    ctx.print(table(["COMMIT", "TIME (UTC)", "STEP", "OWN", "SHARED", "TOTAL", "REFS"], out,
                    right=("STEP", "OWN", "SHARED", "TOTAL")))
    ctx.print(f"total: {human_size(doc['total_bytes'])} to keep {_n(len(rows), 'commit')} "
              f"({human_size(data_total)} data, {human_size(manifests_total)} manifests)")
    if store_total is not None:
        ctx.print(f"store: {human_size(store_total)} in all (refs, leftovers and markers "
                  "included)")
    return 0


# -- diff ----------------------------------------------------------------------------------------
def max_abs_diff(a: torch.Tensor, b: torch.Tensor, step: int = 1 << 22) -> float | None:
    """Largest ``|a - b|`` over elements of two same-shape tensors (positions where both hold
    the same value, NaN included, count as 0); None if the dtypes cannot be subtracted."""
    a, b = a.reshape(-1), b.reshape(-1)
    if a.dtype == torch.bool and b.dtype == torch.bool:
        return float(bool((a != b).any()))
    work = torch.complex128 if (a.dtype.is_complex or b.dtype.is_complex) else torch.float64
    best = 0.0
    try:
        for lo in range(0, a.numel(), step):
            x, y = a[lo: lo + step].to(work), b[lo: lo + step].to(work)
            d = (x - y).abs()
            same = (x == y) | (torch.isnan(x) & torch.isnan(y))
            d = torch.where(same, torch.zeros((), dtype=d.dtype), d)
            m = float(d.max())
            if math.isnan(m):
                return math.nan
            best = max(best, m)
    except (RuntimeError, TypeError):
        return None
    return best


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.contiguous().reshape(-1).view(torch.uint8),
                       b.contiguous().reshape(-1).view(torch.uint8))


def cmd_diff(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    id1, id2 = store.resolve(args.ref1), store.resolve(args.ref2)
    m1, m2 = store.manifest(id1), store.manifest(id2)
    t1, v1 = _leaves(m1)
    t2, v2 = _leaves(m2)
    n1, n2 = len(t1), len(t2)  # every tensor of each commit, before --paths
    t1, t2 = _select(t1, args.paths), _select(t2, args.paths)
    v1, v2 = _select(v1, args.paths), _select(v2, args.paths)

    def desc(m: Manifest, i: int) -> dict[str, Any]:
        e = m.tensors[i]
        return {"dtype": e.dtype, "shape": list(e.shape)}

    added = [{"path": p, **desc(m2, i)} for p, i in t2.items() if p not in t1]
    removed = [{"path": p, **desc(m1, i)} for p, i in t1.items() if p not in t2]
    changed: list[dict[str, Any]] = []
    unchanged = 0
    common = [(p, t1[p], t2[p]) for p in t1 if p in t2]
    to_read = []
    for p, i, j in common:
        e, f = m1.tensors[i], m2.tensors[j]
        if id1 == id2 or _same_data(e, f):
            unchanged += 1
        elif e.dtype != f.dtype or list(e.shape) != list(f.shape):
            changed.append({"path": p, "old": desc(m1, i), "new": desc(m2, j),
                            "max_abs_diff": None})
        else:
            to_read.append((p, i, j))

    results: dict[str, dict[str, Any]] = {c["path"]: c for c in changed}
    if to_read:
        total = sum(_entry_bytes(m1.tensors[i]) for _, i, _ in to_read)
        paths = [p for p, _, _ in to_read]
        sizes = [_entry_bytes(m1.tensors[i]) for _, i, _ in to_read]
        with ctx.bar(total, "diff") as bar:
            old = iter_tensors(store, id1, paths, sizes, everything=len(paths) == n1)
            new = iter_tensors(store, id2, paths, sizes, everything=len(paths) == n2)
            for (p, i, j), a, b in zip(to_read, old, new):
                if _same_bits(a, b):
                    unchanged += 1
                else:
                    results[p] = {"path": p, "old": desc(m1, i), "new": desc(m2, j),
                                  "max_abs_diff": max_abs_diff(a, b)}
                bar.update(_entry_bytes(m1.tensors[i]))
    changed = [results[p] for p, _, _ in common if p in results]

    values_changed = [{"path": p, "old": v1[p], "new": v2[p]} for p in v1
                      if p in v2 and (type(v1[p]), v1[p]) != (type(v2[p]), v2[p])
                      and not (_is_nan(v1[p]) and _is_nan(v2[p]))]
    values_added = [{"path": p, "value": v} for p, v in v2.items() if p not in v1]
    values_removed = [{"path": p, "value": v} for p, v in v1.items() if p not in v2]
    differs = bool(changed or added or removed or values_changed or values_added
                   or values_removed)
    status = 1 if (args.exit_code and differs) else 0
    if ctx.json:
        ctx.emit({"ref1": id1, "ref2": id2, "changed": changed, "added": added,
                  "removed": removed, "unchanged": unchanged, "values_changed": values_changed,
                  "values_added": values_added, "values_removed": values_removed})
        return status
    rows = []
    for c in changed:
        old, new = c["old"], c["new"]
        if old == new:
            what = f"{new['dtype']} {_shape(new['shape'])}"
        else:
            what = f"{old['dtype']} {_shape(old['shape'])} -> {new['dtype']} {_shape(new['shape'])}"
        mad = c["max_abs_diff"]
        rows.append(["changed", c["path"], what, "-" if mad is None else f"{mad:.6g}"])
    for kind, items in (("added", added), ("removed", removed)):
        for a in items:
            rows.append([kind, a["path"], f"{a['dtype']} {_shape(a['shape'])}", "-"])
    for c in values_changed:
        rows.append(["changed", c["path"], (f"{_short_value(c['old'], 30)} -> "
                                           f"{_short_value(c['new'], 30)}"), "-"])
    for kind, items in (("added", values_added), ("removed", values_removed)):
        for a in items:
            rows.append([kind, a["path"], _short_value(a["value"], 40), "-"])
    if rows:
        ctx.print(table(["STATUS", "PATH", "WHAT", "MAX ABS DIFF"], rows,
                        right=("MAX ABS DIFF",)))
    ctx.print(f"{id1[:10]} -> {id2[:10]}: {_n(len(changed), 'tensor')} changed, "
              f"{len(added)} added, {len(removed)} removed, {unchanged} unchanged; "
              f"{_n(len(values_changed), 'value')} changed, {len(values_added)} added, "
              f"{len(values_removed)} removed")
    return status


def _same_data(e: TensorEntry, f: TensorEntry) -> bool:
    """Both entries read the very same stored array (no need to read it)."""
    return (e.layout == f.layout == "array" and e.kind == f.kind
            and (e.commit, e.array, e.dtype, e.shape) == (f.commit, f.array, f.dtype, f.shape))


def _is_nan(v: Any) -> bool:
    return isinstance(v, float) and math.isnan(v)


# -- export --------------------------------------------------------------------------------------
def _export_key(path: str, strip: str | None) -> str:
    return path[len(strip):] if strip and path.startswith(strip) else path


def write_safetensors(file: str, header_entries: list[tuple[str, str, list[int], int]],
                      metadata: dict[str, str],
                      chunks: Iterator[tuple[str, np.ndarray]],
                      on_bytes: Callable[[int], None] = lambda n: None) -> int:
    """Stream a safetensors file: the header first (known from the manifest), then each tensor's
    little-endian bytes in header order. Written to a temporary file, then renamed into place.

    ``header_entries`` are ``(key, safetensors dtype, shape, nbytes)``; ``chunks`` yields
    ``(key, host array)`` in the same order. Returns the file size.
    """
    header: dict[str, Any] = {"__metadata__": metadata}
    offset = 0
    for key, dtype, shape, nbytes in header_entries:
        header[key] = {"dtype": dtype, "shape": list(shape), "data_offsets": [offset,
                                                                             offset + nbytes]}
        offset += nbytes
    head = json.dumps(header, separators=(",", ":")).encode()
    head += b" " * (-len(head) % 8)
    directory = os.path.dirname(os.path.abspath(file))
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".ckpt-export-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(struct.pack("<Q", len(head)))
            f.write(head)
            expected = iter(header_entries)
            for key, arr in chunks:
                want_key, _, _, nbytes = next(expected)
                arr = np.ascontiguousarray(arr)
                arr = arr.astype(arr.dtype.newbyteorder("<"), copy=False)
                if key != want_key or arr.nbytes != nbytes:
                    raise CkptStoreError(f"export: {key!r} has {arr.nbytes} bytes, "
                                         f"the manifest says {nbytes}")
                f.write(memoryview(arr.reshape(-1)).cast("B"))
                on_bytes(nbytes)
            if next(expected, None) is not None:
                raise CkptStoreError("export: fewer tensors were read than the manifest lists")
        os.replace(tmp, file)
    except BaseException:
        os.unlink(tmp)
        raise
    return len(head) + 8 + offset


def cmd_export(ctx: Context) -> int:
    store, args = ctx.store, ctx.args
    if os.path.exists(args.file) and not args.force:
        raise CliError(f"{args.file} exists; use --force to overwrite it")
    if not os.path.isdir(os.path.dirname(os.path.abspath(args.file))):
        raise CliError(f"cannot write {args.file}: its folder does not exist")
    commit_id = store.resolve(args.ref)
    m = store.manifest(commit_id)
    all_tensors, values = _leaves(m)
    tensors, values = _select(all_tensors, args.paths), _select(values, args.paths)
    strip = args.strip_prefix

    entries: list[tuple[str, str, list[int], int]] = []  # (key, dtype code, shape, bytes)
    paths: list[str] = []
    skipped: list[str] = []
    seen: dict[str, str] = {}
    for path, i in tensors.items():
        e = m.tensors[i]
        code = SAFETENSORS_DTYPES.get(e.dtype)
        if code is None:
            skipped.append(f"{path} ({e.dtype}: no safetensors dtype)")
            continue
        key = _export_key(path, strip)
        if key in seen:
            raise CliError(f"two tensors export under the same key {key!r} ({seen[key]!r} and "
                           f"{path!r}); choose another --strip-prefix or --paths")
        seen[key] = path
        shape = [] if e.container == "numpy-scalar" else list(e.shape)
        entries.append((key, code, shape, _entry_bytes(e)))
        paths.append(path)

    metadata = {"format": "pt", "ckptstore.commit": commit_id}
    for path, v in values.items():
        key = _export_key(path, strip)
        text = None if isinstance(v, bytes) else json.dumps(v, allow_nan=True)
        if text is None or len(text) > MAX_METADATA_VALUE or key in metadata:
            skipped.append(f"{path} (plain value: bytes, longer than {MAX_METADATA_VALUE} "
                           "characters as JSON, or a clashing key)")
            continue
        metadata[key] = text

    total = sum(n for *_, n in entries)
    with ctx.bar(total, "export") as bar:
        read = iter_tensors(store, commit_id, paths, [n for *_, n in entries],
                            everything=len(paths) == len(all_tensors))
        arrays = (tensor_to_host(t) for t in read)
        size = write_safetensors(args.file, entries, metadata,
                                 zip([key for key, *_ in entries], arrays), bar.update)
    for item in skipped:
        ctx.note(f"export skipped {item}")
    if ctx.json:
        ctx.emit({"file": args.file, "id": commit_id, "tensors": len(entries),
                  "bytes": size, "metadata_keys": sorted(metadata), "skipped": skipped})
    else:
        ctx.print(f"wrote {args.file}: {len(entries)} tensors, {human_size(size)} "
                  f"from commit {commit_id[:10]}"
                  + (f" ({len(skipped)} entries skipped, see stderr)" if skipped else ""))
    return 0


# -- parser --------------------------------------------------------------------------------------
VERBS: dict[str, Callable[[Context], int]] = {
    "log": cmd_log, "show": cmd_show, "tag": cmd_tag, "branch": cmd_branch, "gc": cmd_gc,
    "verify": cmd_verify, "du": cmd_du, "diff": cmd_diff, "export": cmd_export,
    "rebase": cmd_rebase,
}

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


def build_parser() -> argparse.ArgumentParser:
    """The ``ckpt`` argument parser: one subcommand per verb."""
    return _build()[0]


def _build() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    verbs: dict[str, argparse.ArgumentParser] = {}
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

    parser = argparse.ArgumentParser(
        prog="ckpt", description="Inspect and maintain a ckptstore: a versioned store of "
        "PyTorch checkpoints.", epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--version", action="version",
                        version=f"ckpt (ckptstore) {__version__}")
    sub = parser.add_subparsers(dest="verb", metavar="VERB", required=True)

    def verb(name: str, help: str, description: str | None = None) -> argparse.ArgumentParser:
        verbs[name] = sub.add_parser(name, parents=[common], help=help,
                                     description=description or help,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
        return verbs[name]

    p = verb("log", "history, newest first: id, time, step, stored size, message")
    p.add_argument("--ref", default="main", help="where the history starts (default: main)")
    p.add_argument("--limit", "-n", type=_positive_int, metavar="N", help="show at most N commits")

    p = verb("show", "details of one commit and a table of its tensors")
    p.add_argument("ref", metavar="REF", nargs="?", default="main",
                   help="the commit (default: main)")
    p.add_argument("--paths", action="append", metavar="GLOB",
                   help="only entries whose dotted path matches (repeatable), e.g. 'model.*'")

    p = verb("tag", "list, create or delete tags",
             "ckpt tag URL              list tags\n"
             "ckpt tag URL NAME [REF]   tag REF (default main) as NAME\n"
             "ckpt tag URL --delete NAME")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("ref", metavar="REF", nargs="?")
    p.add_argument("--delete", "-d", metavar="NAME", help="delete tag NAME")

    p = verb("branch", "list, create, move or delete branches",
             "ckpt branch URL                     list branches with their tips\n"
             "ckpt branch URL NAME [REF]          create branch NAME at REF (default main)\n"
             "ckpt branch URL NAME REF --force    move an existing branch to REF\n"
             "ckpt branch URL --delete NAME")
    p.add_argument("name", metavar="NAME", nargs="?")
    p.add_argument("ref", metavar="REF", nargs="?")
    p.add_argument("--delete", "-d", metavar="NAME", help="delete branch NAME")
    p.add_argument("--force", "-f", action="store_true",
                   help="move NAME to REF if the branch exists")

    p = verb("gc", "remove old commits and leftovers; print what goes and the bytes freed",
             "Keeps, per branch, the newest --keep-last commits (all if not given), every\n"
             "--keep-every-th commit, and tagged commits (unless --no-keep-tags). Leftovers of\n"
             "crashed commits are removed once older than --grace seconds.")
    p.add_argument("--keep-last", type=_positive_int, metavar="N",
                   help="keep the newest N commits of each branch")
    p.add_argument("--keep-every", type=_positive_int, metavar="K",
                   help="also keep every commit whose generation is a multiple of K")
    p.add_argument("--no-keep-tags", action="store_true",
                   help="tags do not protect commits (tags of removed commits are deleted)")
    p.add_argument("--grace", type=_seconds, default=3600.0, metavar="SECONDS",
                   help="unreferenced data younger than this is left alone (default 3600)")
    p.add_argument("--dry-run", "-n", action="store_true",
                   help="only print what would be removed")

    p = verb("rebase", "write REF's state as a new full, lossless commit (ends its chains)",
             "Incremental, consecutive and delta commits keep their bases alive. A rebase\n"
             "writes the whole state again so that gc can collect the old chains.")
    p.add_argument("ref", metavar="REF", nargs="?", default="main", help="default: main")
    p.add_argument("--branch", help="branch to commit on (default: REF if it is a branch, else "
                   "main)")
    p.add_argument("--message", "-m", help="commit message (default: 'rebase of <id>')")

    p = verb("verify", "check every chunk (present, checksum); exit 1 and list problems if any")
    p.add_argument("ref", metavar="REF", nargs="?",
                   help="one commit (default: every commit reachable from a branch or tag)")

    p = verb("du", "stored bytes per commit: its own data, data it reads from other commits",
             "OWN is the commit's data/<id>/ folder, SHARED the data of other commits it\n"
             "reads, TOTAL what restoring it needs. Without --ref: every commit in the store.")
    p.add_argument("--ref", help="only the history of REF")
    p.add_argument("--limit", "-n", type=_positive_int, metavar="N", help="at most N commits")

    p = verb("diff", "tensors changed, added or removed between two commits, with max |a-b|")
    p.add_argument("ref1", metavar="REF1")
    p.add_argument("ref2", metavar="REF2")
    p.add_argument("--paths", action="append", metavar="GLOB",
                   help="only entries whose dotted path matches (repeatable)")
    p.add_argument("--exit-code", action="store_true",
                   help="exit with status 1 if the commits differ")

    p = verb("export", "write a commit's tensors to a plain safetensors file",
             "Keys are dotted paths; plain values (step, lr, ...) go into the file's\n"
             "__metadata__ as JSON strings when short. Dtypes are kept (bfloat16 included).")
    p.add_argument("ref", metavar="REF")
    p.add_argument("file", metavar="FILE", help="output .safetensors file (local path)")
    p.add_argument("--paths", action="append", metavar="GLOB",
                   help="only entries whose dotted path matches (repeatable)")
    p.add_argument("--strip-prefix", metavar="PREFIX",
                   help="remove PREFIX from keys (e.g. 'model.' for a model-only file)")
    p.add_argument("--force", "-f", action="store_true", help="overwrite FILE")
    return parser, verbs


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
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 2)
    out, err = sys.stdout, sys.stderr
    try:
        options = parse_storage_options(args.storage_options)
        with open_store(args.store, create=False, **options) as store:
            return VERBS[args.verb](Context(args, store, out, err))
    except (CkptStoreError, CliError) as e:
        print(f"ckpt: error: {e}", file=err)
        return 2
    except BrokenPipeError:  # `ckpt log ... | head`
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, out.fileno())
        return 141
    except OSError as e:  # permissions, disk full, unreachable endpoints
        print(f"ckpt: error: {e}", file=err)
        return 2
    except KeyboardInterrupt:
        print("ckpt: interrupted", file=err)
        return 130


if __name__ == "__main__":
    sys.exit(main())
