"""numba, the reference of the compiled kernels, imported only when a numba kernel runs (issue 28).

The C kernels (``ckptcodecs._native``) are what a process runs; the numba kernels stay as their
reference (``CKPTCODECS_KERNELS=numba``, the twin tests, the benchmarks). Importing numba costs
a few tenths of a second and its compile seconds more, so a kernel module writes
``@njit(...)`` from here: the function is kept as a :class:`Deferred` kernel, and numba is
imported and every deferred kernel handed to ``numba.njit`` only when one is first called (or
:func:`compile_all` is). numba is then an optional dependency (``pip install
'ckptstore[reference]'``): without it a deferred kernel raises a :class:`CodecError` saying so.

Kernels call each other through their modules' globals, as numba resolves them at compile
time: compiling replaces every deferred kernel in the globals of each module that defined one
by its numba dispatcher, so numba never sees a :class:`Deferred`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from .errors import CodecError

__all__ = ["Deferred", "compile_all", "njit", "on_compile"]

_LOCK = threading.Lock()
#: the globals of every module that defined a deferred kernel
_MODULES: list[dict[str, Any]] = []
_KERNELS: list[Deferred] = []
#: what needs numba itself to be defined (its intrinsics): run once numba is imported, each
#: returning names to put into its module's globals before any kernel compiles
_HOOKS: list[Callable[[], dict[str, Any]]] = []


class Deferred:
    """A numba kernel not compiled yet: calling it compiles every deferred kernel (once) and
    calls its dispatcher."""

    def __init__(self, fn: Callable, options: dict[str, Any]):
        self.py_func, self.options = fn, options
        self.dispatcher: Callable | None = None
        self.__name__, self.__doc__ = fn.__name__, fn.__doc__
        self.__module__, self.__qualname__ = fn.__module__, fn.__qualname__

    def __call__(self, *args: Any) -> Any:
        if self.dispatcher is None:
            compile_all()
        return self.dispatcher(*args)

    def __repr__(self) -> str:
        state = "compiled" if self.dispatcher is not None else "deferred"
        return f"<numba kernel {self.__module__}.{self.__qualname__} ({state})>"


def njit(**options: Any) -> Callable[[Callable], Deferred]:
    """``numba.njit(**options)``, deferred until a numba kernel first runs."""

    def defer(fn: Callable) -> Deferred:
        kernel = Deferred(fn, options)
        with _LOCK:
            _KERNELS.append(kernel)
            if not any(g is fn.__globals__ for g in _MODULES):
                _MODULES.append(fn.__globals__)
        return kernel

    return defer


def on_compile(hook: Callable[[], dict[str, Any]]) -> Callable[[], dict[str, Any]]:
    """Register ``hook``: once numba is imported, before any kernel compiles, it runs and the
    names it returns go into its module's globals (numba intrinsics a kernel calls)."""
    with _LOCK:
        _HOOKS.append(hook)
        if not any(g is hook.__globals__ for g in _MODULES):
            _MODULES.append(hook.__globals__)
    return hook


def compile_all() -> None:
    """Hand every deferred kernel to ``numba.njit`` (compiling each on its first call, as numba
    does) and put the dispatchers in place of the deferred kernels in their modules."""
    with _LOCK:
        if not _HOOKS and all(k.dispatcher is not None for k in _KERNELS):
            return
        try:
            import numba
        except ImportError as err:
            raise CodecError("the numba reference kernels need numba (pip install "
                             "'ckptstore[reference]'); the C kernels run without it") from err
        while _HOOKS:
            hook = _HOOKS.pop(0)
            hook.__globals__.update(hook())
        for kernel in _KERNELS:
            if kernel.dispatcher is None:
                kernel.dispatcher = numba.njit(**kernel.options)(kernel.py_func)
        for module in _MODULES:
            for name, value in list(module.items()):
                if isinstance(value, Deferred):
                    module[name] = value.dispatcher
