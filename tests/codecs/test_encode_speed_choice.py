"""The estimates that let encode_chunk and the coded streams leave trials out, checked against
trying everything (encode_chunk(exhaustive=True)) on real chunks of every corpus file: the
stored bytes may grow by at most 0.05% (issue 26's bound), and every payload decodes back."""
from __future__ import annotations

import numpy as np
import pytest

from lmzfs.chunker import plan_chunks
from lmzfs.codecs import BytegroupCodec, ChunkHint, ZstdCodec, decode_chunk, encode_chunk, zstd
from lmzfs.formats import parse_file
from lmzfs.testing.corpus import CorpusUnavailable, fetch

SAMPLED_CHUNKS = 6      # per file, spread over it: a few seconds in all
HALVED_CHUNKS = 2


def _sample(name: str) -> list[tuple[bytes, object]]:
    try:
        path = fetch(name)
    except CorpusUnavailable as exc:
        pytest.skip(f"corpus file {name} cannot be fetched: {exc}")
    plans = [p for p in plan_chunks(parse_file(path)) if p.length >= 4096]
    step = max(1, len(plans) // SAMPLED_CHUNKS)
    out = []
    halved = 0
    with open(path, "rb") as f:
        for i, p in enumerate(plans):
            f.seek(p.offset)
            data = f.read(p.length)
            # the spread sample, and the first few typed chunks that zstd halves (where the
            # slow zstd level is estimated instead of tried)
            if (i % step == step // 2 and i // step < SAMPLED_CHUNKS) or \
                    (p.hint.dtype and halved < HALVED_CHUNKS and len(zstd.compress(data)) * 2 <= len(data)):
                halved += not (i % step == step // 2 and i // step < SAMPLED_CHUNKS)
                out.append((data, p.hint))
    return out


@pytest.mark.parametrize("name", ["astra", "minilm", "isnet", "smollm2", "quire", "smollm2-q4km"])
def test_estimated_codec_choices_store_within_a_twentieth_of_a_percent_of_trying_every_coding(name):
    chunks = _sample(name)
    chosen = tried = 0
    for data, hint in chunks:
        fast, full = encode_chunk(data, hint), encode_chunk(data, hint, exhaustive=True)
        assert decode_chunk(fast.payload, len(data)) == data
        assert decode_chunk(full.payload, len(data)) == data
        chosen += len(fast.payload)
        tried += len(full.payload)
    assert chunks and chosen <= tried * 1.0005, (name, chosen, tried)


def _bf16_weights(n: int, seed: int = 3) -> bytes:
    """n BF16 values of a trained-looking weight (a normal of small spread), truncated from FP32."""
    rng = np.random.default_rng(seed)
    return (rng.normal(0, 0.02, n).astype(np.float32).view(np.uint32) >> 16).astype(np.uint16).tobytes()


def _whole_chunk_zstd_calls(monkeypatch, data: bytes, codec=ZstdCodec) -> list[int]:
    """encode_chunk's trials of codec (zstd unless named) on data, by input length."""
    sizes = []
    real = codec.encode

    def counted(self, mv, hint):
        sizes.append(len(mv))
        return real(self, mv, hint)

    monkeypatch.setattr(codec, "encode", counted)
    return sizes


def test_a_bf16_chunk_that_zstd_cannot_win_is_never_zstd_coded_whole(monkeypatch):
    data = _bf16_weights(1 << 19)
    hint = ChunkHint("BF16", 2, 0, (1024, 512))
    sizes = _whole_chunk_zstd_calls(monkeypatch, data)
    got = encode_chunk(data, hint)
    assert got.codec == "floatseg"
    assert len(data) not in sizes and sizes    # only its slices were
    assert decode_chunk(got.payload, len(data)) == data


def test_a_bf16_chunk_that_bytegroup_cannot_win_is_tried_on_two_element_aligned_slices_only(monkeypatch):
    data = _bf16_weights(1 << 19)
    hint = ChunkHint("BF16", 2, 0, (1024, 512))
    sizes = _whole_chunk_zstd_calls(monkeypatch, data, BytegroupCodec)
    got = encode_chunk(data, hint)
    assert got.codec == "floatseg"
    assert sizes == [64 << 10, 64 << 10]
    assert encode_chunk(data, hint, exhaustive=True).payload == got.payload


def test_a_float_chunk_that_bytegroup_codes_smallest_is_still_bytegroup_coded():
    # FP32 elements whose three high bytes repeat a short cycle and whose low byte is random:
    # per-plane zstd finds the cycle, which the float model's order-0 fields cannot
    rng = np.random.default_rng(5)
    high = np.tile(rng.integers(0x3C000000 >> 8, 0x3D000000 >> 8, 97, dtype=np.uint32), (1 << 18) // 97 + 1)[:1 << 18]
    data = ((high << 8) | rng.integers(0, 256, 1 << 18, dtype=np.uint32)).astype("<u4").tobytes()
    hint = ChunkHint("F32", 4, 0, (512, 512))
    got = encode_chunk(data, hint)
    assert got.codec == "bytegroup"
    assert got.payload == encode_chunk(data, hint, exhaustive=True).payload
    assert decode_chunk(got.payload, len(data)) == data


def test_a_bf16_chunk_of_one_repeated_block_is_still_zstd_coded():
    block = _bf16_weights(2048)
    data = block * ((1 << 20) // len(block))
    got = encode_chunk(data, ChunkHint("BF16", 2, 0, (1024, 512)))
    assert got.codec == "zstd"
    assert decode_chunk(got.payload, len(data)) == data
    assert len(got.payload) == len(encode_chunk(data, ChunkHint("BF16", 2, 0, (1024, 512)), exhaustive=True).payload)


def test_row_classes_of_rows_too_short_to_pay_are_left_to_the_exhaustive_search():
    # the last axis of a 3x3x3 convolution kernel: rows of 3 elements
    data = _bf16_weights(1 << 18)
    hint = ChunkHint("BF16", 2, 0, (256, 256, 4, 3))
    fast, full = encode_chunk(data, hint), encode_chunk(data, hint, exhaustive=True)
    assert len(fast.payload) <= len(full.payload) * 1.0005
    assert decode_chunk(fast.payload, len(data)) == data
