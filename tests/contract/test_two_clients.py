"""Two independent clients of one store see each other's completed work, on every back-end.

A client stands for another process: on S3 the first client opens with s3fs's defaults (its
filesystem object comes from fsspec's instance cache, listings cache on) and the second with
``skip_instance_cache=True`` (its own filesystem object); on a local directory and memory:// two
``Store`` objects. Every ordered pair of commit / gc / log / verify / tag / checkout, each client
first, is followed by both clients agreeing with a model of what the store holds (issue 26,
item 2: nothing the store decides -- which commits, refs and chunks exist -- may come from a
cached listing).
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import pytest
import torch
from helpers import assert_bit_exact

import ckptstore
from ckptstore.storage import FsspecStorage, open_storage

pytestmark = pytest.mark.every_backend


def _client_options(store_url, second: bool) -> tuple[str, dict]:
    """The url and options of one client: the S3 defaults (listings cache on), the second
    client with its own filesystem object."""
    url, opts = store_url
    opts = {k: v for k, v in opts.items() if k != "use_listings_cache"}
    if second and url.startswith("s3://"):
        opts["skip_instance_cache"] = True
    return url, opts


@pytest.fixture
def clients(store_url) -> Iterator[tuple[ckptstore.Store, ckptstore.Store]]:
    url, opts_a = _client_options(store_url, second=False)
    a = ckptstore.open(url, **opts_a)
    url, opts_b = _client_options(store_url, second=True)
    b = ckptstore.open(url, **opts_b)
    yield a, b
    a.close()
    b.close()


def _state(n: int) -> dict:
    g = torch.Generator().manual_seed(n)
    return {"w": torch.randn(64, 8, generator=g), "step": n}


@dataclass
class Model:
    """What the store holds after every completed operation: main's line (oldest first), the
    commits gc removed, and the tags."""

    line: list[str] = field(default_factory=list)
    states: dict[str, dict] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    removed: set[str] = field(default_factory=set)

    def history(self) -> list[str]:
        """What log shows: main's line from the tip back to the first commit gc removed."""
        out = []
        for c in reversed(self.line):
            if c in self.removed:
                break
            out.append(c)
        return out


def _commit(s: ckptstore.Store, m: Model) -> None:
    n = len(m.states)
    info = s.commit(_state(n))
    m.line.append(info.id)
    m.states[info.id] = _state(n)


def _gc(s: ckptstore.Store, m: Model) -> None:
    result = s.gc(keep_last=1, grace_period=0)
    gone = set(result.commits_removed)
    assert not gone & ({m.line[-1], *m.tags.values()} | m.removed)
    m.removed |= gone


def _log(s: ckptstore.Store, m: Model) -> None:
    assert [c.id for c in s.log()] == m.history()


def _verify(s: ckptstore.Store, m: Model) -> None:
    report = s.verify()
    assert report.ok, report.problems
    assert report.commits_checked == len(set(m.history()) | set(m.tags.values()))


def _tag(s: ckptstore.Store, m: Model) -> None:
    name = f"t{len(m.tags)}"
    assert s.tag(name, "main") == m.line[-1]
    m.tags[name] = m.line[-1]


def _checkout(s: ckptstore.Store, m: Model) -> None:
    assert_bit_exact(s.checkout("main"), m.states[m.line[-1]])


OPS: dict[str, Callable[[ckptstore.Store, Model], None]] = {
    "commit": _commit, "gc": _gc, "log": _log, "verify": _verify, "tag": _tag,
    "checkout": _checkout}


def _agree(s: ckptstore.Store, m: Model) -> None:
    """A client's view is the model's: main's tip and history, the tags, the tip's state."""
    assert s.resolve("main") == m.line[-1]
    assert s.tags() == m.tags
    _log(s, m)
    _checkout(s, m)


