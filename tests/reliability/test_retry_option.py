"""``ckptstore.open(url, retry=Retry(...))``: the retry policy of object-store requests, set
through the public API. Through the fault proxy (``proxy.py``), with the S3 client's own retries
off, ``Retry(attempts=1)`` fails a commit on the first 503 while the default policy rides it
out; a policy out of range is refused when it is made."""

from __future__ import annotations

import math

import pytest
from checks import check_store, commit_seed
from proxy import Fault

import ckptstore
from ckptstore import Retry
from ckptstore.storage import FsspecStorage, LocalStorage, MemoryStorage, open_storage
from ckptstore.errors import InvalidRetry

CHUNK = r"/data/[0-9a-f]{32}/w/c/"  # the small profile's big tensor: 6 chunks


def _open(proxy, location: str, **kw: object) -> ckptstore.Store:
    """The store at ``location`` through the proxy, by ``ckptstore.open``; botocore makes one
    attempt and s3fs's own loop is off, so only ckptstore's retries act."""
    store = ckptstore.open(
        f"s3://{location}", key="testing", secret="testing", use_listings_cache=False,
        skip_instance_cache=True, client_kwargs={"endpoint_url": proxy.endpoint},
        config_kwargs={"connect_timeout": 5, "read_timeout": 10,
                       "retries": {"total_max_attempts": 1, "mode": "standard"}},
        options=ckptstore.EncodingOptions(chunk_bytes=16 * 1024), **kw)
    store.storage.fs.retries = 1
    return store


@pytest.mark.s3
def test_one_attempt_fails_on_the_first_fault(proxy, location, direct):
    policy = Retry(attempts=1)
    with _open(proxy, location, retry=policy) as store:
        assert isinstance(store.storage, FsspecStorage) and store.storage.retry is policy
        first = commit_seed(store, 1, "small").id
        proxy.add(Fault("PUT", CHUNK, 503, skip=1, times=1))
        with pytest.raises(ckptstore.StorageError, match="nothing was made visible"):
            commit_seed(store, 2, "small")
        assert proxy.count("PUT", CHUNK, 503) == 1  # no second attempt
        assert store.resolve("main") == first
    with direct() as s:
        check_store(s, [first])


@pytest.mark.s3
def test_the_default_policy_rides_out_the_same_fault(proxy, location, direct):
    with _open(proxy, location) as store:
        assert store.storage.retry == Retry()
        first = commit_seed(store, 1, "small").id
        proxy.add(Fault("PUT", CHUNK, 503, skip=1, times=1))
        second = commit_seed(store, 2, "small").id
        assert proxy.count("PUT", CHUNK, 503) == 1
    with direct() as s:
        check_store(s, [first, second])


@pytest.mark.parametrize("kw", [
    {"attempts": 0}, {"attempts": -2}, {"attempts": 2.5}, {"attempts": True}, {"attempts": "3"},
    {"backoff": -0.1}, {"backoff": math.nan}, {"max_backoff": -1}, {"max_backoff": math.inf},
])
def test_values_out_of_range_are_refused_when_made(kw):
    name = next(iter(kw))
    with pytest.raises(InvalidRetry, match=rf"^Retry\({name}=.*\): {name} must be ") as err:
        Retry(**kw)
    assert isinstance(err.value, ckptstore.CkptStoreError) and isinstance(err.value, ValueError)


def test_open_refuses_what_is_not_a_retry_policy(tmp_path):
    with pytest.raises(InvalidRetry, match="pass a ckptstore.Retry"):
        ckptstore.open(tmp_path / "store", retry=3)
    assert not (tmp_path / "store").exists()


def test_local_disks_and_memory_take_the_keyword_and_are_not_retried(tmp_path):
    assert Retry(attempts=1, backoff=0, max_backoff=0).attempts == 1
    local = open_storage(tmp_path / "s", retry=Retry(attempts=9))
    memory = open_storage("memory://retry-option", retry=Retry(attempts=9))
    assert isinstance(local, LocalStorage) and isinstance(memory, MemoryStorage)
    with ckptstore.open(tmp_path / "store", retry=Retry(attempts=2)) as store:
        assert store.verify().ok
