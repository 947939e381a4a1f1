"""Check that every chunk a set of commits reads exists, decodes and passes its checksum (and,
for lossless arrays whose entry records ``chunk_digests``, decodes to bits of that sha256: a
chunk linked from another commit holds what the manifest says), and that each commit's group
``zarr.json`` and each array's are exactly what ckptstore writes for the manifest (so plain zarr
is not misled). Arrays whose grids exceed :mod:`ckptstore.limits` or
the chunks stored are reported, not walked.

A ``zarr.json`` is written once and never rewritten, so it is compared byte for byte with what
the writer makes of the manifest (:func:`ckptstore.format.arrays.array_metadata`, with the attributes
:mod:`ckptstore.format.zarrjson` gives the array, and its ``GROUP_METADATA``): a changed field, a
changed attribute, an extra key or a change JSON parsing tolerates (white space) is reported.
"""

from __future__ import annotations

import json


from ..format.arrays import array_metadata
from ..chains.walk import StoredArray, Walk, packed_array
from ..chunkcodec import ChunkCodec, QuantizedLossy, check_crc, codec_from_config
from ..checkout.consistency import commit_problems
from .dangling import find_dangling
from ..commit.dedup import chunk_digest
from ..errors import CkptStoreError, CorruptedChunkError
from ..info import VerifyReport
from ..format.layout import ZARR_JSON, data_dir
from ..format.zarrjson import GROUP_METADATA, PACKED_ATTRIBUTES, array_attributes
from ..history.manifest import Layout, TensorEntry
from ..progress import bar
from ..history.repository import Repository

__all__ = ["verify"]

Attributes = dict[str, dict[str, object]]
Ident = tuple[str, str]  # (commit, array name): StoredArray.ident



def _entry_attributes(e: TensorEntry) -> dict[Ident, Attributes]:
    """The ``attributes`` of the ``zarr.json`` of each array an entry writes: its own array,
    and each part of a chain link (``part``: its key)."""
    out: dict[Ident, Attributes] = {
        (b.commit, b.array): array_attributes(e.dtype, e.path, part)
        for part, b in (e.parts or {}).items()}
    if e.layout == Layout.ARRAY and e.commit is not None and e.array is not None:
        out[(e.commit, e.array)] = array_attributes(e.dtype, e.path)
    return out


def _read(repo: Repository, where: str) -> tuple[bytes | None, str | None]:
    """A stored metadata document, or a problem saying why there is none."""
    try:
        return bytes(repo.storage.read(where)), None
    except OSError as e:  # missing, a folder, under a file
        return None, f"{where}: missing or unreadable ({e})"


def _shown(doc: dict, key: str) -> str:
    """One field of a metadata document for a message (a hostile one may be huge)."""
    text = repr(doc[key]) if key in doc else "absent"
    return text if len(text) <= 200 else f"{text[:200]}..."


def _differences(stored: bytes, expected: bytes) -> str:
    """What differs between a stored metadata document and the expected one: ``field stored !=
    expected`` for each field where the stored one parses."""
    try:
        doc = json.loads(stored)
    except (ValueError, RecursionError) as e:  # not JSON, not UTF-8, nested beyond reason
        return f"not JSON: {type(e).__name__}: {str(e)[:200]}"
    want = json.loads(expected)
    if not isinstance(doc, dict):
        return "not a zarr metadata document"
    keys = [*want, *(k for k in doc if k not in want)]
    bad = [f"{k} {_shown(doc, k)} != {_shown(want, k)}"
           for k in keys if doc.get(k, ...) != want.get(k, ...)]
    if not bad:
        return "the same JSON written differently (white space, key order, escapes)"
    return "; ".join(bad)


def _check_group(repo: Repository, commit: str) -> str | None:
    where = f"{data_dir(commit)}/{ZARR_JSON}"
    stored, problem = _read(repo, where)
    if stored is not None and stored != GROUP_METADATA:
        problem = (f"{where}: not the zarr v3 group ckptstore writes "
                   f"({_differences(stored, GROUP_METADATA)})")
    return problem


def _check_metadata(repo: Repository, a: StoredArray, codec: ChunkCodec,
                    attributes: list[Attributes], optional: bool = False) -> str | None:
    """Whether the array's ``zarr.json`` is what the writer makes of the manifest (what plain
    zarr reads); ``attributes``: those each manifest entry reading the array gives it;
    ``optional``: a missing one is no problem."""
    where = f"{a.prefix}/{ZARR_JSON}"
    stored, problem = _read(repo, where)
    if stored is None:
        return None if optional and not repo.storage.exists(where) else problem
    expected = [array_metadata(a.grid, a.dtype, codec, attrs) for attrs in attributes]
    if stored in expected:
        return None
    return f"{where}: does not match the manifest ({_differences(stored, expected[0])})"


