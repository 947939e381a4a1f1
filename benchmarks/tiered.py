"""Tiered commits (issue 29): what a training loop waits for, and when the remote holds a commit.

Usage::

    .venv/bin/python benchmarks/tiered.py                        # 128 MB, 6 commits, 100 MB/s
    .venv/bin/python benchmarks/tiered.py --mb 32 --commits 4    # quick
    .venv/bin/python benchmarks/tiered.py --rate-mbs 0           # remote not throttled

A loop "trains" (``--step-s`` of sleep, then every tensor changes in place) and checkpoints
every ``--k`` steps a float32 state of ``--mb`` MB (8 tensors, random values: they compress
little) with ``commit_async``, (a) to a tiered store (``ckptstore.open(s3_url, local=tmp)``) and
(b) straight to the S3 URL. The remote is a moto S3 server on 127.0.0.1 behind a small
throttling proxy (this file): every request body waits its turn at ``--rate-mbs`` MB/s shared by
all connections (``0``: no proxy). Reported per variant: the median and largest time a
``commit_async`` call blocked training (its capture plus waiting for the previous commit's
persist), the median and largest time from the call until the remote holds the commit (its ref
moved there: for (b) when the persist ended, for (a) when the upload thread reports it uploaded;
polled every 10 ms), the loop's wall time, and the 1-minute load average before and after.
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
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402

import ckptstore  # noqa: E402
from common import command_line, load_average, machine_description, markdown_table  # noqa: E402
from reliability import start_moto  # noqa: E402

_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade", "content-length", "date", "server"}


class Throttle:
    """An HTTP proxy on 127.0.0.1 in front of ``upstream`` that sends request bodies on at
    ``rate`` bytes/s, one shared link: each body waits for the ones before it."""

    def __init__(self, upstream: str, rate: float):
        parts = urlsplit(upstream)
        self.upstream, self.rate = (parts.hostname, parts.port), rate
        self.lock, self.free_at = threading.Lock(), 0.0
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_turn(self, nbytes: int) -> None:
        with self.lock:
            start = max(time.monotonic(), self.free_at)
            self.free_at = start + nbytes / self.rate
            done = self.free_at
        time.sleep(max(0.0, done - time.monotonic()))

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
            proxy.wait_turn(len(body))
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
            self.send_response(resp.status)
            for k, v in resp.getheaders():
                if k.lower() not in _HOP:
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
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


def run_loop(store: ckptstore.Store, state: dict, args: argparse.Namespace, tiered: bool
             ) -> dict[str, float]:
    """The training loop; returns the figures of one variant."""
    stalls, calls, remote_at = [], {}, {}
    stop, seen = threading.Event(), {}
    poller = threading.Thread(target=lambda: seen.update(uploaded_times(store, stop)))
    if tiered:
        poller.start()
    pendings = []
    t0 = time.perf_counter()
    for step in range(1, args.commits * args.k + 1):
        time.sleep(args.step_s)
        for t in state.values():
            t.add_(1e-3)
        if step % args.k == 0:
            start = time.perf_counter()
            pending = store.commit_async(state, message=f"step {step}", metadata={"step": step})
            stalls.append(time.perf_counter() - start)
            pendings.append((start, pending))
    loop_s = time.perf_counter() - t0
    for start, pending in pendings:
        info = pending.wait()
        calls[info.id] = start
        remote_at[info.id] = start + pending.stall_seconds + pending.persist_seconds
    store.push()
    if tiered:
        time.sleep(0.05)
        stop.set()
        poller.join()
        remote_at = {c: seen[c] for c in calls}
    lags = [remote_at[c] - calls[c] for c in calls]
    return {"stall_med": statistics.median(stalls), "stall_max": max(stalls),
            "lag_med": statistics.median(lags), "lag_max": max(lags), "loop_s": loop_s,
            "all_remote_s": max(remote_at.values()) - t0}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=128)
    p.add_argument("--commits", type=int, default=6)
    p.add_argument("--k", type=int, default=5, help="steps between commits")
    p.add_argument("--step-s", type=float, default=0.2, help="seconds of one training step")
    p.add_argument("--rate-mbs", type=float, default=100.0, help="remote MB/s (0: unthrottled)")
    args = p.parse_args(argv)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # moto's request log
    server, options = start_moto("ckpt-tiered")
    proxy = None
    if args.rate_mbs > 0:
        proxy = Throttle(options["client_kwargs"]["endpoint_url"], args.rate_mbs * 1e6)
        options = {**options, "client_kwargs": {"endpoint_url": proxy.endpoint}}
    state = make_state(args.mb)
    rows, load_before = [], load_average()
    for name in ("tiered (local NVMe-like tmp + S3)", "commit_async straight to S3"):
        url = f"s3://ckpt-tiered/run-{uuid.uuid4().hex[:8]}"
        with tempfile.TemporaryDirectory() as tmp:
            tiered = name.startswith("tiered")
            store = ckptstore.open(url, local=os.path.join(tmp, "local") if tiered else None,
                                   skip_instance_cache=True, **options)
            store.commit(state, message="warm-up")  # buffers, first write, baseline
            store.push()
            r = run_loop(store, state, args, tiered)
            store.close()
        rows.append([name, f"{r['stall_med'] * 1e3:.0f}", f"{r['stall_max'] * 1e3:.0f}",
                     f"{r['lag_med']:.2f}", f"{r['lag_max']:.2f}", f"{r['loop_s']:.1f}",
                     f"{r['all_remote_s']:.1f}"])
        print(rows[-1], flush=True)
    rate = f"{args.rate_mbs:g} MB/s" if args.rate_mbs > 0 else "unthrottled"
    print(f"\n{machine_description()}; load average {load_before} before, "
          f"{load_average()} after; remote: moto S3 on 127.0.0.1, {rate}")
    print(f"state {args.mb} MB (8 float32 tensors, random), commit_async every {args.k} steps "
          f"of {args.step_s} s, {args.commits} commits\n")
    print(markdown_table(["variant", "stall median (ms)", "stall max (ms)",
                          "to remote median (s)", "to remote max (s)", "loop (s)",
                          "all on remote (s)"], rows))
    print(f"\n`{command_line('benchmarks/tiered.py', argv)}`")
    if proxy is not None:
        proxy.close()
    server.stop()


if __name__ == "__main__":
    main()
