"""Reads that need less than a chunk decode only its segment (floatseg chunks: `lmz add --segments`),
at the reader layer."""
from __future__ import annotations

import json
import os
import random
import shutil
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

from lmzfs.codecs import SEGMENT_BYTES, floatseg
from lmzfs.errors import CorruptChunk
from lmzfs.reader import Archive
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths
from lmzfs.store.packs import RECORD_HEADER, ChunkLocation, PackDamaged, read_payload, read_payload_part
from lmzfs.testing.synthetic import flip_byte_in_chunk_of


def bf16_model(d: Path, seed: int = 0, mib: int = 4) -> Path:
    """A safetensors file of one BF16 tensor (whole 1 MiB chunks of floatseg) and a small one."""
    rng = np.random.default_rng(seed)
    d.mkdir(parents=True, exist_ok=True)
    w = rng.normal(0, 0.02, mib << 19).astype(np.float32)
    big = (w.view(np.uint32) >> 16).astype("<u2").tobytes()
    small = rng.normal(0, 1, 300).astype("<f2").tobytes()
    header = json.dumps({"w": {"dtype": "BF16", "shape": [mib << 19], "data_offsets": [0, len(big)]},
                         "b": {"dtype": "F16", "shape": [300], "data_offsets": [len(big), len(big) + len(small)]}})
    header += " " * (-len(header) % 8)
    (d / "model.safetensors").write_bytes(len(header).to_bytes(8, "little") + header.encode() + big + small)
    return d


@pytest.fixture(scope="module")
def bf16_store(tmp_path_factory) -> tuple[StorePaths, bytes]:
    root = tmp_path_factory.mktemp("seg")
    src = bf16_model(root / "src", seed=4)
    store = StorePaths(root / "store")
    add_model(store, src, "m", segments=True, chunk_size=1 << 20)  # four segments a chunk
    return store, (src / "model.safetensors").read_bytes()


@contextmanager
def reading(root: Path, **options) -> Iterator[tuple[Archive, object, list]]:
    """(archive, reader of the model file, its floatseg extents); closes both."""
    archive = Archive(root, **options)
    try:
        with archive.open(archive.entry("m", "model.safetensors")) as r:
            yield archive, r, [e for e in r.extents if e.codec == "floatseg"]
    finally:
        archive.close()


def test_a_random_4k_read_decodes_one_segment_not_its_chunk(bf16_store):
    store, plain = bf16_store
    with reading(store.root, workers=0) as (archive, r, chunks):
        assert len(chunks) >= 3 and all(e.size == 1 << 20 for e in chunks[:3])
        e = chunks[1]
        at = e.offset + 2 * SEGMENT_BYTES + 1234
        assert r.pread(at, 4096) == plain[at:at + 4096]
        assert archive.counters.segments_decoded == 1 and archive.counters.chunks_decoded == 0
        # the same segment again, on the event loop's path: from the cache
        assert r.pread_nowait(at + 8192, 4096) == plain[at + 8192:at + 12288]
        # a read across two segments decodes both (with one table build)
        edge = e.offset + SEGMENT_BYTES - 100
        assert r.pread(edge, 4096) == plain[edge:edge + 4096]
        assert archive.counters.segments_decoded == 3 and archive.counters.chunks_decoded == 0
        # and they are cached one by one
        assert r.pread_nowait(e.offset + 5, 10) == plain[e.offset + 5:e.offset + 15]
        assert r.pread_nowait(e.offset + SEGMENT_BYTES + 5, 10) == \
            plain[e.offset + SEGMENT_BYTES + 5:e.offset + SEGMENT_BYTES + 15]
        # a read of every segment decodes the chunk
        far = chunks[2].offset
        assert r.pread(far, chunks[2].size) == plain[far:far + chunks[2].size]
        assert archive.counters.segments_decoded == 3 and archive.counters.chunks_decoded == 1


def test_a_random_4k_read_of_a_new_stores_4_mib_float_chunk_decodes_one_segment(tmp_path):
    src = bf16_model(tmp_path / "src", seed=5, mib=8)
    plain = (src / "model.safetensors").read_bytes()
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m")                  # the store's own sizes: float tensors at 4 MiB
    with reading(store.root, workers=0) as (archive, r, chunks):
        assert [e.size for e in chunks] == [4 << 20, 4 << 20]
        e = chunks[1]
        at = e.offset + 13 * SEGMENT_BYTES + 777
        assert r.pread(at, 4096) == plain[at:at + 4096]
        assert archive.counters.segments_decoded == 1 and archive.counters.chunks_decoded == 0
        assert r.pread(chunks[0].offset, chunks[0].size) == plain[chunks[0].offset:chunks[0].offset + (4 << 20)]
        assert archive.counters.segments_decoded == 1 and archive.counters.chunks_decoded == 1


def test_a_sequential_reader_decodes_whole_chunks(bf16_store):
    store, plain = bf16_store
    with reading(store.root, workers=0) as (archive, r, chunks):
        assert b"".join(r.pread(off, 128 << 10) for off in range(0, r.size, 128 << 10)) == plain
        # only the first read, at the start of the file, could have been a lone one
        assert archive.counters.segments_decoded <= 1
        assert archive.counters.chunks_decoded == len(chunks) + 2


