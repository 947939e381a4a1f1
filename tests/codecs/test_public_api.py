"""ckptcodecs' public face is all ckptstore uses (issue 27 item 4; numcodecs' habit).

The public face: the names of ``ckptcodecs.__all__`` and of the ``__all__`` of its documented
public modules (:data:`PUBLIC_MODULES`); everything else -- the underscore modules holding the
compiled kernels, and the algorithm modules (``adaptive``, ``kmeans``, ``qparams``, ...) -- is
implementation that may change (issue 28 moves the kernels to C behind this same face).
"""

from __future__ import annotations

import ast
import doctest
import importlib
import inspect
from pathlib import Path

import numpy as np
import pytest

import ckptcodecs

#: the modules of ckptcodecs a user (and ckptstore) may import from
PUBLIC_MODULES = ("ckptcodecs", "ckptcodecs.floats", "ckptcodecs.kernels", "ckptcodecs.zarr3")
STORE = Path(__file__).resolve().parents[2] / "ckptstore"


def _codec_imports() -> list[tuple[str, str, str]]:
    """``(file:line, module, name)`` of every import from ckptcodecs in ckptstore's source (in
    functions and under TYPE_CHECKING too); ``name`` is ``""`` for ``import ckptcodecs.x``."""
    found = []
    for path in sorted(STORE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            where = f"{path.relative_to(STORE.parent)}:{getattr(node, 'lineno', 0)}"
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and (
                    node.module.split(".")[0] == "ckptcodecs"):
                found += [(where, node.module, a.name) for a in node.names]
            elif isinstance(node, ast.Import):
                found += [(where, a.name, "") for a in node.names
                          if a.name.split(".")[0] == "ckptcodecs"]
    return found


def test_ckptstore_imports_no_private_name_of_ckptcodecs():
    imports = _codec_imports()
    assert imports  # the store does use the codecs: the walk found them
    private = [f"{w}: {m} {n}" for w, m, n in imports
               if any(p.startswith("_") for p in m.split(".")) or n.startswith("_")]
    assert private == []


def test_ckptstore_imports_only_the_public_face():
    """Only from the public modules, only names their ``__all__`` lists (not a module's
    internals such as ``adaptive.HIST_PER_BIN``)."""
    outside = []
    for where, module, name in _codec_imports():
        if module not in PUBLIC_MODULES:
            outside.append(f"{where}: {module} {name}")
        elif name and name not in importlib.import_module(module).__all__:
            outside.append(f"{where}: {name} is not in {module}.__all__")
    assert outside == []


@pytest.mark.parametrize("module", PUBLIC_MODULES)
def test_public_names_exist_and_are_documented(module):
    """Every listed name exists; functions and classes have a docstring; constants are
    described in the module's docstring."""
    mod = importlib.import_module(module)
    assert mod.__doc__ and mod.__all__
    for name in mod.__all__:
        obj = getattr(mod, name)
        if inspect.isclass(obj) or callable(obj):
            assert inspect.getdoc(obj), f"{module}.{name} has no docstring"
        else:
            assert name in mod.__doc__, f"{module}.{name} is not described in {module}'s docstring"


def test_package_exposes_its_public_modules():
    """``import ckptcodecs`` is enough to reach ``ckptcodecs.floats`` and ``.kernels``."""
    assert ckptcodecs.floats.__name__ == "ckptcodecs.floats"
    assert ckptcodecs.kernels.__name__ == "ckptcodecs.kernels"


def test_floats_public_casts():
    from ckptcodecs import floats

    x = np.array([1.0, 2.5, -0.0, np.inf, 3.4e38], np.float32)
    bits = floats.to_bf16_bits(x)
    assert bits.dtype == np.uint16
    values = floats.from_bf16_bits(bits)
    assert values[:4].tolist() == [1.0, 2.5, -0.0, np.inf]
    assert np.isfinite(values[4])  # a finite value beyond the bfloat16 range saturates
    assert floats.to_float16(x[:3]).tobytes() == x[:3].astype(np.float16).tobytes()
    assert floats.float16_values(x[:3].astype(np.float16)).tolist() == [1.0, 2.5, 0.0]
    total = floats.add_rounded(bits[:2], bits[:2], "bfloat16")
    assert floats.from_bf16_bits(total).tolist() == [2.0, 5.0]
    assert floats.from_float(np.array([1.5]), "float16").dtype == np.float16
    assert floats.from_float(np.array([1.5]), "bfloat16").dtype == np.uint16


def test_kernels_uniform_params_float16():
    from ckptcodecs import kernels

    lo, hi = np.array([-1.0, 0.1]), np.array([1.0, 0.3])
    zero, scale = np.empty(2), np.empty(2)
    assert kernels.uniform_params_f16(lo, hi, 16, zero, scale)
    assert np.all(zero <= lo) and np.all(zero + 15 * scale >= hi)  # covers the range
    assert zero.astype(np.float16).astype(np.float64).tolist() == zero.tolist()  # float16 values
    assert scale.astype(np.float16).astype(np.float64).tolist() == scale.tolist()
    assert not kernels.uniform_params_f16(np.array([-1e6]), np.array([1e6]), 16,
                                          np.empty(1), np.empty(1))  # beyond float16
    with pytest.raises(ValueError, match="one value per segment"):
        kernels.uniform_params_f16(lo, hi, 16, np.empty(1), np.empty(2))


def test_kernels_fit_from_buckets_checks_its_arrays():
    from ckptcodecs import kernels

    counts, sums = np.array([2, 1], np.int64), np.array([2.0, 5.0])
    book = np.empty((1, 2))
    kernels.fit_from_buckets(counts, sums, np.array([0, 2]), 2, 1.0, 0, book)
    assert book.tolist() == [[1.0, 5.0]]  # two buckets, two levels: their means
    with pytest.raises(ValueError, match="offsets"):
        kernels.fit_from_buckets(counts, sums, np.array([0, 3]), 2, 1.0, 0, book)
    with pytest.raises(ValueError, match="offsets"):
        kernels.fit_from_buckets(counts, sums, np.array([0, 1, 2]), 2, 1.0, 0, book)
    with pytest.raises(ValueError, match="sums"):
        kernels.fit_from_buckets(counts, sums[:1], np.array([0, 2]), 2, 1.0, 0, book)


def test_kernels_constants_are_those_the_codec_uses():
    """The constants a device implementation must agree on are the host codec's own."""
    from ckptcodecs import adaptive, kernels, kmeans

    assert kernels.HIST_PER_BIN == adaptive.HIST_PER_BIN
    assert kernels.MANTISSA_BITS == kmeans.MANTISSA_BITS
    assert kernels.segment_length((4, 8), "row", None) == 8


def test_floats_docstring_example_runs():
    from ckptcodecs import floats

    result = doctest.testmod(floats, optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
