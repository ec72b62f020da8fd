"""Lent chunks: a lone read answered from the decoded array, the chunk copied into the cache after."""
from __future__ import annotations

import random
import threading

import numpy as np
import pytest

from lmzfs.codecs import REGISTRY, decode_chunk, encode_chunk, kernels
from lmzfs.codecs.base import ChunkHint
from lmzfs.codecs.plainbytes import to_bytes
from lmzfs.reader import Archive
from lmzfs.store.read.chunkcache import ChunkCache
from lmzfs.store.add import add_model
from lmzfs.store.layout import StorePaths


def _array(n: int = 1 << 18) -> np.ndarray:
    return np.random.default_rng(5).integers(0, 1 << 16, n, dtype=np.uint16)


def test_a_lent_value_is_the_loaders_buffer_and_is_cached_as_bytes_only_once_settled():
    cache = ChunkCache(16 << 20)
    a = _array()
    lent, settle = cache.lend(b"k", lambda: memoryview(a).cast("B"))
    assert isinstance(lent, memoryview) and lent.obj is a
    assert b"k" in cache and cache.peek(b"k") is None
    settle()
    value = cache.peek(b"k")
    assert type(value) is bytes and value == a.tobytes()
    assert cache.size_bytes == a.nbytes
    again, settle2 = cache.lend(b"k", lambda: pytest.fail("decoded twice"))
    assert again is value and settle2 is None


def test_threads_asking_for_a_lent_chunk_wait_for_its_settle_and_get_its_bytes():
    cache = ChunkCache(16 << 20)
    a = _array()
    lent, settle = cache.lend(b"k", lambda: memoryview(a).cast("B"))
    got, started = [], threading.Event()

    def reader() -> None:
        started.set()
        got.append(cache.get(b"k", lambda: pytest.fail("decoded twice")))

    t = threading.Thread(target=reader)
    t.start()
    started.wait()
    t.join(0.2)
    assert t.is_alive() and not got         # still waiting: nothing is cached yet
    settle()
    t.join(5)
    assert got == [a.tobytes()] and type(got[0]) is bytes
    assert cache.stats.waits == 1 and cache.stats.misses == 1


def test_a_lent_chunk_discarded_before_it_settles_is_handed_out_but_not_kept():
    cache = ChunkCache(16 << 20)
    a = _array()
    _, settle = cache.lend(b"k", lambda: memoryview(a).cast("B"))
    assert cache.discard(b"k") is False      # not cached yet: remembered for when it lands
    settle()
    assert cache.peek(b"k") is None and cache.size_bytes == 0 and b"k" not in cache


def test_a_failed_load_or_settle_reaches_every_waiter_and_caches_nothing():
    cache = ChunkCache(16 << 20)
    with pytest.raises(OSError, match="bad pack"):
        cache.lend(b"k", lambda: (_ for _ in ()).throw(OSError(5, "bad pack")))
    assert b"k" not in cache

    class Unbufferable:          # its copy fails, as a copy with no memory left would
        pass
    _, settle = cache.lend(b"j", Unbufferable)
    errors = []

    def reader() -> None:
        try:
            cache.get(b"j", lambda: pytest.fail("decoded again"))
        except TypeError as exc:
            errors.append(exc)

    t = threading.Thread(target=reader)
    t.start()
    settle()                        # the lender has its bytes already: settle itself does not raise
    t.join(5)
    assert len(errors) == 1 and b"j" not in cache and cache.size_bytes == 0


@pytest.mark.parametrize("compiled", [True, False])
def test_to_bytes_copies_any_contiguous_buffer_exactly_and_passes_bytes_through(compiled, request):
    if not compiled:
        request.getfixturevalue("reference_kernels")
    elif kernels.compiled() is None:
        pytest.skip("the compiled extension is not built")
    a = _array(1 << 20)
    for buf in (a, memoryview(a).cast("B"), memoryview(a.tobytes())[3:70_003], bytearray(b"xyz"), a[:10]):
        out = to_bytes(buf)
        assert type(out) is bytes and out == memoryview(buf).tobytes()
    b = b"as it is"
    assert to_bytes(b) is b


