"""Read-ahead and the decoded-chunk cache, at the reader layer (no mount)."""
from __future__ import annotations

import hashlib
import random
import threading
import time
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
                data = reader.pread_cached(off, 128 << 10)
                if data is None:
                    data = reader.pread(off, 128 << 10)
                got += data
            assert bytes(got) == originals["f0.bin"]
        stats = archive.stats.snapshot()
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
                    data = reader.pread_cached(off, 128 << 10)
                    got += data if data is not None else reader.pread(off, 128 << 10)
                assert bytes(got) == originals["f2.bin"]
            stats = archive.stats.snapshot()
            assert stats["chunks_released"] == 6 * rnd
            assert stats["chunks_decoded"] == 6 * rnd      # read again, released chunks are decoded again
            assert archive.cache.size_bytes == 0
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
            assert first_chunk in archive.cache
            assert reader.pread(2 * k, k) == data[2 * k:3 * k]
            assert first_chunk not in archive.cache
        assert archive.stats.snapshot()["chunks_released"] >= 1
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
        archive.wait_settled()
        stats = archive.stats.snapshot()
        assert stats["readahead_chunks"] <= 4
        assert stats["chunks_released"] == 0
        assert archive.cache.size_bytes == stats["chunks_decoded"] * CHUNK
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
                got = r.pread_cached(off, n)
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
        assert archive.stats.snapshot()["readahead_chunks"] > 0
    finally:
        archive.close()


def test_the_cache_budget_holds_while_8_readers_stream_a_model_larger_than_it(eight_files):
    store, originals = eight_files
    budget = 6 << 20
    archive = Archive(store, cache_bytes=budget, workers=2)
    peak = 0
    done = threading.Event()

    def watch() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, archive.cache.size_bytes)
            time.sleep(0.0005)

    def stream(name: str) -> None:
        with archive.open(archive.entry("big", name)) as r:
            out = bytearray()
            for off in range(0, r.size, 128 << 10):
                out += r.pread(off, 128 << 10)
            assert bytes(out) == originals[name]

    watcher = threading.Thread(target=watch)
    watcher.start()
    readers = [threading.Thread(target=stream, args=(f"f{i}.bin",)) for i in range(8)]
    try:
        for t in readers:
            t.start()
        for t in readers:
            t.join()
    finally:
        done.set()
        watcher.join()
        archive.close()
    assert 0 < peak <= budget


def test_closing_a_reader_while_it_reads_ahead_releases_every_pack(eight_files):
    store, _ = eight_files
    archive = Archive(store, cache_bytes=32 << 20, workers=2)
    try:
        for _ in range(20):
            with archive.open(archive.entry("big", "f2.bin")) as r:
                for off in range(0, 4 * (128 << 10), 128 << 10):
                    r.pread(off, 128 << 10)
        assert archive.packs._holders == {} and archive.packs._fds == {}
    finally:
        archive.close()


def test_a_cache_of_zero_bytes_still_serves_exact_bytes(eight_files):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=0, workers=2)
    try:
        with archive.open(archive.entry("big", "f3.bin")) as r:
            assert r.pread(0, r.size) == originals["f3.bin"]
            assert r.pread_cached(0, 10) is None
        assert archive.cache.size_bytes == 0
    finally:
        archive.close()


def test_the_process_decoder_serves_exact_bytes_and_reports_damage(eight_files, tmp_path):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=8 << 20, workers=2, decoder="process")
    try:
        assert len(archive.decoder._all) == 2
        for name in ("f4.bin", "f5.bin"):
            with archive.open(archive.entry("big", name)) as r:
                assert r.pread(0, r.size) == originals[name]
                assert r.pread(3 * CHUNK - 5, 10) == originals[name][3 * CHUNK - 5:3 * CHUNK + 5]
    finally:
        archive.close()


@pytest.mark.allow_log_warnings
def test_a_killed_decode_worker_is_replaced_and_the_read_still_succeeds(eight_files):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=0, workers=1, decoder="process")
    try:
        archive.decoder._all[0].process.kill()
        archive.decoder._all[0].process.wait()
        with archive.open(archive.entry("big", "f6.bin")) as r:
            assert r.pread(0, r.size) == originals["f6.bin"]
    finally:
        archive.close()


