"""Reliability campaign (issue 13): SIGKILLs at random points, byte mutations of stored objects.

A failure is a committed version lost or data returned silently wrong; a clear ckptstore error
is a pass. Every campaign prints and returns ``{"tried", "failed", ...}``; docs/reliability.md
holds the figures of the recorded run. Usage (from the repository root)::

    .venv/bin/python benchmarks/reliability.py commit-kills --backend local --kills 120
    .venv/bin/python benchmarks/reliability.py commit-kills --backend s3 --kills 40
    .venv/bin/python benchmarks/reliability.py gc-kills --kills 40
    .venv/bin/python benchmarks/reliability.py ref-kills --kills 40
    .venv/bin/python benchmarks/reliability.py mutations --count 600
    .venv/bin/python benchmarks/reliability.py two-clients --count 200     # issue 26 families:
    .venv/bin/python benchmarks/reliability.py imports --count 300
    .venv/bin/python benchmarks/reliability.py files --count 200
    .venv/bin/python benchmarks/reliability.py tier-kills --count 56     # issue 29
    .venv/bin/python benchmarks/reliability.py tier-rank-kills --count 54   # 29, 2 gloo ranks
    .venv/bin/python benchmarks/reliability.py all --out reliability.json   # everything above

Killed processes are real: forked from a clean ``multiprocessing`` fork server that imported
torch and ckptstore once (the idea of ``tests/workers.py serve``); a commit worker first makes two
commits to a memory store (compiling the codecs), then it is SIGKILLed after a random delay up
to 1.2x the operation's measured duration. Commit kills rotate over five kinds of commit:
``full`` (lossless), ``quantized`` (8-bit, lossy), ``incremental`` (one-shot row increments of
an embedding table), ``delta`` (lossless XOR chains) and ``async`` (``commit_async``). Each
worker commits three states in a row, so chains grow within a worker.
After every kill the checker opens the store and requires: every commit seen before is still on
the branch and checks out to the same bits; every commit the worker reported is there; at most one
more (its ref moved just before the kill); new commits match the state their seed rebuilds
(bit-exact, or within the quantization error); ``verify`` is clean; ``gc(grace_period=0)``
succeeds and leaves a valid store.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import multiprocessing as mp
import os
import random
import shutil
import sys
import tempfile
import time
import traceback
from typing import Any

MODES = ("full", "quantized", "incremental", "delta", "async")
CHUNK_BYTES = 32 * 1024


# -- states and how they are committed ------------------------------------------------------------
def build_state(mode: str, seed: int) -> dict[str, Any]:
    """The state a worker commits for ``seed`` (same seed, same bits, in any process)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    if mode == "incremental":  # an embedding table of which 16 rows change per seed
        emb = torch.randn(1024, 32, generator=torch.Generator().manual_seed(0))
        rows = torch.randperm(1024, generator=g)[:16]
        emb[rows] = torch.randn(16, 32, generator=g)
        return {"emb": emb, "b": torch.randn(32, generator=g), "step": seed}
    return {"w": torch.randn(256, 256, generator=g),  # 256 KiB: 8 chunks
            "v": torch.randn(128, 64, generator=g).to(torch.float16),
            "b": torch.randn(40, generator=g), "opt": {"lr": 1e-3 * (seed % 5 + 1)},
            "step": seed}


def policy_for(mode: str) -> Any:
    from ckptstore import Policy, QuantSpec

    if mode == "quantized":
        return Policy(quantize=QuantSpec(bits=8))
    if mode == "incremental":
        return Policy(incremental="one-shot", min_rows=512)
    if mode == "delta":
        return Policy(delta=True)
    return Policy()


def open_store(url: str, opts: dict, create: bool = True) -> Any:
    import ckptstore

    return ckptstore.open(url, create=create, options=ckptstore.EncodingOptions(
        chunk_bytes=CHUNK_BYTES), **opts)


def digest(state: Any) -> str:
    """sha256 over a state's structure, dtypes, shapes and bits."""
    import numpy as np
    import torch

    h = hashlib.sha256()

    def walk(x: Any) -> None:
        if isinstance(x, torch.Tensor):
            t = x.detach().cpu().contiguous()
            h.update(f"T{t.dtype}{tuple(t.shape)}".encode())
            h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
        elif isinstance(x, np.ndarray):
            h.update(f"N{x.dtype}{x.shape}".encode() + x.tobytes())
        elif isinstance(x, dict):
            h.update(b"{")
            for k in x:
                h.update(repr(k).encode())
                walk(x[k])
            h.update(b"}")
        elif isinstance(x, (list, tuple)):
            h.update(b"[" if isinstance(x, list) else b"(")
            for v in x:
                walk(v)
            h.update(b"]")
        else:
            h.update(f"{type(x).__name__}:{x!r}".encode())
    walk(state)
    return h.hexdigest()