def test_random_reads_of_every_segment_return_exact_bytes(bf16_store):
    store, plain = bf16_store
    rng = random.Random(9)
    with reading(store.root, cache_bytes=3 << 20, workers=2) as (archive, r, _):
        for _ in range(300):
            at = rng.randrange(0, len(plain) - 1)
            n = rng.choice((1, 4096, 70000))
            assert r.pread(at, n) == plain[at:at + n]
        assert archive.counters.segments_decoded > 10


def test_a_damaged_segment_is_eio_and_the_others_of_its_chunk_still_read_exactly(tmp_path):
    src = bf16_model(tmp_path / "src", seed=6)
    plain = (src / "model.safetensors").read_bytes()
    store = StorePaths(tmp_path / "store")
    add_model(store, src, "m", segments=True, chunk_size=1 << 20)  # four segments a chunk
    bad = flip_byte_in_chunk_of(store, "m", "model.safetensors")
    with reading(store.root, workers=0) as (archive, r, chunks):
        e = next(x for x in chunks if x.offset <= bad < x.offset + x.size)
        assert bad > e.offset           # the byte is not in the chunk's first segment
        with pytest.raises(CorruptChunk):
            r.pread(bad + 10, 100)
        assert r.pread(e.offset + 10, 100) == plain[e.offset + 10:e.offset + 110]
        with pytest.raises(CorruptChunk):
            r.pread(e.offset, e.size)       # all of the chunk: its checksum fails
        assert archive.counters.corrupt_chunks == 2


def test_a_store_with_other_segment_sizes_is_read_through_whole_chunks(tmp_path, monkeypatch):
    src = bf16_model(tmp_path / "src", seed=7, mib=2)
    plain = (src / "model.safetensors").read_bytes()
    store = StorePaths(tmp_path / "store")
    monkeypatch.setattr(floatseg, "SEGMENT_LOG", 16)      # what another version might write
    add_model(store, src, "m", segments=True)
    monkeypatch.undo()
    with reading(store.root, workers=0) as (archive, r, chunks):
        at = chunks[0].offset + SEGMENT_BYTES + 77
        assert r.pread(at, 4096) == plain[at:at + 4096]
        assert archive.counters.segments_decoded == 0 and archive.counters.chunks_decoded == 1


def test_the_event_loop_decodes_the_one_segment_a_lone_read_needs_and_nothing_more(bf16_store):
    store, plain = bf16_store
    with reading(store.root, workers=0) as (archive, r, chunks):
        e = chunks[2]
        at = e.offset + SEGMENT_BYTES + 999
        assert r.pread_nowait(at, 4096) == plain[at:at + 4096]
        assert archive.counters.segments_decoded == 1
        # a read right after it continues a stream: whole chunks, in a thread
        assert r.pread_nowait(at + SEGMENT_BYTES, 4096) is None
        # a lone read needing two segments is more than a cheap decode: not here either
        far = chunks[0].offset + SEGMENT_BYTES - 50
        assert r.pread_nowait(far, 4096) is None
        assert archive.counters.segments_decoded == 1 and archive.counters.chunks_decoded == 0
        # unless the caller has nothing else to do (idle): then here, and only those two
        assert r.pread_nowait(far, 4096, idle=True) == plain[far:far + 4096]
        assert archive.counters.segments_decoded == 3 and archive.counters.chunks_decoded == 0


def test_a_part_of_a_payload_is_read_with_its_record_checked_and_never_past_it(bf16_store):
    store, _ = bf16_store
    with reading(store.root, workers=0) as (_, r, chunks):
        e = chunks[0]
        loc = e.location
    fd = os.open(store.pack(loc.pack), os.O_RDONLY)
    try:
        whole = bytes(read_payload(fd, e.chunk_id, loc))
        assert bytes(read_payload_part(fd, e.chunk_id, loc, 0, 100)) == whole[:100]
        assert bytes(read_payload_part(fd, e.chunk_id, loc, 5000, loc.length - 5000)) == whole[5000:]
        with pytest.raises(PackDamaged, match="does not hold chunk"):
            read_payload_part(fd, bytes(32), loc, 0, 100)
        with pytest.raises(PackDamaged, match="outside the payload"):
            read_payload_part(fd, e.chunk_id, loc, loc.length - 10, 11)
        past = ChunkLocation(loc.pack, os.fstat(fd).st_size - 50, 100)     # as a truncated pack
        with pytest.raises(PackDamaged, match="truncated"):
            read_payload_part(fd, e.chunk_id, past, 10, 90)
    finally:
        os.close(fd)


def test_a_lone_read_of_a_chunk_whose_record_names_another_chunk_is_eio(bf16_store, tmp_path):
    store, plain = bf16_store
    copy = StorePaths(tmp_path / "copy")
    shutil.copytree(store.root, copy.root)
    with reading(copy.root, workers=0) as (_, r, chunks):
        e = chunks[1]
    with open(copy.pack(e.location.pack), "r+b") as f:          # the record header's chunk id
        f.seek(e.location.offset - RECORD_HEADER.size + 4)
        f.write(bytes(32))
    with reading(copy.root, workers=0) as (archive, r, _):
        with pytest.raises(CorruptChunk, match="does not hold chunk"):
            r.pread(e.offset + SEGMENT_BYTES + 100, 4096)
        assert archive.counters.corrupt_chunks == 1
        assert r.pread(chunks[0].offset, 4096) == plain[chunks[0].offset:chunks[0].offset + 4096]
