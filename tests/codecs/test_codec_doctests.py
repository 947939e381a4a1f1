"""The Examples sections of the codec docstrings run."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ["ckptcodecs.quantize", "ckptcodecs.rle_huffman", "ckptcodecs.delta", "ckptcodecs.qdelta"]


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
