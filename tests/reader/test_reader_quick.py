"""pread_nowait(): what is cached, or one chunk that its codec says is cheap to decode, served by the
caller without a thread (no mount)."""
from __future__ import annotations

import random
import threading

import pytest

from lmzfs.errors import CorruptChunk
from lmzfs.reader import Archive
from lmzfs.codecs.base import THREAD_HOP_BYTES as QUICK_BYTES
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model

SMALL = 64 << 10


@pytest.fixture(scope="module")
def quick_store(tmp_path_factory) -> tuple[StorePaths, dict[str, bytes]]:
    """`add --fast --chunk-size 64K` of random bytes (raw chunks) and of text (zstd chunks)."""
    root = tmp_path_factory.mktemp("quick")
    src = root / "src"
    src.mkdir()
    rng = random.Random(7)
    originals = {"noise.bin": rng.randbytes(5 * SMALL),
                 "words.txt": " ".join(rng.choice(("alpha", "beta", "gamma", "delta")) for _ in range(80_000)).encode()}
    for name, data in originals.items():
        (src / name).write_bytes(data)
    store = StorePaths(root / "store")
    add_model(store, src, "q", fast=True, chunk_size=SMALL)
    return store, originals


@pytest.fixture
def archive(quick_store):
    """The quick store opened with no read-ahead, closed after the test."""
    a = Archive(quick_store[0].root, workers=0)
    yield a
    a.close()


def _codecs(archive: Archive, name: str) -> set[str]:
    with archive.open(archive.entry("q", name)) as r:
        return {e.codec for e in r.extents}


def test_one_missing_cheap_chunk_is_decoded_by_the_caller_and_then_cached(quick_store, archive):
    _, originals = quick_store
    assert _codecs(archive, "noise.bin") == {"raw"} and "zstd" in _codecs(archive, "words.txt")
    for name in originals:
        with archive.open(archive.entry("q", name)) as r:
            off = SMALL + 1000
            before = archive.counters.chunks_decoded
            assert r.pread_nowait(off, 4096) == originals[name][off:off + 4096]
            assert archive.counters.chunks_decoded == before + 1
            assert r.pread_nowait(off + 8192, 4096) == originals[name][off + 8192:off + 12288]
            assert archive.counters.chunks_decoded == before + 1      # a hit


def test_a_read_over_two_missing_chunks_decodes_nothing_and_goes_to_a_thread(quick_store, archive):
    _, originals = quick_store
    with archive.open(archive.entry("q", "noise.bin")) as r:
        assert r.pread_nowait(2 * SMALL - 100, 200) is None
        assert archive.counters.chunks_decoded == 0
        assert r.pread(2 * SMALL - 100, 100) == originals["noise.bin"][2 * SMALL - 100:2 * SMALL]
        # one of the two is cached now: the other is decoded here
        assert r.pread_nowait(2 * SMALL - 100, 200) == \
            originals["noise.bin"][2 * SMALL - 100:2 * SMALL + 100]
        assert archive.counters.chunks_decoded == 2


def test_a_chunk_another_thread_decodes_is_not_decoded_again_here(quick_store, archive):
    _, originals = quick_store
    loading, release = threading.Event(), threading.Event()

    def slow_decode() -> bytes:
        loading.set()
        release.wait(10)
        return originals["noise.bin"][:SMALL]

    with archive.open(archive.entry("q", "noise.bin")) as r:
        e = r.extents[0]
        other = threading.Thread(target=archive.source.cache.get, args=(e.chunk_id, slow_decode))
        other.start()
        try:
            assert loading.wait(10)
            assert r.pread_nowait(0, 4096) is None          # never waits for the other thread
            assert archive.counters.chunks_decoded == 0
        finally:
            release.set()
            other.join()
        assert r.pread_nowait(0, 4096) == originals["noise.bin"][:4096]
        assert archive.counters.chunks_decoded == 0


def test_entropy_coded_and_large_chunks_are_left_to_a_thread(tmp_path):
    src = small_model(tmp_path / "m", seed=3)              # FP32 weights: floatsplit chunks
    (src / "noise.bin").write_bytes(random.Random(3).randbytes(2 * QUICK_BYTES + 1))
    for chunk_size, name, codec in ((None, "noise.bin", "raw"), (QUICK_BYTES, "model.safetensors", "floatsplit")):
        store = StorePaths(tmp_path / f"store-{chunk_size}")
        add_model(store, src, "m", chunk_size=chunk_size)
        archive = Archive(store.root, workers=0)
        try:
            with archive.open(archive.entry("m", name)) as r:
                tested = [e for e in r.extents if e.codec == codec and e.size >= QUICK_BYTES]
                assert tested and all(e.size > QUICK_BYTES for e in tested) == (codec == "raw")
                for e in tested:
                    assert r.pread_nowait(e.offset, 4096) is None
            assert archive.counters.chunks_decoded == 0
        finally:
            archive.close()


def test_a_damaged_quick_chunk_is_corrupt_chunk_naming_the_file_never_wrong_bytes(tmp_path, quick_store):
    _, originals = quick_store
    src = tmp_path / "src"
    src.mkdir()
    (src / "noise.bin").write_bytes(originals["noise.bin"])
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "q", fast=True, chunk_size=SMALL)
    bad = flip_byte_in_chunk_of(store, "q", "noise.bin")
    archive = Archive(store.root, workers=0)
    try:
        with archive.open(archive.entry("q", "noise.bin")) as r:
            with pytest.raises(CorruptChunk, match="q/noise.bin at offset"):
                r.pread_nowait(bad, 16)
            good = (bad // SMALL + 2) % 5 * SMALL
            assert r.pread_nowait(good, 16) == originals["noise.bin"][good:good + 16]
    finally:
        archive.close()


def test_a_read_spanning_several_chunks_is_one_bytes_object_equal_to_the_original(quick_store, archive):
    # pieces are cut as views and joined once: what comes back must still be plain bytes, never
    # a view into a cached chunk, and exactly the original across every boundary
    _, originals = quick_store
    data = originals["noise.bin"]
    with archive.open(archive.entry("q", "noise.bin")) as r:
        for off, length in [(SMALL - 7, 2 * SMALL + 14), (0, len(data)), (3 * SMALL - 1, 2), (SMALL, SMALL)]:
            got = r.pread(off, length)
            assert type(got) is bytes and got == data[off:off + length]
            cached = r.pread_nowait(off, length)
            assert type(cached) is bytes and cached == data[off:off + length]
