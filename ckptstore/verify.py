"""Check that every chunk a set of commits reads exists, decodes and passes its checksum, and
that each array's ``zarr.json`` agrees with the manifest (so plain zarr is not misled)."""

from __future__ import annotations

import json

import numpy as np

from .chains.walk import StoredArray, Walk, packed_array
from .chunkcodec import ChunkCodec, check_crc, codec_from_config
from .errors import CkptStoreError, CorruptedChunkError
from .info import VerifyReport
from .layout import ZARR_JSON
from .manifest import Layout
from .progress import bar
from .repository import Repository

__all__ = ["verify"]

def _check_metadata(repo: Repository, a: StoredArray) -> str | None:
    where = f"{a.prefix}/{ZARR_JSON}"
    try:
        meta = json.loads(repo.storage.read(where))
    except (FileNotFoundError, ValueError) as e:
        return f"{where}: missing or unreadable ({e})"
    if meta.get("shape") != list(a.grid.shape) or meta.get("data_type") != a.dtype.name:
        return f"{where}: does not match the manifest"
    return None


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
        found = [packed_array(m, p) for p in m.pack_infos()]
        for e in m.entries():
            try:
                found += walk.own_arrays(e)
                todo += walk.bases_of(m, e) if e.layout == Layout.CHAIN else ()
            except CkptStoreError as err:
                report.problems.append(f"commit {c}, {e.path!r}: {err}")
        arrays.update((a.ident, a) for a in found)
    return arrays


def verify(repo: Repository, ref: str | None = None, progress: bool = False) -> VerifyReport:
    """Read every chunk that ``ref``'s commit (or every commit reachable from refs) reads and
    report missing, unreadable or corrupted ones by path."""
    report = VerifyReport()
    commits = [repo.resolve(ref)] if ref is not None else repo.reachable()
    arrays = _arrays_read(repo, commits, report)
    report.commits_checked = len(commits)
    jobs: list[tuple[str, StoredArray, ChunkCodec | None]] = []
    for a in arrays.values():
        try:
            codec = codec_from_config(a.codec)
        except CkptStoreError as e:
            report.problems.append(f"{a.prefix}: {e}")
            continue
        if not codec.standalone:  # code deltas: no zarr metadata, decoding needs the base codes
            jobs += [(a.chunk(key), a, None) for _, key, _, _ in a.grid]
            continue
        problem = _check_metadata(repo, a)
        if problem:
            report.problems.append(problem)
        jobs += [(a.chunk(key), a, codec) for _, key, _, _ in a.grid]

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
