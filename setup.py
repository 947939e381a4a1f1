"""The compiled core of ckptcodecs (issue 28): ``ckptcodecs._native``, a plain C extension built
with the machine's C compiler by ``pip install`` (everything else is in pyproject.toml)."""

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
    ],
)
