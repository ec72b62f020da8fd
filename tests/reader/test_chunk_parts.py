"""Float chunks coded in segments by default, and a random read's miss decoding one segment with
the chunk's tables built once, kept in the cache's budget."""
from __future__ import annotations

import pytest

from lmzfs.cli import main
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.synthetic import small_model

SEGMENT = 256 << 10


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return small_model(tmp_path_factory.mktemp("parts") / "src", seed=7)


def _codecs(store: StorePaths) -> dict[str, int]:
    archive = Archive(store.root, workers=0)
    try:
        with archive.open(archive.entry("m", "model.safetensors")) as r:
            out: dict[str, int] = {}
            for e in r.extents:
                out[e.codec] = out.get(e.codec, 0) + e.size
            return out
    finally:
        archive.close()


def test_a_default_add_codes_float_chunks_over_256k_in_segments_and_no_segments_codes_them_whole(model, tmp_path):
    default, whole = StorePaths(tmp_path / "default"), StorePaths(tmp_path / "whole")
    assert main(["--store", str(default.root), "add", str(model), "--name", "m"]) == 0
    assert main(["--store", str(whole.root), "add", str(model), "--name", "m", "--no-segments"]) == 0
    seg, one = _codecs(default), _codecs(whole)
    assert seg.get("floatseg", 0) >= 2 << 20 and "floatseg" not in one
    assert one.get("floatsplit", 0) == seg.get("floatseg", 0) + seg.get("floatsplit", 0)
    plain = (model / "model.safetensors").read_bytes()
    for store in (default, whole):
        archive = Archive(store.root, workers=0)
        try:
            with archive.open(archive.entry("m", "model.safetensors")) as r:
                assert r.pread(0, len(plain)) == plain
        finally:
            archive.close()


@pytest.fixture(scope="module")
def segmented(model, tmp_path_factory):
    store = StorePaths(tmp_path_factory.mktemp("segmented") / "store")
    add_model(store, model, "m", chunk_size=1 << 20)
    return store, (model / "model.safetensors").read_bytes()


def test_random_reads_into_one_chunk_build_its_part_decoder_once_and_decode_one_segment_each(segmented):
    store, plain = segmented
    archive = Archive(store.root, workers=0)
    try:
        with archive.open(archive.entry("m", "model.safetensors")) as r:
            big = next(e for e in r.extents if e.codec == "floatseg" and e.size >= 4 * SEGMENT)
            # lone reads (far apart), each in another segment of the same chunk
            for k in (2, 0, 3):
                off = big.offset + k * SEGMENT + 1000
                assert r.pread(off, 4096) == plain[off:off + 4096]
            c = archive.counters
            assert (c.part_decoders_built, c.segments_decoded, c.chunks_decoded) == (1, 3, 0)
            off = big.offset + 2 * SEGMENT + 9000            # a segment decoded before: a hit
            assert r.pread(off, 4096) == plain[off:off + 4096]
            assert (c.part_decoders_built, c.segments_decoded) == (1, 3)
    finally:
        archive.close()


def test_part_decoders_count_in_the_cache_budget_and_reads_stay_exact_when_they_are_evicted(segmented):
    store, plain = segmented
    budget = SEGMENT + (SEGMENT >> 1)         # a segment, or a chunk's tables, not both for long
    archive = Archive(store.root, cache_bytes=budget, workers=0)
    try:
        with archive.open(archive.entry("m", "model.safetensors")) as r:
            chunks = [e for e in r.extents if e.codec == "floatseg" and e.size >= 4 * SEGMENT]
            assert len(chunks) >= 2
            for rnd in range(2):
                for e in chunks:
                    for k in (3, 1):
                        off = e.offset + k * SEGMENT + 123
                        assert r.pread(off, 4096) == plain[off:off + 4096]
            cache = archive.source.cache
            assert 0 < cache.peak_bytes <= budget
            # each decoded segment evicts the decoder it was made with: every read builds one
            assert archive.counters.part_decoders_built == 2 * 2 * len(chunks)
    finally:
        archive.close()