@pytest.mark.parametrize(("first", "then"), list(itertools.product(OPS, OPS)))
def test_each_client_sees_the_others_completed_work(clients, first, then):
    """``first`` by one client, then ``then`` by the other, each client first in turn; the
    other client agrees with the model after each (a commit by each comes first)."""
    a, b = clients
    m = Model()
    _commit(a, m)
    _commit(b, m)
    for x, y in ((a, b), (b, a)):
        OPS[first](x, m)
        _agree(y, m)
        OPS[then](y, m)
        _agree(x, m)


def test_gc_then_a_commit_of_the_other_client(clients, store_url):
    """The issue's reproduction: A commits, B opens, A runs gc, B commits: A, and a store A's
    process opens afresh, see B's commit (not "removed by gc?", not a "damaged" ref)."""
    a, b = clients
    a.commit(_state(0))
    a.gc(keep_last=5)
    info = b.commit(_state(1))
    assert_bit_exact(a.checkout("main"), _state(1))
    assert [c.id for c in a.log()][0] == info.id
    assert a.verify().ok
    url, opts = _client_options(store_url, second=False)
    with ckptstore.open(url, **opts) as fresh:
        assert_bit_exact(fresh.checkout("main"), _state(1))


def test_storage_sees_the_other_clients_keys(store_url):
    """Listing, existence, size and reads of one client follow the other's writes and deletes,
    whatever the first client listed or read before."""
    url, opts = _client_options(store_url, second=False)
    a = open_storage(url, **opts)
    url, opts = _client_options(store_url, second=True)
    b = open_storage(url, **opts)
    a.put("d/x", b"1")
    assert a.listdir("d") == ["x"] and a.walk_sizes("d") == {"d/x": 1}
    assert not a.exists("d/y")
    b.put("d/y", b"22")
    assert a.read("d/y") == b"22" and a.size("d/y") == 2 and a.exists("d/y")
    assert a.listdir("d") == ["x", "y"] and a.walk_sizes("d") == {"d/x": 1, "d/y": 2}
    b.delete("d/x")
    assert not a.exists("d/x") and a.listdir("d") == ["y"]
    with pytest.raises(FileNotFoundError):
        a.read("d/x")
    assert b.put_if_absent("d/z", b"3") and not a.put_if_absent("d/z", b"4")


def test_a_filesystem_with_a_listings_cache_is_not_trusted(store_url):
    """An fsspec filesystem handed to FsspecStorage with its listings cache on (shared with
    other code of the process) never answers the store from a stale listing."""
    url, opts = _client_options(store_url, second=True)
    if not url.startswith("s3://"):
        pytest.skip("only S3's filesystem caches listings")
    import s3fs

    fs = s3fs.S3FileSystem(**opts)
    root = url.removeprefix("s3://") + f"/{uuid.uuid4().hex}"
    a = FsspecStorage(fs, root)
    b = open_storage(f"s3://{root}", **opts)
    a.put("d/x", b"1")
    fs.ls(f"{root}/d")  # other code of the process lists the folder through the shared object
    b.put("d/y", b"22")
    assert a.read("d/y") == b"22" and a.size("d/y") == 2 and a.listdir("d") == ["x", "y"]


@pytest.mark.parametrize("policy", [{"delta": True},
                                    {"incremental": "consecutive", "delta": True}])
def test_chains_across_clients(store_url, policy):
    """Each client remembers what it committed last (a chain's reference): commits of the two
    clients taking turns on one branch still check out bit-exact, from either client."""
    url, opts_a = _client_options(store_url, second=False)
    _, opts_b = _client_options(store_url, second=True)
    g = torch.Generator().manual_seed(1)
    w = torch.randn(2000, 16, generator=g)
    states = {}
    with ckptstore.open(url, policy=ckptstore.Policy(**policy), **opts_a) as a, \
            ckptstore.open(url, policy=ckptstore.Policy(**policy), **opts_b) as b:
        for s in (a, a, b, a, b, b):
            w = w.clone()
            w[torch.randint(0, 2000, (40,), generator=g)] += 1
            states[s.commit({"emb": w}).id] = w
        for s in (a, b):
            for commit_id, expected in states.items():
                assert torch.equal(s.checkout(commit_id)["emb"], expected)
