"""Every pair of :class:`Policy` fields either takes effect or is refused when the Policy is made
(issue 26 item 14): no setting is quietly dropped. A working pair is committed three times and
compared with the same Policy without each of its two fields: each must change what is stored,
except a bound whose feature is off (``max_chain`` with no chain, ...), which must change
nothing (docs/policies.md, "Combining settings")."""

from __future__ import annotations

import itertools
import json
import uuid
from dataclasses import fields

import pytest
import torch

import ckptstore
from ckptstore import BitWidth, GradientEMA, Policy, QuantSpec
from ckptstore.chunkcodec import LOSSLESS_IDS
from ckptstore.policy import Shrink
from ckptstore.policy.rebase import MaxChain

SHRINK = Shrink(pairs=(("head", "optim.state.0.exp_avg", "optim.state.0.exp_avg_sq"),))
#: a value other than the default of each field (incremental: two modes)
VALUES: list[tuple[str, object]] = [
    ("incremental", "consecutive"), ("incremental", "intermittent"),
    ("quantize", QuantSpec(bits=8, protect=0.01)), ("delta", True), ("max_chain", 1),
    ("rebase", MaxChain(1)), ("bitwidth", BitWidth(expected_restores=1)),
    ("lossless", ("model.out", "emb.cold", "head")),
    ("overrides", (("model.*", QuantSpec(bits=4)),)), ("min_rows", 512),
    ("min_quant_bytes", 1024), ("shrink", SHRINK), ("sensitivity", "ema")]
PAIRS = [(a, b) for a, b in itertools.combinations(VALUES, 2) if a[0] != b[0]]


def test_every_field_is_enumerated():
    assert {f.name for f in fields(Policy)} == {name for name, _ in VALUES}


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.dense = torch.nn.Parameter(torch.randn(128, 128, generator=g))
        self.out = torch.nn.Parameter(torch.randn(128, 128, generator=g))
        self.narrow = torch.nn.Parameter(torch.randn(1024, 4, generator=g))  # 16 KiB table


def _vacuous(name: str, s: dict[str, object]) -> bool:
    """A bound with nothing to bound in ``s`` (it holds trivially)."""
    chains = {"incremental", "delta", "shrink"} & set(s)
    lossy_or_chained = chains | ({"quantize", "overrides"} & set(s))
    return {"max_chain": not chains, "min_rows": "incremental" not in s,
            "min_quant_bytes": not ({"incremental", "delta", "quantize", "overrides"} & set(s)),
            "lossless": not lossy_or_chained}.get(name, False)


def _make(settings: dict[str, object], ema: GradientEMA) -> Policy:
    return Policy(**{k: (ema if v == "ema" else v) for k, v in settings.items()})


def _run(settings: dict[str, object]) -> tuple[object, ...]:
    """Three commits of a small training state; what they stored (kinds, chains, codecs, parts,
    bytes) and the last checkout, after checking lossless entries come back bit for bit."""
    torch.manual_seed(0)
    net = _Net()
    ema = GradientEMA(net)
    policy = _make(settings, ema)
    g = torch.Generator().manual_seed(1)
    state = {"model": net,
             "emb": {"table": torch.randn(2048, 8, generator=g),    # 64 KiB, 2048 rows
                     "cold": torch.randn(2048, 8, generator=g),     # the same, kept lossless
                     "mid": torch.randn(768, 24, generator=g)},     # 72 KiB, 768 rows
             "head": torch.randn(128, 128, generator=g),
             "optim": {"state": {"0": {"exp_avg": torch.zeros(128, 128),
                                       "exp_avg_sq": torch.zeros(128, 128)}}}}
    store = ckptstore.open(f"memory://combinations-{uuid.uuid4().hex}", policy=policy)
    seen: list[object] = []
    for _ in range(3):
        loss = sum((p * torch.randn(p.shape, generator=g)).pow(2).sum() for p in net.parameters())
        loss.backward()
        with torch.no_grad():
            for p in net.parameters():
                p -= 1e-3 * p.grad
                p.grad = None
            for t in state["emb"].values():
                rows = torch.randperm(t.shape[0], generator=g)[: t.shape[0] // 10]
                t[rows] += 1e-3 * torch.randn(len(rows), t.shape[1], generator=g)
            head_step = 1e-3 * torch.randn(128, 128, generator=g)
            state["head"] += head_step
            moments = state["optim"]["state"]["0"]
            moments["exp_avg"].mul_(0.9).add_(head_step, alpha=0.1)
            moments["exp_avg_sq"].mul_(0.99).add_(head_step.square(), alpha=0.01)
        info = store.commit(state)
        m = store.manifest(info.id)
        seen.append((info.stored_bytes, sorted(
            (e.path, str(e.kind), e.chain, json.dumps(e.codec, sort_keys=True, default=str),
             sorted(e.parts or {})) for e in m.tensors)))
    got = store.checkout("main")
    flat = {"model." + k: v for k, v in net.state_dict().items()}
    flat |= {"emb." + k: v for k, v in state["emb"].items()} | {"head": state["head"]}
    for e in store.manifest(store.resolve("main")).tensors:
        if e.path in flat and (e.codec or {}).get("id", "raw") in LOSSLESS_IDS | {"raw"} and (
                str(e.kind) != "residual"):
            node = got
            for key in e.path.split("."):
                node = node[key]
            assert torch.equal(node, flat[e.path]), e.path
    assert store.verify().ok
    seen.append([t.sum().item() for t in got["model"].values()])
    return tuple(seen)


def _without(settings: dict[str, object], name: str) -> dict[str, object] | None:
    rest = {k: v for k, v in settings.items() if k != name}
    try:
        _make(rest, object())  # type: ignore[arg-type]  # a stand-in for the GradientEMA
    except ValueError:
        return None
    return rest


@pytest.mark.parametrize("a,b", PAIRS, ids=[f"{a[0]}={a[1]}-{b[0]}" if a[0] == "incremental"
                                            else f"{a[0]}-{b[0]}" for a, b in PAIRS])
def test_pair_takes_effect_or_is_refused(a, b):
    settings = dict([a, b])
    try:
        _make(settings, object())  # type: ignore[arg-type]
    except ValueError as e:
        message = str(e)
        assert "Policy(" in message and ("or leave" in message or "pattern" in message)
        assert a[0] in message or b[0] in message
        return
    got = _run(settings)
    for name in (a[0], b[0]):
        other = _without(settings, name)
        changed = _run(other if other is not None else {}) != got
        assert changed != _vacuous(name, settings), (
            f"{name} {'changed what a vacuous bound must not' if changed else 'had no effect'}")


def test_an_override_of_a_shrink_path_is_refused():
    with pytest.raises(ValueError, match="matches 'head', which shrink encodes"):
        Policy(shrink=SHRINK, overrides=(("h*", QuantSpec(bits=4)),))
    Policy(shrink=SHRINK, overrides=(("model.*", QuantSpec(bits=4)),))  # no path in common
