"""Commits against an S3 endpoint that fails: 5xx answers and dropped connections, injected by a
real proxy between s3fs and the moto server (``proxy.py``).

Transient faults are retried (by the client, then by ckptstore) and the commit succeeds with exact
data; persistent ones fail the commit with a :class:`ckptstore.StorageError` while the branch
stays where it was and nothing half-written is visible; gc removes the leftovers. A write whose
answer is lost (the proxy forwards it, then drops the connection) is recognised when repeated, so
the ref moves exactly once and no spurious ``ConcurrentUpdateError`` is raised.
"""

from __future__ import annotations

import pytest
from checks import check_store
from checks import commit_seed as _commit_seed
from proxy import Fault
from workers import build_state

import ckptstore
from ckptstore.storage.retry import Retry

pytestmark = pytest.mark.s3


def commit_seed(store: ckptstore.Store, seed: int) -> ckptstore.CommitInfo:
    return _commit_seed(store, seed, "small")


def state(seed: int) -> dict:
    return build_state(seed, "small")

CHUNK = r"/data/[0-9a-f]{32}/w/c/"  # the small profile's big tensor: 6 chunks
MANIFEST = r"/commits/[0-9a-f]{32}\.msgpack$"
REF = r"/refs/heads/main/\d{12}$"


def test_transient_503_on_chunk_puts_is_retried(proxied, proxy, direct):
    store = proxied(client_attempts=1)  # the client gives up at once: ckptstore's retries act
    first = commit_seed(store, 1).id
    proxy.add(Fault("PUT", CHUNK, 503, skip=2, times=2), Fault("PUT", CHUNK, 500, skip=2))
    second = commit_seed(store, 2).id
    assert proxy.count("PUT", CHUNK, 503) == 2 and proxy.count("PUT", CHUNK, 500) == 1
    with direct() as s:
        check_store(s, [first, second])


@pytest.mark.slow
def test_transient_503_with_the_clients_default_retries(proxied, proxy, direct):
    store = proxied(client_attempts=None, retry=None)  # botocore's and ckptstore's defaults
    proxy.add(Fault("PUT", CHUNK, 503, times=3), Fault("PUT", MANIFEST, 503, times=1),
              Fault("PUT", REF, 503, times=1))
    first = commit_seed(store, 1).id
    assert proxy.count("PUT", r"/", 503) == 5
    with direct() as s:
        check_store(s, [first])


@pytest.mark.parametrize("status", [500, pytest.param(503, marks=pytest.mark.slow)])
def test_persistent_error_on_the_manifest_put_fails_cleanly(proxied, proxy, direct, status):
    store = proxied(client_attempts=2)
    first = commit_seed(store, 1).id
    proxy.add(Fault("PUT", MANIFEST, status, times=None))
    with pytest.raises(ckptstore.StorageError, match="nothing was made visible") as err:
        commit_seed(store, 2)
    assert "unchanged" in str(err.value) and isinstance(err.value, OSError)
    assert proxy.count("PUT", MANIFEST, status) == 2 * 3  # client attempts x ckptstore attempts
    assert store.resolve("main") == first and proxy.count("PUT", REF) == 1
    with direct() as s:
        assert len(s.storage.listdir("data")) == 2  # the failed commit's chunks, unreachable
        check_store(s, [first])
    proxy.clear()
    third = commit_seed(store, 3).id  # the endpoint is back: the next commit works
    with direct() as s:
        check_store(s, [first, third])


@pytest.mark.parametrize("action", [pytest.param("drop", marks=pytest.mark.slow), "drop-after"])
def test_connection_drop_during_a_chunk_put_is_retried(proxied, proxy, direct, action):
    store = proxied(client_attempts=1)
    proxy.add(Fault("PUT", CHUNK, action, skip=5, times=2))
    first = commit_seed(store, 1).id
    assert proxy.count("PUT", CHUNK, action) == 2
    with direct() as s:
        check_store(s, [first])


