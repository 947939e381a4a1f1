"""Check that every chunk a set of commits reads exists, decodes and passes its checksum, and
that each commit's group ``zarr.json`` and each array's agree with the manifest (so plain zarr
is not misled). Arrays whose grids exceed :mod:`ckptstore.limits` or the chunks stored are
reported, not walked."""

from __future__ import annotations

import json

import numpy as np

from .chains.walk import StoredArray, Walk, packed_array
from .chunkcodec import ChunkCodec, check_crc, codec_from_config
from .errors import CkptStoreError, CorruptedChunkError
from .info import VerifyReport
from .layout import ZARR_JSON, data_dir
from .manifest import Layout
from .progress import bar
from .repository import Repository

__all__ = ["verify"]


def _read_json(repo: Repository, where: str) -> tuple[dict | None, str | None]:
    """A stored JSON object, or a problem saying why there is none."""
    try:
        doc = json.loads(repo.storage.read(where))
    except (OSError, ValueError) as e:  # missing, a folder, not JSON, not UTF-8
        return None, f"{where}: missing or unreadable ({e})"
    if not isinstance(doc, dict):
        return None, f"{where}: not a zarr metadata document"
    return doc, None


def _mismatches(doc: dict, expected: dict) -> list[str]:
    """``field: stored != manifest`` for each field of ``expected`` the document disagrees on."""
    return [f"{k} {doc.get(k)!r} != {v!r}" for k, v in expected.items() if doc.get(k) != v]


def _check_group(repo: Repository, commit: str) -> str | None:
    where = f"{data_dir(commit)}/{ZARR_JSON}"
    doc, problem = _read_json(repo, where)
    if doc is not None and (bad := _mismatches(doc, {"zarr_format": 3, "node_type": "group"})):
        problem = f"{where}: not a zarr v3 group ({'; '.join(bad)})"
    return problem


def _check_metadata(repo: Repository, a: StoredArray, codec: ChunkCodec) -> str | None:
    """Whether the array's ``zarr.json`` says what the manifest says: what plain zarr reads."""
    where = f"{a.prefix}/{ZARR_JSON}"
    doc, problem = _read_json(repo, where)
    if doc is None:
        return problem
    expected = json.loads(json.dumps({
        "zarr_format": 3, "node_type": "array", "shape": list(a.grid.shape),
        "data_type": a.dtype.name,
        "chunk_grid": {"name": "regular", "configuration": {"chunk_shape": list(a.grid.chunks)}},
        "chunk_key_encoding": {"name": "default", "configuration": {"separator": "/"}},
        "codecs": codec.zarr_codecs(a.dtype.itemsize)}))
    bad = _mismatches(doc, expected)
    return f"{where}: does not match the manifest ({'; '.join(bad)})" if bad else None


def _arrays_read(repo: Repository, commits: list[str], report: VerifyReport
                 ) -> dict[tuple[str, str], StoredArray]:
    """Every array the commits read, their chains' bases included; a broken manifest or chain is
    reported and does not hide the other entries."""
    walk = Walk(repo.manifest)
    arrays: dict[tuple[str, str], StoredArray] = {}
    todo, seen = list(commits), set()
    while todo:
        c = todo.pop()
        if c in seen:
            continue
        seen.add(c)
        try:
            m = repo.manifest(c)
        except CkptStoreError as e:
            report.problems.append(f"commit {c}: {e}")
            continue
        found = []
        for p in m.pack_infos():
            try:
                found.append(packed_array(m, p))
            except CkptStoreError as err:
                report.problems.append(f"commit {c}, packed array {p.array!r}: {err}")
        for e in m.entries():
            try:
                found += walk.own_arrays(e)
                todo += walk.bases_of(m, e) if e.layout == Layout.CHAIN else ()
            except CkptStoreError as err:
                report.problems.append(f"commit {c}, {e.path!r}: {err}")
        arrays.update((a.ident, a) for a in found)
    return arrays


def _checked_codec(repo: Repository, a: StoredArray) -> tuple[ChunkCodec | None, str | None]:
    """The array's codec once the store holds nearly every chunk its grid has; else a problem
    (an array is listed before its grid is walked: a hostile shape costs one listing)."""
    try:
        codec = codec_from_config(a.codec)
        a.missing_chunks(repo.storage)  # its read names each missing chunk
    except CkptStoreError as e:
        return None, str(e) if str(e).startswith(a.prefix) else f"{a.prefix}: {e}"
    return codec, None


def verify(repo: Repository, ref: str | None = None, progress: bool = False) -> VerifyReport:
    """Read every chunk that ``ref``'s commit (or every commit reachable from refs) reads and
    report missing, unreadable or corrupted ones by path."""
    report = VerifyReport()
    commits = [repo.resolve(ref)] if ref is not None else repo.reachable()
    arrays = _arrays_read(repo, commits, report)
    report.commits_checked = len(commits)
    jobs: list[tuple[str, StoredArray, ChunkCodec | None]] = []
    groups: set[str] = set()
    codecs = list(repo.executor.map(lambda a: _checked_codec(repo, a), arrays.values()))
    for a, (codec, problem) in zip(arrays.values(), codecs):
        if codec is None:
            report.problems.append(problem)
            continue
        if not codec.standalone:  # code deltas: no zarr metadata, decoding needs the base codes
            jobs += [(a.chunk(key), a, None) for _, key, _, _ in a.grid]
            continue
        groups.add(a.commit)
        problem = _check_metadata(repo, a, codec)
        if problem:
            report.problems.append(problem)
        jobs += [(a.chunk(key), a, codec) for _, key, _, _ in a.grid]
    report.problems += [p for p in (_check_group(repo, c) for c in sorted(groups)) if p]

    def check(job: tuple[str, StoredArray, ChunkCodec | None]) -> tuple[int, str | None]:
        where, a, codec = job
        data = b""
        try:
            data = repo.storage.read(where)
            if codec is None:
                check_crc(data, where)
            else:
                codec.decode(data, np.empty(a.grid.chunks, dtype=a.dtype), where)
        except FileNotFoundError:
            return 0, f"{where}: missing"
        except (IsADirectoryError, NotADirectoryError):
            return 0, f"{where}: not a chunk (a folder, or under a file): the manifest's " \
                      "dimensions disagree with the stored array"
        except CorruptedChunkError as e:  # "chunk <where> failed ..." -> "<where>: failed ..."
            reason = str(e).removeprefix(f"chunk {where} ")
            return len(data), f"{where}: {reason}"
        return len(data), None

    with bar(len(jobs), "verify", progress, unit="chunk") as shown:
        for nbytes, problem in repo.executor.map(check, jobs):
            report.chunks_checked += 1
            report.bytes_checked += nbytes
            if problem:
                report.problems.append(problem)
            shown.update()
    return report
