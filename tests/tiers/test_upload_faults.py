"""Upload faults of a tiered store through the fault proxy (tests/reliability/proxy.py) in front
of the moto S3 server: transient ones are retried by the storage layer, persistent ones are an
UploadError with nothing of the commit visible remotely, and the next push succeeds."""

from __future__ import annotations

import sys
import uuid
from pathlib import Path

import pytest
import torch

import ckptstore
from ckptstore import Retry, UploadError

sys.path.insert(0, str(Path(__file__).parents[1] / "reliability"))
from proxy import Fault, FaultProxy  # noqa: E402

pytestmark = pytest.mark.s3
CHUNK, MANIFEST = r"/data/.*/c/", r"/commits/.*\.msgpack$"


@pytest.fixture
def proxy(s3_server):
    p = FaultProxy(s3_server["client_kwargs"]["endpoint_url"])
    yield p
    p.close()


def test_faults_retried_then_reported_then_pushed(tmp_path, s3_server, proxy):
    url = f"s3://ckpt-tests/tier-faults-{uuid.uuid4().hex[:8]}"
    options = {**s3_server, "client_kwargs": {"endpoint_url": proxy.endpoint},
               "config_kwargs": {"retries": {"total_max_attempts": 1, "mode": "standard"}},
               "skip_instance_cache": True}
    store = ckptstore.open(url, local=tmp_path / "local",
                           retry=Retry(attempts=3, backoff=0.01, max_backoff=0.05), **options)
    store.tiers.remote.fs.retries = 1  # s3fs's own loop off: ckptstore's retries are the ones
    reader = ckptstore.open(url, create=False, skip_instance_cache=True, **s3_server)

    proxy.add(Fault("PUT", CHUNK, 503, times=2), Fault("PUT", CHUNK, "drop", times=1))
    first = store.commit({"w": torch.randn(128, 128)})
    store.push()  # transient faults: retried underneath
    assert proxy.count("PUT", CHUNK, 503) == 2 and reader.resolve("main") == first.id

    proxy.add(Fault("PUT", MANIFEST, 503, times=None))
    second = store.commit({"w": torch.randn(128, 128)})
    with pytest.raises(UploadError, match="safe on the local tier") as e:
        store.push()
    assert e.value.commit_id == second.id
    assert [u.state for u in store.uploads][-1] == "failed"
    assert reader.resolve("main") == first.id  # chunks up, no manifest, no ref: invisible
    assert reader.verify().ok

    proxy.clear()
    store.push()
    assert reader.resolve("main") == second.id and reader.verify().ok
    store.close()
