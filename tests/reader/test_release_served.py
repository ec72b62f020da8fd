"""The reader keeps a decoded chunk only while some of it is still to be served, whatever order its
bytes are asked for in, and reads ahead no further than a stream has read (reader layer, no mount)."""
from __future__ import annotations

import hashlib
import random
from pathlib import Path

import pytest

from lmzfs.reader import Archive
from lmzfs.reader.readahead import MAX_WINDOW, MIN_WINDOW, Prefetcher
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths

CHUNK = 1 << 20
PAGE = 4096


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[Path, bytes]:
    root = tmp_path_factory.mktemp("release")
    (root / "src").mkdir()
    data = random.Random(7).randbytes(8 * CHUNK)
    (root / "src" / "blob.bin").write_bytes(data)
    add_model(StorePaths(root / "store"), root / "src", "m")
    return root / "store", data


def test_a_chunk_served_in_full_by_scattered_page_reads_in_any_order_leaves_the_cache(store):
    # an mmap'd loader touches pages in no order: once every page of a chunk was served the
    # kernel holds them all, and the chunk's cache room goes to chunks still being read
    path, data = store
    archive = Archive(path, cache_bytes=32 << 20, workers=1)
    second = hashlib.sha256(data[CHUNK:2 * CHUNK]).digest()      # a chunk's id is its SHA-256
    try:
        with archive.open(archive.entry("m", "blob.bin")) as reader:
            pages = list(range(CHUNK // PAGE, 2 * CHUNK // PAGE))     # the second chunk's pages
            random.Random(1).shuffle(pages)
            far = 6 * CHUNK // PAGE         # pages of a chunk far away in between: no stream at all
            for i, p in enumerate(pages[:-1]):
                for q in (p, far + i % 8):
                    assert reader.pread(q * PAGE, PAGE) == data[q * PAGE:(q + 1) * PAGE]
            archive.source.wait_settled()
            assert second in archive.source.cache                     # one page still to serve: kept
            p = pages[-1]
            assert reader.pread(p * PAGE, PAGE) == data[p * PAGE:(p + 1) * PAGE]
            archive.source.wait_settled()
            assert second not in archive.source.cache
            assert archive.counters.snapshot()["chunks_released"] >= 1
    finally:
        archive.close()


def test_overlapping_and_repeated_reads_do_not_count_twice_towards_a_chunk_being_served(store):
    path, data = store
    archive = Archive(path, cache_bytes=32 << 20, workers=1)
    first = hashlib.sha256(data[:CHUNK]).digest()
    try:
        with archive.open(archive.entry("m", "blob.bin")) as reader:
            for off, n in ((0, 600 << 10), (0, 600 << 10), (300 << 10, 400 << 10)):
                assert reader.pread(off, n) == data[off:off + n]
            archive.source.wait_settled()
            assert first in archive.source.cache                      # 700 KiB of 1 MiB served
            assert reader.pread(700 << 10, CHUNK) == data[700 << 10:(700 << 10) + CHUNK]
            archive.source.wait_settled()
            assert first not in archive.source.cache
    finally:
        archive.close()


def test_the_read_ahead_window_never_exceeds_what_the_stream_has_read():
    p = Prefetcher(1, 1 << 30)
    try:
        s = p.register(1)
        mib = 1 << 20
        spans = [p.note_read(s, k * mib, (k + 1) * mib) for k in range(40)]
        for k, span in enumerate(spans):
            if span is not None:
                read = (k + 1) * mib
                assert span[1] - (k + 1) * mib <= max(MIN_WINDOW, read)
        assert spans[-1][1] - 40 * mib == MAX_WINDOW      # a long stream still reaches the full window
    finally:
        p.close()
