"""Fixtures of the fault tests: a fault proxy in front of the moto server, stores behind it.

``proxy`` is a :class:`~proxy.FaultProxy` in front of the session's moto server (tests/conftest.py).
``proxied`` opens stores whose S3 traffic goes through it, with the client's own retries
configurable (``client_attempts``) and ckptstore's :class:`~ckptstore.storage.retry.Retry` waits
shortened, so persistent faults fail in a second rather than a minute. ``direct`` opens the same
location without the proxy, to check what a fault left behind.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator

import pytest
from proxy import FaultProxy

import ckptstore
from ckptstore.format.layout import MARKER
from ckptstore.history.manifest import encode_marker
from ckptstore.storage import FsspecStorage
from ckptstore.storage.retry import Retry

CHUNK_BYTES = 16 * 1024  # the small profile of tests/workers.py: its 96 KiB tensor is 6 chunks
FAST = Retry(attempts=3, backoff=0.01, max_backoff=0.05)


@pytest.fixture
def proxy(s3_server) -> Iterator[FaultProxy]:
    p = FaultProxy(s3_server["client_kwargs"]["endpoint_url"])
    yield p
    p.close()


@pytest.fixture
def location() -> str:
    """A fresh store prefix in the test bucket."""
    return f"ckpt-tests/faults-{uuid.uuid4().hex}"


def s3fs_for(endpoint: str, client_attempts: int | None) -> object:
    """A fresh s3fs filesystem on ``endpoint``; ``client_attempts`` caps botocore's attempts
    (None: its defaults) and turns off s3fs's own loop, so ckptstore's retries are the ones seen."""
    import s3fs

    config = {"connect_timeout": 5, "read_timeout": 10}
    if client_attempts is not None:
        config["retries"] = {"total_max_attempts": client_attempts, "mode": "standard"}
    fs = s3fs.S3FileSystem(key="testing", secret="testing", use_listings_cache=False,
                           client_kwargs={"endpoint_url": endpoint}, config_kwargs=config,
                           skip_instance_cache=True)
    if client_attempts is not None:
        fs.retries = 1
    return fs


@pytest.fixture
def proxied(proxy, location) -> Iterator[Callable[..., ckptstore.Store]]:
    """``proxied(client_attempts=1, retry=FAST)``: a store at ``location`` through the proxy."""
    opened: list[ckptstore.Store] = []

    def open_(client_attempts: int | None = 1, retry: Retry | None = FAST) -> ckptstore.Store:
        storage = FsspecStorage(s3fs_for(proxy.endpoint, client_attempts), location,
                                url=f"s3://{location}", retry=retry)
        storage.put_if_absent(MARKER, encode_marker())
        opened.append(ckptstore.Store(storage, ckptstore.EncodingOptions(
            chunk_bytes=CHUNK_BYTES)))
        return opened[-1]

    yield open_
    for s in opened:
        try:
            s.close()
        except ckptstore.CkptStoreError:
            pass


@pytest.fixture
def direct(s3_server, location) -> Callable[[], ckptstore.Store]:
    """Open the store at ``location`` straight on the moto server (no faults)."""
    def open_() -> ckptstore.Store:
        return ckptstore.open(f"s3://{location}", create=False, **s3_server)
    return open_
