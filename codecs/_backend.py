"""Which implementation runs ckptcodecs' kernels: the compiled C one or the numba reference.

The one place that chooses (issue 28). ``CKPTCODECS_KERNELS`` picks for the whole process, once,
at import:

- unset or empty: ``c`` where the extension ``ckptcodecs._native`` imports, else ``numba`` with
  one :class:`RuntimeWarning` (the package was installed without building it), or a
  :class:`~ckptcodecs.errors.CodecError` where numba is not installed either;
- ``c``: the compiled kernels; a :class:`~ckptcodecs.errors.CodecError` at import when the
  extension is not built (``pip install -e .`` builds it; it needs a C compiler);
- ``numba``: the numba kernels, the reference the C ones reproduce bit for bit (numba is an
  optional dependency, ``pip install 'ckptstore[reference]'``; it is imported only when a numba
  kernel runs, see ``ckptcodecs._jit``).

A kernel family (a module's kernels: ``bytegroup``, ``bitpack``, ``delta``) hands its numba
kernels to :func:`kernels` and calls what it returns; the C twin of kernel ``name`` of family
``f`` is ``ckptcodecs._native.f_name``, with the same arguments. Families not yet ported do not
come here and stay numba.

``CKPTCODECS_SIMD`` picks the CPU path of the compiled kernels, at import: ``auto`` (the
default: the best this CPU runs), ``portable`` (plain C loops only), ``sse2``, ``avx2`` (with
BMI2) or ``avx512`` (x86-64-v4); each path runs what the ones below it run, and a kernel
without code for a path runs the one below. A path this build or CPU cannot run is a
:class:`~ckptcodecs.errors.CodecError`. Every path writes the same bytes (the twin tests run
each).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import warnings
from collections.abc import Callable
from types import ModuleType, SimpleNamespace

from .errors import CodecError

__all__ = ["CHOICE", "KERNELS_ENV", "SIMD", "SIMD_ENV", "implementation", "kernels", "native",
           "use_simd"]

KERNELS_ENV = "CKPTCODECS_KERNELS"
SIMD_ENV = "CKPTCODECS_SIMD"
_IMPLEMENTATIONS = ("c", "numba")
_SIMD_PATHS = ("auto", "portable", "sse2", "avx2", "avx512")
#: the numba kernels of each family that came through :func:`kernels`
_REFERENCE: dict[str, dict[str, Callable]] = {}


def native() -> ModuleType | None:
    """The compiled extension, or None where it is not built."""
    try:
        return importlib.import_module("ckptcodecs._native")
    except ImportError:
        return None


def _simd() -> str:
    simd = os.environ.get(SIMD_ENV, "").strip().lower() or "auto"
    if simd not in _SIMD_PATHS:
        raise CodecError(f"{SIMD_ENV}={simd!r}: expected one of {', '.join(_SIMD_PATHS)}")
    return simd


def _choose() -> str:
    wanted = os.environ.get(KERNELS_ENV, "").strip().lower()
    if wanted not in ("", *_IMPLEMENTATIONS):
        raise CodecError(f"{KERNELS_ENV}={wanted!r}: expected one of {', '.join(_IMPLEMENTATIONS)}"
                         " (or unset)")
    if wanted == "numba" or (wanted == "c" and native() is not None):
        return wanted
    if wanted == "c":
        raise CodecError(f"{KERNELS_ENV}=c but ckptcodecs' compiled kernels are not built: "
                         "reinstall with `pip install -e .` (needs a C compiler)")
    if native() is None:
        if importlib.util.find_spec("numba") is None:
            raise CodecError("ckptcodecs' compiled kernels are not built and numba (their "
                             "reference) is not installed: reinstall with `pip install -e .` "
                             "(needs a C compiler)")
        warnings.warn("ckptcodecs' compiled kernels are not built (reinstall with `pip install "
                      "-e .`, which needs a C compiler): running the numba kernels",
                      RuntimeWarning, stacklevel=2)
        return "numba"
    return "c"


def use_simd(path: str) -> None:
    """Run the compiled transposes on CPU ``path`` (one of ``CKPTCODECS_SIMD``'s values) from
    now on, in this process: what the variable does at import, and what tests use to run each
    path."""
    module = native()
    if module is None:
        raise CodecError("ckptcodecs' compiled kernels are not built")
    try:
        module.set_simd(path)
    except ValueError as err:
        raise CodecError(f"{SIMD_ENV}={path!r}: {err}; this CPU runs "
                         f"{', '.join(module.simd_paths())}") from err


#: the CPU path of the compiled kernels asked for ("auto": the best this CPU runs)
SIMD = _simd()
#: the implementation this process runs: "c" or "numba"
CHOICE = _choose()
if CHOICE == "c":
    use_simd(SIMD)


def implementation(family: str, which: str) -> SimpleNamespace:
    """The kernels of ``family`` in implementation ``which`` ("c" or "numba"), whatever this
    process chose: what tests and benchmarks compare side by side."""
    reference = _REFERENCE.get(family)
    if reference is None or which not in _IMPLEMENTATIONS:
        raise CodecError(f"no kernel family {family!r} in implementation {which!r}")
    if which == "numba":
        return SimpleNamespace(**reference)
    module = native()
    if module is None:
        raise CodecError("ckptcodecs' compiled kernels are not built")
    return SimpleNamespace(**{name: getattr(module, f"{family}_{name}") for name in reference})


def kernels(family: str, **reference: Callable) -> SimpleNamespace:
    """The kernels of ``family`` this process runs: the C twins of ``reference`` (name -> numba
    kernel) under :data:`CHOICE` ``c``, else ``reference`` itself."""
    _REFERENCE[family] = dict(reference)
    return implementation(family, CHOICE)