def matches(mode: str, expected: dict, got: dict) -> bool:
    """Bit-exact, or for quantized commits within 2% of each float tensor's range."""
    import torch

    if mode != "quantized":
        return digest(expected) == digest(got)
    if list(expected) != list(got):
        return False
    for k, e in expected.items():
        a = got[k]
        if isinstance(e, torch.Tensor):
            if a.dtype != e.dtype or a.shape != e.shape:
                return False
            e32, a32 = e.float(), a.float()
            span = float(e32.max() - e32.min()) or 1.0
            if float((e32 - a32).abs().max()) > 0.02 * span:
                return False
        elif e != a:
            return False
    return True


# -- worker side (runs in processes forked by the fork server) -----------------------------------
def _emit(path: str, event: str, **fields: Any) -> None:
    line = json.dumps({"event": event, **fields}) + "\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def worker(op: str, url: str, opts: dict, events: str, arg: Any) -> None:
    """One killable operation: ``commit`` (arg: (mode, first seed, count)), ``gc`` (keep_last)
    or ``refs`` (arg: (seed, commit ids to point names at))."""
    store = open_store(url, opts, create=False)
    if op == "commit":
        mode, seed, count = arg
        states = [(s, build_state(mode, s)) for s in range(seed, seed + count)]
        _warm_up(mode)
        _emit(events, "ready")
        for s, state in states:
            t0 = time.perf_counter()
            meta = {"seed": s, "mode": mode}
            if mode == "async":
                info = store.commit_async(state, message=f"seed {s}", metadata=meta).wait()
            else:
                info = store.commit(state, message=f"seed {s}", metadata=meta,
                                    policy=policy_for(mode))
            _emit(events, "commit", id=info.id, seed=s, seconds=time.perf_counter() - t0)
    elif op == "gc":
        _emit(events, "ready")
        t0 = time.perf_counter()
        store.gc(keep_last=arg, grace_period=0)
        _emit(events, "gc", seconds=time.perf_counter() - t0)
    elif op == "refs":
        seed, ids = arg
        rng = random.Random(seed)
        _emit(events, "ready")
        t0 = time.perf_counter()
        for i in range(12):
            name = f"x{seed}-{i}"
            op_ = rng.choice(["tag", "untag", "branch", "reset", "unbranch"])
            tags, branches = store.tags(), [b for b in store.branches() if b != "main"]
            if op_ == "tag" or (op_ == "untag" and not tags):
                store.tag(name, rng.choice(ids))
            elif op_ == "untag":
                store.delete_tag(rng.choice(sorted(tags)))
            elif op_ == "branch" or not branches:
                store.branch(name, rng.choice(ids))
            elif op_ == "reset":
                store.reset_branch(rng.choice(sorted(branches)), rng.choice(ids))
            else:
                store.delete_branch(rng.choice(sorted(branches)))
            _emit(events, "op", n=i + 1)
        _emit(events, "refs", seconds=time.perf_counter() - t0)
    store.close()


def _warm_up(mode: str) -> None:
    """One commit of the same kind to a memory store: the codecs' compiled kernels are built
    before the clock starts, so kills spread over the real commits, not over compilation."""
    import ckptstore

    with ckptstore.open(f"memory://warm-{os.getpid()}") as store:
        for s in (0, 1):
            if mode == "async":
                store.commit_async(build_state(mode, s)).wait()
            else:
                store.commit(build_state(mode, s), policy=policy_for(mode))


# -- campaign side --------------------------------------------------------------------------------
class Killer:
    """Runs workers from a fork server and SIGKILLs them after a random delay."""

    def __init__(self, workdir: str):
        self.ctx = mp.get_context("forkserver")
        self.ctx.set_forkserver_preload(["torch", "ckptstore", "ckptstore.maintenance.gc", "s3fs",
                                         "__main__"])
        self.workdir = workdir
        self.n = 0

    def run(self, op: str, url: str, opts: dict, arg: Any, delay: float | None
            ) -> tuple[int | None, list[dict]]:
        """Start a worker; kill it ``delay`` seconds after it is ready (None: let it finish).
        Returns (exit code, -9 when killed; its events)."""
        self.n += 1
        events = os.path.join(self.workdir, f"events-{self.n}.jsonl")
        p = self.ctx.Process(target=worker, args=(op, url, opts, events, arg))
        p.start()
        deadline = time.monotonic() + 120
        while not _events(events) and p.is_alive() and time.monotonic() < deadline:
            time.sleep(0.002)
        if delay is not None:
            time.sleep(delay)
            p.kill()
        p.join(300)
        if p.is_alive():
            p.kill()
            p.join()
        return p.exitcode, _events(events)


