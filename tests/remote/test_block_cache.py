"""The host's disk cache of fetched blocks, on its own (no engine): one file per object, blocks at
their offsets, bounded by bytes with holes punched for what is evicted, checked on every read."""
from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lmzfs.store.remote.blockcache import (BLOCK_BYTES, BlockCache, ObjectLayout, cached_blocks,
                                           disk_bytes, read_object_file)

KEY = "packs/000001-0123456789abcdef.lmzp"
SIZE = 5 * BLOCK_BYTES + 1000               # six blocks, the last 1000 bytes


def block(i: int, size: int = SIZE, salt: int = 0) -> bytes:
    n = ObjectLayout.of(size).block_len(i)
    return bytes([(i * 37 + 11 + salt * 53) % 251]) * n


def test_a_block_put_is_read_back_byte_for_byte_in_this_process_and_the_next(tmp_path):
    cache = BlockCache(tmp_path, 1 << 30)
    for i in (0, 2, 5):
        cache.put(KEY, SIZE, i, block(i))
    assert [cache.get(KEY, SIZE, i) for i in (0, 2, 5)] == [block(0), block(2), block(5)]
    assert cache.get(KEY, SIZE, 1) is None
    cache.close()
    again = BlockCache(tmp_path, 1 << 30)
    try:
        assert [again.get(KEY, SIZE, i) for i in range(6)] == [block(0), None, block(2), None, None, block(5)]
        assert (again.stats.hits, again.stats.misses, again.stats.damaged) == (3, 3, 0)
        assert [(b.block, b.length) for b in cached_blocks(tmp_path)] == [(0, BLOCK_BYTES), (2, BLOCK_BYTES), (5, 1000)]
        assert len(list((tmp_path / "objects").rglob("*.*"))) == 0          # one file per object, nothing beside it
    finally:
        again.close()


def test_blocks_are_kept_in_one_file_per_object_at_their_offsets_after_a_header_and_table(tmp_path):
    cache = BlockCache(tmp_path, 1 << 30)
    try:
        cache.put(KEY, SIZE, 3, block(3))
        (path,) = [p for p in (tmp_path / "objects").rglob("*") if p.is_file()]
        layout = ObjectLayout.of(SIZE)
        assert layout.data_offset == 4096
        with open(path, "rb") as f:
            f.seek(layout.block_at(3))
            assert f.read(BLOCK_BYTES) == block(3)
        found = read_object_file(path)
        assert found.layout == layout and [s.block for s in found.present] == [3]
    finally:
        cache.close()


def test_the_least_recently_used_blocks_go_first_and_their_space_is_freed_on_disk(tmp_path):
    cap = 3 * BLOCK_BYTES + 8192
    cache = BlockCache(tmp_path, cap)
    try:
        for i in range(3):
            cache.put(KEY, SIZE, i, block(i))
        assert cache.get(KEY, SIZE, 0) == block(0)          # block 0 used again: block 1 is the oldest now
        cache.put(KEY, SIZE, 3, block(3))
        assert [cache.contains(KEY, i) for i in range(4)] == [True, False, True, True]
        assert cache.stats.evicted == 1
        assert cache.size_bytes <= cap
        assert disk_bytes(tmp_path) <= cap                  # the evicted block is a hole, not just forgotten
        assert cache.get(KEY, SIZE, 1) is None and cache.stats.damaged == 0
    finally:
        cache.close()


def test_after_a_restart_the_earliest_written_blocks_are_the_first_to_go(tmp_path):
    cache = BlockCache(tmp_path, 1 << 30)
    for i in (4, 1, 3, 0):
        cache.put(KEY, SIZE, i, block(i))
    cache.close()
    smaller = BlockCache(tmp_path, 2 * BLOCK_BYTES + 8192)
    try:
        assert [i for i in range(6) if smaller.contains(KEY, i)] == [0, 3]
        assert [smaller.get(KEY, SIZE, i) for i in (0, 3)] == [block(0), block(3)]
    finally:
        smaller.close()


