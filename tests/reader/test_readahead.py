"""Read-ahead and the decoded-chunk cache, at the reader layer (no mount)."""
from __future__ import annotations

import hashlib
import random
import threading
from pathlib import Path

import pytest

from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths

CHUNK = 1 << 20


@pytest.fixture(scope="module")
def eight_files(tmp_path_factory) -> tuple[Path, dict[str, bytes]]:
    """A store with one model of eight distinct 6 MiB files (48 MiB, far larger than the caches used here)."""
    root = tmp_path_factory.mktemp("ra")
    src = root / "src"
    src.mkdir()
    rng = random.Random(1)
    originals = {}
    for i in range(8):
        data = rng.randbytes(6 * CHUNK)
        (src / f"f{i}.bin").write_bytes(data)
        originals[f"f{i}.bin"] = data
    add_model(StorePaths(root / "store"), src, "big")
    return root / "store", originals


def test_a_sequential_reader_is_served_by_read_ahead(eight_files):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=32 << 20, workers=2)
    try:
        entry = archive.entry("big", "f0.bin")
        with archive.open(entry) as reader:
            got = bytearray()
            for off in range(0, entry.size, 128 << 10):
                data = reader.pread_nowait(off, 128 << 10)
                if data is None:
                    data = reader.pread(off, 128 << 10)
                got += data
            assert bytes(got) == originals["f0.bin"]
        stats = archive.counters.snapshot()
        assert stats["readahead_chunks"] > 0 and stats["readahead_hits"] > 0
        assert stats["chunks_decoded"] == 6        # each chunk decoded once, by a reader or ahead of it
    finally:
        archive.close()


def test_a_sequential_reader_leaves_none_of_the_chunks_it_read_in_the_cache(eight_files):
    # the kernel's page cache holds what was served; a second copy here only costs memory. With
    # 128 KiB reads each chunk is read eight times: releasing one before its last read would
    # decode it again.
    store, originals = eight_files
    archive = Archive(store, cache_bytes=32 << 20, workers=2)
    try:
        entry = archive.entry("big", "f2.bin")
        for rnd in (1, 2):
            with archive.open(entry) as reader:
                got = bytearray()
                for off in range(0, entry.size, 128 << 10):
                    data = reader.pread_nowait(off, 128 << 10)
                    got += data if data is not None else reader.pread(off, 128 << 10)
                assert bytes(got) == originals["f2.bin"]
            stats = archive.counters.snapshot()
            assert stats["chunks_released"] == 6 * rnd
            assert stats["chunks_decoded"] == 6 * rnd      # read again, released chunks are decoded again
            assert archive.source.cache.size_bytes == 0
    finally:
        archive.close()


def test_a_chunk_is_released_only_once_every_part_of_it_was_served_whatever_the_order(eight_files):
    # the kernel answers a stream's requests out of order when one waits for a decode and the next
    # is served from read-ahead: the read that ends at a chunk's end may come before its middle
    store, originals = eight_files
    archive = Archive(store, cache_bytes=32 << 20, workers=2)
    data = originals["f4.bin"]
    first_chunk = hashlib.sha256(data[:CHUNK]).digest()      # a chunk's id is its SHA-256
    k = 256 << 10
    try:
        with archive.open(archive.entry("big", "f4.bin")) as reader:
            for off in (0, k, 3 * k):                      # a stream, with the third quarter missing
                assert reader.pread(off, k) == data[off:off + k]
            assert first_chunk in archive.source.cache
            assert reader.pread(2 * k, k) == data[2 * k:3 * k]
            assert first_chunk not in archive.source.cache
        assert archive.counters.snapshot()["chunks_released"] >= 1
    finally:
        archive.close()


def test_read_ahead_starts_only_after_two_sequential_reads_in_a_row():
    from lmzfs.reader.readahead import MIN_WINDOW, Prefetcher
    p = Prefetcher(1, 256 << 20)
    try:
        s = p.register(1)
        mib = 1 << 20
        assert p.note_read(s, 100 * mib, 101 * mib) is None       # a first read: nothing to follow
        assert p.note_read(s, 101 * mib, 102 * mib) is None       # one in a row: could be chance
        assert p.note_read(s, 102 * mib, 103 * mib) == (103 * mib, 103 * mib + MIN_WINDOW)
        assert p.note_read(s, 7 * mib, 8 * mib) is None           # a jump resets the stream
        assert p.note_read(s, 8 * mib, 9 * mib) is None
    finally:
        p.close()


def test_a_free_decode_thread_takes_the_oldest_chunk_at_hand_and_one_still_on_the_wire_last():
    from lmzfs.reader.readahead import Prefetcher
    p = Prefetcher(1, 256 << 20)
    order, started, go = [], threading.Event(), threading.Event()
    try:
        p.submit(lambda: (started.set(), go.wait(10)))          # holds the one decode thread
        assert started.wait(10)
        arrived = {"a": False, "b": True, "c": True, "d": None}
        for name, ready in arrived.items():
            p.submit(lambda name=name: order.append(name), None if ready is None else lambda r=ready: r)
        done = threading.Event()
        p.submit(lambda: done.set(), lambda: False)
        go.set()
        assert done.wait(10)
        # b and c (at hand) and d (always at hand: a local store's chunk) before a, whose bytes
        # are still on their way; then a and the last job, oldest first, once none is at hand
        assert order == ["b", "c", "d", "a"]
    finally:
        p.close()


