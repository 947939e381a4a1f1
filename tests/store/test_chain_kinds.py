"""The chain-kind registry (ckptstore.chains.kinds): every entry kind a manifest can hold and
every want a policy can express is found there, each kind is named only by its own module (and
the manifest that defines it), and the registry refuses what would make a stored kind ambiguous.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import ClassVar, get_args

import pytest
import torch

import ckptstore
from ckptstore import Policy
from ckptstore.chains.kinds import ChainKind, chain_kind, chain_kinds, kind_for_want, \
    register_chain_kind
from ckptstore.errors import ManifestError
from ckptstore.history.manifest import Kind
from ckptstore.policy.encoding import Want

PACKAGE = Path(ckptstore.__file__).resolve().parent
KINDS = PACKAGE / "chains" / "kinds"
MANIFEST = PACKAGE / "history" / "manifest.py"


def test_every_entry_kind_has_exactly_one_chain_kind() -> None:
    owners = {k: chain_kind(k) for k in Kind}
    assert all(k in owner.kinds for k, owner in owners.items())
    listed = [k for owner in chain_kinds() for k in owner.kinds]
    assert sorted(listed) == sorted(Kind), "a kind is owned twice, or by none"
    assert chain_kinds()[0].kinds == (Kind.FULL,)  # the base case first


def test_every_want_finds_the_kind_it_asks_for() -> None:
    for want in get_args(Want):
        kind = kind_for_want(want)
        assert kind is not None and kind.want == want
    assert kind_for_want("no such want") is None


def test_each_kind_lives_in_its_own_module() -> None:
    modules = {type(k).__module__ for k in chain_kinds()}
    assert len(modules) == len(chain_kinds())
    assert all(m.startswith("ckptstore.chains.kinds.") for m in modules)


def _kind_members_named(path: Path) -> list[str]:
    """``Kind.<MEMBER>`` in one source file, ``full`` (every chain's base case) aside."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id == "Kind" and node.attr in Kind.__members__
                and node.attr != "FULL"):
            found.append(f"{path.relative_to(PACKAGE.parent)}:{node.lineno} Kind.{node.attr}")
    return found


def test_only_a_kinds_module_names_it() -> None:
    """Adding a chain kind touches its module (and the manifest), not the generic code."""
    outside = [hit for path in sorted(PACKAGE.rglob("*.py"))
               if path.parent != KINDS and path != MANIFEST
               for hit in _kind_members_named(path)]
    assert not outside, f"chain kinds named outside ckptstore/chains/kinds: {outside}"
    for path in sorted(KINDS.glob("*.py")):  # and a kind's module names only its own kinds
        owner = next((k for k in chain_kinds() if type(k).__module__.endswith(path.stem)), None)
        foreign = [hit for hit in _kind_members_named(path)
                   if owner is None or Kind[hit.rsplit(".", 1)[1]] not in owner.kinds]
        assert not foreign, f"{path.name} names another module's kind: {foreign}"


def test_a_kind_held_by_another_class_is_refused() -> None:
    class Impostor(ChainKind):
        kinds: ClassVar[tuple[Kind, ...]] = (Kind.XOR,)
        want: ClassVar[str] = "impostor"

    with pytest.raises(ValueError, match="already registered"):
        register_chain_kind(Impostor)
    assert type(chain_kind(Kind.XOR)).__name__ == "Xor"
    assert kind_for_want("impostor") is None


def test_an_unknown_entry_kind_is_a_manifest_error() -> None:
    with pytest.raises(ManifestError, match="newer ckptstore"):
        chain_kind("spiral")  # type: ignore[arg-type]


@pytest.mark.parametrize("want,policy,kind", [
    ("rows", Policy(incremental="consecutive", max_chain=3, min_rows=1), Kind.CONSECUTIVE),
    ("xor", Policy(delta=True, max_chain=3), Kind.XOR),
])
def test_a_chain_decided_and_replayed_through_the_registry(tmp_path, want, policy, kind) -> None:
    """The kind the registry finds for the policy's want writes the link and replays it."""
    store = ckptstore.open(tmp_path / "s", policy=policy)
    t = torch.arange(64 * 256, dtype=torch.float32).reshape(64, 256)
    store.commit({"w": t})
    t[3] += 1
    info = store.commit({"w": t})
    e = store.manifest(info.id).tensors[0]
    assert e.kind == kind and kind in kind_for_want(want).kinds
    assert torch.equal(store.checkout(info.id)["w"], t)


def test_every_chain_kind_answers_the_whole_protocol() -> None:
    """Each kind but the base case decides, writes, remembers, checks and replays itself."""
    protocol = ("link", "start", "write", "remember", "check", "replay")
    for kind in chain_kinds():
        own = [name for name in protocol if name in type(kind).__dict__]
        if kind.kinds == (Kind.FULL,):
            assert own == [] and not kind.remembers
        else:
            name = type(kind).__name__
            assert own == list(protocol), f"{name} inherits {set(protocol) - set(own)}"
            assert kind.parts and all(kind.parts), f"{name} names no parts"


def test_the_parts_a_kind_names_are_the_ones_the_manifest_accepts(tmp_path) -> None:
    """The manifest (history, below chains) keeps its own table of parts; a kind's ``parts``
    must say the same, or a kind would write entries the manifest refuses to read."""
    from ckptstore.history.manifest import TensorEntry

    store = ckptstore.open(tmp_path / "s", policy=Policy(delta=True, max_chain=3))
    t = torch.ones(64, 256)
    store.commit({"w": t})
    info = store.commit({"w": t * 2})
    link = store.manifest(info.id).tensors[0].model_dump()
    blob = link["parts"]["xor"]
    for kind in chain_kinds():
        for k in kind.kinds:
            if k == Kind.FULL:
                continue
            for parts in kind.parts:
                entry = TensorEntry.model_validate(
                    {**link, "kind": k.value, "parts": {p: blob for p in parts}})
                assert set(entry.parts) == parts
            with pytest.raises(ValueError, match="needs parts"):
                TensorEntry.model_validate({**link, "kind": k.value, "parts": {"other": blob}})
