"""Shared fixtures: the storage contract and the behaviour suites run against every back-end.

Back-ends: a local directory, fsspec ``memory://``, and S3 through s3fs against a real moto S3
server started on 127.0.0.1 for the session (HTTP, no mocked client; the server's conditional
PutObject is made atomic, as S3's is). A test that asks for
one of the ``BACKEND_FIXTURES``, or is marked ``@pytest.mark.every_backend``, runs once per
back-end; otherwise ``store`` is a local store.
"""

from __future__ import annotations

import os
import uuid

import pytest
from moto_atomic import serialise_conditional_puts

import ckptstore
from ckptstore.storage import Storage, open_storage

BACKENDS = ["local", "memory", "s3"]
BACKEND_FIXTURES = ("backend_store", "backend_storage", "open_backend_store")


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 (random port); yields storage options for s3fs."""
    pytest.importorskip("s3fs", reason="s3fs is needed for the S3 back-end")
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
    serialise_conditional_puts()
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import boto3

    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(
        Bucket="ckpt-tests")
    yield {"client_kwargs": {"endpoint_url": endpoint}, "key": "testing", "secret": "testing",
           "use_listings_cache": False}
    server.stop()


@pytest.fixture
def store_url(request, tmp_path):
    """``(url, storage_options)`` of a fresh, empty store location on the back-end under test."""
    backend = getattr(request, "param", "local")
    if backend == "local":
        return str(tmp_path / "store"), {}
    if backend == "memory":
        return f"memory://ckpt-{uuid.uuid4().hex}", {}
    if backend == "s3":
        opts = request.getfixturevalue("s3_server")
        return f"s3://ckpt-tests/{uuid.uuid4().hex}", opts
    raise ValueError(backend)


@pytest.fixture
def store(store_url):
    url, opts = store_url
    s = ckptstore.open(url, **opts)
    yield s
    s.close()


@pytest.fixture
def neighbours(tmp_path):
    """Stores that another test might have left open in this process, one per background
    priority, each with a persist done (its threads alive at their level): tests that read
    thread priorities must see only their own store's threads."""
    import torch
    stores = [ckptstore.open(tmp_path / f"neighbour-{level}", background_priority=level)
              for level in ckptstore.priority.BACKGROUND_PRIORITIES]
    for s in stores:
        s.commit_async({"w": torch.randn(300, 300)}).wait()
    yield stores
    for s in stores:
        s.close()


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "every_backend: run once per back-end (the test's `store` or `store_url`)")


def pytest_generate_tests(metafunc):
    """Tests that ask for a ``backend_*`` fixture, or are marked ``every_backend``, run once per
    back-end."""
    if any(name in metafunc.fixturenames for name in BACKEND_FIXTURES) or \
            metafunc.definition.get_closest_marker("every_backend"):
        metafunc.parametrize("store_url", BACKENDS, indirect=True)


@pytest.fixture
def backend_store(store):
    """A fresh store on each back-end."""
    return store


@pytest.fixture
def open_backend_store(store_url):
    """``open(**options)``: open (again) the store at one fresh location of each back-end."""
    url, opts = store_url
    opened: list[ckptstore.Store] = []

    def open_(**options) -> ckptstore.Store:
        opened.append(ckptstore.open(url, **opts, **options))
        return opened[-1]

    yield open_
    for s in opened:
        s.close()


@pytest.fixture
def backend_storage(store_url) -> Storage:
    """The bare storage of a fresh, empty location on each back-end."""
    url, opts = store_url
    return open_storage(url, **opts)
