"""Tiered commits (issue 29): what a training loop waits for, when the remote holds a
checkpoint, and how long a restart takes to load the last one.

Usage::

    .venv/bin/python benchmarks/tiered.py                        # 128 MB, 6 commits, 100 MB/s
    .venv/bin/python benchmarks/tiered.py --mb 32 --commits 3    # quick
    .venv/bin/python benchmarks/tiered.py --rate-mbs 0           # remote not throttled

A loop "trains" (``--step-s`` of sleep, then every tensor changes in place) and checkpoints
every ``--k`` steps a float32 state of ``--mb`` MB (8 tensors, random values: they compress
little), in one run: (a) ``commit_async`` to a tiered store (``ckptstore.open(s3_url,
local=tmp)``), (b) ``commit_async`` straight to the S3 URL, (c) DCP's
``torch.distributed.checkpoint.async_save`` (no process group: ``no_dist=True``) with an
``FsspecWriter(s3_url/step-N, thread_count=8, **s3fs options)`` -- the writer is given whole,
without ``checkpoint_id=``, since ``reset(checkpoint_id)`` re-creates its file system without
the s3fs options; like (b), a save waits for the previous one. The remote is a moto S3 server
on 127.0.0.1 behind a small throttling proxy (this file): request bodies (uploads) wait their
turn at ``--rate-mbs`` MB/s shared by all connections, and response bodies (downloads) on a
second link of the same rate (``0``: no proxy). Reported per variant: the median and largest
time a save call blocked training (its capture plus waiting for the previous save), the median
and largest time from the call until the remote holds the checkpoint (its ref moved there: for
(b) when the persist ended, for (a) when the upload thread reports it uploaded, polled every
10 ms; for (c) when the save's future completed), the loop's wall time, and the 1-minute load
average before and after.

(d) Recovery: after (a), a fresh store object opens the tiered store (``open(s3_url,
local=tmp)``: journal, remote refs) and checks out the last commit, read from the local tier;
then a fresh ``open(s3_url)`` checks it out from the remote only, and ``dcp.load`` reads (c)'s
last checkpoint into a state of the same shapes: seconds from the open to the loaded state.
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import statistics
import sys
import tempfile
import threading
import time
import uuid
import warnings
from collections.abc import Callable
from concurrent.futures import Future
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ckptstore  # noqa: E402
from common import command_line, load_average, machine_description, markdown_table  # noqa: E402
from reliability import start_moto  # noqa: E402

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "content-length", "date", "server"}


class Link:
    """One shared link of ``rate`` bytes/s: each body waits for the ones before it."""

    def __init__(self, rate: float):
        self.rate, self.lock, self.free_at = rate, threading.Lock(), 0.0

    def wait_turn(self, nbytes: int) -> None:
        with self.lock:
            start = max(time.monotonic(), self.free_at)
            self.free_at = start + nbytes / self.rate
            done = self.free_at
        time.sleep(max(0.0, done - time.monotonic()))


class Throttle:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` that sends request bodies on at
    ``rate`` bytes/s (``up``) and response bodies back at ``rate`` bytes/s (``down``)."""

    def __init__(self, upstream: str, rate: float):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.up, self.down = Link(rate), Link(rate)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(proxy: Throttle) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args: object) -> None:
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while (size := int(self.rfile.readline().split(b";")[0], 16)) > 0:
                    out += self.rfile.read(size)
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass
                return bytes(out)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _handle(self) -> None:
            body = self._body()
            proxy.up.wait_turn(len(body))
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=120)
            try:
                headers = {k: v for k, v in self.headers.items()
                           if k.lower() not in _HOP and k.lower() != "expect"}
                if self.command not in ("GET", "HEAD", "DELETE") or body:
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
            finally:
                conn.close()
            if self.command != "HEAD":
                proxy.down.wait_turn(len(data))
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            # a HEAD answer has no body: its length is the object's (s3fs sizes files by it)
            length = resp.getheader("Content-Length") if self.command == "HEAD" else None
            self.send_header("Content-Length", length or str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


def make_state(mb: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    n = mb * 2**20 // 4 // 8
    return {f"layer{i}": torch.randn(n // 1024, 1024, generator=g) for i in range(8)}


def uploaded_times(store: ckptstore.Store, stop: threading.Event) -> dict[str, float]:
    """Poll ``store.uploads``: the first time each commit shows as uploaded."""
    seen: dict[str, float] = {}
    while not stop.is_set():
        now = time.perf_counter()
        for u in store.uploads:
            if u.state == "uploaded" and u.commit not in seen:
                seen[u.commit] = now
        time.sleep(0.01)
    return seen


def train(state: dict, args: argparse.Namespace, save: Callable[[int], None]
          ) -> tuple[list[float], list[float], float, float]:
    """The training loop, ``save(step)`` every ``k`` steps: (call times, stalls, the loop's
    start, its seconds)."""
    calls, stalls = [], []
    t0 = time.perf_counter()
    for step in range(1, args.commits * args.k + 1):
        time.sleep(args.step_s)
        for t in state.values():
            t.add_(1e-3)
        if step % args.k == 0:
            calls.append(time.perf_counter())
            save(step)
            stalls.append(time.perf_counter() - calls[-1])
    return calls, stalls, t0, time.perf_counter() - t0


def figures(stalls: list[float], lags: list[float], loop_s: float, all_remote_s: float
            ) -> dict[str, float]:
    return {"stall_med": statistics.median(stalls), "stall_max": max(stalls),
            "lag_med": statistics.median(lags), "lag_max": max(lags), "loop_s": loop_s,
            "all_remote_s": all_remote_s}


def run_loop(store: ckptstore.Store, state: dict, args: argparse.Namespace, tiered: bool
             ) -> dict[str, float]:
    """The training loop with ``commit_async``; returns the figures of one variant."""
    stop, seen = threading.Event(), {}
    poller = threading.Thread(target=lambda: seen.update(uploaded_times(store, stop)))
    if tiered:
        poller.start()
    pendings = []
    calls, stalls, t0, loop_s = train(state, args, lambda step: pendings.append(
        store.commit_async(state, message=f"step {step}", metadata={"step": step})))
    called, remote_at = {}, {}
    for start, pending in zip(calls, pendings):
        info = pending.wait()
        called[info.id] = start
        remote_at[info.id] = start + pending.stall_seconds + pending.persist_seconds
    store.push()
    if tiered:
        time.sleep(0.05)
        stop.set()
        poller.join()
        remote_at = {c: seen[c] for c in called}
    lags = [remote_at[c] - called[c] for c in called]
    return figures(stalls, lags, loop_s, max(remote_at.values()) - t0)


def run_dcp(state: dict, args: argparse.Namespace, url: str, options: dict) -> dict[str, float]:
    """The training loop with DCP's ``async_save`` to ``url/step-N`` (one save in flight, as
    ``commit_async``); returns the figures."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    done: list[float] = []
    futures: list[Future] = []

    def save(step: int) -> None:
        if futures:
            futures[-1].result()
        writer = FsspecWriter(f"{url}/step-{step}", thread_count=8, **options)
        r = dcp.async_save(state, storage_writer=writer, no_dist=True)
        future = getattr(r, "upload_completion", r)  # AsyncSaveResponse or a Future
        future.add_done_callback(lambda _: done.append(time.perf_counter()))
        futures.append(future)

    calls, stalls, t0, loop_s = train(state, args, save)
    for f in futures:
        f.result()
    time.sleep(0.05)
    return figures(stalls, [d - c for c, d in zip(calls, done)], loop_s, max(done) - t0)


def recovery(url: str, local: str, dcp_url: str, state: dict, options: dict
             ) -> list[tuple[str, float]]:
    """(d): seconds from a fresh open to the last checkpoint loaded, per source."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecReader

    out = []
    for name, tier in (("tiered store, the local tier", local),
                       ("the remote only (open(s3_url))", None)):
        t = time.perf_counter()
        with ckptstore.open(url, create=False, local=tier, skip_instance_cache=True,
                            **options) as store:
            store.checkout("main")
        out.append((name, time.perf_counter() - t))
    t = time.perf_counter()
    into = {k: torch.empty_like(v) for k, v in state.items()}
    dcp.load(into, storage_reader=FsspecReader(dcp_url, **options), no_dist=True)
    out.append(("DCP load from S3 (FsspecReader)", time.perf_counter() - t))
    return out


def run_arms(state: dict, args: argparse.Namespace, options: dict
             ) -> tuple[list[list[str]], list[tuple[str, float]]]:
    """(a), (b), (c) in one run, then (d) on (a)'s and (c)'s remotes."""
    rows, tiered_url, dcp_url = [], "", f"s3://ckpt-tiered/dcp-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as tmp:
        for name in ("tiered (local NVMe-like tmp + S3)", "commit_async straight to S3"):
            url = f"s3://ckpt-tiered/run-{uuid.uuid4().hex[:8]}"
            tiered = name.startswith("tiered")
            tiered_url = url if tiered else tiered_url
            store = ckptstore.open(url, local=os.path.join(tmp, "local") if tiered else None,
                                   skip_instance_cache=True, **options)
            store.commit(state, message="warm-up")  # buffers, first write, baseline
            store.push()
            r = run_loop(store, state, args, tiered)
            store.close()
            rows.append(_row(name, r))
        rows.append(_row("DCP async_save, FsspecWriter to S3", run_dcp(
            state, args, dcp_url, options)))
        last = f"{dcp_url}/step-{args.commits * args.k}"
        recovered = recovery(tiered_url, os.path.join(tmp, "local"), last, state, options)
    return rows, recovered


def _row(name: str, r: dict[str, float]) -> list[str]:
    row = [name, f"{r['stall_med'] * 1e3:.0f}", f"{r['stall_max'] * 1e3:.0f}",
           f"{r['lag_med']:.2f}", f"{r['lag_max']:.2f}", f"{r['loop_s']:.1f}",
           f"{r['all_remote_s']:.1f}"]
    print(row, flush=True)
    return row


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=128)
    p.add_argument("--commits", type=int, default=6)
    p.add_argument("--k", type=int, default=5, help="steps between commits")
    p.add_argument("--step-s", type=float, default=0.2, help="seconds of one training step")
    p.add_argument("--rate-mbs", type=float, default=100.0, help="remote MB/s (0: unthrottled)")
    args = p.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    warnings.filterwarnings("ignore", message="torch.distributed is disabled")  # no_dist=True
    server, options = start_moto("ckpt-tiered")
    proxy = None
    if args.rate_mbs > 0:
        proxy = Throttle(options["client_kwargs"]["endpoint_url"], args.rate_mbs * 1e6)
        options = {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
    load_before = load_average()
    rows, recovered = run_arms(make_state(args.mb), args, options)
    rate = f"{args.rate_mbs:g} MB/s" if args.rate_mbs > 0 else "unthrottled"
    print(f"\n{machine_description()}; load average {load_before} before, "
          f"{load_average()} after; remote: moto S3 on 127.0.0.1, {rate} each way")
    print(f"state {args.mb} MB (8 float32 tensors, random), a save every {args.k} steps "
          f"of {args.step_s} s, {args.commits} saves\n")
    print(markdown_table(["variant", "stall median (ms)", "stall max (ms)",
                          "to remote median (s)", "to remote max (s)", "loop (s)",
                          "all on remote (s)"], rows))
    print("\nrecovery of the last checkpoint by a fresh process (open + load)\n")
    print(markdown_table(["from", "seconds"], [[n, f"{t:.2f}"] for n, t in recovered]))
    print(f"\n`{command_line('benchmarks/tiered.py', argv)}`")
    if proxy is not None:
        proxy.close()
    server.stop()


if __name__ == "__main__":
    main()
