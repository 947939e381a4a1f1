"""Crash injection: a committing process is SIGKILLed at every step of a commit, and at random.

Atomicity (data, then manifest, then ref): after every kill the store opens, the branch shows
only complete commits, its tip and the tip before the kill check out bit-exact, the killed
commit's leftovers are invisible, and ``gc(grace_period=0)`` removes them so that ``verify`` is
clean and no data folder, manifest or temporary file is left that no commit needs.

The killed processes are real: forked from ``tests/workers.py serve`` (a fork server, so that a
kill costs milliseconds rather than an interpreter start with torch). Deterministic kill points
come from the worker's own write counter (``--kill-after-writes N``); random ones from a timer in
this process. Expected states are recomputed from the seed each commit records in its metadata.
"""

from __future__ import annotations

import collections
import json
import os
import random
import signal
import statistics
import time

import pytest
from helpers import assert_bit_exact as assert_same
from workers import ForkServer, build_state

import ckptstore

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the worker server forks")

KILLED = -signal.SIGKILL


@pytest.fixture(scope="module")
def workers(tmp_path_factory):
    server = ForkServer(str(tmp_path_factory.mktemp("workers") / "stderr.log"))
    yield server
    server.close()


def _phase(key: str) -> str:
    return {"data": "data", "commits": "manifest", "refs": "ref"}[key.split("/")[0]]


def _temp_files(store: ckptstore.Store) -> list[str]:
    return sorted(k for k in store.storage.walk_sizes("") if k.rsplit("/", 1)[-1].startswith(
        ".tmp-"))


class Checker:
    """Follows one store across kills; checks it after each one.

    ``history`` is the branch as last checked (newest first). After a kill the branch must be
    that history plus the commits the worker reported, plus at most the one commit whose ref
    moved just before the kill; nothing else may be visible.
    """

    def __init__(self, url: str, opts: dict):
        self.url, self.opts = url, opts
        self.history: list[str] = []

    def check(self, events: list[dict]) -> dict:
        """Check the store after a worker ended; return what happened and what gc removed."""
        reported = [e["id"] for e in events if e["event"] == "commit"]
        store = ckptstore.open(self.url, create=False, **self.opts)
        try:
            return self._check(store, reported)
        finally:
            store.close()

    def _check(self, store: ckptstore.Store, reported: list[str]) -> dict:
        branches = store.branches()
        assert set(branches) <= {"main"}, branches
        log = store.log("main") if branches else []
        ids = [c.id for c in log]
        new = ids[: len(ids) - len(self.history)]
        assert ids[len(new):] == self.history, "history before the kill changed"
        assert list(reversed(new))[: len(reported)] == reported, (new, reported)
        assert len(new) - len(reported) in (0, 1), f"{len(new)} new commits, {reported} reported"
        for c in log[: len(new) + 1]:  # the new commits and the tip before the kill: bit-exact
            seed = c.metadata["seed"]
            assert c.message == f"seed {seed}" and c.step == seed
            assert_same(build_state(seed), store.checkout(c.id))
        if ids:
            assert store.resolve("main") == ids[0]

        before_gc = set(store.storage.listdir("data"))
        temp_before = _temp_files(store)
        gc = store.gc(grace_period=0)
        assert sorted(store.commit_ids()) == sorted(ids), "an unreferenced manifest survived gc"
        needed = set().union(*(store.manifest(c).data_commits() for c in ids))
        assert set(store.storage.listdir("data")) == needed, "orphan data survived gc"
        assert set(gc.data_removed) == before_gc - needed
        assert _temp_files(store) == []
        report = store.verify()
        assert report.ok, report.problems
        assert report.commits_checked == len(ids)
        self.history = ids
        return {"new": len(new), "unreported": len(new) - len(reported),
                "commits_removed": gc.commits_removed, "data_removed": gc.data_removed,
                "temp_files": temp_before}


def _outcome(result: dict) -> str:
    """Which phase of a commit the kill hit, read from what it left behind."""
    if result["unreported"]:
        return "after ref"
    if result["commits_removed"]:
        return "after manifest, before ref"
    if result["temp_files"]:
        return "manifest or ref half written"
    if result["data_removed"]:
        return "during data"
    return "before any write"


def _location(store_url):
    url, opts = store_url
    return url, opts, json.dumps(opts)


def _calibrate(workers: ForkServer, url: str, opts_json: str, checker: Checker, seed: int,
               count: int = 1) -> list[dict]:
    """One clean commit run with a write trace; returns its write events."""
    code, events = workers.run("commit", url, "--opts", opts_json, "--seed", seed, "--count",
                               count, "--trace-writes")
    assert code == 0, events
    checker.check(events)
    return events


