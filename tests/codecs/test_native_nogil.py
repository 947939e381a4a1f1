"""Short kernel calls keep the GIL, long ones release it (``CK_BEGIN_NOGIL``, issue 28): a
persist's histogram-sized calls beside a training loop would each wait for the GIL to come back;
``_native.nogil_min`` sets the size, and the bytes are the same at every setting."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest

from ckptcodecs import _backend, encode_uniform_chunk, planes_encode, rle_huffman_encode
from ckptcodecs.planes import _K
from helpers import progress_during, spins_during

pytestmark = pytest.mark.skipif(_backend.native() is None,
                                reason="ckptcodecs' compiled kernels are not built")

#: native.h's CK_NOGIL_MIN
DEFAULT = 1 << 17


@pytest.fixture
def native() -> Iterator[object]:
    n = _backend.native()
    before = n.nogil_min(DEFAULT)
    assert before == DEFAULT  # the compiled default (no test leaves another setting behind)
    try:
        yield n
    finally:
        n.nogil_min(before)


def _weights(n: int, seed: int = 0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(n) * 0.02).astype(np.float32)


def test_the_default_and_the_setter(native) -> None:
    assert native.nogil_min(0) == DEFAULT
    assert native.nogil_min(DEFAULT) == 0
    with pytest.raises(ValueError, match="0 or more"):
        native.nogil_min(-1)
    assert native.nogil_min(DEFAULT) == DEFAULT


def test_short_calls_keep_the_gil(native) -> None:
    # the zstd trials' larger sample, 64 KiB (~20 us: long enough for a waiting thread to wake
    # and take a released GIL now and then)
    small = np.random.default_rng(0).integers(0, 256, 64 << 10, dtype=np.uint8)
    freq = np.empty((1, 256), np.int64)
    lens = np.empty(256, np.int64)
    _K.plane_stats(small, small.size, freq)

    def calls() -> None:
        for _ in range(100):  # a persist's sample statistics and code lengths
            _K.plane_stats(small, small.size, freq)
            _K.code_lengths(freq[0], lens)

    assert progress_during(calls) == [0, 0, 0]
    native.nogil_min(0)  # as before: every call releases, and the counter gets a turn
    assert sum(progress_during(calls)) > 0


def test_long_calls_release_it_unless_the_size_says_otherwise(native) -> None:
    big = np.random.default_rng(1).integers(0, 256, 32 << 20, dtype=np.uint8)
    freq = np.empty((256, 256), np.int64)
    assert spins_during(lambda: _K.plane_stats(big, 1 << 17, freq)) > 0
    native.nogil_min(1 << 40)
    assert progress_during(lambda: _K.plane_stats(big, 1 << 17, freq)) == [0, 0, 0]


@pytest.mark.parametrize("n", [1000, 40_000, 400_000])
def test_the_same_bytes_either_way(native, n: int) -> None:
    x = _weights(n, n)  # 4 KB to 1.6 MB: both sides of the size
    codes = np.random.default_rng(n).integers(0, 16, n, dtype=np.uint8)
    outs = []
    for setting in (DEFAULT, 0, 1 << 40):
        native.nogil_min(setting)
        outs.append((planes_encode(x).tobytes(),
                     bytes(encode_uniform_chunk(x.reshape(-1, 8), "uniform-asymmetric", 8,
                                                entropy=True)),
                     bytes(rle_huffman_encode(codes))))
    assert outs[0] == outs[1] == outs[2]
