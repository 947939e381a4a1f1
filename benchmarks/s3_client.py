"""The S3 client's CPU for chunk PUTs: each PUT naming its CRC32C (``ChecksumCRC32C``, issue 28's
eighteenth slice) against botocore computing its own CRC-32 of the body (the default before).

Usage::

    .venv/bin/python benchmarks/s3_client.py                     # 16 chunks of 8 MiB, 5 rounds
    .venv/bin/python benchmarks/s3_client.py --chunks 8 --rounds 3

A moto S3 server runs in a process of its own (cpu_proxy.py's ``Remote``), so this process's CPU
is the client's alone: ``FsspecStorage.put_chunk`` of ``--chunks`` random chunks of
``--chunk-mib`` MiB from 8 threads, as a commit's writers do; the two ways alternate, round by
round. Reported: the client's CPU seconds and wall seconds a GiB (medians), and their ratio.
Over plain ``http://`` (as moto's endpoint is) botocore also hashes every body with SHA-256 for
its signature, in both ways alike.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import command_line, machine_description, markdown_table  # noqa: E402
from cpu_proxy import Remote  # noqa: E402

from ckptstore.storage import fsspec as fsspec_storage  # noqa: E402
from ckptstore.storage import open_storage  # noqa: E402

WAYS = {"the chunk's CRC32C named (now)": fsspec_storage._ONE_PUT,
        "botocore's own CRC-32 (before)": 0}


def one_round(remote: Remote, chunks: list[bytes], one_put: int) -> tuple[float, float]:
    """CPU and wall seconds of this process for PUTting ``chunks`` to a fresh prefix."""
    fsspec_storage._ONE_PUT = one_put  # 0: no checksum named (the body is never below 0 bytes)
    storage = open_storage(f"s3://{remote.BUCKET}/{uuid.uuid4().hex}", **remote.options)
    with ThreadPoolExecutor(8) as pool:
        c0, w0 = time.process_time(), time.perf_counter()
        list(pool.map(lambda i: storage.put_chunk(f"data/c/{i}", chunks[i]), range(len(chunks))))
        cpu, wall = time.process_time() - c0, time.perf_counter() - w0
    storage.delete_tree("data")
    return cpu, wall


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--chunks", type=int, default=16)
    ap.add_argument("--chunk-mib", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args(argv)
    print(f"# {command_line(__file__, argv)}\n# {machine_description()}\n")
    rng = np.random.default_rng(0)
    chunks = [rng.integers(0, 256, args.chunk_mib << 20, np.uint8).tobytes()
              for _ in range(args.chunks)]
    gib = args.chunks * args.chunk_mib / 1024
    remote = Remote()
    runs: dict[str, list[tuple[float, float]]] = {w: [] for w in WAYS}
    try:
        one_round(remote, chunks, WAYS["botocore's own CRC-32 (before)"])  # warm
        for r in range(args.rounds):
            for way in (WAYS if r % 2 == 0 else reversed(list(WAYS))):
                runs[way].append(one_round(remote, chunks, WAYS[way]))
    finally:
        fsspec_storage._ONE_PUT = WAYS["the chunk's CRC32C named (now)"]
        remote.close()
    now = statistics.median(c for c, _ in runs["the chunk's CRC32C named (now)"])
    rows = [[way, f"{statistics.median(c for c, _ in v) / gib:.3f}",
             f"{statistics.median(w for _, w in v) / gib:.3f}",
             f"{statistics.median(c for c, _ in v) / now:.2f}x"] for way, v in runs.items()]
    print(markdown_table(["way", "client CPU-s a GiB", "wall s a GiB", "CPU / now's"], rows,
                         "lrrr"))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
