"""The compiled passes of tANS symbol sections (lmzfs/codecs/_tanssection.c) against the numpy
code they stand in for: the same section bytes on adversarial symbols (constant, random, skewed,
tiny, odd sizes, with and without contexts), decoding back on both paths; and `--fast` keeping
the slow zstd level off tensor chunks."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lmzfs.codecs import ChunkHint, decode_chunk, encode_chunk, encode_with, entropy, kernels
from lmzfs.codecs import zstd as zstd_codec
from lmzfs.testing.synthetic import int8_columns
from lmzfs.testing.tanspaths import compiled_then_numpy


@pytest.fixture(autouse=True)
def _compiled_loop_built():
    if kernels.compiled() is None:
        pytest.fail("the compiled tANS loop (lmzfs/codecs/_tansloop.c) is not built; `pip install -e .` builds it")


def _symbols(kind: str, n: int, S: int, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if kind == "constant":
        return np.full(n, int(rng.integers(0, S)), dtype=np.int64)
    if kind == "random":
        return rng.integers(0, S, n)
    return np.minimum(rng.geometric(0.35, n) - 1, S - 1)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(kind=st.sampled_from(["constant", "random", "skewed"]), n=st.integers(1, 7000),
       S=st.sampled_from([2, 3, 16, 256, 300]), K=st.sampled_from([1, 2, 16]), narrow=st.booleans(),
       seed=st.integers(0, 2**32 - 1))
def test_compiled_and_numpy_sections_are_the_same_bytes_and_decode_back(kind, n, S, K, narrow, seed):
    sym = _symbols(kind, n, S, seed)
    ctx = None if K == 1 else np.random.default_rng(seed + 1).integers(0, K, n)
    if narrow and S <= 256:     # the uint8 inputs the codecs pass
        sym = sym.astype(np.uint8)
        ctx = None if ctx is None else ctx.astype(np.uint8)
    compiled, reference = compiled_then_numpy(lambda: entropy.tans_section(sym, S, ctx, K))
    assert compiled == reference
    for got in compiled_then_numpy(lambda: entropy.decode_tans_section(compiled, n, S, ctx, K)):
        assert np.array_equal(np.asarray(got, dtype=np.int64), sym.astype(np.int64))


def test_a_symbol_out_of_its_alphabet_is_refused_on_both_paths():
    sym = np.array([0, 1, 2, 16], dtype=np.uint8)
    with pytest.raises(ValueError):
        entropy.tans_section(sym, 16)
    with kernels.reference_only(), pytest.raises(ValueError):
        entropy.tans_section(sym, 16)


@pytest.mark.parametrize("rows, C", [(257, 64), (64, 96), (1000, 33)])
def test_the_entropy_codec_writes_the_same_payload_on_both_paths_and_it_decodes(rows, C):
    data = int8_columns(rows, C, rows + C)
    hint = ChunkHint("I8", 1, shape=(rows, C))
    compiled, reference = compiled_then_numpy(lambda: encode_with("entropy", data, hint))
    assert compiled == reference
    assert compiled_then_numpy(lambda: decode_chunk(compiled, len(data))) == (data, data)


def test_fast_codes_an_int8_tensor_at_the_default_zstd_level_and_a_header_at_the_text_level():
    tensor = int8_columns(2048, 64, 7, zeros=0.75)   # zstd halves it: the slow level would be tried
    got = encode_chunk(tensor, ChunkHint("I8", 1, shape=(2048, 64)), fast=True)
    assert got.codec == "zstd"
    assert len(zstd_codec.compress(tensor, 19)) < len(zstd_codec.compress(tensor, zstd_codec.DEFAULT_LEVEL)) * 2 <= len(tensor)
    assert got.payload.endswith(zstd_codec.compress(tensor, zstd_codec.DEFAULT_LEVEL))
    header = b"".join(b'{"tensor.%d": {"dtype": "I8", "shape": [64, 64]}}, ' % i for i in range(4000))
    got = encode_chunk(header, ChunkHint(), fast=True)
    level3 = zstd_codec.compress(header, zstd_codec.DEFAULT_LEVEL)
    level19 = zstd_codec.compress(header, 19)
    assert len(level19) < len(level3)
    assert got.payload.endswith(level19)
    assert decode_chunk(got.payload, len(header)) == header


def test_the_slow_zstd_level_is_measured_on_a_slice_of_an_int8_chunk_the_entropy_coder_wins(monkeypatch):
    import lmzfs.codecs as codecs
    tensor = int8_columns(1 << 14, 64, 11, zeros=0.75)     # 1 MiB that zstd halves
    hint = ChunkHint("I8", 1, shape=(1 << 14, 64))
    seen: list[int] = []
    plain = zstd_codec.compress

    def recording(data, level=zstd_codec.DEFAULT_LEVEL):
        if level == codecs.TEXT_LEVEL:
            seen.append(len(data))
        return plain(data, level)

    monkeypatch.setattr(zstd_codec, "compress", recording)
    got = encode_chunk(tensor, hint)
    assert got.codec == "entropy"
    assert seen and max(seen) == codecs.TEXT_SAMPLE_BYTES < len(tensor)
    assert len(plain(tensor, codecs.TEXT_LEVEL)) > len(got.payload)    # the whole-chunk trial would have lost
    assert got.payload == encode_chunk(tensor, hint, exhaustive=True).payload


def test_a_stream_level_9_cannot_shrink_keeps_its_level_1_frame():
    # one random 4 KiB block 64 times: zstd wins, and level 9 codes the middle slice no smaller
    a = np.tile(np.random.default_rng(1).integers(0, 256, 4096, dtype=np.uint8), 64)
    got = entropy.encode_stream(a)
    assert got == bytes((entropy.ZSTD,)) + zstd_codec.compress(a.tobytes(), 1)
    assert entropy.decode_stream(got, len(a)).tobytes() == a.tobytes()


def test_a_stream_level_9_shrinks_on_its_slice_gets_level_9():
    # words of a Zipf-distributed vocabulary: level 9 finds the repeats level 1 misses
    rng = np.random.default_rng(1)
    words = [bytes(rng.integers(97, 123, int(rng.integers(2, 9)), dtype=np.uint8)) for _ in range(2000)]
    text = b" ".join(words[int(i)] for i in rng.zipf(1.3, 60000) % 2000)[:300000]
    got = entropy.encode_stream(np.frombuffer(text, dtype=np.uint8))
    assert got == bytes((entropy.ZSTD,)) + zstd_codec.compress(text, 9)
    assert len(got) < 0.95 * len(zstd_codec.compress(text, 1))


def test_a_short_stream_whose_level_9_frame_comes_out_larger_keeps_its_level_1_frame():
    # a skewed byte stream with short nearby repeats, shorter than two slices (so level 9 is
    # run in full): level 1 beats the tANS section, and level 9's frame is the larger one
    rng = np.random.default_rng(0)
    n = int(rng.integers(20000, 60000))
    a = rng.geometric(0.08, n).clip(0, 255).astype(np.uint8)
    for i in rng.integers(16, n - 16, n // 40):
        length = int(rng.integers(6, 12))
        a[i:i + length] = a[i - 12:i - 12 + length]
    level1, level9 = zstd_codec.compress(a.tobytes(), 1), zstd_codec.compress(a.tobytes(), 9)
    assert len(level9) > len(level1) and len(a) < 2 * entropy.ZSTD_SLICE
    got = entropy.encode_stream(a)
    assert got == bytes((entropy.ZSTD,)) + level1
    assert entropy.decode_stream(got, len(a)).tobytes() == a.tobytes()
