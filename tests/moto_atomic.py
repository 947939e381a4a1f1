"""moto made to behave like S3 where ckptstore relies on it (shared by tests/conftest.py and
benchmarks/reliability.py)."""

from __future__ import annotations

import threading


def serialise_conditional_puts() -> None:
    """Make moto's ``PutObject`` with ``If-None-Match: *`` atomic, as S3 documents it.

    moto checks for the key and then stores it in two steps while its server answers requests on
    many threads, so two racing creates could both succeed; real S3 lets exactly one win.
    """
    from moto.s3.responses import S3Response

    put_object = S3Response.put_object
    if getattr(put_object, "serialised", False):
        return
    lock = threading.Lock()

    def serialised(self):
        if self.headers.get("If-None-Match") != "*":
            return put_object(self)
        with lock:
            return put_object(self)

    serialised.serialised = True
    S3Response.put_object = serialised
