"""Hostile campaign family "tier rank kills" (issue 29): SIGKILLs of one rank of 2 gloo ranks
committing sharded states to tiered stores (a local tier per rank + the moto S3 server), then
fresh processes resume both journals and push.

Each trial runs 2 rank processes (``python hostile_tier_rank_kills.py rank ...``, a gloo group
through a file) that open their tiered stores (resuming what earlier trials left in the
journals), commit three sharded states (DTensors: one table by rows, one by columns), printing
each commit that returned (durable locally), then push. One rank, the victim, is SIGKILLed at one
point of one kind, rotating over :data:`KINDS`: before the k-th local chunk write (``local``),
before the k-th journal record (``journal``: the rank's part is on its disk, not journalled),
before the k-th chunk upload (``chunk``), right after the k-th completion object
(``part``: between a rank's upload and the coordinator's publish), before the k-th adoption of
a manifest by rank 1 (``adopt``), on the coordinator before the k-th remote manifest
(``manifest``), before or after the k-th remote ref (``before-ref``, ``after-ref``), or after a
random delay (``timer``). As a job launcher does, the other rank is killed as soon as the victim
is gone.

After each kill the campaign requires: an independent client of the remote
(``skip_instance_cache=True``) verifies every remote manifest (no commit whose data, any rank's,
is not all there); two fresh processes open the ranks' tiered stores and push, concurrently,
without an error or a hang; every commit that returned on any rank is then on the remote, bit
for bit (checkout of the whole state there, compared with what its seed rebuilds), at most one
more (killed between the coordinator's publish and its print); the remote branch is rank 0's
local one. Counts as in :mod:`hostile_tier_kills`: kills, ``lost``, ``remote_missing_data``,
``raw``, ``hangs``; 0 of each but kills expected.

Usage: ``.venv/bin/python benchmarks/reliability.py tier-rank-kills --count 54`` (or this file
with ``--count``, ``--seed`` and ``--kinds part,adopt``).
"""

from __future__ import annotations

import argparse
import datetime
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

from hostile_tier_kills import _arm, _kill, _record, _same, _whole  # noqa: E402
from reliability import Tally, start_moto  # noqa: E402

KINDS = ("local", "journal", "chunk", "part", "adopt", "manifest", "before-ref", "after-ref",
         "timer")
COORDINATOR_KINDS = ("manifest", "before-ref", "after-ref")  # only rank 0 publishes
COMMITS = 3
CHUNK_BYTES = 32 * 1024
HANG_S = 240
PART_TIMEOUT = 120.0  # the coordinator's wait for the other rank's part, per attempt


# -- the ranks ------------------------------------------------------------------------------------
def full(seed: int) -> dict[str, Any]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return {"emb": torch.randn(512, 64, generator=g), "item": torch.randn(64, 48, generator=g),
            "step": seed}


def sharded(mesh: Any, seed: int) -> dict[str, Any]:
    from torch.distributed.tensor import Shard, distribute_tensor

    t = full(seed)
    return {"emb": distribute_tensor(t["emb"], mesh, [Shard(0)], src_data_rank=None),
            "item": distribute_tensor(t["item"], mesh, [Shard(1)], src_data_rank=None),
            "step": seed}


def open_tiered(local: str, url: str, opts: dict) -> Any:
    import ckptstore

    store = ckptstore.open(url, local=local, options=ckptstore.EncodingOptions(
        chunk_bytes=CHUNK_BYTES), **opts)
    store.tiers.uploader.part_timeout = PART_TIMEOUT
    return store


def arm(kind: str, k: int) -> None:
    from ckptstore.storage import FsspecStorage, LocalStorage
    from ckptstore.tiers import Journal, Tiers

    if kind == "local":
        _arm(LocalStorage, "put_chunk", k)
    elif kind == "journal":
        _arm(Journal, "add", k)
    elif kind == "chunk":
        _arm(FsspecStorage, "put_chunk", k)
    elif kind == "part":
        _arm(FsspecStorage, "put_if_absent", k, after=True, prefix="data/")
    elif kind == "adopt":
        _arm(Tiers, "adopt", k)
    elif kind == "manifest":
        _arm(FsspecStorage, "put_if_absent", k, prefix="commits/")
    elif kind in ("before-ref", "after-ref"):
        _arm(FsspecStorage, "put_if_absent", k, after=kind == "after-ref", prefix="refs/heads/")
    elif kind == "timer":
        threading.Timer(k / 1000, _kill).start()


