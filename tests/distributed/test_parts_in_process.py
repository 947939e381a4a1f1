"""A rank's part of a sharded commit written by the store's persist process, in one process
(no process group): ``ProcessCommitter.stage`` and ``part``, the part entries' way back, and
the coordinator's merge of parts from the process and from a thread. The spawned-rank runs are
in ``test_ranks.py`` (``test_collective_parts_persist_in_the_persist_process``)."""

from __future__ import annotations

import pytest
import torch

import ckptstore
from ckptstore.commit.publish import Target
from ckptstore.commit.records import PartEntry
from ckptstore.commit.shared import located
from ckptstore.dcp.shards import LocalTensor, merge
from ckptstore.errors import DistributedError
from ckptstore.format.ids import new_commit_id
from ckptstore.policy import Policy, QuantSpec


def _ranks(full: torch.Tensor, bias: torch.Tensor) -> list[list[LocalTensor]]:
    """Two ranks' blocks of ``full`` (rows), the bias on rank 1."""
    half = full.shape[0] // 2
    return [[LocalTensor("w", (0, 0), tuple(full.shape), full[:half])],
            [LocalTensor("w", (half, 0), tuple(full.shape), full[half:]),
             LocalTensor("b", (0,), tuple(bias.shape), bias)]]


def _merged(store: ckptstore.Store, commit_id: str, parts: list[PartEntry]) -> str:
    tree = {"dict": [["w", {"tensor": 0}], ["b", {"tensor": 1}]]}
    shapes = {"w": [256, 64], "b": [64]}
    tip = store.repo.refs.tip("main")
    return merge(store.committer, Target("main", tip), commit_id, "", {}, tree, shapes,
                 parts).id


def test_staged_parts_are_sent_where_they_lie_and_merge_into_one_commit(tmp_path):
    """A staged rank's tensors travel as places in the shared file (no second copy), another
    rank's are copied in; both parts merge into one commit that checks out bit for bit."""
    g = torch.Generator().manual_seed(0)
    full, bias = torch.randn(256, 64, generator=g), torch.randn(64, generator=g)
    with ckptstore.open(tmp_path / "s", background="process") as store:
        committer = store.committer
        ranks = _ranks(full, bias)
        staged = committer.stage([t.tensor for t in ranks[0]])
        assert located(staged, committer._worker.mapped) is not None
        assert located([t.tensor for t in ranks[0]], committer._worker.mapped) is None
        first = LocalTensor("w", (0, 0), (256, 64), staged[0])
        commit_id = new_commit_id()
        parts = committer.part(commit_id, 0, [first], Policy(), "main", None)
        with torch.no_grad():
            staged[0].zero_()  # the part was written before part() returned
        parts += committer.part(commit_id, 1, ranks[1], Policy(), "main", None)
        assert [(p.fqn, p.offsets, p.whole) for p in parts] == [
            ("w", (0, 0), False), ("w", (128, 0), False), ("b", (0,), True)]
        assert all(p.stored_bytes >= 0 for p in parts) and parts[0].stored_bytes > 0
        merged = _merged(store, commit_id, parts)
        got = store.checkout(merged)
        assert torch.equal(got["w"], full) and torch.equal(got["b"], bias)
        assert store.verify().problems == []


def test_the_persist_process_keeps_each_ranks_chain_memory(tmp_path):
    """One-shot increments of a rank's block against the base the persist process wrote:
    its chain memory holds the parts it wrote, as a thread's does."""
    g = torch.Generator().manual_seed(1)
    full, bias = torch.randn(4096, 16, generator=g), torch.randn(16, generator=g)
    policy = Policy(incremental="one-shot", min_rows=256)
    with ckptstore.open(tmp_path / "s", background="process") as store:
        committer = store.committer
        ids = []
        for step in range(3):
            full[step * 1500: step * 1500 + 3] += 1.0
            commit_id, parts = new_commit_id(), []
            parent = ids[-1] if ids else None
            for rank, local in enumerate(_ranks(full, bias)):
                parts += committer.part(commit_id, rank, local, policy, "main", parent)
            tree = {"dict": [["w", {"tensor": 0}], ["b", {"tensor": 1}]]}
            tip = store.repo.refs.tip("main")
            ids.append(merge(committer, Target("main", tip), commit_id, "", {}, tree,
                             {"w": [4096, 16], "b": [16]}, parts).id)
        m = store.manifest(ids[-1])
        assert [s.kind.value for s in m.shards] == ["incremental"] * 2, m.shards
        assert {s.base_commit for s in m.shards} == {ids[0]}
        assert torch.equal(store.checkout(ids[-1])["w"], full)