def _events(path: str) -> list[dict]:
    try:
        with open(path) as f:
            return [json.loads(line) for line in f if line.endswith("\n")]
    except FileNotFoundError:
        return []


class Tally:
    """Tried / failed counts and the first failures' details."""

    def __init__(self, name: str):
        self.name, self.tried, self.failed = name, 0, 0
        self.outcomes: collections.Counter = collections.Counter()
        self.failures: list[str] = []

    def add(self, ok: bool, outcome: str, detail: str = "") -> None:
        self.tried += 1
        self.outcomes[outcome] += 1
        if not ok:
            self.failed += 1
            if len(self.failures) < 20:
                self.failures.append(detail)
            print(f"[{self.name}] FAILURE {outcome}: {detail}", flush=True)

    def summary(self) -> dict:
        return {"campaign": self.name, "tried": self.tried, "failed": self.failed,
                "outcomes": dict(self.outcomes), "failures": self.failures}


class History:
    """The branch as last checked, and each commit's checkout digest at first sight."""

    def __init__(self) -> None:
        self.ids: list[str] = []  # newest first
        self.digests: dict[str, str] = {}

    def check(self, store: Any, reported: list[str], rng: random.Random, full_verify: bool
              ) -> str:
        """Raise AssertionError on a failure; return which outcome the kill had."""
        log = store.log("main") if "main" in store.branches() else []
        ids = [c.id for c in log]
        new = ids[: len(ids) - len(self.ids)]
        assert ids[len(new):] == self.ids, "a committed version was lost"
        assert set(reported) <= set(new), f"reported commits {reported} missing from {new}"
        assert len(new) - len(reported) in (0, 1), f"{len(new)} new, {len(reported)} reported"
        by_id = {c.id: c for c in log}
        for c in new:
            meta = by_id[c].metadata
            got = store.checkout(c)
            expected = build_state("incremental" if meta["mode"] == "incremental" else
                                   meta["mode"], meta["seed"])
            assert matches(meta["mode"], expected, got), f"commit {c} ({meta}) is wrong"
            self.digests[c] = digest(got)
        old = self.ids[:1] + rng.sample(self.ids[1:], min(2, len(self.ids[1:])))
        for c in old:  # the tip before the kill and two older ones: the same bits as before
            assert digest(store.checkout(c)) == self.digests[c], f"commit {c} changed"
        report = store.verify() if full_verify else (store.verify("main") if ids else None)
        assert report is None or report.ok, report.problems
        store.gc(grace_period=0)
        assert sorted(store.commit_ids()) == sorted(ids), "gc left an unreachable manifest"
        self.ids = ids
        return "after ref" if len(new) > len(reported) else "clean"


def commit_kills(kills: int, backend: str, seed: int = 13) -> dict:
    """SIGKILLs at random points of commits of every kind."""
    with _location(backend) as (url, opts), tempfile.TemporaryDirectory() as work:
        killer, rng, tally, hist = Killer(work), random.Random(seed), Tally(
            f"commit-kills-{backend}"), History()
        open_store(url, opts).close()
        durations: dict[str, float] = {}
        state_seed = 1000
        for mode in MODES:  # calibration: one clean run per kind
            code, events = killer.run("commit", url, opts, (mode, state_seed, 3), None)
            assert code == 0, (mode, code, events)
            durations[mode] = sum(e["seconds"] for e in events if e["event"] == "commit")
            with open_store(url, opts, create=False) as store:
                hist.check(store, [e["id"] for e in events if e["event"] == "commit"], rng, True)
            state_seed += 3
        print(f"[{tally.name}] calibrated: {durations}", flush=True)
        for i in range(kills):
            mode = MODES[i % len(MODES)]
            delay = rng.uniform(0, 1.2 * durations[mode])
            code, events = killer.run("commit", url, opts, (mode, state_seed, 3), delay)
            state_seed += 3
            reported = [e["id"] for e in events if e["event"] == "commit"]
            try:
                with open_store(url, opts, create=False) as store:
                    outcome = hist.check(store, reported, rng, full_verify=i % 10 == 9)
                tally.add(True, f"{mode}: {'finished' if code == 0 else outcome}"
                          f" after {len(reported)} commits")
            except Exception as e:  # noqa: BLE001 - counted, reported, campaign goes on
                tally.add(False, f"{mode}: failed", f"{type(e).__name__}: {e}\n"
                          f"{traceback.format_exc(limit=3)}")
                with open_store(url, opts, create=False) as store:  # re-sync to go on
                    hist.ids = [c.id for c in store.log("main")]
        return tally.summary()


