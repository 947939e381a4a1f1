"""Hostile campaign family "two clients" (issue 26, item 2): two clients of one S3 store.

Each round opens a fresh store prefix on a moto S3 server with two clients, as two processes
would: client A with s3fs's default options (its filesystem object from fsspec's instance cache,
listings cache on), client B with ``skip_instance_cache=True``. Then random steps, each either one
operation of a random client (commit, gc, log, verify, tag, checkout) or two operations of both
clients at once (a commit beside another commit, a gc, a tag, a checkout or a log). After every
step both clients must agree with a model of the store: main's tip and history, the tags, the
tip's bits, every tagged commit's bits, and gc never removed a commit a branch or tag keeps.

Outcomes: a *lost* commit (one a client was told is committed that the store no longer has), a
*silent* wrong answer (other bits, another tip, a log listing removed commits), a *raw* exception
(not a ckptstore error), a *wrong error* (a ckptstore error where nothing was wrong: "removed by
gc?" for a live commit) -- each is a failure; 0 are expected. Racing commits end in
``ConcurrentUpdateError`` for one of them: that is the expected, clear outcome.

Usage: ``.venv/bin/python benchmarks/hostile_two_clients.py --count 40`` (or through
``benchmarks/reliability.py two-clients``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

from reliability import Tally, start_moto  # noqa: E402

STEPS = 6  # steps of one round
SOLO = ("commit", "gc", "log", "verify", "tag", "checkout")
BESIDE_A_COMMIT = ("commit", "gc", "tag", "checkout", "log")


class Failure(Exception):
    """A lost commit, a silently wrong answer or a wrong error; ``kind`` says which."""

    def __init__(self, kind: str, detail: str):
        super().__init__(detail)
        self.kind = kind


def _state(n: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(n)
    return {"w": torch.randn(64, 16, generator=g), "b": torch.randn(7, generator=g), "step": n}


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


@dataclass
class Model:
    """What the store holds: main's line (oldest first), what gc removed, the tags."""

    line: list[str] = field(default_factory=list)
    seeds: dict[str, int] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def history(self) -> list[str]:
        out = []
        for c in reversed(self.line):
            if c in self.removed:
                break
            out.append(c)
        return out


def _op(name: str, store: Any, m: Model, rng: random.Random) -> Callable[[], Any]:
    """One operation of one client; run it, then :func:`_account` its result into the model."""
    from ckptstore.errors import ConcurrentUpdateError

    if name == "commit":
        seed = rng.randrange(1 << 30)

        def commit() -> Any:
            try:
                return ("commit", seed, store.commit(_state(seed), metadata={"seed": seed}).id)
            except ConcurrentUpdateError as e:
                return ("lost race", seed, e.commit_id)
        return commit
    if name == "gc":
        return lambda: ("gc", set(store.gc(keep_last=2).commits_removed))
    if name == "tag":
        tag = f"t{uuid.uuid4().hex[:8]}"
        return lambda: ("tag", tag, store.tag(tag, "main"))
    if name == "checkout":
        return lambda: ("checkout", store.resolve("main"), store.checkout("main"))
    if name == "log":
        return lambda: ("log", [c.id for c in store.log()])
    if name == "verify":
        return lambda: ("verify", store.verify())
    raise ValueError(name)


def _account(result: tuple, m: Model, before: str) -> None:
    """Fold one finished operation into the model; raise :class:`Failure` if its answer is
    wrong. ``before``: main's tip when the step began."""
    kind = result[0]
    if kind == "commit":
        _, seed, commit_id = result
        m.line.append(commit_id)
        m.seeds[commit_id] = seed
    elif kind == "gc":
        gone = result[1]
        kept = {m.line[-1], *m.tags.values()}
        if gone & kept:
            raise Failure("lost", f"gc removed {sorted(gone & kept)}, which a ref keeps")
        m.removed |= gone
    elif kind == "tag":
        _, tag, commit_id = result
        if commit_id not in (before, m.line[-1]):
            raise Failure("silent", f"tag {tag} at {commit_id}, main was {before}")
        m.tags[tag] = commit_id
    elif kind == "checkout":
        _, tip, state = result
        if tip not in m.seeds or not _same(state, _state(m.seeds[tip])):
            raise Failure("silent", f"checkout of main ({tip}) returned other bits")
    elif kind == "log":
        ids = result[1]
        if not ids or ids[0] not in (before, m.line[-1]):
            raise Failure("silent", f"log starts at {ids[:1]}, main was {before}")
        if set(ids) & m.removed - set(m.line[-1:]):
            raise Failure("silent", "log lists commits gc removed")
    elif kind == "verify":
        report = result[1]
        if not report.ok:
            raise Failure("silent", f"verify: {report.problems[:2]}")