def _arrays_read(repo: Repository, commits: list[str], report: VerifyReport
                 ) -> tuple[dict[Ident, StoredArray], dict[Ident, list[Attributes]],
                            dict[Ident, str], dict[Ident, int]]:
    """Every array the commits read, their chains' bases included, the ``zarr.json``
    attributes each entry reading an array gives it, the ``chunk_digests`` entries record
    for their arrays, and the rows of the tensor each increment's ``rows`` array indexes; a
    broken manifest or chain is reported and does not hide the other entries."""
    walk = Walk(repo.manifest)
    arrays: dict[Ident, StoredArray] = {}
    attributes: dict[Ident, list[Attributes]] = {}
    digests: dict[Ident, str] = {}
    row_counts: dict[Ident, int] = {}

    def found(a: StoredArray, attrs: Attributes) -> None:
        arrays[a.ident] = a
        known = attributes.setdefault(a.ident, [])
        if attrs not in known:
            known.append(attrs)

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
        for p in m.pack_infos():
            try:
                found(packed_array(m, p), PACKED_ATTRIBUTES)
            except CkptStoreError as err:
                report.problems.append(f"commit {c}, packed array {p.array!r}: {err}")
        for e in m.entries():
            try:
                own, attrs = walk.own_arrays(e), _entry_attributes(e)
                if e.chunk_digests and e.commit is not None and e.array is not None:
                    digests[(e.commit, e.array)] = e.chunk_digests
                if "rows" in (e.parts or {}) and e.shape:  # an increment's row indices
                    rows = e.parts["rows"]  # checkout refuses an index outside the tensor
                    row_counts[(rows.commit, rows.array)] = e.shape[0]
                for a in own:  # what is not the entry's array or a part is its packed array
                    found(a, attrs.get(a.ident, PACKED_ATTRIBUTES))
                todo += walk.bases_of(m, e) if e.layout == Layout.CHAIN else ()
            except CkptStoreError as err:
                report.problems.append(f"commit {c}, {e.path!r}: {err}")
        known = set(report.problems)  # what checkout refuses before reading a chunk
        report.problems += [p for p in commit_problems(walk, m) if p not in known]
    return arrays, attributes, digests, row_counts


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
    commits = [repo.resolve(ref)] if ref is not None else repo.reachable(broken=True)
    arrays, attributes, digests, row_counts = _arrays_read(repo, commits, report)
    report.commits_checked = len(commits)
    if ref is None:  # what no ref reaches yet continues a branch: a lost ref file
        report.dangling = [d.problem() for d in find_dangling(repo, set(commits))]
    jobs: list[tuple[str, StoredArray, ChunkCodec | None, str | None]] = []
    groups: set[str] = set()
    codecs = list(repo.executor.map(lambda a: _checked_codec(repo, a), arrays.values()))
    for a, (codec, problem) in zip(arrays.values(), codecs):
        if codec is None:
            report.problems.append(problem)
            continue
        if not codec.standalone:  # code deltas: decoding needs the base codes; a zarr.json
            # only since issue 26 (an older one has none)
            problem = _check_metadata(repo, a, codec, attributes[a.ident], optional=True)
            if problem:
                report.problems.append(problem)
            jobs += [(a.chunk(key), a, None, None) for _, key, _, _ in a.grid]
            continue
        groups.add(a.commit)
        problem = _check_metadata(repo, a, codec, attributes[a.ident])
        if problem:
            report.problems.append(problem)
        # a lossy codec decodes to other bits than the digests' (those of what was quantized)
        known = None if isinstance(codec, QuantizedLossy) else digests.get(a.ident)
        jobs += [(a.chunk(key), a, codec, known and known[64 * i: 64 * i + 64])
                 for i, key, _, _ in a.grid]
    report.problems += [p for p in (_check_group(repo, c) for c in sorted(groups)) if p]

    def check(job: tuple[str, StoredArray, ChunkCodec | None, str | None]
              ) -> tuple[int, str | None]:
        where, a, codec, digest = job
        data = b""
        try:
            data = repo.storage.read(where)  # not read_chunk: a disk error under a mapped
            # page would end the process (SIGBUS), and verify's job is to report it
            if codec is None:
                check_crc(data, where)
            else:
                chunk = codec.decoded(data, a.grid.chunks, a.dtype, where)
                if digest and chunk_digest(chunk) != digest:
                    return len(data), (f"{where}: its bits are not those the manifest's "
                                       "chunk_digests record (a wrong or stale linked chunk)")
                n = row_counts.get(a.ident)  # (an edge chunk's padding is row 0)
                if n is not None and chunk.size and (chunk.min() < 0 or chunk.max() >= n):
                    return len(data), (f"{where}: row indices outside the tensor's {n} rows "
                                       "(checkout refuses the increment)")
        except FileNotFoundError:
            return 0, f"{where}: missing"
        except (IsADirectoryError, NotADirectoryError):
            return 0, (f"{where}: not a chunk (a folder, or under a file): the manifest's "
                       "dimensions disagree with the stored array")
        except CorruptedChunkError as e:  # "chunk <where> failed ..." -> "<where>: failed ..."
            reason = str(e).removeprefix(f"chunk {where} ")
            return len(data), f"{where}: {reason}"
        except MemoryError:  # a grid's chunk this process cannot hold: checkout cannot either
            return len(data), (f"{where}: {len(data)} stored bytes for a chunk of shape "
                               f"{list(a.grid.chunks)} this process cannot allocate (a damaged "
                               "or hostile manifest, or too little memory)")
        return len(data), None

    with bar(len(jobs), "verify", progress, unit="chunk") as shown:
        for nbytes, problem in repo.executor.map(check, jobs):
            report.chunks_checked += 1
            report.bytes_checked += nbytes
            if problem:
                report.problems.append(problem)
            shown.update()
    return report
