"""Hostile campaign family "tier kills" (issue 29): SIGKILLs of a process committing to a tiered
store (a local tier + the moto S3 server), then a fresh process resumes its journal and pushes.

Each trial runs a child (``python hostile_tier_kills.py child ...``) that opens the tiered store
(resuming what earlier children left in the journal), commits three states -- ``commit``, or
``commit_async`` then ``wait()`` -- printing each commit that returned (durable locally), then
pushes. It is SIGKILLed at one point of one kind, rotating over :data:`KINDS`: before the k-th
chunk write of the local tier (``local``; ``async``: during a ``commit_async`` persist), before
the k-th journal record (the local ref has moved), before the k-th chunk upload, after the k-th
remote manifest, before or after the k-th remote ref (these four in the store's upload
process, which kills the child and itself there: :mod:`upload_child`), right after the
k-th ``commit_async`` returned while the store's persist process persists it (``process``: the
persist process outlives the child, finishes that commit on the local tier, and the next open
queues it), or after a random delay (``timer``).

After each kill the campaign requires: a second, independent client of the remote
(``skip_instance_cache=True``) sees no commit whose data is not all there (verify of every
remote manifest); a fresh process opens the tiered store and pushes without an error or a hang;
every commit that returned is then on the local tier and on the remote, bit for bit (checkout
and compare with the state its seed rebuilds), at most one more (its ref moved just before the
kill); the remote branch is the local one. Counts: kills, ``lost`` (commits that returned and
are missing or different on either tier), ``remote_missing_data`` (remote commits that do not
verify), ``raw`` (a child ending with an exception), ``hangs``; 0 of each but kills expected.

Usage: ``.venv/bin/python benchmarks/reliability.py tier-kills --count 56`` (or this file with
``--count``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

from reliability import Tally, start_moto  # noqa: E402
from upload_child import arm_calls, arm_uploads  # noqa: E402

KINDS = ("local", "journal", "chunk", "manifest", "before-ref", "after-ref", "async", "process",
         "timer")
COMMITS = 3  # states a child commits
CHUNK_BYTES = 32 * 1024
HANG_S = 180  # a child or a push running longer is a hang


# -- the child: commits to the tiered store, killed at one point ----------------------------------
def build(seed: int) -> dict[str, Any]:
    """The state committed for ``seed`` (same seed, same bits, in any process)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    return {**{f"w{i}": torch.randn(128, 128, generator=g) for i in range(4)},
            "b": torch.randn(50, generator=g), "step": seed}


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def _arm(cls: type, name: str, k: int, after: bool = False, prefix: str = "") -> None:
    """SIGKILL this process at the ``k``-th call of ``cls.name`` (on a key starting with
    ``prefix``), before or ``after`` the call itself."""
    arm_calls(cls, name, k, after, prefix, _kill)


def arm(kind: str, k: int) -> None:
    """Install the kill point of ``kind`` (``k``: which call, or ms for ``timer``)."""
    from ckptstore.storage import LocalStorage
    from ckptstore.tiers import Journal

    if kind in ("local", "async"):
        _arm(LocalStorage, "put_chunk", k)
    elif kind == "journal":
        _arm(Journal, "add", k)
    elif kind == "chunk":  # the remote's writes: in the store's upload process (.offload)
        arm_uploads("put_chunk", k)
    elif kind == "manifest":
        arm_uploads("put_if_absent", k, after=True, prefix="commits/")
    elif kind in ("before-ref", "after-ref"):
        arm_uploads("put_if_absent", k, after=kind == "after-ref", prefix="refs/heads/")
    elif kind == "timer":
        threading.Timer(k / 1000, _kill).start()


def open_tiered(local: str, url: str, opts: dict) -> Any:
    import ckptstore

    return ckptstore.open(url, local=local, options=ckptstore.EncodingOptions(
        chunk_bytes=CHUNK_BYTES), **opts)