def test_every_codec_decodes_the_same_bytes_into_its_own_buffer_as_into_bytes():
    rng = random.Random(9)
    bf16 = (np.random.default_rng(2).standard_normal(300_001).astype(np.float32).view(np.uint32) >> 16)
    samples = [bf16.astype(np.uint16).tobytes(), bf16.astype(np.uint16).tobytes() + b"\x07",   # trailing byte
               rng.randbytes(70_000), b"word " * 9000, b""]
    hints = [ChunkHint(dtype="BF16", itemsize=2), ChunkHint(dtype="BF16", itemsize=2), ChunkHint(), ChunkHint(), ChunkHint()]
    tested = set()
    for data, hint in zip(samples, hints):
        for codec in REGISTRY.values():
            try:
                params, body = codec.encode(memoryview(data), hint)
            except ValueError:
                continue        # a codec that does not take such data
            whole = codec.decode(params, body, len(data))
            into = codec.decode_buffer(params, body, len(data))
            assert type(whole) is bytes and whole == data, codec.name
            assert memoryview(into).tobytes() == data and len(into) == len(data), codec.name
            if codec.name == "floatsplit" and data and len(data) % 2 == 0 or codec.name == "floatseg" and data:
                assert isinstance(into, memoryview) and into.format == "B"    # its array, no copy
                tested.add(codec.name)
        payload = encode_chunk(data, hint).payload
        assert memoryview(decode_chunk(payload, len(data), copy=False)).tobytes() == data
        assert type(decode_chunk(payload, len(data))) is bytes
    assert tested == {"floatsplit", "floatseg"}


@pytest.fixture(scope="module")
def float_store(tmp_path_factory):
    """A store of one BF16 safetensors-like file whose chunks are floatsplit (not quick, and
    coded whole: `--no-segments`)."""
    from lmzfs.testing.synthetic import small_model
    root = tmp_path_factory.mktemp("lend")
    src = small_model(root / "src")
    store = StorePaths(root / "store")
    add_model(store, src, "m", segments=False, chunk_size=1 << 20)
    return store, src


@pytest.fixture
def opened(float_store):
    """(archive with no read-ahead, a reader of the store's largest file, that file's bytes)."""
    store, src = float_store
    archive = Archive(store.root, workers=0)
    try:
        entry = max(archive.files(), key=lambda e: e.size)
        with archive.open(entry) as r:
            yield archive, r, (src / entry.path).read_bytes()
    finally:
        archive.close()


def test_a_lone_read_that_misses_gets_exact_bytes_and_its_chunk_lands_in_the_cache_once(opened):
    archive, r, plain = opened
    big = max(r.extents, key=lambda e: e.size)
    assert big.codec == "floatsplit" and big.size > 256 << 10
    off = big.offset + big.size // 3
    assert r.pread(off, 4096) == plain[off:off + 4096]
    archive.source.wait_settled()
    assert archive.source.cache.peek(big.chunk_id) == plain[big.offset:big.offset + big.size]
    before = archive.counters.chunks_decoded
    far = big.offset + big.size - 5000
    got = r.pread(far, 4096)
    assert type(got) is bytes and got == plain[far:far + 4096]
    assert archive.counters.chunks_decoded == before      # the second read was a hit


def test_pread_nowait_decodes_a_lone_miss_here_only_when_idle_and_then_serves_it_cached(opened):
    archive, r, plain = opened
    floats = [e for e in r.extents if e.codec == "floatsplit"]
    c0, c1 = next((a, b) for a, b in zip(floats, floats[1:]) if a.offset + a.size == b.offset)
    off = c0.offset + 12_288
    assert r.pread_nowait(off, 4096) is None                 # floatsplit: not cheap
    assert archive.counters.chunks_decoded == 0
    got = r.pread_nowait(off, 4096, idle=True)
    assert type(got) is bytes and got == plain[off:off + 4096]
    assert archive.counters.chunks_decoded == 1
    archive.source.wait_settled()
    last = c0.offset + c0.size - 4096
    assert r.pread_nowait(last, 4096) == plain[last:last + 4096]      # cached now
    # the next read continues that one: not lone, so it is left to a thread as before
    assert r.pread_nowait(c1.offset, 4096, idle=True) is None
    assert archive.counters.chunks_decoded == 1