@pytest.mark.parametrize("action", ["drop", pytest.param("drop-after", marks=pytest.mark.slow)])
def test_persistent_drop_on_a_chunk_put_fails_cleanly(proxied, proxy, direct, action):
    store = proxied(client_attempts=1)
    first = commit_seed(store, 1).id
    proxy.add(Fault("PUT", CHUNK + r"5/0$", action, times=None))
    with pytest.raises(ckptstore.StorageError, match="unchanged") as err:
        commit_seed(store, 2)
    assert "c/5/0" in (err.value.key or "")
    assert proxy.count("PUT", MANIFEST) == 1  # only the first commit's: no manifest, no ref
    assert store.resolve("main") == first
    assert store.verify().ok
    with direct() as s:
        check_store(s, [first])


@pytest.mark.parametrize("target,client_attempts", [
    (REF, None), (REF, 1), pytest.param(MANIFEST, None, marks=pytest.mark.slow),
    pytest.param(MANIFEST, 1, marks=pytest.mark.slow)])
def test_lost_answer_of_a_create_is_recognised(proxied, proxy, direct, target, client_attempts):
    """The manifest or ref PUT lands, its answer is lost; the repeat (botocore's own when
    ``client_attempts`` is None, else ckptstore's) finds the key: it is this writer's, so the
    commit succeeds and the branch moves exactly once."""
    store = proxied(client_attempts=client_attempts)
    first = commit_seed(store, 1).id
    proxy.add(Fault("PUT", target, "drop-after", times=1))
    second = commit_seed(store, 2).id
    assert proxy.count("PUT", target, "drop-after") == 1
    assert store.storage.listdir("refs/heads/main") == ["000000000000", "000000000001"]
    with direct() as s:
        check_store(s, [first, second])


def test_a_create_that_another_writer_won_is_still_lost(proxied, proxy, direct):
    """A key created by someone else (another token, other bytes) is never claimed."""
    store = proxied(client_attempts=None)
    assert store.storage.put_if_absent("refs/tags/x", b"a" * 32 + b"\n")
    proxy.add(Fault("PUT", r"/refs/tags/x$", "drop", times=1))
    assert store.storage.put_if_absent("refs/tags/x", b"a" * 32 + b"\n") is False
    assert store.storage.put_if_absent("refs/tags/x", b"b" * 32 + b"\n") is False


def test_async_commit_with_faults(proxied, proxy, direct):
    store = proxied(client_attempts=1)
    proxy.add(Fault("PUT", CHUNK, 503, skip=1, times=2))
    meta = {"seed": 1, "profile": "small"}
    first = store.commit_async(state(1), message="seed 1", metadata=meta).wait().id
    proxy.add(Fault("PUT", MANIFEST, 500, times=None))
    pending = store.commit_async(state(2), message="seed 2", metadata={**meta, "seed": 2})
    with pytest.raises(ckptstore.StorageError, match="unchanged"):
        pending.wait()
    assert store.resolve("main") == first
    with direct() as s:
        check_store(s, [first])


def test_faults_on_reads_are_retried(proxied, proxy):
    store = proxied(client_attempts=1)
    first = commit_seed(store, 1).id
    store.repo.forget(first)
    proxy.add(Fault("GET", CHUNK, 503, times=2), Fault("GET", CHUNK, "drop", skip=3, times=1),
              Fault("GET", MANIFEST, 500, times=1), Fault("GET", CHUNK, "truncate", skip=1))
    from helpers import assert_bit_exact

    assert_bit_exact(state(1), store.checkout(first))
    assert proxy.count("GET", CHUNK, "truncate") >= 1


@pytest.mark.slow
def test_persistent_read_fault_is_a_storage_error(proxied, proxy):
    store = proxied(client_attempts=1, retry=Retry(attempts=2, backoff=0.01))
    first = commit_seed(store, 1).id
    proxy.add(Fault("GET", CHUNK, 500, times=None))
    with pytest.raises(ckptstore.StorageError, match="could not read"):
        store.checkout(first)