def rank_main(rank: int, root: str, url: str, opts: dict, kind: str, k: int, first: int) -> None:
    """One rank: commit ``COMMITS`` sharded states from seed ``first``, print each, push."""
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"file://{root}/pg-{first}", rank=rank,
                            world_size=2, timeout=datetime.timedelta(seconds=60))
    mesh = init_device_mesh("cpu", (2,))
    store = open_tiered(os.path.join(root, f"local{rank}"), url, opts)
    states = [(s, sharded(mesh, s)) for s in range(first, first + COMMITS)]
    print("ready", flush=True)
    if kind != "none":
        arm(kind, k)
    for s, state in states:
        info = store.commit(state, message=f"seed {s}", metadata={"seed": s})
        print(f"committed {info.id} {s}", flush=True)
    store.push()
    print("pushed", flush=True)
    store.close()
    dist.destroy_process_group()


def push_main(local: str, url: str, opts: dict) -> None:
    with open_tiered(local, url, opts) as store:
        store.push()
        print("pushed", flush=True)


# -- the campaign ---------------------------------------------------------------------------------
def _popen(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, os.path.abspath(__file__), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _run_ranks(root: str, common: list[str], kinds: tuple[str, str], k: int,
               first: int) -> tuple[list[int | None], list[str], list[str]]:
    """Both ranks; ``kinds[r]`` arms rank r (``timer``: it SIGKILLs itself ``k`` ms after it
    is ready). Once one is killed (or fails) the other is killed too."""
    procs = [_popen(["rank", str(r), root, *common, kinds[r], str(k), str(first)])
             for r in range(2)]
    outs: list[list[str]] = [[], []]

    def read(r: int) -> None:
        for line in procs[r].stdout:  # type: ignore[union-attr]
            outs[r].append(line)

    readers = [threading.Thread(target=read, args=(r,), daemon=True) for r in range(2)]
    for t in readers:
        t.start()
    t0 = time.monotonic()
    while any(p.poll() is None for p in procs):
        if any(p.poll() is not None and p.returncode != 0 for p in procs):
            for p in procs:
                if p.poll() is None:
                    p.kill()  # the launcher stops the job
        if time.monotonic() - t0 > HANG_S:
            for p in procs:
                p.kill()
            for p in procs:
                p.wait()
            return [None, None], ["".join(o) for o in outs], ["hang", "hang"]
        time.sleep(0.02)
    for t in readers:
        t.join()
    errs = [p.stderr.read() for p in procs]  # type: ignore[union-attr]
    return [p.returncode for p in procs], ["".join(o) for o in outs], errs


def _check(root: str, url: str, opts: dict, returned: dict[str, int], seen: set[str],
           rng: random.Random) -> list[str]:
    """Every commit that returned on a rank is on the remote, whole and bit for bit; at most
    one more is new; the remote branch is rank 0's local one."""
    import ckptstore

    remote = ckptstore.open(url, create=False, skip_instance_cache=True, **opts)
    line = [c.id for c in remote.log()] if remote.branches() else []
    with ckptstore.open(os.path.join(root, "local0"), create=False) as rank0:
        local = [c.id for c in rank0.log()] if rank0.branches() else []
    lost = [f"{c} not on the remote" for c in returned if c not in line]
    if local != line:
        lost.append(f"remote branch {line[:3]} != rank 0's {local[:3]}")
    new = set(line) - seen
    if len(new - set(returned)) > 1:
        lost.append(f"{len(new - set(returned))} new commits nobody was told of")
    old = sorted(set(returned) & seen)
    seen |= set(line)
    for c in sorted(new) + rng.sample(old, min(2, len(old))):
        seed = remote.log(c, limit=1)[0].metadata["seed"]
        if not _same(remote.checkout(c), full(seed)):
            lost.append(f"{c} differs on the remote")
    return lost


def _kill_point(kind: str, rng: random.Random, seconds: float) -> int:
    if kind == "timer":
        return int(rng.uniform(0, 1.1 * seconds) * 1000)
    if kind in ("local", "chunk"):
        return rng.randint(1, 14)  # a rank writes ~4 chunks + 4 zarr.json per commit
    if kind == "journal":
        return rng.randint(1, COMMITS)
    if kind == "part":
        return rng.randint(1, COMMITS)  # one completion object per commit and rank
    return rng.randint(1, COMMITS)


def campaign(count: int, seed: int = 41, kinds: tuple[str, ...] = KINDS) -> dict:
    import ckptstore

    tally, rng = Tally("tier-rank-kills"), random.Random(seed)
    server, options = start_moto("ckpt")
    opts = {**options, "use_listings_cache": False}
    url = f"s3://ckpt/tier-rank-kills-{seed}"
    counts = {"kills": 0, "lost": 0, "remote_missing_data": 0, "raw": 0, "hangs": 0}
    returned: dict[str, int] = {}
    seen: set[str] = set()
    with tempfile.TemporaryDirectory(prefix="ckpt-tier-rank-kills-") as root:
        ckptstore.open(url, **opts).close()
        common = [url, json.dumps(opts)]
        t0 = time.perf_counter()  # calibration: a trial not killed, for the timer's range
        codes, outs, errs = _run_ranks(root, common, ("none", "none"), 0, 0)
        assert codes == [0, 0], errs
        seconds, first = time.perf_counter() - t0, COMMITS
        for o in outs:
            _record(o, returned)
        for i in range(count):
            kind = kinds[i % len(kinds)]
            victim = 0 if kind in COORDINATOR_KINDS else 1 if kind == "adopt" else i // len(
                kinds) % 2
            k = _kill_point(kind, rng, seconds)
            try:
                outcome = _trial(root, common, kind, victim, k, first, returned, seen, counts,
                                 rng)
                tally.add(not outcome.startswith("FAIL"), outcome,
                          f"{kind} rank {victim} k={k}: {outcome}")
            except Exception as e:  # noqa: BLE001 - counted, reported, campaign goes on
                tally.add(False, f"{kind}: error", f"{type(e).__name__}: {e}\n"
                          f"{traceback.format_exc(limit=4)}")
            first += COMMITS
    server.stop()
    return {**tally.summary(), **counts, "seconds": round(time.perf_counter() - t0)}