def child(local: str, url: str, opts: dict, kind: str, k: int, first: int) -> None:
    """Commit ``COMMITS`` states from seed ``first``, print each one that returned, push."""
    store = open_tiered(local, url, opts)
    states = [(s, build(s)) for s in range(first, first + COMMITS)]
    if kind == "process":  # the persist process runs: every commit_async goes there
        store.reserve(states[0][1]).result()
        assert store.committer.way == "process", store.committer.way
    print("ready", flush=True)
    arm(kind, k)
    for n, (s, state) in enumerate(states, 1):
        meta = {"seed": s}
        if kind in ("async", "process"):
            pending = store.commit_async(state, message=f"seed {s}", metadata=meta)
            if kind == "process" and n == k:
                _kill()  # its persist in flight in the persist process
            info = pending.wait()
        else:
            info = store.commit(state, message=f"seed {s}", metadata=meta)
        print(f"committed {info.id} {s}", flush=True)
    store.push()
    print("pushed", flush=True)
    store.close()


def push(local: str, url: str, opts: dict) -> None:
    """The fresh process after a kill: open the tiered store (resuming the journal), push."""
    with open_tiered(local, url, opts) as store:
        store.push()
        print("pushed", flush=True)


# -- the campaign ---------------------------------------------------------------------------------
def _spawn(args: list[str], kill_after: float | None = None) -> tuple[int | None, str, str]:
    """Run this file with ``args``; (exit code or None for a hang, stdout, stderr)."""
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after is not None:  # the timer kind: counted from "ready"
        line = p.stdout.readline()
        time.sleep(kill_after)
        p.kill()
        out, err = p.communicate(timeout=HANG_S)
        return p.returncode, line + out, err
    try:
        out, err = p.communicate(timeout=HANG_S)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
        return None, out, err
    return p.returncode, out, err


def _whole(url: str, opts: dict) -> list[str]:
    """Remote commits a second, independent client finds incomplete (verify of each)."""
    import ckptstore

    reader = ckptstore.open(url, create=False, skip_instance_cache=True, **opts)
    bad = []
    report = reader.verify()
    if not report.ok:
        bad.append(f"reachable: {report.problems[:3]}")
    for c in set(reader.commit_ids()) - set(reader.reachable()):
        r = reader.verify(c)
        if not r.ok:
            bad.append(f"{c}: {r.problems[:3]}")
    return bad


def _same(a: dict, b: dict) -> bool:
    import torch

    return a.keys() == b.keys() and all(
        torch.equal(a[k], b[k]) if isinstance(a[k], torch.Tensor) else a[k] == b[k] for k in a)


def _check_tiers(local: str, url: str, opts: dict, returned: dict[str, int],
                 seen: set[str], rng: random.Random) -> list[str]:
    """What returned is on both tiers bit for bit (every commit not ``seen`` before, two older
    ones), at most one more than returned is new; the remote branch is the local one. Returns
    the commits lost (and the other failures); adds the local branch to ``seen``."""
    import ckptstore

    tiers = {"local": ckptstore.open(local, create=False),
             "remote": ckptstore.open(url, create=False, skip_instance_cache=True, **opts)}
    lines = {name: [c.id for c in s.log()] for name, s in tiers.items()}
    lost = [f"{c} not on the {name} tier" for name, line in lines.items()
            for c in returned if c not in line]
    if lines["local"] != lines["remote"]:
        lost.append(f"remote branch {lines['remote'][:3]} != local {lines['local'][:3]}")
    new = set(lines["local"]) - seen
    if len(new - set(returned)) > 1:
        lost.append(f"{len(new - set(returned))} new commits nobody was told of")
    old = sorted(set(returned) - new)
    seen |= set(lines["local"])
    for c in sorted(new) + rng.sample(old, min(2, len(old))):
        for name, s in tiers.items():
            if c in lines[name]:
                seed = s.log(c, limit=1)[0].metadata["seed"]
                if not _same(s.checkout(c), build(seed)):
                    lost.append(f"{c} differs on the {name} tier")
    tiers["local"].close()
    return lost


def _kill_point(kind: str, rng: random.Random, seconds: float) -> int:
    if kind == "timer":
        return int(rng.uniform(0, 1.2 * seconds) * 1000)
    if kind in ("local", "async", "chunk"):
        return rng.randint(1, 30)  # a commit writes 8 chunks and 6 zarr.json
    return rng.randint(1, COMMITS)


