"""Concurrent writers in separate processes: no lost commit, one clear error per loser.

Branch moves are put-if-absent creations of numbered ref files, so of the processes that read the
same tip exactly one moves the branch; each other one gets :class:`ckptstore.ConcurrentUpdateError`
naming the branch and its stored, unreferenced commit (``err.commit_id``), which stays readable
until gc and can be kept with ``store.branch(name, err.commit_id)``.

Workers are ``tests/workers.py`` processes (forked from its fork server, or started as independent
interpreters). A file barrier inside the workers (``--barrier``) holds each one just before its
put-if-absent until all have arrived, so the races below are tight, not lucky.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from helpers import assert_bit_exact as assert_same
from workers import ForkServer, build_state, run_processes

import ckptstore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker server forks")

BACKENDS = ["local", "s3"]


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    server = ForkServer(str(tmp_path_factory.mktemp("workers") / "stderr.log"))
    yield server
    server.close()


def _first_commit(url: str, opts: dict) -> str:
    with ckptstore.open(url, **opts) as store:
        return store.commit(build_state(0, "small"), message="seed 0",
                            metadata={"seed": 0}).id


def _check_conflict_message(event: dict, branch: str) -> None:
    msg = event["message"]
    assert event["branch"] == branch and repr(branch) in msg, msg
    assert event["commit_id"] in msg and "stored" in msg and "Nothing is lost" in msg, msg


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_concurrent_committers_lose_nothing(workers, store_url, tmp_path):
    """4 processes x 5 commits on one branch, retrying on ConcurrentUpdateError."""
    n_workers, per_worker = 4, 5
    url, opts = store_url
    base = _first_commit(url, opts)
    pids = [workers.spawn("commit", url, "--opts", json.dumps(opts), "--profile", "small",
                          "--seed", 1000 * (w + 1), "--count", per_worker, "--retry",
                          "--barrier", tmp_path / "barrier", "--parties", n_workers)
            for w in range(n_workers)]
    codes = [workers.wait(pid, timeout=180) for pid in pids]
    assert codes == [0] * n_workers, workers.stderr_tail()
    mine = {pid: [e["id"] for e in workers.events(pid, "commit")] for pid in pids}
    commits = [e for pid in pids for e in workers.events(pid, "commit")]
    conflicts = [e for pid in pids for e in workers.events(pid, "conflict")]
    assert [len(ids) for ids in mine.values()] == [per_worker] * n_workers
    # one error per retry, and the first round (held at the barrier) had n - 1 losers
    assert sum(e["attempt"] - 1 for e in commits) == len(conflicts) >= n_workers - 1

    with ckptstore.open(url, create=False, **opts) as store:
        log = store.log("main")
        ids = [c.id for c in log]
        assert ids[-1] == base and len(ids) == len(set(ids)) == n_workers * per_worker + 1
        assert set(ids[:-1]) == {e["id"] for e in commits}, "a successful commit is missing"
        for pid, own in mine.items():  # each process's commits in its own order
            assert [c for c in reversed(ids) if c in own] == own
        parents = {c.id: c.parent for c in log}
        assert all(parents[e["id"]] == e["parent"] for e in commits)
        for c in log:
            assert_same(build_state(c.metadata["seed"], "small"), store.checkout(c.id))

        lost = {e["commit_id"] for e in conflicts}
        assert len(lost) == len(conflicts) and not lost & set(ids)
        assert lost <= set(store.commit_ids()), "a loser's commit was not kept"
        for e in conflicts:
            _check_conflict_message(e, "main")
        rescued = conflicts[0]
        assert_same(build_state(rescued["seed"], "small"), store.checkout(rescued["commit_id"]))
        store.branch("rescued", rescued["commit_id"])
        assert store.log("rescued")[0].id == rescued["commit_id"]
        assert store.log("rescued")[1].id in ids  # it was made on a tip of main

        gc = store.gc(grace_period=0)
        assert set(gc.commits_removed) == lost - {rescued["commit_id"]}
        assert set(store.commit_ids()) == set(ids) | {rescued["commit_id"]}
        assert store.verify().ok


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_two_processes_race_for_a_new_branch(workers, store_url, tmp_path):
    """Two processes commit to a branch that does not exist yet: exactly one creates it.

    On the local disk they are independent interpreters (``python tests/workers.py commit``);
    on S3 forked workers (the same program, without a second interpreter start).
    """
    url, opts = store_url
    base = _first_commit(url, opts)
    argv = ["commit", url, "--opts", json.dumps(opts), "--profile", "small", "--branch", "race",
            "--barrier", tmp_path / "barrier", "--parties", 2]
    if url.startswith("s3://"):
        pids = [workers.spawn(*argv, "--seed", seed) for seed in (1, 2)]
        results = [(workers.wait(pid, timeout=120), workers.events(pid), "") for pid in pids]
    else:
        results = run_processes([[*argv, "--seed", 1], [*argv, "--seed", 2]], timeout=180)
    assert sorted(code for code, _, _ in results) == [0, 2], [err for *_, err in results]
    events = [e for _, evs, _ in results for e in evs]
    [won] = [e for e in events if e["event"] == "commit"]
    [lost] = [e for e in events if e["event"] == "conflict"]
    _check_conflict_message(lost, "race")

    with ckptstore.open(url, create=False, **opts) as store:
        assert store.branches() == {"main": base, "race": won["id"]}
        assert [c.id for c in store.log("race")] == [won["id"]]
        assert_same(build_state(won["seed"], "small"), store.checkout("race"))
        assert_same(build_state(lost["seed"], "small"), store.checkout(lost["commit_id"]))
        retried = store.commit(build_state(lost["seed"], "small"), branch="race",
                               metadata={"seed": lost["seed"]})
        assert retried.parent == won["id"]
        store.branch("rescued", lost["commit_id"])
        assert store.resolve("rescued") == lost["commit_id"]
        gc = store.gc(grace_period=0)
        assert gc.commits_removed == [] and store.verify().ok


@pytest.mark.parametrize("store_url", BACKENDS, indirect=True)
def test_two_processes_create_the_same_tag(workers, store_url, tmp_path):
    url, opts = store_url
    base = _first_commit(url, opts)
    pids = [workers.spawn("tag", url, "v1", "--opts", json.dumps(opts), "--barrier",
                          tmp_path / "barrier", "--parties", 2) for _ in range(2)]
    codes = sorted(workers.wait(pid, timeout=120) for pid in pids)
    assert codes == [0, 2], workers.stderr_tail()
    [won] = [e for pid in pids for e in workers.events(pid, "tag")]
    [lost] = [e for pid in pids for e in workers.events(pid, "refexists")]
    assert won["id"] == base
    assert "'v1'" in lost["message"] and "already exists" in lost["message"]
    with ckptstore.open(url, create=False, **opts) as store:
        assert store.tags() == {"v1": base}


# -- races with gc and between branch creators (both were bugs once) ----------------------------
def _wait_for_arrival(directory, prefix: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not (directory.exists() and any(p.name.startswith(prefix)
                                          for p in directory.iterdir())):
        assert time.monotonic() < deadline, f"no worker arrived at {prefix!r} in {timeout} s"
        time.sleep(0.005)


def test_gc_during_a_commit_loses_nothing(workers, tmp_path):
    url = str(tmp_path / "store")
    _first_commit(url, {})
    barrier = tmp_path / "barrier"
    pid = workers.spawn("commit", url, "--profile", "small", "--seed", 7, "--barrier", barrier,
                        "--parties", 2)
    # the worker has read the tip (seq 0), written data and manifest, and waits to move the branch
    _wait_for_arrival(barrier, "advance-1.")
    with ckptstore.open(url, create=False) as store:
        for seed in (1, 2):  # another writer moves the branch twice (seq 1, seq 2)
            store.commit(build_state(seed, "small"), metadata={"seed": seed})
        store.gc()  # default grace period: no commit is removed, ref files 0 and 1 are
    (barrier / "advance-1.test").touch()
    code = workers.wait(pid, timeout=60)
    with ckptstore.open(url, create=False) as store:
        ids = [c.id for c in store.log("main")]
    if code == 0:  # reported as committed: then it must be on the branch
        [made] = workers.events(pid, "commit")
        assert made["id"] in ids, "commit reported as made is not on the branch"
    else:  # or the writer was told, with its commit kept
        [conflict] = workers.events(pid, "conflict")
        assert code == 2 and conflict["commit_id"] not in ids


def test_two_processes_create_the_same_branch(workers, tmp_path):
    url = str(tmp_path / "store")
    base = _first_commit(url, {})
    pids = [workers.spawn("branch", url, "feature", "--barrier", tmp_path / "barrier",
                          "--parties", 2) for _ in range(2)]
    codes = sorted(workers.wait(pid, timeout=60) for pid in pids)
    assert codes == [0, 2], workers.stderr_tail()
    [won] = [e for pid in pids for e in workers.events(pid, "branch")]
    [lost] = [e for pid in pids for e in workers.events(pid, "error")]
    with ckptstore.open(url, create=False) as store:
        assert store.branches() == {"main": base, "feature": base} and won["id"] == base
    assert lost["type"] == "RefExists", lost