def _agree(store: Any, m: Model) -> None:
    """A client's view is the model's."""
    tip = store.resolve("main")
    if tip != m.line[-1]:
        raise Failure("lost" if m.line[-1] not in store.reachable() else "silent",
                      f"main at {tip}, expected {m.line[-1]}")
    if [c.id for c in store.log()] != m.history():
        raise Failure("silent", "log differs from the history")
    if store.tags() != m.tags:
        raise Failure("silent", "tags differ")
    for c in {tip, *m.tags.values()}:
        if not _same(store.checkout(c), _state(m.seeds[c])):
            raise Failure("silent", f"commit {c} checks out to other bits")


def _both(ops: list[Callable[[], Any]]) -> list[Any]:
    """Run operations at once (released together); their results or exceptions, in order."""
    barrier = threading.Barrier(len(ops))
    out: list[Any] = [None] * len(ops)

    def run(i: int) -> None:
        barrier.wait()
        try:
            out[i] = ops[i]()
        except BaseException as e:  # noqa: BLE001 - classified by the caller
            out[i] = e

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(ops))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _round(url: str, opts: dict, rng: random.Random) -> str:
    """One store, two clients, ``STEPS`` random steps; the outcome (raises on a failure)."""
    import ckptstore

    a = ckptstore.open(url, **opts)
    b = ckptstore.open(url, skip_instance_cache=True, **opts)
    m = Model()
    raced = 0
    try:
        _account(_op("commit", a, m, rng)(), m, "")
        for _ in range(STEPS):
            before = m.line[-1]
            x, y = rng.sample([a, b], 2)
            if rng.random() < 0.5:
                results = [_op(rng.choice(SOLO), x, m, rng)()]
            else:
                results = _both([_op("commit", x, m, rng),
                                 _op(rng.choice(BESIDE_A_COMMIT), y, m, rng)])
            for r in results:
                if isinstance(r, BaseException):
                    raise r
            commits = [r for r in results if r[0] == "commit"]
            raced += sum(r[0] == "lost race" for r in results)
            for r in commits:  # commits first: a tag or log beside one may show it
                _account(r, m, before)
            for r in results:
                if r[0] not in ("commit", "lost race"):
                    _account(r, m, before)
            _agree(a, m)
            _agree(b, m)
    finally:
        a.close()
        b.close()
    return f"ok, {raced} lost races" if raced else "ok"


def campaign(count: int, seed: int) -> dict:
    """``count`` rounds of two clients on a moto S3 server; the tally of outcomes."""
    from ckptstore.errors import CkptStoreError

    tally = Tally("two-clients")
    rng = random.Random(seed)
    with _S3() as (bucket, opts):
        for i in range(count):
            url = f"s3://{bucket}/round-{i}-{uuid.uuid4().hex[:8]}"
            try:
                outcome = _round(url, opts, rng)
                tally.add(True, outcome.split(",")[0] if "lost races" not in outcome else
                          "ok, a commit lost a race")
            except Failure as f:
                tally.add(False, f.kind, f"{url}: {f}")
            except CkptStoreError as e:
                tally.add(False, "wrong error", f"{url}: {type(e).__name__}: {e}")
            except Exception as e:  # noqa: BLE001 - a raw exception is what is counted
                tally.add(False, "raw exception",
                          f"{url}: {type(e).__name__}: {e}\n{traceback.format_exc()[-800:]}")
    return tally.summary()


class _S3:
    """A moto S3 server on 127.0.0.1 with conditional PUTs atomic, as S3's; yields the bucket
    and s3fs's options -- its defaults otherwise (listings cache on), as a user's."""

    def __enter__(self) -> tuple[str, dict]:
        self.server, options = start_moto("ckpt-two-clients")
        return "ckpt-two-clients", options

    def __exit__(self, *exc: object) -> None:
        self.server.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=200, help="rounds (default 200)")
    parser.add_argument("--seed", type=int, default=29)
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    summary = campaign(args.count, args.seed)
    print(json.dumps(summary, indent=1))
    return 1 if summary["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
