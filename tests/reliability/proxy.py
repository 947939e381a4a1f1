"""A fault-injecting HTTP proxy between s3fs and the moto S3 server (a real socket server).

Requests are read whole, then either forwarded to the server (``http.client``) and the answer
relayed, or answered with a fault chosen by the first matching :class:`Fault`:

- ``status``: an S3 error document with that status (500 ``InternalError``, 503 ``SlowDown``), the
  request never reaching the server;
- ``drop``: the connection closed without an answer before the request reaches the server;
- ``drop-after``: the request forwarded (the server stores the object) and the connection then
  closed without the answer -- the ambiguous case of a write whose success the client never sees;
- ``truncate``: the request forwarded, the answer cut in the middle of its body.

>>> proxy = FaultProxy("http://127.0.0.1:9000")            # doctest: +SKIP
>>> proxy.add(Fault("PUT", r"/data/.*/c/", action=503, times=2))   # doctest: +SKIP
"""

from __future__ import annotations

import http.client
import re
import socket
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

__all__ = ["Fault", "FaultProxy"]

_ERRORS = {500: "InternalError", 502: "BadGateway", 503: "SlowDown", 504: "GatewayTimeout"}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer",
        "upgrade"}


@dataclass
class Fault:
    """Answer matching requests with a fault.

    Parameters
    ----------
    method
        HTTP method (``PUT``, ``GET``, ``HEAD``, ...) or ``*``.
    pattern
        Regular expression searched in the unquoted request path (``/bucket/key``).
    action
        An HTTP status (500, 503, ...), ``"drop"``, ``"drop-after"`` or ``"truncate"``.
    skip
        Matching requests let through before the first fault (the fault hits the skip+1-th).
    times
        How many matching requests get the fault (None: all of them, a persistent fault).
    """

    method: str
    pattern: str
    action: int | str
    skip: int = 0
    times: int | None = 1
    seen: int = field(default=0, init=False)
    fired: int = field(default=0, init=False)

    def take(self, method: str, path: str) -> bool:
        """Whether this request gets the fault (counts it; called under the proxy's lock)."""
        if self.method not in ("*", method) or not re.search(self.pattern, path):
            return False
        self.seen += 1
        if self.seen <= self.skip or (self.times is not None and self.fired >= self.times):
            return False
        self.fired += 1
        return True


class FaultProxy:
    """A threaded HTTP proxy on 127.0.0.1 in front of ``upstream``; ``endpoint`` is its URL.

    ``log`` lists ``(method, path, outcome)`` of every request (outcome: the status relayed or
    the fault), so a test can count attempts.
    """

    def __init__(self, upstream: str):
        parts = urlsplit(upstream)
        self.upstream = (parts.hostname, parts.port)
        self.faults: list[Fault] = []
        self.log: list[tuple[str, str, int | str]] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(self))
        self.server.daemon_threads = True
        self.endpoint = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self._thread.start()

    def add(self, *faults: Fault) -> FaultProxy:
        with self.lock:
            self.faults.extend(faults)
        return self

    def clear(self) -> None:
        """Remove every fault (the log is kept)."""
        with self.lock:
            self.faults.clear()

    def fault_for(self, method: str, path: str) -> int | str | None:
        with self.lock:
            for f in self.faults:
                if f.take(method, path):
                    return f.action
        return None

    def record(self, method: str, path: str, outcome: int | str) -> None:
        with self.lock:
            self.log.append((method, path, outcome))

    def count(self, method: str, pattern: str, outcome: int | str | None = None) -> int:
        """Requests logged with this method, a path matching ``pattern`` (and ``outcome``)."""
        with self.lock:
            return sum(1 for m, p, o in self.log if m == method and re.search(pattern, p)
                       and outcome in (None, o))

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def _handler(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the client expects

        def log_message(self, *args: object) -> None:  # quiet
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                out = bytearray()
                while True:
                    size = int(self.rfile.readline().split(b";")[0], 16)
                    if size == 0:
                        while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                            pass
                        return bytes(out)
                    out += self.rfile.read(size)
                    self.rfile.readline()
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _drop(self) -> None:
            self.close_connection = True
            try:
                self.connection.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

        def _error(self, status: int) -> None:
            code = _ERRORS.get(status, "InternalError")
            body = (f'<?xml version="1.0" encoding="UTF-8"?><Error><Code>{code}</Code>'
                    f"<Message>injected by the test proxy</Message></Error>").encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/xml")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _forward(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes]:
            conn = http.client.HTTPConnection(*proxy.upstream, timeout=60)
            try:
                headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP
                           and k.lower() != "expect"}
                if self.command not in ("GET", "HEAD", "DELETE") or body:
                    headers["Content-Length"] = str(len(body))
                conn.request(self.command, self.path, body=body, headers=headers)
                resp = conn.getresponse()
                data = resp.read()
                return resp.status, resp.getheaders(), data
            finally:
                conn.close()

        def _handle(self) -> None:
            body = self._body()
            path = unquote(urlsplit(self.path).path)
            action = proxy.fault_for(self.command, path)
            if action == "drop":
                proxy.record(self.command, path, "drop")
                return self._drop()
            if isinstance(action, int):
                proxy.record(self.command, path, action)
                return self._error(action)
            status, headers, data = self._forward(body)
            if action == "drop-after":
                proxy.record(self.command, path, "drop-after")
                return self._drop()
            proxy.record(self.command, path, "truncate" if action == "truncate" else status)
            self.send_response(status)
            for k, v in headers:
                if k.lower() not in _HOP and k.lower() not in ("content-length", "date",
                                                               "server"):
                    self.send_header(k, v)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command == "HEAD":
                return
            if action == "truncate":
                self.wfile.write(data[: len(data) // 2])
                return self._drop()
            self.wfile.write(data)

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler
