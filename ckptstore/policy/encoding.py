"""Per-tensor encoding policy: full / incremental rows / code deltas, lossless or quantized."""

from __future__ import annotations

import fnmatch
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import torch

from ..chunkcodec.quantized import DEFAULT_MIN_SAVING
from .bitwidth import BitWidth
from .rebase import Intermittent, RebasePredictor
from .sensitivity import GradientAverages
from .shrink import SHRINKABLE, Shrink

__all__ = ["Decision", "Policy", "QuantSpec", "Want"]

IncrementalMode = Literal["off", "one-shot", "consecutive", "intermittent"]
# a whole tensor, changed rows, code deltas, the lossless XOR with the previous commit, or a
# pruned quantized residual against the previous commit (Shrink)
#: the widest codes ``QuantSpec(method="auto")`` searches ranges for (Check-N-Run section 5.2)
ADAPTIVE_MAX_BITS = 4

Want = Literal["full", "rows", "codes", "xor", "residual"]


@dataclass(frozen=True)
class QuantSpec:
    """A lossy encoding of float tensors (see :class:`ckptcodecs.Quantize`).

    ``entropy`` adds RLE + Huffman coding of the packed codes, done where a sample of a chunk
    says it saves at least ``entropy_min_saving`` of its size (else the codes are stored raw:
    coding costs a core a few nanoseconds a byte, and saves 2-7 % on 8-bit and 2-4-bit row
    codes of dense weights; 0.0 codes every chunk). ``protect_mode="sparse"`` keeps the
    protected values in a side list instead of spending a code level on them (better at 2-3 bits).
    ``param_dtype="float16"`` halves the per-row scales and zero points (8x instead of 5.3x for
    2-bit rows of 16 values). ``num_bins`` and ``ratio`` tune the adaptive range search
    (Check-N-Run section 5.2: None picks 25 bins up to 3 bits, 45 above; ``ratio`` the share of
    the range searched); :func:`ckptstore.policy.autotune` chooses them from a sample of rows.
    ``prune_zeros`` gives exact zeros a code of their own (sparse tensors, see :class:`Shrink`).

    ``method="auto"`` (the default) is Check-N-Run's choice (section 5.2): the adaptive
    asymmetric search up to 4 bits, plain uniform asymmetric above ("for 8-bit quantization,
    naive asymmetric quantization is sufficient"), unless ``num_bins`` or ``ratio`` tune the
    search. The stored codec configuration names the method used.
    """

    method: str = "auto"
    bits: int = 4
    granularity: str = "row"
    group_size: int | None = None
    protect: float = 0.0
    prune: float = 0.0
    levels: int | None = None
    lam: float = 1.0
    protect_mode: str = "level"
    param_dtype: str = "float32"
    entropy: bool = True
    entropy_min_saving: float = DEFAULT_MIN_SAVING
    num_bins: int | None = None
    ratio: float = 1.0
    prune_zeros: bool = False

    def __post_init__(self) -> None:
        saving = self.entropy_min_saving
        if isinstance(saving, bool) or not isinstance(saving, (int, float)) or not (
                0.0 <= saving < 1.0):
            raise ValueError("entropy_min_saving is the least share of a chunk's size entropy "
                             f"coding must save, in [0, 1): not {saving!r}")

    def with_bits(self, bits: int) -> QuantSpec:
        return replace(self, bits=bits)

    @property
    def resolved_method(self) -> str:
        """The quantization method ``method`` stands for at ``bits`` (see ``"auto"``)."""
        if self.method != "auto":
            return self.method
        searched = self.bits <= ADAPTIVE_MAX_BITS or self.num_bins is not None or (
            self.ratio != 1.0)
        return "adaptive-asymmetric" if searched else "uniform-asymmetric"

    def codec_kwargs(self, dtype: str) -> dict[str, Any]:
        """Keyword arguments of ``ckptcodecs.Quantize`` for a tensor of torch dtype ``dtype``."""
        kw: dict[str, Any] = {"method": self.resolved_method, "bits": self.bits,
                              "granularity": self.granularity, "protect": self.protect,
                              "prune": self.prune, "lam": self.lam}
        if self.group_size is not None:
            kw["group_size"] = self.group_size
        if self.levels is not None:
            kw["levels"] = self.levels
        if self.protect_mode != "level":
            kw["protect_mode"] = self.protect_mode
        if self.param_dtype != "float32":
            kw["param_dtype"] = self.param_dtype
        if self.num_bins is not None:
            kw["num_bins"] = self.num_bins
        if self.ratio != 1.0:
            kw["ratio"] = self.ratio
        if dtype == "bfloat16":
            kw["dtype"] = "bfloat16"
        return kw


@dataclass(frozen=True)
class Decision:
    """What the policy wants for one tensor: ``rows`` (incremental candidate), ``codes``
    (code-delta candidate), ``xor`` (lossless delta candidate) or ``full``; and its
    quantization (None: lossless)."""

    want: Want
    quant: QuantSpec | None = None


_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)
_SHRINKABLE = tuple(getattr(torch, name) for name in SHRINKABLE)


@dataclass(frozen=True)
class Policy:
    """How a commit encodes each tensor.

    Parameters
    ----------
    incremental
        ``"off"``; ``"one-shot"`` (rows changed since the full baseline); ``"consecutive"`` (rows
        changed since the previous commit; restore replays the chain); ``"intermittent"``
        (one-shot, with a new baseline when ``rebase`` predicts it pays off -- Check-N-Run's
        default). Applies to embedding-like tensors: 2-D with at least ``min_rows`` rows.
    quantize
        Lossy encoding of float tensors of at least ``min_quant_bytes`` (None: lossless).
    delta
        Dense tensors are stored as deltas against the previous commit: DynaQuant code deltas
        where they are quantized, else (lossless) the XOR of their bits with the previous
        commit's, byte-plane entropy coded (a host copy of each such tensor is kept between
        commits to XOR against).
    max_chain
        Longest chain of increments or deltas before a full commit is forced.
    rebase
        Predictor of ``intermittent`` rebasing.
    bitwidth
        Choose ``quantize.bits`` from the expected number of restores.
    lossless
        Glob patterns of dotted paths that are always stored lossless and full.
    overrides
        ``(glob, QuantSpec or None)`` pairs: the first pattern matching a path replaces
        ``quantize`` for it (None: lossless), e.g. ``(("model.emb.*", QuantSpec(bits=4)),
        ("optim.*", None))``.
    shrink
        ExCP's weight-momentum joint shrinking (:class:`Shrink`): its weights are stored as
        pruned, quantized residuals against the previous commit (a chain, like ``delta``; a host
        copy of each is kept between commits), its moments pruned jointly and quantized.
        ``lossless`` patterns still win.
    sensitivity
        A :class:`ckptstore.GradientEMA` (any
        :class:`~ckptstore.policy.sensitivity.GradientAverages`): quantized tensors that
        ``protect`` or ``prune`` rank their values by DynaQuant's sensitivity ``|w * g|``
        (protect: the largest magnitudes and the largest sensitivities; prune: the smallest
        sensitivities) where it has seen gradients, by magnitude elsewhere.

    Notes
    -----
    Every combination of fields either takes effect or is refused here with a ``ValueError``
    (docs/policies.md has the table). Refused: a feature with nothing to act on (``bitwidth``
    with no quantization, ``rebase`` without ``"intermittent"``, ``sensitivity`` with no
    quantization that protects or prunes) and an ``overrides`` pattern that matches a ``shrink``
    path. Bounds hold trivially where what they bound is off (``max_chain`` with no chain,
    ``min_rows`` without ``incremental``, ``min_quant_bytes``, ``lossless``). ``delta`` with
    ``incremental``: tables take row increments, their lossless changed rows stored as the XOR
    of their old bits (also with a tracker), quantized ones as codes; other tensors take deltas.
    """

    incremental: IncrementalMode = "off"
    quantize: QuantSpec | None = None
    delta: bool = False
    max_chain: int = 16
    rebase: RebasePredictor = field(default_factory=Intermittent)
    bitwidth: BitWidth | None = None
    lossless: tuple[str, ...] = ()
    overrides: tuple[tuple[str, QuantSpec | None], ...] = ()
    min_rows: int = 1024
    min_quant_bytes: int = 64 * 1024
    shrink: Shrink | None = None
    sensitivity: GradientAverages | None = None

    def __post_init__(self) -> None:
        if self.incremental not in ("off", "one-shot", "consecutive", "intermittent"):
            raise ValueError("incremental must be 'off', 'one-shot', 'consecutive' or "
                             f"'intermittent', not {self.incremental!r}")
        if self.max_chain < 1:
            raise ValueError("max_chain must be >= 1")
        _check_combination(self)

    @classmethod
    def lossless_full(cls) -> Policy:
        """Every tensor full and lossless (the default of a store)."""
        return cls()

    def with_bits(self, bits: int) -> Policy:
        """The same policy with every quantization at ``bits`` bits."""
        return replace(self, quantize=self.quantize.with_bits(bits) if self.quantize else None,
                       overrides=tuple((p, s.with_bits(bits) if s else None)
                                       for p, s in self.overrides))

    def decide(self, path: str, tensor: torch.Tensor) -> Decision:
        """The wanted encoding of one tensor (the store then checks a base is available)."""
        if any(fnmatch.fnmatchcase(path, p) for p in self.lossless):
            return Decision("full")
        nbytes = tensor.numel() * tensor.element_size()
        if (self.shrink is not None and tensor.dtype in _SHRINKABLE and tensor.dim()
                and nbytes >= self.shrink.min_bytes and path in self.shrink.roles):
            # 2**bits - 1 k-means levels and a code for the pruned zeros; a residual's baseline
            # is lossless
            spec = QuantSpec("kmeans", self.shrink.bits, "tensor", prune_zeros=True)
            return Decision("residual" if self.shrink.roles[path] == "weight" else "full", spec)
        is_float = tensor.dtype in _FLOATS
        spec = next((s for pattern, s in self.overrides if fnmatch.fnmatchcase(path, pattern)),
                    self.quantize)
        quant = spec if is_float and tensor.dim() and nbytes >= self.min_quant_bytes else None
        if (self.incremental != "off" and tensor.dim() == 2 and tensor.shape[0] >= self.min_rows
                and nbytes >= self.min_quant_bytes):
            return Decision("rows", quant)
        if self.delta and quant is not None:
            return Decision("codes", quant)
        if self.delta and tensor.dim() and nbytes >= self.min_quant_bytes:
            return Decision("xor")
        return Decision("full", quant)