def test_the_process_decoder_turns_a_flipped_byte_into_corrupt_chunk(tmp_path):
    from lmzfs.errors import CorruptChunk
    from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model
    store = StorePaths(tmp_path / "store")
    src = small_model(tmp_path / "a", seed=21)
    add_model(store, src, "a")
    bad = flip_byte_in_chunk_of(store, "a", "model.safetensors")
    archive = Archive(store.root, cache_bytes=0, workers=1, decoder="process")
    try:
        with archive.open(archive.entry("a", "model.safetensors")) as r:
            with pytest.raises(CorruptChunk):
                r.pread(bad, 100)
            assert r.pread(0, 100) == (src / "model.safetensors").read_bytes()[:100]
    finally:
        archive.close()


# -- decode workers that do not start ------------------------------------------------------------

def test_a_decode_worker_that_exits_while_starting_fails_the_decoder_with_its_status(monkeypatch):
    from lmzfs.reader import decodepool
    monkeypatch.setattr(decodepool, "_WORKER_START", "import sys; sys.exit(3)")
    with pytest.raises(decodepool.WorkerStartError, match=r"lmz-decode-\d exited with status 3 while starting"):
        decodepool.ProcessDecoder(2)


def test_a_decode_worker_that_stays_silent_is_killed_after_the_start_timeout(monkeypatch):
    from lmzfs.reader import decodepool
    monkeypatch.setattr(decodepool, "_WORKER_START", "import time; time.sleep(60)")
    monkeypatch.setattr(decodepool, "START_SECONDS", 0.5)
    t0 = time.monotonic()
    with pytest.raises(decodepool.WorkerStartError, match="did not start within 0.5 s"):
        decodepool.ProcessDecoder(1)
    assert time.monotonic() - t0 < 10


def test_started_decode_workers_have_all_said_ready_before_work_is_given(eight_files):
    store, originals = eight_files
    archive = Archive(store, cache_bytes=0, workers=2, decoder="process")
    try:
        workers = archive.decoder._all
        assert len(workers) == 2 and all(w.process.poll() is None for w in workers)
        assert all(not w.conn.poll(0) for w in workers)       # the ready message was consumed
        with archive.open(archive.entry("big", "f3.bin")) as r:
            assert r.pread(0, r.size) == originals["f3.bin"]
    finally:
        archive.close()


def test_a_mount_whose_decode_worker_cannot_start_fails_with_that_reason_and_mounts_nothing(
        eight_files, tmp_path, monkeypatch, capsys):
    import os
    from lmzfs.daemon.mount import serve
    from lmzfs.reader import decodepool
    store, _ = eight_files
    monkeypatch.setattr(decodepool, "_WORKER_START", "import sys; sys.exit(3)")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    r, w = os.pipe()
    status = serve(mnt, store, decoder="process", workers=1, ready_fd=w)
    with os.fdopen(r) as f:
        line = f.read()
    assert status == 1
    assert line.startswith("error 1 decode worker lmz-decode-0 exited with status 3"), line
    assert "decode worker lmz-decode-0 exited with status 3" in capsys.readouterr().err
    assert not os.path.ismount(mnt)


def test_the_process_decoder_starts_two_workers_per_usable_cpu_unless_told(eight_files):
    from lmzfs.hostresources import usable_cpus
    from lmzfs.reader.decodepool import WORKERS_PER_CPU
    store, originals = eight_files
    archive = Archive(store, cache_bytes=0, decoder="process")
    try:
        assert WORKERS_PER_CPU == 2 and len(archive.decoder._all) == 2 * usable_cpus()
        with archive.open(archive.entry("big", "f2.bin")) as r:
            assert r.pread(0, r.size) == originals["f2.bin"]
    finally:
        archive.close()
    threaded = Archive(store, cache_bytes=0)
    try:
        assert threaded.decoder is None and threaded.prefetcher._pool._max_workers == usable_cpus()
    finally:
        threaded.close()