def campaign(count: int, seed: int = 31, kinds: tuple[str, ...] = KINDS) -> dict:
    """``count`` trials rotating over ``kinds``; the tally counts the failures."""
    import ckptstore

    tally, rng = Tally("tier-kills"), random.Random(seed)
    server, options = start_moto("ckpt")
    opts = {**options, "use_listings_cache": False}
    url, counts = f"s3://ckpt/tier-kills-{seed}", {"kills": 0, "lost": 0,
                                                   "remote_missing_data": 0, "raw": 0, "hangs": 0}
    returned: dict[str, int] = {}
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="ckpt-tier-kills-") as tmp:
        local = os.path.join(tmp, "local")
        ckptstore.open(url, **opts).close()
        common = [local, url, json.dumps(opts)]
        seconds, first = 0.0, 0
        if "timer" in kinds:  # calibration: one child not killed, for the timer's range
            t0 = time.perf_counter()
            code, out, err = _spawn(["child", *common, "none", "0", "0"])
            assert code == 0, err[-2000:]
            seconds, first = time.perf_counter() - t0, COMMITS
            _record(out, returned)
        for i in range(count):
            kind = kinds[i % len(kinds)]
            k = _kill_point(kind, rng, seconds)
            try:
                outcome = _trial(common, kind, k, first, returned, seen, counts, rng)
                tally.add(not outcome.startswith("FAIL"), outcome, f"{kind} k={k}: {outcome}")
            except Exception as e:  # noqa: BLE001 - counted, reported, campaign goes on
                tally.add(False, f"{kind}: error", f"{type(e).__name__}: {e}\n"
                          f"{traceback.format_exc(limit=4)}")
            first += COMMITS
    server.stop()
    return {**tally.summary(), **counts}


def _record(out: str, returned: dict[str, int]) -> list[str]:
    ids = []
    for line in out.splitlines():
        if line.startswith("committed "):
            _, c, s = line.split()
            returned[c] = int(s)
            ids.append(c)
    return ids


def _trial(common: list[str], kind: str, k: int, first: int, returned: dict[str, int],
           seen: set[str], counts: dict[str, int], rng: random.Random) -> str:
    """One kill, the checks after it; the outcome (``FAIL ...`` for a failure)."""
    local, url, opts = common[0], common[1], json.loads(common[2])
    mode = "timer" if kind == "timer" else kind
    code, out, err = _spawn(["child", *common, mode, str(k), str(first)],
                            kill_after=k / 1000 if kind == "timer" else None)
    new = _record(out, returned)
    killed = code == -signal.SIGKILL
    counts["kills"] += killed
    if code is None:
        counts["hangs"] += 1
        return f"FAIL {kind}: the child hung"
    if not killed and (code != 0 or "pushed" not in out):
        counts["raw"] += 1
        return f"FAIL {kind}: the child ended with {code}: {err[-800:]}"
    bad = _whole(url, opts)  # after the kill, before any resume
    pcode, pout, perr = _spawn(["push", *common])
    if pcode != 0:
        counts["raw" if pcode is not None else "hangs"] += 1
        return f"FAIL {kind}: the push after the kill ended with {pcode}: {perr[-800:]}"
    bad += _whole(url, opts)
    counts["remote_missing_data"] += len(bad)
    lost = _check_tiers(local, url, opts, returned, seen, rng)
    counts["lost"] += len(lost)
    if bad or lost:
        return f"FAIL {kind}: missing data {bad[:2]}, lost {lost[:3]}"
    return f"{kind}: {'killed' if killed else 'finished'} after {len(new)} commits"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("child", "push"):
        local, url, opts = sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
        if sys.argv[1] == "push":
            push(local, url, opts)
        else:
            child(local, url, opts, sys.argv[5], int(sys.argv[6]), int(sys.argv[7]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=56)
    parser.add_argument("--seed", type=int, default=31)
    args = parser.parse_args()
    result = campaign(args.count, args.seed)
    print(json.dumps(result))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