def gc_kills(kills: int, seed: int = 17) -> dict:
    """SIGKILLs during gc(keep_last=3, grace_period=0) of a store with orphans and old commits."""
    with _location("local") as (url, opts), tempfile.TemporaryDirectory() as work:
        killer, rng, tally = Killer(work), random.Random(seed), Tally("gc-kills")
        digests: dict[str, str] = {}
        s = 0
        duration = None
        for i in range(kills + 1):
            with open_store(url, opts) as store:  # 3 commits, an orphan, a tagged old commit
                for _ in range(3):
                    s += 1
                    info = store.commit(build_state("full", s), metadata={"seed": s,
                                                                          "mode": "full"})
                    digests[info.id] = digest(build_state("full", s))
                store.branch(f"tmp{i}")
                s += 1
                store.commit(build_state("full", s), branch=f"tmp{i}")
                store.delete_branch(f"tmp{i}")  # its commit is now an orphan
                if i % 4 == 0:
                    store.tag(f"keep{i}", "main~2")
                plan = store.gc(keep_last=3, grace_period=0, dry_run=True)
                kept = set(plan.kept)
                doomed = set(plan.commits_removed) | set(plan.data_removed)
                present = set(store.commit_ids()) | set(store.storage.listdir("data"))
            code, events = killer.run("gc", url, opts, 3,
                                      None if duration is None else rng.uniform(0, 1.2 *
                                                                                duration))
            if duration is None:
                duration = next(e["seconds"] for e in events if e["event"] == "gc")
                continue
            try:
                with open_store(url, opts, create=False) as store:
                    left_commits = store.commit_ids()
                    left_data = set(store.storage.listdir("data"))
                    for c in kept:
                        assert digest(store.checkout(c)) == digests[c], f"kept commit {c} changed"
                    report = store.verify()
                    assert report.ok, report.problems
                    store.gc(keep_last=3, grace_period=0)
                    assert store.verify().ok
                    assert set(store.commit_ids()) == kept, "gc did not converge"
                gone = len(doomed & present) - len(doomed & (set(left_commits) | left_data))
                where = ("finished" if code == 0 else "killed before removing anything"
                         if gone == 0 else "killed after removing all" if gone == len(doomed)
                         else "killed half-way")
                tally.add(True, where)
            except Exception as e:  # noqa: BLE001
                tally.add(False, "failed", f"{type(e).__name__}: {e}")
        return tally.summary()


def ref_kills(kills: int, seed: int = 19) -> dict:
    """SIGKILLs during sequences of tag and branch creations, moves and deletions."""
    with _location("local") as (url, opts), tempfile.TemporaryDirectory() as work:
        killer, rng, tally = Killer(work), random.Random(seed), Tally("ref-kills")
        digests: dict[str, str] = {}
        with open_store(url, opts) as store:
            for s in range(6):
                info = store.commit(build_state("full", s))
                digests[info.id] = digest(build_state("full", s))
        ids = sorted(digests)
        code, events = killer.run("refs", url, opts, (0, ids), None)
        duration = next(e["seconds"] for e in events if e["event"] == "refs")
        main = None
        for i in range(kills):
            code, events = killer.run("refs", url, opts, (i + 1, ids),
                                      rng.uniform(0, 1.2 * duration))
            done = sum(e["event"] == "op" for e in events)
            try:
                with open_store(url, opts, create=False) as store:
                    main = main or store.resolve("main")
                    assert store.resolve("main") == main, "main moved"
                    names = {**store.branches(), **store.tags()}
                    for name, c in names.items():
                        assert c in digests, f"{name} points at unknown commit {c}"
                    for c in set(names.values()):
                        assert digest(store.checkout(c)) == digests[c], f"commit {c} changed"
                    assert store.verify().ok
                    store.tag(f"probe{i}", "main")  # the refs still work
                    store.delete_tag(f"probe{i}")
                    store.branch(f"probe{i}", "main")
                    store.delete_branch(f"probe{i}")
                tally.add(True, "finished" if code == 0 else f"killed after {done // 4 * 4}-"
                          f"{done // 4 * 4 + 3} of 12 operations")
            except Exception as e:  # noqa: BLE001
                tally.add(False, "failed", f"{type(e).__name__}: {e}")
        return tally.summary()


