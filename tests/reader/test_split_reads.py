"""A read that misses more than one piece (chunks, or a lone read's segments of a floatseg chunk)
is decoded by its own thread and a helper at once, each piece once, the bytes exact. Which thread
takes which piece is the scheduler's choice: the tests assert what was decoded, never by whom."""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from lmzfs.codecs import SEGMENT_BYTES
from lmzfs.counters import thread_tally
from lmzfs.errors import CorruptChunk
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.testing.synthetic import flip_byte_in_chunk_of


def bf16_model(d: Path, seed: int, mib: int = 4) -> Path:
    """A safetensors file of one BF16 tensor: whole 1 MiB floatseg chunks of four segments."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    w = rng.normal(0, 0.02, mib << 19).astype(np.float32)
    big = (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [mib << 19], "data_offsets": [0, len(big)]}})
    header += " " * (-len(header) % 8)
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode() + big)
    return d


@pytest.fixture(scope="module")
def store(tmp_path_factory) -> tuple[StorePaths, bytes]:
    root = tmp_path_factory.mktemp("split")
    src = bf16_model(root / "src", seed=11)
    store = StorePaths(root / "store")
    add_model(store, src, "m", segments=True, chunk_size=1 << 20)  # four segments a chunk
    return store, (src / "model.safetensors").read_bytes()


@contextmanager
def reading(root: Path, workers: int) -> Iterator[tuple[Archive, object, list]]:
    archive = Archive(root, workers=workers)
    try:
        with archive.open(archive.entry("m", "model.safetensors")) as r:
            yield archive, r, [e for e in r.extents if e.codec == "floatseg" and e.size == 1 << 20]
    finally:
        archive.close()


def decoded_here() -> int:
    return thread_tally()[0]


def test_a_lone_read_of_three_segments_split_across_threads_decodes_each_segment_once(store):
    store, plain = store
    with reading(store.root, workers=2) as (archive, r, chunks):
        e = chunks[1]
        at, n = e.offset + 100, 3 * SEGMENT_BYTES - 200
        before = decoded_here()
        assert r.pread(at, n) == plain[at:at + n]
        assert archive.counters.segments_decoded == 3 and archive.counters.chunks_decoded == 0
        assert decoded_here() - before <= 3 * SEGMENT_BYTES
        # every segment it touched is cached: the same bytes again decode nothing
        assert r.pread_nowait(at, n) == plain[at:at + n]
        assert archive.counters.segments_decoded == 3


def test_a_lone_read_across_two_chunks_split_across_threads_decodes_only_the_segments_it_touches(store):
    store, plain = store
    with reading(store.root, workers=2) as (archive, r, chunks):
        a, b = chunks[1], chunks[2]
        assert a.offset + a.size == b.offset
        at, n = b.offset - SEGMENT_BYTES - 10, 2 * SEGMENT_BYTES + 20     # 2 segments of a, 2 of b
        before = decoded_here()
        assert r.pread(at, n) == plain[at:at + n]
        assert archive.counters.segments_decoded == 4 and archive.counters.chunks_decoded == 0
        assert archive.counters.bytes_decoded == 4 * SEGMENT_BYTES
        assert decoded_here() - before <= 4 * SEGMENT_BYTES


def test_a_lone_read_of_a_whole_chunk_is_one_decode_checked_by_the_chunks_checksum(store):
    store, plain = store
    with reading(store.root, workers=2) as (archive, r, chunks):
        e = chunks[2]
        assert r.pread(e.offset, e.size) == plain[e.offset:e.offset + e.size]
        assert archive.counters.segments_decoded == 0 and archive.counters.chunks_decoded == 1


def test_without_a_second_cpu_a_read_is_decoded_by_its_own_thread_alone(store):
    store, plain = store
    with reading(store.root, workers=1) as (archive, r, chunks):
        e = chunks[1]
        at, n = e.offset + 100, 3 * SEGMENT_BYTES - 200
        before = decoded_here()
        assert r.pread(at, n) == plain[at:at + n]
        assert decoded_here() - before == 3 * SEGMENT_BYTES
        assert archive.counters.segments_decoded == 3


def test_a_damaged_segment_in_a_read_split_across_threads_is_eio_and_the_rest_reads_exactly(tmp_path):
    src = bf16_model(tmp_path / "src", seed=12)
    plain = (src / "model.safetensors").read_bytes()
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m", segments=True, chunk_size=1 << 20)  # four segments a chunk
    bad = flip_byte_in_chunk_of(store, "m", "model.safetensors")
    with reading(store.root, workers=2) as (archive, r, chunks):
        e = next(x for x in chunks if x.offset <= bad < x.offset + x.size)
        seg = (bad - e.offset) // SEGMENT_BYTES
        assert seg > 0
        # three segments, the damaged one last: the helper's piece fails, the read is EIO
        at = e.offset + (seg - 2) * SEGMENT_BYTES + 1 if seg >= 2 else e.offset + 1
        n = e.offset + (seg + 1) * SEGMENT_BYTES - 1 - at
        with pytest.raises(CorruptChunk) as info:
            r.pread(at, n)
        assert info.value.errno == 5 and "model.safetensors" in info.value.strerror
        good = e.offset + (seg - 1) * SEGMENT_BYTES + 5
        assert r.pread(good, 100) == plain[good:good + 100]
        assert archive.counters.corrupt_chunks >= 1




def test_read_ahead_never_decodes_again_a_chunk_the_reader_was_served_all_of(store):
    import threading
    store, plain = store
    with reading(store.root, workers=1) as (archive, r, chunks):
        assert len(chunks) == 4
        ahead = chunks[3]
        assert r.pread(ahead.offset, ahead.size) == plain[ahead.offset:ahead.offset + ahead.size]
        archive.source.wait_settled()                   # a lone read is answered before the chunk is cached
        assert not archive.source.is_cached(ahead)      # served whole: released
        # a stream through the first two chunks: read-ahead's window grows to span the last again
        start = chunks[0].offset
        for o in range(start, chunks[2].offset, 64 << 10):
            assert r.pread(o, 64 << 10) == plain[o:o + (64 << 10)]
        done = threading.Event()
        archive.prefetcher.submit(done.set)             # one read-ahead thread: runs after its tasks
        assert done.wait(30)
        assert archive.source.is_cached(chunks[2])      # the window was read ahead...
        assert not archive.source.is_cached(ahead)      # ...but not the chunk served already
