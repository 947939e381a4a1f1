"""The compiled parts, plain C extensions built with the machine's C compiler by ``pip install``
(everything else is in pyproject.toml): ckptcodecs' kernels, ``ckptcodecs._native`` (issue 28),
and a local store's file-system steps, ``ckptstore.storage._files`` (POSIX only: elsewhere
ckptstore makes the same calls from Python)."""

import os
from glob import glob

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "ckptcodecs._native",
            sources=sorted(glob("codecs/csrc/*.c")),
            depends=sorted(glob("codecs/csrc/*.h")),
            extra_compile_args=["-O3", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter"],
        )
    ] + ([
        Extension(
            "ckptstore.storage._files",
            sources=["ckptstore/storage/csrc/files.c"],
            extra_compile_args=["-O2", "-std=c11", "-Wall", "-Wextra", "-Wno-unused-parameter",
                                "-D_GNU_SOURCE"],
        )
    ] if os.name == "posix" else []),
)
