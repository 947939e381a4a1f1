"""The upload journal: the commits of a tiered store's local tier not yet on its remote.

It lives on the local tier, beside the store it describes (never uploaded)::

    <local>/.uploads/remote.json       {"version": 1, "remote": URL, "options": {...}}
    <local>/.uploads/queue/<seq>       one msgpack record per commit to upload, put-if-absent:
                                       {"v": 1, "commit": id, "branch": name, "bytes": n,
                                        "queued": unix time}; <seq> is 12 zero-padded digits,
                                       the upload order. A branch or tag change to replay on
                                       the remote in that order is a version-2 record with
                                       "op": "branch" | "reset" | "delete-branch" |
                                       "delete-tag" ("branch" holds the branch or tag name,
                                       "commit" its commit, "bytes" 0). A rank's part of a
                                       sharded commit (a process group) is a version-3
                                       record with "op": "part", "rank" and "world"
    <local>/.uploads/rank.json         {"version": 1, "rank": r, "world": n}: this local tier
                                       belongs to rank r of a process group (:mod:`.parts`)
    <local>/.uploads/failed/<seq>      JSON {"error": message, "time": unix time}: the last
                                       failed attempt at that record (gone once it uploads)

A record is created once the commit is durable locally and deleted once the remote ref (and
tags) name the commit; an upload is idempotent (keys the remote has are skipped, a ref already
there is left), so a record that outlives its upload -- a kill between the two -- costs a
check. ``remote.json`` holds the remote's URL and the storage options that are not secrets
(so that ``ckpt status`` / ``ckpt push`` find the remote; credentials come from the
environment or ``--storage-option``).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any

import msgpack

from ..errors import ManifestError
from ..storage import Storage

__all__ = ["JOURNAL", "OPS", "Journal", "Record", "public_options"]

JOURNAL = ".uploads"
_QUEUE = f"{JOURNAL}/queue"
_FAILED = f"{JOURNAL}/failed"
_REMOTE = f"{JOURNAL}/remote.json"
_SEQ_WIDTH = 12
_VERSION = 1
_OP_VERSION = 2
_PART_VERSION = 3
#: what a record replays on the remote: a commit (its data, manifest, ref and tags), a branch
#: or tag change made on the local tier, or one rank's part of a sharded commit (its data and
#: its completion object; on the coordinator also the manifest, ref and tags, once every
#: rank's part is up)
OPS = ("commit", "branch", "reset", "delete-branch", "delete-tag", "part")
_SECRET_WORDS = ("key", "secret", "token", "password", "credential", "session")


@dataclass(frozen=True)
class Record:
    """One commit waiting for upload: ``seq`` (its place in the order), ``commit``, the
    ``branch`` whose remote ref it moves, its local ``bytes`` and when it was ``queued``; or,
    with another ``op`` (:data:`OPS`), a change of branch or tag ``branch`` to ``commit`` to
    replay on the remote; ``op="part"``: rank ``rank``'s part of a commit written by ``world``
    ranks."""

    seq: int
    commit: str
    branch: str
    bytes: int
    queued: float
    op: str = "commit"
    rank: int = 0
    world: int = 1


def public_options(options: dict[str, Any]) -> dict[str, Any]:
    """``options`` without credentials (any key naming a key, secret, token or password).

    >>> public_options({"key": "a", "client_kwargs": {"endpoint_url": "http://h"}, "anon": 0})
    {'client_kwargs': {'endpoint_url': 'http://h'}, 'anon': 0}
    """
    out: dict[str, Any] = {}
    for k, v in options.items():
        if any(w in str(k).lower() for w in _SECRET_WORDS):
            continue
        if isinstance(v, dict):
            out[k] = public_options(v)
        elif v is None or isinstance(v, (str, int, float, bool, list)):
            out[k] = v
    return out


class Journal:
    """The queue records of one local tier (thread-safe)."""

    def __init__(self, local: Storage):
        self.local = local
        self._lock = threading.Lock()

    # -- the remote it uploads to ----------------------------------------------------------
    def set_remote(self, url: str, options: dict[str, Any]) -> None:
        doc = {"version": _VERSION, "remote": url, "options": public_options(options)}
        self.local.put(_REMOTE, json.dumps(doc, sort_keys=True).encode())

    def remote(self) -> tuple[str, dict[str, Any]] | None:
        """``(url, public options)`` of the remote this local tier uploads to, or None."""
        try:
            doc = json.loads(self.local.read(_REMOTE))
        except FileNotFoundError:
            return None
        return doc["remote"], doc.get("options", {})

    # -- records ---------------------------------------------------------------------------
    def _seqs(self, folder: str) -> list[int]:
        return sorted(int(n) for n in self.local.listdir(folder)
                      if len(n) == _SEQ_WIDTH and n.isascii() and n.isdigit())

    def add(self, commit: str, branch: str, nbytes: int, op: str = "commit", rank: int = 0,
            world: int = 1) -> Record:
        """Queue ``commit`` (durable before this returns) after every record there is; ``op``
        other than "commit": a change of branch or tag ``branch`` to replay there, or
        (``"part"``) rank ``rank`` of ``world``'s part of ``commit``."""
        if op not in OPS:
            raise ValueError(f"op must be one of {OPS}, not {op!r}")
        if op == "part" and not 0 <= rank < world:
            raise ValueError(f"rank {rank} of a world of {world}")
        with self._lock:
            seqs = self._seqs(_QUEUE)
            seq = seqs[-1] + 1 if seqs else 0
            while True:
                rec = Record(seq, commit, branch, nbytes, time.time(), op,
                             *((rank, world) if op == "part" else ()))
                doc = {"v": _VERSION, "commit": commit, "branch": branch, "bytes": nbytes,
                       "queued": rec.queued}
                if op == "part":  # version 3: a rank's part of a sharded commit
                    doc.update(v=_PART_VERSION, op=op, rank=rank, world=world)
                elif op != "commit":  # version 2: records version 1 did not have
                    doc.update(v=_OP_VERSION, op=op)
                if self.local.put_if_absent(self._key(seq), msgpack.packb(doc)):
                    return rec
                seq += 1  # another process of this local tier queued one meanwhile

    def records(self) -> list[Record]:
        """The records not yet uploaded, in upload order."""
        out = []
        for seq in self._seqs(_QUEUE):
            try:
                data = self.local.read(self._key(seq))
            except FileNotFoundError:  # uploaded meanwhile
                continue
            out.append(self._decode(seq, data))
        return out

    def done(self, rec: Record) -> None:
        """The commit of ``rec`` is on the remote: drop its record (and its failure)."""
        self.local.delete(self._key(rec.seq))
        self.local.delete(f"{_FAILED}/{rec.seq:0{_SEQ_WIDTH}d}")

    def failed(self, rec: Record, error: BaseException) -> None:
        doc = {"error": f"{type(error).__name__}: {error}", "time": time.time()}
        self.local.put(f"{_FAILED}/{rec.seq:0{_SEQ_WIDTH}d}", json.dumps(doc).encode())

    def failure(self, rec: Record) -> str | None:
        """The message of the last failed upload of ``rec``, or None."""
        try:
            return json.loads(self.local.read(f"{_FAILED}/{rec.seq:0{_SEQ_WIDTH}d}"))["error"]
        except FileNotFoundError:
            return None

    @staticmethod
    def _key(seq: int) -> str:
        return f"{_QUEUE}/{seq:0{_SEQ_WIDTH}d}"

    def _decode(self, seq: int, data: bytes) -> Record:
        where = self.local.path(self._key(seq))
        try:
            doc = msgpack.unpackb(data)
            op = str(doc.get("op", "commit"))
            if op not in OPS or doc.get("v") not in (_VERSION, _OP_VERSION, _PART_VERSION):
                raise ValueError(f"version {doc.get('v')!r}, op {op!r}")
            rank, world = (int(doc["rank"]), int(doc["world"])) if op == "part" else (0, 1)
            if not 0 <= rank < world:
                raise ValueError(f"rank {rank} of a world of {world}")
            return Record(seq, str(doc["commit"]), str(doc["branch"]), int(doc["bytes"]),
                          float(doc["queued"]), op, rank, world)
        except (ValueError, KeyError, TypeError, AttributeError, msgpack.UnpackException) as e:
            raise ManifestError(f"upload journal record {where} is damaged ({e}); delete it "
                                "(`ckpt push` re-queues what the remote lacks)") from None
