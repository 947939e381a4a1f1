"""Shared fixtures: one behaviour suite runs against every storage back-end.

Back-ends: a local directory, fsspec ``memory://``, and S3 through s3fs against a real moto S3
server started on 127.0.0.1 for the session (HTTP, no in-process mocking).
"""

from __future__ import annotations

import os
import uuid

import pytest

import ckptstore

BACKENDS = ["local", "memory", "s3"]


@pytest.fixture(scope="session")
def s3_server():
    """A moto S3 server on 127.0.0.1 (random port); yields storage options for s3fs."""
    pytest.importorskip("s3fs", reason="s3fs is needed for the S3 back-end")
    from moto.server import ThreadedMotoServer

    os.environ.setdefault("AWS_ACCESS_KEY_ID", "testing")
    os.environ.setdefault("AWS_SECRET_ACCESS_KEY", "testing")
    os.environ.setdefault("AWS_DEFAULT_REGION", "us-east-1")
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


def pytest_generate_tests(metafunc):
    """Tests that ask for ``backend_store`` run once per back-end."""
    if "backend_store" in metafunc.fixturenames:
        metafunc.parametrize("store_url", BACKENDS, indirect=True)


@pytest.fixture
def backend_store(store):
    return store