def test_an_object_whose_last_block_is_evicted_leaves_no_file(tmp_path):
    other = "packs/000002-fedcba9876543210.lmzp"
    cache = BlockCache(tmp_path, 2 * BLOCK_BYTES + 8192)
    try:
        cache.put(other, SIZE, 0, block(0))
        cache.put(KEY, SIZE, 0, block(0))
        cache.put(KEY, SIZE, 1, block(1))
        assert not cache.contains(other, 0)
        assert len(cached_blocks(tmp_path)) == 2
        assert len([p for p in (tmp_path / "objects").rglob("*") if p.is_file()]) == 1
    finally:
        cache.close()


def test_a_cache_file_of_another_version_or_with_a_damaged_header_is_removed_at_start_and_nothing_of_it_served(tmp_path):
    cache = BlockCache(tmp_path, 1 << 30)
    cache.put(KEY, SIZE, 0, block(0))
    cache.put("packs/other.lmzp", SIZE, 0, block(0))
    cache.close()
    first, second = sorted(p for p in (tmp_path / "objects").rglob("*") if p.is_file())
    with open(first, "r+b") as f:
        f.seek(8)
        f.write((2).to_bytes(4, "little"))          # a version this build does not know
    with open(second, "r+b") as f:
        f.seek(16)
        f.write(b"\xff")                            # the object's size, damaged
    again = BlockCache(tmp_path, 1 << 30)
    try:
        assert not again.contains(KEY, 0) and not again.contains("packs/other.lmzp", 0)
        assert not first.exists() and not second.exists()
        assert again.size_bytes == 0
    finally:
        again.close()


def test_a_cache_of_the_earlier_one_file_per_block_layout_is_dropped_at_start_with_one_line(tmp_path, caplog):
    old = tmp_path / "blocks" / "ab"
    old.mkdir(parents=True)
    (old / "ab0123-00000000").write_bytes(b"LMZBLK1\0" + bytes(100))
    with caplog.at_level("INFO", logger="lmzfs.store.remote.blockcache"):
        cache = BlockCache(tmp_path, 1 << 30)
    try:
        assert [r.getMessage() for r in caplog.records] == [
            f"{tmp_path}: dropping the cache of an earlier release (one file per block)"]
        assert not (tmp_path / "blocks").exists()
        assert len(cache) == 0
    finally:
        cache.close()


def test_a_second_process_cannot_own_the_same_cache_directory(tmp_path):
    cache = BlockCache(tmp_path, 1 << 30)
    try:
        code = ("import sys; from lmzfs.store.remote.blockcache import BlockCache, CacheBusy\n"
                "try:\n    BlockCache(sys.argv[1], 1 << 20)\nexcept CacheBusy as e:\n    print(e)\n")
        out = subprocess.run([os.sys.executable, "-c", code, str(tmp_path)], capture_output=True, text=True, check=True)
        assert "is in use by another lmz process" in out.stdout
    finally:
        cache.close()


def test_a_block_of_the_wrong_length_for_its_object_is_refused(tmp_path):
    cache = BlockCache(tmp_path, 1 << 30)
    try:
        with pytest.raises(ValueError, match="not one of an object"):
            cache.put(KEY, SIZE, 5, block(0))
        with pytest.raises(ValueError, match="not one of an object"):
            cache.put(KEY, SIZE, 6, b"x")
        assert len(cache) == 0
    finally:
        cache.close()


@pytest.fixture
def ramfs(tmp_path) -> Path:
    """A ramfs, whose files cannot have holes punched in them (fallocate answers EOPNOTSUPP)."""
    where = tmp_path / "ramfs"
    where.mkdir()
    if subprocess.run(["mount", "-t", "ramfs", "ramfs", str(where)], capture_output=True).returncode != 0:
        pytest.skip("cannot mount a ramfs here (needs root)")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def test_where_holes_cannot_be_punched_whole_objects_are_evicted_and_the_cap_still_holds(ramfs):
    cap = 3 * BLOCK_BYTES + 8192
    other = "packs/000002-fedcba9876543210.lmzp"
    cache = BlockCache(ramfs, cap)
    try:
        for i in range(3):
            cache.put(KEY, SIZE, i, block(i))
        cache.put(other, SIZE, 0, block(0))         # past the cap: KEY's oldest block goes, and with it KEY
        assert [cache.contains(KEY, i) for i in range(3)] == [False, False, False]
        assert cache.stats.evicted == 3
        assert cache.get(other, SIZE, 0) == block(0)
        assert cache.size_bytes <= cap
        assert sum(p.stat().st_size for p in (ramfs / "objects").rglob("*") if p.is_file()) <= cap
        cache.put(KEY, SIZE, 1, block(1))           # and it is cached again as a new object file
        assert cache.get(KEY, SIZE, 1) == block(1)
    finally:
        cache.close()


