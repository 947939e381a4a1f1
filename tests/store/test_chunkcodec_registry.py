"""Chunk codecs are found by the id of their manifest config; a user codec registers in a few
lines; bad configs and unknown ids are ManifestErrors."""

from __future__ import annotations

import numpy as np
import pytest

from ckptstore import chunkcodec
from ckptstore.chunkcodec import (
    BloscLossless,
    CodeDelta,
    QuantizedLossy,
    RawLossless,
    add_crc,
    chunk_codec_ids,
    codec_from_config,
    lossless_codec,
    register_chunk_codec,
    registry,
)
from ckptstore.errors import CorruptedChunkError, ManifestError

BUILTINS = [BloscLossless(), BloscLossless("zstd", 5, "shuffle"), RawLossless(),
            QuantizedLossy({"method": "kmeans", "bits": 3}, entropy=False),
            QuantizedLossy({"method": "uniform-asymmetric", "bits": 4, "protect": 0.01})]


@pytest.mark.parametrize("codec", BUILTINS, ids=repr)
def test_config_round_trips_and_decodes(codec):
    again = codec_from_config(codec.config())
    assert type(again) is type(codec) and again.config() == codec.config()
    chunk = np.linspace(-1, 1, 256, dtype=np.float32).reshape(16, 16)
    out = np.empty_like(chunk)
    again.decode(b"".join(codec.encode(chunk)), out, "a/0.0")
    ref = np.empty_like(chunk)
    codec.decode(b"".join(codec.encode(chunk)), ref, "a/0.0")
    np.testing.assert_array_equal(out, ref)


def test_configs_are_what_manifests_hold():
    assert BloscLossless().config() == {"id": "blosc", "cname": "lz4", "clevel": 1,
                                        "shuffle": "bitshuffle"}
    assert RawLossless().config() == {"id": "raw"}
    assert CodeDelta().config() == {"id": "qdelta"}
    assert QuantizedLossy({"method": "kmeans", "bits": 2}).config() == {
        "id": "quantize", "quantize": {"method": "kmeans", "bits": 2}, "entropy": True}
    assert {"blosc", "raw", "quantize", "qdelta"} <= set(chunk_codec_ids())


@pytest.mark.parametrize("config", [{"id": "zfp"}, {}, None, ["blosc"]])
def test_unknown_id_asks_for_an_upgrade(config):
    with pytest.raises(ManifestError, match="newer ckptstore; upgrade"):
        codec_from_config(config)


@pytest.mark.parametrize("config", [
    {"id": "blosc", "shuffle": "sideways"},
    {"id": "blosc", "clevel": "high"},
    {"id": "quantize"},
    {"id": "quantize", "quantize": [("bits", 4)]},
    {"id": "quantize", "quantize": {"method": "uniform-asymmetric", "bits": 9}},
    {"id": "raw", "level": 3},
])
def test_bad_config_is_a_manifest_error(config):
    with pytest.raises(ManifestError, match="invalid chunk codec"):
        codec_from_config(config)


def test_code_delta_decodes_only_against_its_base():
    codec = codec_from_config({"id": "qdelta"})
    assert isinstance(codec, CodeDelta) and not codec.standalone and RawLossless.standalone
    with pytest.raises(ManifestError, match="code delta"):
        codec.decode(b"", np.empty(4, np.float32), "a.codes/0")


def test_corrupted_code_delta_names_its_chunk():
    q = QuantizedLossy({"method": "uniform-asymmetric", "bits": 4})
    x = np.linspace(-1, 1, 64, dtype=np.float32)
    _, codes, params = q.encode_codes(x)
    body, _ = q.encode_delta(x + 0.01, codes, params)[0]
    corrupted = b"".join(add_crc(body[:12]))  # a valid checksum over bad bytes
    with pytest.raises(CorruptedChunkError, match="chunk a.codes/0 does not decode"):
        q.decode_delta(corrupted, codes, params, "a.codes/0")


def test_lossless_codec_by_compression_option():
    assert isinstance(lossless_codec("lz4"), BloscLossless)
    assert isinstance(lossless_codec("none"), RawLossless)
    assert lossless_codec("entropy").codec_id == "planes"
    with pytest.raises(ValueError, match=r"one of \['entropy', 'lz4', 'none'\]"):
        lossless_codec("zstd")


def _documented_example() -> str:
    """The code block of "Adding a chunk codec" in the package docstring, dedented."""
    doc = chunkcodec.__doc__
    block = doc[doc.index("::\n", doc.index("Adding a chunk codec")) + 3:]
    lines = []
    for line in block.split("\n")[1:]:
        if line and not line.startswith("    "):
            break
        lines.append(line[4:])
    return "\n".join(lines)


def test_a_user_codec_registers_in_a_few_lines():
    """The package docstring's example, as written there, registers and round-trips."""
    names: dict = {}
    try:
        exec(_documented_example(), names)  # noqa: S102 - our own docstring
        ZstdLossless = names["ZstdLossless"]
        codec = codec_from_config({"id": "zstd", "level": 5})
        assert isinstance(codec, ZstdLossless) and codec.config() == {"id": "zstd", "level": 5}
        x = np.arange(100, dtype=np.float64)
        out = np.empty_like(x)
        codec.decode(b"".join(codec.encode(x)), out, "z/0")
        np.testing.assert_array_equal(out, x)

        class Other(ZstdLossless):
            codec_id = "blosc"

        with pytest.raises(ValueError, match="already registered to BloscLossless"):
            register_chunk_codec(Other)
    finally:
        registry._REGISTRY.pop("zstd", None)
    assert codec_from_config({"id": "blosc"}).__class__ is BloscLossless


def test_docstring_examples():
    import doctest

    from ckptstore.chunkcodec import lossless

    result = doctest.testmod(lossless)
    assert result.attempted > 0 and result.failed == 0
