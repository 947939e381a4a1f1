"""Hostile files in a local store (issue 26 items 6 and 10): non-regular files, links and
truncation under a reader.

A real store holds commits of every kind the reliability campaign makes (full, quantized, row
increments, XOR chains) and one of large chunks (~2 MiB: mapped before issue 26). Each trial
picks an attack and a stored file (or folder) at random:

- ``dev-zero``, ``fifo``, ``socket``, ``loop`` (a link to itself), ``folder`` (an empty folder),
  ``huge`` (a sparse file of 5 GiB) in the file's place;
- ``outside``: a link to a copy of the file out of the store's root (the same bytes: following
  it would read right data -- still refused);
- ``folder-outside``: the file's folder moved out of the root and linked back; the reader also
  tries to tag (a write) -- nothing may appear out of the root;
- ``truncate-0`` / ``truncate-half``: a chunk (half of the time a large one) truncated at a
  random moment while a child process checks out the commit that holds it ten times in a row.

The reader is a forked child (1 GiB more heap at most, 30 s): it opens the store, lists the
history, checks out every commit and compares each with its digest. Counted, all expected 0:
``lost`` (after the file is restored, a commit no longer checks out exactly), ``silent`` (a
checkout with other bits, or a link out of the root followed without an error), ``raw`` (an
exception that is not a ckptstore error), ``hangs``, ``crashes`` (the child killed by a
signal: ``SIGBUS``), ``wrote outside``. Passes: ``refused`` (UnsafeFileError), ``detected``
(another ckptstore error), ``unread`` (no reader reads that file: an old ref file, zarr.json),
``whole`` (a truncation after the reads).

Usage (from the repository root)::

    .venv/bin/python benchmarks/hostile_files.py --count 200 --seed 29
    .venv/bin/python benchmarks/reliability.py files --count 200
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import socket
import sys
import tempfile
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from reliability import Tally, commit_each_kind, digest, open_store  # noqa: E402

ATTACKS = ("dev-zero", "fifo", "socket", "loop", "folder", "huge", "outside", "folder-outside",
           "truncate-0", "truncate-half")
DEADLINE = 30.0
ROUNDS = 10  # checkouts of the commit whose chunk is truncated under them
FAILURES = ("lost", "silent", "raw", "hang", "crash", "wrote outside")


def campaign(count: int, seed: int, attacks: tuple[str, ...] = ATTACKS) -> dict:
    """``count`` trials of random ``attacks`` on a fresh store; the tally (see the module)."""
    import ckptstore
    import torch

    rng, tally = random.Random(seed), Tally("files")
    with tempfile.TemporaryDirectory(prefix="ckpt-files-") as tmp:
        url, outside = os.path.join(tmp, "store"), os.path.join(tmp, "outside")
        digests = _template(ckptstore, torch, url)
        files = _files(url)
        chunks = [f for f in files if _is_chunk(f)]
        large = [f for f in chunks if os.path.getsize(os.path.join(url, f)) >= 1 << 20]
        tip_refs = {_tip_ref(url)}
        assert _read_all(url, digests, None)["status"] == "exact"
        t0 = time.perf_counter()
        _read_all(url, {c: d for c, d in digests.items() if c == large[0].split("/")[1]}, None)
        duration = time.perf_counter() - t0  # one checkout of the large commit
        kinds: dict[str, int] = {}
        for trial in range(count):
            attack = rng.choice(attacks)
            if attack.startswith("truncate"):  # half of them a large chunk (reused buffers)
                rel = rng.choice(large if rng.random() < 0.5 else chunks)
            elif attack == "folder-outside":  # not the root's own files: a root that is a
                rel = rng.choice([f for f in files if "/" in f])  # link is a fine root
            else:
                rel = rng.choice(files)
            kinds[attack] = kinds.get(attack, 0) + 1
            os.makedirs(outside, exist_ok=True)
            outcome, detail = _trial(url, outside, rel, attack, digests, rng, duration, trial)
            read = _is_chunk(rel) or rel.startswith("commits/") or rel in tip_refs or \
                rel == "ckptstore.json" or attack == "folder-outside"
            if outcome == "exact":
                # a file a reader reads, replaced, and no error: only a link out was followed
                outcome = ("whole (read before the cut)" if attack.startswith("truncate") else
                           "silent" if read else "unread")
            shutil.rmtree(outside, ignore_errors=True)
            _drop_tags(url)
            after = _read_all(url, digests, None)  # restored: every commit as committed
            if after["status"] != "exact":
                outcome, detail = "lost", f"after restoring {rel}: {after}"
            tally.add(outcome not in FAILURES, f"{attack}: {outcome}", f"{rel}: {detail}")
        result = tally.summary()
        result["attacks"] = kinds
        result["counts"] = {k: sum(n for o, n in tally.outcomes.items() if o.endswith(": " + k))
                            for k in FAILURES}
        return result


def _template(ckptstore: Any, torch: Any, url: str) -> dict[str, str]:
    """The store: three commits of each kind, then one of large chunks; digests by commit."""
    with open_store(url, {}) as store:
        digests = commit_each_kind(store)
    big = {"big": torch.randn(8 * 4096, 64, generator=torch.Generator().manual_seed(7))}
    with ckptstore.open(url, options=ckptstore.EncodingOptions(chunk_bytes=1 << 21)) as store:
        info = store.commit(big)
        digests[info.id] = digest(store.checkout(info.id))
    return digests


def _files(url: str) -> list[str]:
    """Every stored file, as a key (sorted: the seed picks the same ones in every run)."""
    return sorted(os.path.relpath(os.path.join(d, f), url).replace(os.sep, "/")
                  for d, _, fs in os.walk(url) for f in fs)


def _is_chunk(rel: str) -> bool:
    return rel.startswith("data/") and not rel.endswith("zarr.json")


def _tip_ref(url: str) -> str:
    folder = os.path.join(url, "refs", "heads", "main")
    return f"refs/heads/main/{max(os.listdir(folder))}"


def _snapshot(folder: str) -> dict[str, int]:
    return {os.path.join(d, f): os.lstat(os.path.join(d, f)).st_size
            for d, _, fs in os.walk(folder) for f in fs} | \
        {d: -1 for d, _, _ in os.walk(folder)}


def _drop_tags(url: str) -> None:
    shutil.rmtree(os.path.join(url, "refs", "tags"), ignore_errors=True)


def _trial(url: str, outside: str, rel: str, attack: str, digests: dict[str, str],
           rng: random.Random, duration: float, trial: int) -> tuple[str, str]:
    """Attack ``rel``, read in a child, restore; ``(outcome, detail)`` of the reader."""
    path = os.path.join(url, *rel.split("/"))
    saved = os.path.join(outside, "..", f"saved-{trial}")
    if attack == "folder-outside":
        folder = os.path.dirname(path)
        moved = os.path.join(outside, "moved")
        shutil.copytree(folder, saved, symlinks=True)
        shutil.move(folder, moved)
        os.symlink(moved, folder)
        try:
            before = _snapshot(outside)
            return _unless_written(outside, before, _outcome(_in_child(url, digests,
                                                                       f"t{trial}")))
        finally:
            os.unlink(folder)
            shutil.rmtree(moved, ignore_errors=True)
            shutil.copytree(saved, folder, symlinks=True)
            shutil.rmtree(saved)
    shutil.copy2(path, saved)
    try:
        if attack.startswith("truncate"):
            return _truncated(url, path, attack, digests, rng, duration)
        _replace(path, attack, outside)
        before = _snapshot(outside)
        return _unless_written(outside, before, _outcome(_in_child(url, digests, None)))
    finally:
        if os.path.isdir(path) and not os.path.islink(path):
            os.rmdir(path)
        elif os.path.lexists(path):
            os.unlink(path)
        shutil.copy2(saved, path)
        os.unlink(saved)


def _unless_written(outside: str, before: dict[str, int], outcome: tuple[str, str]
                    ) -> tuple[str, str]:
    """``outcome``, unless something out of the root changed meanwhile."""
    after = _snapshot(outside)
    if after != before:
        return "wrote outside", f"{sorted(set(after) ^ set(before))[:5]}"
    return outcome


def _replace(path: str, attack: str, outside: str) -> None:
    if attack == "outside":
        shutil.copy2(path, os.path.join(outside, "copy"))
    os.unlink(path)
    if attack == "dev-zero":
        os.symlink("/dev/zero", path)
    elif attack == "fifo":
        os.mkfifo(path)
    elif attack == "loop":
        os.symlink(os.path.basename(path), path)
    elif attack == "folder":
        os.mkdir(path)
    elif attack == "huge":  # sparse: no disk used, 5 GiB to read
        with open(path, "wb") as f:
            f.truncate(5 << 30)
    elif attack == "outside":
        os.symlink(os.path.join(outside, "copy"), path)
    elif attack == "socket":
        short = os.path.join(tempfile.mkdtemp(), "s")  # AF_UNIX paths are short: bind, move
        s = socket.socket(socket.AF_UNIX)
        s.bind(short)
        s.close()
        os.rename(short, path)
        os.rmdir(os.path.dirname(short))


def _truncated(url: str, path: str, attack: str, digests: dict[str, str], rng: random.Random,
               duration: float) -> tuple[str, str]:
    """Truncate ``path`` at a random moment while a child checks out the commit that owns it
    ``ROUNDS`` times in a row."""
    owner = os.path.relpath(path, url).split(os.sep)[1]
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    ready = ctx.Event()
    p = ctx.Process(target=_child, args=(url, {owner: digests[owner]}, None, child, ready,
                                         ROUNDS), daemon=True)
    p.start()
    ready.wait(DEADLINE)
    time.sleep(rng.uniform(0, ROUNDS * duration))
    size = os.path.getsize(path)
    os.truncate(path, 0 if attack == "truncate-0" else size // 2)
    return _outcome(_collect(p, parent))


def _in_child(url: str, digests: dict[str, str], tag: str | None) -> dict:
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe(duplex=False)
    p = ctx.Process(target=_child, args=(url, digests, tag, child, None, 1), daemon=True)
    p.start()
    return _collect(p, parent)


def _collect(p: Any, parent: Any) -> dict:
    got = parent.recv() if parent.poll(DEADLINE) else None
    if got is None:
        p.kill()
    p.join(10)
    if got is None:
        code = p.exitcode
        if code is not None and code < 0 and code != -9:
            return {"status": "crash", "detail": f"killed by signal {-code}"}
        return {"status": "hang", "detail": f"no answer in {DEADLINE:.0f} s"}
    return got


def _outcome(result: dict) -> tuple[str, str]:
    status = result["status"]
    if status == "error":
        kind = "refused" if result["type"] == "UnsafeFileError" else "detected"
        return kind, f"{result['type']}: {result['detail'][:200]}"
    return status, result.get("detail", "")[:300]


def _child(url: str, digests: dict[str, str], tag: str | None, conn: Any, ready: Any,
           rounds: int) -> None:
    _cap_memory()
    if ready is not None:
        ready.set()
    result = {"status": "exact"}
    for _ in range(rounds):
        result = _read_all(url, digests, tag)
        if result["status"] != "exact":
            break
    conn.send(result)


def _read_all(url: str, digests: dict[str, str], tag: str | None) -> dict:
    """Open, log, check out every commit (and tag, a write); the first failure, or exact."""
    import ckptstore
    from ckptstore.errors import UnsafeFileError

    try:
        with open_store(url, {}, create=False) as store:
            [c.id for c in store.log("main")]
            for commit_id, want in digests.items():
                if digest(store.checkout(commit_id)) != want:
                    return {"status": "silent", "detail": f"commit {commit_id} differs"}
            if tag is not None:
                store.tag(tag, "main")
    except ckptstore.CkptStoreError as e:
        kind = "UnsafeFileError" if isinstance(e, UnsafeFileError) else type(e).__name__
        return {"status": "error", "type": kind, "detail": str(e)}
    except Exception as e:  # noqa: BLE001 - the campaign counts it
        return {"status": "raw", "detail": f"{type(e).__name__}: {e}"}
    return {"status": "exact"}


def _cap_memory() -> None:
    """At most 1 GiB more heap (a read of ``/dev/zero`` fails fast instead of filling memory)."""
    try:
        with open("/proc/self/status") as f:
            data = next(int(line.split()[1]) << 10 for line in f if line.startswith("VmData:"))
    except (OSError, StopIteration):
        return
    resource.setrlimit(resource.RLIMIT_DATA, (data + (1 << 30), data + (1 << 30)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=200)
    ap.add_argument("--seed", type=int, default=29)
    ap.add_argument("--attacks", default=",".join(ATTACKS), help="a comma-separated subset")
    args = ap.parse_args(argv)
    attacks = tuple(a for a in args.attacks.split(",") if a)
    if set(attacks) - set(ATTACKS):
        ap.error(f"unknown attacks {sorted(set(attacks) - set(ATTACKS))}; known: {ATTACKS}")
    result = campaign(args.count, args.seed, attacks)
    print(json.dumps(result, indent=1))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    raise SystemExit(main())
