"""Encoded fixtures under tests/data/codecs must decode identically forever.

Run as a script to write fixtures that are missing (existing files are never overwritten):
``python tests/codecs/test_codec_backcompat.py``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).parent))
from common import (
    check_backwards_compatibility,
    fixture_cases,
    fixture_paths,
    write_missing_fixture,
)

CASES = fixture_cases()


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_fixture_decodes_identically(name):
    check_backwards_compatibility(name)


@pytest.mark.parametrize("name,codec", [(c[0], c[1]) for c in CASES])
def test_fixture_array_roundtrips_within_codec(name, codec):
    # the stored array still encodes to something that decodes like the stored decoding would
    arr = np.load(fixture_paths(name)["array"])
    dec = np.asarray(codec.decode(codec.encode(arr)))
    assert dec.nbytes == arr.nbytes


if __name__ == "__main__":
    written = [name for name, codec, arr in CASES if write_missing_fixture(name, codec, arr)]
    print(f"wrote {len(written)} fixture(s): {', '.join(written) or '-'}")
