"""The store's chunk source under the read path: shared chunks, descriptors, the cache budget,
removal while reading, and damage confined to the range that touches it."""
from __future__ import annotations

import errno
import os
import shutil

import pytest

from lmzfs.errors import CorruptChunk
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.read.chunkcache import ChunkCache
from lmzfs.store.gc import collect_garbage
from lmzfs.store.layout import StorePaths
from lmzfs.store.remove import remove_models
from lmzfs.testing.mount import mounted
from lmzfs.testing.synthetic import flip_byte_in_chunk_of, small_model


@pytest.fixture
def two_models_one_file(tmp_path) -> tuple[StorePaths, bytes]:
    """Models "a" and "b" whose model.safetensors are the same bytes (so share every chunk)."""
    a = small_model(tmp_path / "a", seed=31)
    b = tmp_path / "b"
    b.mkdir()
    shutil.copy(a / "model.safetensors", b / "model.safetensors")
    store = StorePaths(tmp_path / "store")
    add_model(store, a, "a")
    add_model(store, b, "b")
    return store, (a / "model.safetensors").read_bytes()


def test_a_chunk_shared_by_two_models_is_decoded_once_through_one_set_of_descriptors(two_models_one_file):
    store, plain = two_models_one_file
    archive = Archive(store.root, workers=0)
    try:
        ra = archive.open(archive.entry("a", "model.safetensors"))
        rb = archive.open(archive.entry("b", "model.safetensors"))
        try:
            assert [e.chunk_id for e in ra.extents] == [e.chunk_id for e in rb.extents]
            packs = {e.location.pack for e in ra.extents}
            assert archive.source.open_packs() == len(packs)      # not one set per open file
            for off in range(0, len(plain), 300_000):
                assert ra.pread(off, 300_000) == plain[off:off + 300_000]
                assert rb.pread(off, 300_000) == plain[off:off + 300_000]
            assert archive.counters.chunks_decoded == len(ra.extents)
        finally:
            ra.close()
            rb.close()
        assert archive.source.open_packs() == 0
    finally:
        archive.close()


def test_the_cache_never_holds_more_than_its_budget_not_even_while_inserting():
    cache = ChunkCache(10)
    for i, n in enumerate([4, 4, 4, 9, 1, 10, 3, 11]):
        cache.put(bytes([i]), b"x" * n)
        assert cache.size_bytes <= 10
    assert cache.peak_bytes == 10
    assert cache.peek(bytes([7])) is None            # larger than the whole budget: not kept
    assert cache.peek(bytes([6])) == b"xxx"


def test_a_reader_of_a_file_whose_model_is_removed_and_collected_mid_read_keeps_reading(two_models_one_file, tmp_path):
    store, plain = two_models_one_file
    other = small_model(tmp_path / "c", seed=32)
    add_model(store, other, "c")
    archive = Archive(store.root, workers=1, cache_bytes=1 << 20)
    try:
        with archive.open(archive.entry("c", "model.safetensors")) as r:
            want = (other / "model.safetensors").read_bytes()
            half = len(want) // 2
            assert r.pread(0, half) == want[:half]
            remove_models(store, ["c"])
            collected = collect_garbage(store)
            assert collected.reclaimed > 0                  # its chunks' pack bytes are gone from disk
            assert r.pread(half, len(want)) == want[half:]
            assert r.pread(0, 4096) == want[:4096]          # and what was read before, again
        with pytest.raises(FileNotFoundError):
            archive.open(archive.entry("c", "model.safetensors"))
    finally:
        archive.close()


@pytest.mark.allow_log_warnings
def test_a_damaged_chunk_is_eio_on_exactly_the_pages_that_touch_it_through_the_mount(tmp_path):
    store = StorePaths(tmp_path / "store")
    src = small_model(tmp_path / "a", seed=33)
    add_model(store, src, "a", segments=False)     # whole chunks: a segment's damage is in test_codecs_floatseg
    plain = (src / "model.safetensors").read_bytes()
    bad = flip_byte_in_chunk_of(store, "a", "model.safetensors")
    archive = Archive(store.root, workers=0)
    try:
        with archive.open(archive.entry("a", "model.safetensors")) as r:
            e = next(x for x in r.extents if x.offset <= bad < x.offset + x.size)
            with pytest.raises(CorruptChunk, match=f"a/model.safetensors at offset {e.offset}"):
                r.pread(bad, 1)
    finally:
        archive.close()
    lo, hi = e.offset, e.offset + e.size
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with mounted(mnt, store.root) as fs:
        fd = os.open(fs.mountpoint / "a" / "model.safetensors", os.O_RDONLY)
        try:
            failed, wrong = [], []
            for page in range(0, len(plain), 4096):
                try:
                    got = os.pread(fd, 4096, page)
                except OSError as exc:
                    assert exc.errno == errno.EIO
                    failed.append(page)
                    continue
                if got != plain[page:page + 4096]:
                    wrong.append(page)
        finally:
            os.close(fd)
    assert wrong == []
    assert failed == [p for p in range(0, len(plain), 4096) if p < hi and p + 4096 > lo]