@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
def test_kill_at_every_step_of_a_commit(workers, store_url):
    url, opts, opts_json = _location(store_url)
    checker = Checker(url, opts)
    events = _calibrate(workers, url, opts_json, checker, seed=0)
    writes = [e for e in events if e["event"] == "write"]
    phases = [_phase(w["key"]) for w in writes]
    n = len(writes)
    assert phases == ["data"] * (n - 2) + ["manifest", "ref"], phases
    assert n - 2 > 12  # the big tensor's chunks are separate writes

    local = not url.startswith("s3://")
    if local:  # every write; torn: first, middle and last chunk, manifest and ref
        points = [(k, "after") for k in range(1, n + 1)]
        points += [(k, "torn") for k in (1, n // 2, n - 2, n - 1, n)]
    else:  # each phase once (an S3 write is slower; an S3 PUT is never torn)
        points = [(k, "after") for k in (1, n // 2, n - 2, n - 1, n)]
    seed = 1
    for k, mode in points:
        code, events = workers.run("commit", url, "--opts", opts_json, "--seed", seed,
                                   "--kill-after-writes", k, "--kill-mode", mode)
        seed += 1
        assert code == KILLED, (k, mode, events)
        result = checker.check(events)
        where = f"kill {mode} write {k}/{n}"
        if (k, mode) == (n, "after"):  # the ref moved: the commit is complete and visible
            assert result["unreported"] == 1 and not result["data_removed"], where
        elif k == n - 1 and mode == "after" or k == n and mode == "torn":
            # manifest stored, ref never moved: an orphan commit, removed by gc
            assert result["new"] == 0 and len(result["commits_removed"]) == 1, where
            assert result["data_removed"] == result["commits_removed"], where
        else:  # data (or a half-written manifest): nothing visible, the data folder removed
            assert result["new"] == 0 and not result["commits_removed"], where
            assert len(result["data_removed"]) == 1, where
        if mode == "torn" and k >= n - 1 and local:  # temp file of an unfinished put-if-absent
            assert len(result["temp_files"]) == 1, (where, result)
    assert len(checker.history) == 2  # the calibration commit and the one killed after its ref


def _random_kills(workers: ForkServer, store_url, kills: int, seed: int) -> collections.Counter:
    url, opts, opts_json = _location(store_url)
    checker = Checker(url, opts)
    events = _calibrate(workers, url, opts_json, checker, seed=0, count=3)
    duration = statistics.median(e["seconds"] for e in events if e["event"] == "commit")
    rng = random.Random(seed)
    outcomes: collections.Counter = collections.Counter()
    state_seed = 3
    for _ in range(kills):
        pid = workers.spawn("commit", url, "--opts", opts_json, "--seed", state_seed,
                            "--count", 3)
        state_seed += 3
        workers.wait_event(pid, "ready")
        time.sleep(rng.uniform(0, 1.2 * duration))
        workers.kill(pid)
        code = workers.wait(pid)
        assert code in (KILLED, 0), workers.events(pid)
        result = checker.check(workers.events(pid))
        outcomes["finished" if code == 0 else _outcome(result)] += 1
    return outcomes


@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
def test_kill_at_random_times(workers, store_url):
    kills = 4 if store_url[0].startswith("s3://") else 8
    outcomes = _random_kills(workers, store_url, kills=kills, seed=20261122)
    assert sum(outcomes.values()) == kills
    print(dict(outcomes))


@pytest.mark.slow
@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
def test_kill_at_random_times_many(workers, store_url):
    kills = 60 if store_url[0].startswith("s3://") else 200
    outcomes = _random_kills(workers, store_url, kills=kills, seed=7)
    assert sum(outcomes.values()) == kills
    # writing chunks is most of a commit's time; the manifest and ref windows are microseconds
    # wide, so random kills reach them only now and then (the deterministic sweep always does)
    assert outcomes["during data"] >= kills // 4, outcomes
    print(dict(outcomes))


@pytest.mark.parametrize("store_url", ["local", "s3"], indirect=True)
def test_kill_during_the_first_commit(workers, store_url):
    """No previous commit: the store stays a valid, empty store; gc leaves nothing behind."""
    url, opts, opts_json = _location(store_url)
    code, events = workers.run("commit", url + "-scratch", "--opts", opts_json, "--trace-writes")
    assert code == 0, events
    n = len([e for e in events if e["event"] == "write"])  # the last two: manifest, ref
    ckptstore.open(url, **opts).close()
    for k in (n // 3, n - 1):  # mid-data; after the manifest, before the first ref file
        code, events = workers.run("commit", url, "--opts", opts_json, "--kill-after-writes", k)
        assert code == KILLED, events
        with ckptstore.open(url, create=False, **opts) as store:
            assert store.branches() == {}
            with pytest.raises(ckptstore.RefNotFound):
                store.log()
            assert store.storage.listdir("data")
            gc = store.gc(grace_period=0)
            assert len(gc.data_removed) == 1 and len(gc.commits_removed) == (k == n - 1)
            assert store.storage.listdir("data") == [] and store.commit_ids() == []
            assert store.verify().ok
    code, events = workers.run("commit", url, "--opts", opts_json, "--seed", 42)
    assert code == 0
    with ckptstore.open(url, create=False, **opts) as store:
        assert_same(build_state(42), store.checkout("main"))