def commit_each_kind(store: Any) -> dict[str, str]:
    """Three commits of each kind but async (full, quantized, incremental, delta), seeds 1-12;
    the checkout digest of each, by commit id."""
    digests: dict[str, str] = {}
    for s, mode in enumerate([m for m in MODES if m != "async" for _ in range(3)], start=1):
        info = store.commit(build_state(mode, s), policy=policy_for(mode),
                            metadata={"seed": s, "mode": mode})
        digests[info.id] = digest(store.checkout(info.id))
    return digests


def mutations(count: int, seed: int = 23) -> dict:
    """Flip one byte of a random stored object; every commit must check out to its own bits or
    fail with a ckptstore error (``detected``); the object is restored after each check.
    ``unflagged`` in the result lists the changes no checkout reads that ``verify`` does not
    report either (object@offset, the bytes around it, the byte before and after)."""
    import ckptstore

    rng, tally = random.Random(seed), Tally("mutations")
    with tempfile.TemporaryDirectory() as root:
        url = os.path.join(root, "store")
        with open_store(url, {}) as store:
            digests = commit_each_kind(store)
            tip = store.resolve("main")
            history = [c.id for c in store.log("main")]
        # listed in an order that does not depend on the random commit ids, so that the seed
        # picks the same objects and bytes in every run
        order = {c: f"#{i:02d}" for i, c in enumerate(reversed(history))}
        files = sorted((os.path.relpath(os.path.join(d, f), url) for d, _, fs in os.walk(url)
                        for f in fs),
                       key=lambda rel: [order.get(p.removesuffix(".msgpack"), p)
                                        for p in rel.split(os.sep)])
        kinds = collections.Counter()
        unflagged: list[str] = []  # changes no checkout reads and verify does not report
        for _ in range(count):
            rel = rng.choice(files)
            path = os.path.join(url, rel)
            with open(path, "rb") as f:
                original = f.read()
            if not original:
                continue
            pos = rng.randrange(len(original))
            mutated = bytearray(original)
            mutated[pos] ^= rng.randrange(1, 256)
            # a top-level folder or file; zarr metadata apart ("data": its chunks)
            kind = "zarr.json" if os.path.basename(rel) == "zarr.json" else rel.split(os.sep)[0]
            kinds[kind] += 1
            with open(path, "wb") as f:
                f.write(mutated)
            try:
                outcome, detail = _check_mutation(ckptstore, url, digests, tip, history)
                tally.add(outcome != "silently wrong", f"{kind}: {outcome}",
                          f"{rel}@{pos}: {detail}")
                if outcome == "exact, verify clean":
                    unflagged.append(f"{rel}@{pos}: {original[max(pos - 12, 0):pos + 12]!r} "
                                     f"byte {original[pos]:#04x} -> {mutated[pos]:#04x}")
            finally:
                with open(path, "wb") as f:
                    f.write(original)
        result = tally.summary()
        result["objects"] = dict(kinds)
        result["unflagged"] = unflagged
        return result