def test_a_question_of_at_hand_that_raises_counts_as_not_at_hand_and_the_decode_thread_goes_on():
    from lmzfs.reader.readahead import Prefetcher
    p = Prefetcher(1, 256 << 20)
    ran, started, go, done = [], threading.Event(), threading.Event(), threading.Event()
    try:
        def broken() -> bool:
            raise OSError("a pack closed meanwhile")
        p.submit(lambda: (started.set(), go.wait(10)))          # holds the one decode thread
        assert started.wait(10)
        p.submit(lambda: ran.append("asked"), broken)
        p.submit(lambda: ran.append("next"))
        p.submit(lambda: done.set(), lambda: False)
        go.set()
        assert done.wait(10)
        assert ran == ["next", "asked"]
    finally:
        p.close()


def test_random_reads_do_not_read_ahead_and_keep_the_chunks_they_decoded(eight_files):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=32 << 20, workers=2)
    rng = random.Random(3)
    try:
        entry = archive.entry("big", "f1.bin")
        with archive.open(entry) as reader:
            for _ in range(200):
                off = rng.randrange(0, entry.size - 4096)
                off -= off % 4096
                assert reader.pread(off, 4096) == originals["f1.bin"][off:off + 4096]
        # Two reads that happen to land within the slack may look sequential; nothing more.
        archive.source.wait_settled()
        stats = archive.counters.snapshot()
        assert stats["readahead_chunks"] <= 4
        assert stats["chunks_released"] == 0
        assert archive.source.cache.size_bytes == stats["chunks_decoded"] * CHUNK
    finally:
        archive.close()


def test_read_ahead_never_returns_bytes_of_the_wrong_chunk(eight_files):
    """Eight threads interleave sequential runs and random jumps over different files, through a
    cache smaller than one file so that prefetched chunks are evicted while in use."""
    store, originals = eight_files
    archive = Archive(store, cache_bytes=4 << 20, workers=2)
    errors: list[str] = []

    def reader(i: int) -> None:
        rng = random.Random(i)
        name = f"f{i}.bin"
        data = originals[name]
        with archive.open(archive.entry("big", name)) as r:
            off = 0
            for _ in range(300):
                if rng.random() < 0.1:
                    off = rng.randrange(0, len(data))
                n = rng.choice([4096, 128 << 10, 300_000])
                got = r.pread_nowait(off, n)
                if got is None:
                    got = r.pread(off, n)
                if got != data[off:off + n]:
                    errors.append(f"{name} at {off}+{n}")
                off = (off + n) % len(data)

    threads = [threading.Thread(target=reader, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == []
        assert archive.counters.snapshot()["readahead_chunks"] > 0
    finally:
        archive.close()


def test_the_cache_budget_holds_at_every_instant_while_8_readers_stream_a_model_larger_than_it(eight_files):
    store, originals = eight_files
    budget = 6 << 20
    archive = Archive(store, cache_bytes=budget, workers=2)
    failures = []

    def stream(name: str) -> None:
        with archive.open(archive.entry("big", name)) as r:
            out = bytearray()
            for off in range(0, r.size, 128 << 10):
                out += r.pread(off, 128 << 10)
            if bytes(out) != originals[name]:
                failures.append(name)

    readers = [threading.Thread(target=stream, args=(f"f{i}.bin",)) for i in range(8)]
    try:
        for t in readers:
            t.start()
        for t in readers:
            t.join()
        peak = archive.source.cache.peak_bytes      # the cache's own high-water mark, not a sample
    finally:
        archive.close()
    assert failures == []
    assert 0 < peak <= budget


def test_closing_a_reader_while_it_reads_ahead_releases_every_pack(eight_files):
    store, _ = eight_files
    archive = Archive(store, cache_bytes=32 << 20, workers=2)
    try:
        for _ in range(20):
            with archive.open(archive.entry("big", "f2.bin")) as r:
                for off in range(0, 4 * (128 << 10), 128 << 10):
                    r.pread(off, 128 << 10)
        assert archive.source.open_packs() == 0
    finally:
        archive.close()


def test_a_cache_of_zero_bytes_still_serves_exact_bytes(eight_files):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=0, workers=2)
    try:
        with archive.open(archive.entry("big", "f3.bin")) as r:
            assert r.pread(0, r.size) == originals["f3.bin"]
            assert r.pread_nowait(0, 10) is None        # raw 1 MiB chunks: not cheap, not cached
        assert archive.source.cache.size_bytes == 0
    finally:
        archive.close()