def test_a_quantized_part_goes_through_the_process(tmp_path):
    full = torch.randn(512, 64, generator=torch.Generator().manual_seed(2))
    policy = Policy(quantize=QuantSpec(bits=8), min_quant_bytes=1024)
    with ckptstore.open(tmp_path / "s", background="process") as store:
        commit_id = new_commit_id()
        parts = [p for r, local in enumerate(_ranks(full, torch.zeros(64)))
                 for p in store.committer.part(commit_id, r, local, policy, "main", None)]
        assert {p.entry.codec["id"] for p in parts if p.fqn == "w"} == {"quantize"}
        tree = {"dict": [["w", {"tensor": 0}], ["b", {"tensor": 1}]]}
        merged = merge(store.committer, Target("main", None), commit_id, "", {}, tree,
                       {"w": [512, 64], "b": [64]}, parts)
        err = (store.checkout(merged.id)["w"] - full).abs().max().item()
        assert 0 < err < 0.05, err


def test_part_entries_cross_as_plain_values_and_malformed_ones_are_refused(tmp_path):
    full = torch.randn(64, 8, generator=torch.Generator().manual_seed(3))
    with ckptstore.open(tmp_path / "s", background="thread") as store:
        from ckptstore.dcp.shards import write_part
        parts = write_part(store.committer, new_commit_id(), 0,
                           [LocalTensor("w", (0, 0), (128, 8), full)], Policy(), "main", None)
    for p in parts:
        assert PartEntry.from_plain(p.to_plain()) == p
    plain = parts[0].to_plain()
    for bad in (None, [], {**plain, "offsets": "x"}, {**plain, "entry": {"path": 3}},
                {k: v for k, v in plain.items() if k != "stored"}):
        with pytest.raises(DistributedError, match="part entry"):
            PartEntry.from_plain(bad)


def test_what_a_persist_process_cannot_take_is_refused_before_the_collective(tmp_path):
    """background='process': a part a row tracker sees, or a tiered store's, is refused on
    the caller's thread (every rank, before any collective), with what to do."""
    with ckptstore.open(tmp_path / "s", background="process") as store:
        tracker = ckptstore.track(torch.nn.Embedding(4, 2))
        with pytest.raises(TypeError, match="with a tracker.*background='thread'"):
            store.committer.parts_in_process({}, Policy(), tracker, asynchronous=True)
    with ckptstore.open(tmp_path / "r", local=tmp_path / "l", background="process") as store:
        with pytest.raises(TypeError, match="of a tiered store"):
            store.committer.parts_in_process({}, Policy(), None, asynchronous=False)


def test_a_part_whose_tensors_partly_lie_in_the_file_gets_a_file_of_its_own(tmp_path):
    """Copied in whole where one tensor lies elsewhere: never into the file the others are
    views over (a reordered list would overwrite a region before it is read)."""
    x, y, w, z = (torch.full((64,), float(v)) for v in (1, 2, 3, 4))
    with ckptstore.open(tmp_path / "s", background="process") as store:
        committer = store.committer
        xs, ys, _ = committer.stage([x, y, w])
        before = committer._worker.mapped
        commit_id = new_commit_id()
        parts = committer.part(commit_id, 0, [LocalTensor("y", (0,), (64,), ys),
                                              LocalTensor("x", (0,), (64,), xs),
                                              LocalTensor("z", (0,), (64,), z)],
                               Policy(), "main", None)
        assert committer._worker.mapped is not before
        tree = {"dict": [["x", {"tensor": 0}], ["y", {"tensor": 1}], ["z", {"tensor": 2}]]}
        m = merge(committer, Target("main", None), commit_id, "", {}, tree,
                  {"x": [64], "y": [64], "z": [64]}, parts)
        got = store.checkout(m.id)
        for k, want in (("x", x), ("y", y), ("z", z)):
            assert torch.equal(got[k], want), k