def test_an_object_file_is_laid_out_exactly_as_docs_format_md_writes_it_down(tmp_path):
    import hashlib
    import struct

    import xxhash
    cache = BlockCache(tmp_path, 1 << 30)
    try:
        cache.put(KEY, SIZE, 5, block(5))
    finally:
        cache.close()
    name = hashlib.sha256(KEY.encode()).hexdigest()[:32]
    raw = (tmp_path / "objects" / name[:2] / name).read_bytes()
    fields = b"LMZOBJC\0" + struct.pack("<IIQII", 1, 1 << 20, SIZE, 6, 4096) + bytes.fromhex(name)
    assert raw[:64] == fields + xxhash.xxh3_128_digest(fields)
    length, state, written, digest = struct.unpack_from("<IIQ16s", raw, 64 + 5 * 32)
    assert (length, state, digest) == (1000, 1, xxhash.xxh3_128_digest(block(5)))
    assert raw[64:64 + 5 * 32] == bytes(5 * 32)                 # blocks 0-4: absent
    assert raw[4096 + 5 * (1 << 20):] == block(5)
    assert len(raw) == 4096 + 5 * (1 << 20) + 1000


@pytest.fixture
def full_disk(tmp_path) -> Path:
    """A 3 MiB tmpfs: room for an object file's header and two 1 MiB blocks, and a bit."""
    from lmzfs.testing.smalldisk import CannotMount, small_disk
    try:
        with small_disk(tmp_path / "disk", "3m") as disk:
            yield disk
    except CannotMount as exc:
        pytest.skip(str(exc))


def test_on_a_full_disk_a_block_that_does_not_fit_is_counted_and_freed_and_the_others_read_back(full_disk):
    cache = BlockCache(full_disk / "cache", 1 << 30)
    try:
        for i in range(5):
            cache.put(KEY, SIZE, i, block(i))
        assert [i for i in range(5) if cache.contains(KEY, i)] == [0, 1] and cache.stats.write_errors == 3
        assert [cache.get(KEY, SIZE, i) for i in range(5)] == [block(0), block(1), None, None, None]
        assert cache.stats.damaged == 0
        assert disk_bytes(full_disk / "cache") == 4096 + 2 * BLOCK_BYTES     # what a block half written took is freed
    finally:
        cache.close()
    again = BlockCache(full_disk / "cache", 1 << 30)
    try:
        assert [again.get(KEY, SIZE, i) for i in range(3)] == [block(0), block(1), None]
    finally:
        again.close()


def test_threads_putting_reading_and_evicting_at_once_never_get_wrong_bytes_and_the_count_matches_the_files(tmp_path):
    import random
    import threading
    keys = [f"packs/{i:06d}-{i:016x}.lmzp" for i in range(4)]
    cap = 6 * BLOCK_BYTES + 4 * 8192
    cache = BlockCache(tmp_path, cap)
    wrong: list[tuple[str, int]] = []
    errors: list[BaseException] = []

    def worker(seed: int) -> None:
        rng = random.Random(seed)
        try:
            for _ in range(300):
                key, i = rng.choice(keys), rng.randrange(6)
                if rng.random() < 0.5:
                    cache.put(key, SIZE, i, block(i, salt=keys.index(key)))
                else:
                    got = cache.get(key, SIZE, i)
                    if got is not None and got != block(i, salt=keys.index(key)):
                        wrong.append((key, i))
        except BaseException as exc:            # noqa: BLE001 -- reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(seed,)) for seed in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert errors == [] and wrong == []
        assert cache.stats.evicted > 0 and cache.stats.damaged <= cache.stats.evicted
        assert cache.size_bytes <= cap
        held = cached_blocks(tmp_path)
        assert len(held) == len(cache)
        files = {b.path for b in held}
        assert cache.size_bytes == sum(b.length for b in held) + 4096 * len(files)
        for key in keys:
            for i in range(6):
                got = cache.get(key, SIZE, i)
                assert got is None or got == block(i, salt=keys.index(key))
    finally:
        cache.close()