def _check_combination(p: Policy) -> None:
    """Refuse a feature that the rest of ``p`` would leave without effect (never drop it)."""
    specs = [s for s in (p.quantize, *(s for _, s in p.overrides)) if s is not None]
    unused = {
        "bitwidth": (p.bitwidth is not None and not specs,
                     "it picks the bits of quantize/overrides: give quantize=QuantSpec(...)"),
        "rebase": (p.rebase != Intermittent() and p.incremental != "intermittent",
                   "it decides rebases of incremental='intermittent' only: set that mode"),
        "sensitivity": (p.sensitivity is not None and not any(
            s.protect > 0 or s.prune > 0 for s in specs),
            "it ranks what a QuantSpec protects or prunes: give one with protect or prune > 0"),
    }
    for name, (bad, todo) in unused.items():
        if bad:
            raise ValueError(f"Policy({name}=...) would have no effect with the other settings; "
                             f"{todo}, or leave {name} out")
    clash = [(pat, path) for pat, _ in p.overrides for path in (p.shrink.roles if p.shrink else ())
             if fnmatch.fnmatchcase(path, pat)]
    if clash:
        raise ValueError(f"Policy(overrides=...) pattern {clash[0][0]!r} matches {clash[0][1]!r}, "
                         "which shrink encodes (shrink wins): narrow the pattern, or use "
                         "lossless=(...) to keep that path out of shrink")
