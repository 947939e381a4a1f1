"""What a checkout costs on S3 (moto) with ``FsspecStorage`` as it was before issue 26 item 2
(``--before REV``: its module at that commit, s3fs's listings cache on) and as it is now (no
listings cache, one GET a read): a checkout's requests and seconds, and one chunk read's requests
and milliseconds (the store's chunks read one after another), the two alternated in one run.

Usage: ``.venv/bin/python benchmarks/two_clients_reads.py --mib 32 --repeats 5 --before a521a93``
"""

from __future__ import annotations

import argparse
import collections
import json
import logging
import os
import subprocess
import sys
import types
import time
import uuid

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from hostile_two_clients import _S3  # noqa: E402


class _Requests(logging.Handler):
    """Counts the moto server's requests by HTTP method."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: collections.Counter = collections.Counter()

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if '"' in msg:
            self.seen[msg.split('"')[1].split(" ")[0]] += 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--mib", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", default="a521a93", help="the commit of the old module")
    parser.add_argument("--now-first", action="store_true", help="run the new module first")
    args = parser.parse_args(argv)
    import torch

    import ckptstore
    import ckptstore.store as store_module
    from fsspec.core import url_to_fs

    source = subprocess.run(["git", "show", f"{args.before}:ckptstore/storage/fsspec.py"],
                            capture_output=True, text=True, check=True).stdout
    old = types.ModuleType("ckptstore.storage._fsspec_before")
    old.__package__ = "ckptstore.storage"
    exec(compile(source, f"{args.before}:ckptstore/storage/fsspec.py", "exec"), old.__dict__)
    now = store_module.open_storage

    def before(url: str, durable: bool = False, retry: object = None, **opts: object) -> object:
        fs, root = url_to_fs(url, **opts)
        return old.FsspecStorage(fs, root, url=url, durable=durable, retry=retry)

    requests = _Requests()
    log = logging.getLogger("werkzeug")
    log.handlers[:] = [requests]
    log.propagate = False
    log.setLevel(logging.INFO)
    out: dict[str, dict] = {}
    variants = {f"before ({args.before})": before, "now": now}
    if args.now_first:
        variants = dict(reversed(variants.items()))
    times: dict[str, list[float]] = {k: [] for k in variants}
    reads: dict[str, list[float]] = {k: [] for k in variants}
    with _S3() as (bucket, opts):
        url = f"s3://{bucket}/{uuid.uuid4().hex}"
        state = {"w": torch.randn(args.mib * 2**18)}
        with ckptstore.open(url, **opts) as s:
            s.commit(state)
        for _ in range(args.repeats):
            for name, opener in variants.items():  # alternated: the same load for both
                store_module.open_storage = opener
                with ckptstore.open(url, create=False, **opts) as s:
                    s.checkout("main")  # warm: refs, manifest, anything a cache keeps
                    requests.seen.clear()
                    t = time.perf_counter()
                    s.checkout("main")
                    times[name].append(time.perf_counter() - t)
                    out.setdefault(name, {})["requests"] = dict(requests.seen)
                    chunks = [k for k in s.storage.walk_sizes("data") if "/c/" in k]
                    requests.seen.clear()
                    t = time.perf_counter()
                    for key in chunks:  # one after another: each read's own latency
                        s.storage.read(key)
                    reads[name].append((time.perf_counter() - t) / len(chunks))
                    out[name]["requests_per_read"] = {
                        k: v / len(chunks) for k, v in requests.seen.items()}
        store_module.open_storage = now
    for name, ts in times.items():
        ts.sort()
        out[name]["checkout_median_s"] = round(ts[len(ts) // 2], 3)
        out[name]["checkout_s"] = [round(t, 3) for t in ts]
        rs = sorted(reads[name])
        out[name]["read_median_ms"] = round(1e3 * rs[len(rs) // 2], 2)
        out[name]["read_ms"] = [round(1e3 * r, 2) for r in rs]
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