def _trial(root: str, common: list[str], kind: str, victim: int, k: int, first: int,
           returned: dict[str, int], seen: set[str], counts: dict[str, int],
           rng: random.Random) -> str:
    url, opts = common[0], json.loads(common[1])
    armed = (kind, "none") if victim == 0 else ("none", kind)
    codes, outs, errs = _run_ranks(root, common, armed, k, first)
    new = [c for o in outs for c in _record(o, returned)]
    if codes == [None, None]:
        counts["hangs"] += 1
        return f"FAIL {kind}: the ranks hung"
    killed = codes[victim] == -signal.SIGKILL
    counts["kills"] += killed
    if not killed and codes != [0, 0]:
        counts["raw"] += 1
        bad = [r for r in range(2) if codes[r] not in (0, -signal.SIGKILL)]
        return f"FAIL {kind}: rank(s) {bad} ended with {codes}: {errs[bad[0]][-800:]}"
    bad = _whole(url, opts)  # after the kill, before any resume
    pushes = [_popen(["push", os.path.join(root, f"local{r}"), *common]) for r in range(2)]
    for r, p in enumerate(pushes):
        try:
            _, perr = p.communicate(timeout=HANG_S)
        except subprocess.TimeoutExpired:
            p.kill()
            p.communicate()
            counts["hangs"] += 1
            return f"FAIL {kind}: the push of rank {r} after the kill hung"
        if p.returncode != 0:
            counts["raw"] += 1
            return f"FAIL {kind}: the push of rank {r} ended with {p.returncode}: {perr[-800:]}"
    bad += _whole(url, opts)
    counts["remote_missing_data"] += len(bad)
    lost = _check(root, url, opts, returned, seen, rng)
    counts["lost"] += len(lost)
    if bad or lost:
        return f"FAIL {kind}: missing data {bad[:2]}, lost {lost[:3]}"
    commits = len(set(new))
    return f"{kind} rank {victim}: {'killed' if killed else 'finished'} after {commits} commits"


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] == "rank":
        rank, root, url, opts = int(sys.argv[2]), sys.argv[3], sys.argv[4], json.loads(
            sys.argv[5])
        rank_main(rank, root, url, opts, sys.argv[6], int(sys.argv[7]), int(sys.argv[8]))
        return 0
    if len(sys.argv) > 1 and sys.argv[1] == "push":
        push_main(sys.argv[2], sys.argv[3], json.loads(sys.argv[4]))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--count", type=int, default=54)
    parser.add_argument("--seed", type=int, default=41)
    parser.add_argument("--kinds", default=",".join(KINDS),
                        help=f"comma-separated, of {','.join(KINDS)}")
    args = parser.parse_args()
    kinds = tuple(args.kinds.split(","))
    if not set(kinds) <= set(KINDS):
        parser.error(f"--kinds: {sorted(set(kinds) - set(KINDS))} not among {KINDS}")
    result = campaign(args.count, args.seed, kinds)
    print(json.dumps(result))
    return 1 if result["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