def _check_mutation(ckptstore: Any, url: str, digests: dict[str, str], tip: str,
                    history: list[str]) -> tuple[str, str]:
    """``exact`` (no commit affected; whether ``verify`` flags the change), ``detected`` (clear
    errors), ``unclear error`` (an exception that is not a ckptstore error: no data returned, but
    a poor message), or ``silently wrong``."""
    errors, unclear = [], []
    try:
        store = open_store(url, {}, create=False)
    except ckptstore.CkptStoreError as e:
        return "detected", f"open: {e}"
    except Exception as e:  # noqa: BLE001
        return "unclear error", f"open: {type(e).__name__}: {e}"
    with store:
        try:  # the history as before, or a clear error
            if [c.id for c in store.log("main")] != history:
                return "silently wrong", "the history of main changed"
        except ckptstore.CkptStoreError as e:
            errors.append(f"log: {type(e).__name__}")
        except Exception as e:  # noqa: BLE001
            unclear.append(f"log: {type(e).__name__}: {e}")
        try:  # a mutated tip may name a commit that does not exist: reading it must fail
            main = store.resolve("main")
            if main != tip:
                store.checkout("main")
                return "silently wrong", f"main checks out as {main}, not {tip}"
        except ckptstore.CkptStoreError as e:
            errors.append(f"main: {type(e).__name__}")
        except Exception as e:  # noqa: BLE001
            unclear.append(f"main: {type(e).__name__}: {e}")
        for c, d in digests.items():
            try:
                got = digest(store.checkout(c))
            except ckptstore.CkptStoreError as e:
                errors.append(f"{c[:8]}: {type(e).__name__}")
                continue
            except Exception as e:  # noqa: BLE001
                unclear.append(f"{c[:8]}: {type(e).__name__}: {e}")
                continue
            if got != d:
                return "silently wrong", f"commit {c} checks out to other bits"
        if unclear:
            return "unclear error", "; ".join(unclear[:3])
        if errors:
            return "detected", "; ".join(errors[:3])
        try:  # nothing a checkout reads changed: does verify see it (zarr.json, old refs)?
            flagged = not store.verify().ok
        except ckptstore.CkptStoreError:
            flagged = True
        return ("exact, verify flags it" if flagged else "exact, verify clean"), ""


# -- locations ------------------------------------------------------------------------------------
def start_moto(bucket: str) -> tuple[Any, dict]:
    """A moto S3 server on 127.0.0.1 holding ``bucket``, its conditional PUTs atomic as S3's,
    and the s3fs options that reach it (s3fs's defaults otherwise)."""
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir,
                                    "tests"))
    from moto_atomic import serialise_conditional_puts

    serialise_conditional_puts()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=bucket)
    return server, {"client_kwargs": {"endpoint_url": endpoint}, "key": "testing",
                    "secret": "testing"}


class _location:
    """A fresh store location: a temporary folder, or a prefix on a moto S3 server."""

    def __init__(self, backend: str):
        self.backend = backend

    def __enter__(self) -> tuple[str, dict]:
        if self.backend == "local":
            self.tmp = tempfile.mkdtemp(prefix="ckpt-reliability-")
            return os.path.join(self.tmp, "store"), {}
        self.server, options = start_moto("ckpt")
        return "s3://ckpt/reliability", {**options, "use_listings_cache": False}

    def __exit__(self, *exc: object) -> None:
        if self.backend == "local":
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            self.server.stop()


# Families of issues 26 and 29, one module each beside this file, each with
# ``campaign(count, seed)``.
FAMILIES = {"two-clients": "hostile_two_clients", "imports": "hostile_imports",
            "files": "hostile_files", "tier-kills": "hostile_tier_kills",
            "tier-rank-kills": "hostile_tier_rank_kills"}


def family(name: str, count: int, seed: int = 29) -> dict:
    """Run the campaign of the family ``name`` (a module of this folder)."""
    import importlib

    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    return importlib.import_module(FAMILIES[name]).campaign(count, seed)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("campaign", choices=["commit-kills", "gc-kills", "ref-kills",
                                             "mutations", *FAMILIES, "all"])
    parser.add_argument("--backend", choices=["local", "s3"], default="local")
    parser.add_argument("--kills", type=int, default=100)
    parser.add_argument("--count", type=int, default=None,
                        help="mutations: 600; a family of issue 26: 200")
    parser.add_argument("--out", help="append the JSON results to this file")
    args = parser.parse_args(argv)
    runs = {
        "commit-kills": lambda: [commit_kills(args.kills, args.backend)],
        "gc-kills": lambda: [gc_kills(args.kills)],
        "ref-kills": lambda: [ref_kills(args.kills)],
        "mutations": lambda: [mutations(args.count or 600)],
        **{name: (lambda name=name: [family(name, args.count or 200)]) for name in FAMILIES},
        "all": lambda: [commit_kills(120, "local"), commit_kills(40, "s3"), gc_kills(40),
                        ref_kills(40), mutations(600),
                        *(family(name, 200) for name in FAMILIES)],
    }[args.campaign]
    t0 = time.perf_counter()
    results = []
    for r in runs():
        r["seconds"] = round(time.perf_counter() - t0, 1)
        print(json.dumps({k: v for k, v in r.items() if k != "failures"}), flush=True)
        results.append(r)
    if args.out:
        with open(args.out, "a") as f:
            for r in results:
                f.write(json.dumps(r) + "\n")
    return 1 if any(r["failed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
