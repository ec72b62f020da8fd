"""The one way the read path gets a chunk's plain bytes: chunk in, checked bytes out.

A ChunkSource belongs to one store and is shared by every open file of it. It owns what turns a
catalog row (an Extent) into plain bytes: the pack descriptors (opened once, shared, released
when no open file needs them), the decode (store/read/chunkread.py, which checks every byte it hands
out), and the decoded-chunk cache (store/read/chunkcache.py), under which a chunk is decoded once
however many readers wait for it. Callers ask for a byte range of a chunk and say whether the
read is lone (it continues no stream: then only the parts it touches are decoded, for a codec
that decodes in parts, or its chunk is lent: the read is answered before the chunk is copied
into the cache). What a codec can do (decode in parts, decode cheaply) it states through its
interface (codecs/base.py); nothing here depends on which codec a chunk has.

A chunk coded against a reference (Extent.base, a delta) is decoded by first reading its base's
whole plain bytes through this same source, and so through its cache: a base that many chunks
(or many files) need is decoded once, and a chain decodes link by link, each link checked
against its own checksum. A damaged base is an EIO for every chunk that needs it, naming both.
A writable mount puts its unflushed bytes in front of this source.
"""
from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

from lmzfs.codecs import by_name
from lmzfs.codecs.base import Buffer, Codec
from lmzfs.counters import ReadCounters, tally_decoded
from lmzfs.errors import CorruptChunk
from lmzfs.store.catalog import Extent
from lmzfs.store.read.chunkcache import ChunkCache
from lmzfs.store.read.chunkread import chunk_parts, read_chunk, read_chunk_parts
from lmzfs.store.packs import PackSource
from lmzfs.store.packbackend import PackBackend


class _NotInParts(Exception):
    """The chunk's parts are not where its codec said they would be: decode all of it instead."""


def _part_key(e: Extent, start: int) -> bytes:
    return e.chunk_id + start.to_bytes(4, "little")     # 36 bytes: never a chunk id (32)


def _parts_key(e: Extent) -> bytes:
    return e.chunk_id + b"parts"                        # 37 bytes: the chunk's part decoder


def _codec(e: Extent) -> Codec | None:
    try:
        return by_name(e.codec)
    except KeyError:            # an unknown codec: decoding the payload reports it
        return None


def _slice(data: bytes, lo: int, hi: int) -> Buffer:
    """[lo, hi) of a cached chunk: the chunk itself when that is all of it (a read of a whole
    chunk then costs no copy), else a view."""
    return data if lo == 0 and hi == len(data) else memoryview(data)[lo:hi]


@dataclass(frozen=True)
class PackHold:
    """The pack descriptors an open file holds while it is open (ChunkSource.hold/release)."""
    fds: dict[int, PackSource]


class ChunkSource:
    """Thread-safe. `check_ids` also checks every chunk against its SHA-256 id (`lmz verify`)."""

    def __init__(self, packs: PackBackend, cache_bytes: int, *, check_ids: bool = False,
                 counters: ReadCounters | None = None):
        """packs: where the chunks' packs are: the local packs directory (LocalPacks), or a remote
        store's pack objects (store/remote/packs.py)."""
        self.cache = ChunkCache(cache_bytes)
        self.counters = counters if counters is not None else ReadCounters()
        self._check_ids = check_ids
        self._packs = packs.descriptors()
        # copies lent chunks into the cache once their reads are answered (see _lent)
        self._settler = ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmz-settle")

    # -- pack descriptors --------------------------------------------------------------------------
    def hold(self, extents: list[Extent]) -> PackHold:
        """Open (or share) the packs these chunks live in, for as long as the caller reads them:
        a descriptor stays valid after `lmz gc` unlinks its pack. Pair with release()."""
        return PackHold(self._packs.acquire({c.location.pack for e in extents for c in e.chain()}))

    def release(self, hold: PackHold) -> None:
        self._packs.release(hold.fds)

    def chunk_bytes(self, e: Extent) -> bytes:
        """A whole chunk's plain bytes, its packs held while they are read; checked as every read
        is (CorruptChunk if damaged)."""
        hold = self.hold([e])
        try:
            return bytes(self.read(e, 0, e.size))
        finally:
            self.release(hold)

    def open_packs(self) -> int:
        """How many pack descriptors are open now (each shared by every file that needs it)."""
        return len(self._packs)

    def _fd(self, e: Extent) -> PackSource:
        fd = self._packs.held(e.location.pack)
        if fd is None:
            raise CorruptChunk(f"chunk {e.chunk_id.hex()[:16]}: pack {e.location.pack} is not held by any open file")
        return fd

    # -- decoding ----------------------------------------------------------------------------------
    @contextmanager
    def _counted(self) -> Iterator[None]:
        try:
            yield
        except CorruptChunk:
            self.counters.add(corrupt_chunks=1)
            raise

    def _reference(self, e: Extent) -> Buffer:
        """The whole plain bytes of a delta chunk's base, through the cache (decoded once)."""
        try:
            return self.read(e.base, 0, e.base.size)
        except CorruptChunk as exc:
            raise CorruptChunk(f"chunk {e.chunk_id.hex()[:16]}: its reference chunk "
                               f"{e.base.chunk_id.hex()[:16]} is damaged ({exc.strerror})") from exc

    def _decode(self, e: Extent, copy: bool = True) -> Buffer:
        ref = None if e.base is None else self._reference(e)
        t0 = time.perf_counter()
        with self._counted():
            data = read_chunk(self._fd(e), e, check_id=self._check_ids, copy=copy, ref=ref)
        self.counters.add(chunks_decoded=1, bytes_decoded=e.size, decode_seconds=time.perf_counter() - t0)
        tally_decoded(e.size)
        return data

    def _parts(self, e: Extent):
        """The chunk's part decoder (its params parsed, tables built), through the cache: built
        once for all the reads that decode parts of the chunk, not once per part."""
        def load():
            with self._counted():
                parts = chunk_parts(self._fd(e), e)
            if parts is None:
                raise _NotInParts
            self.counters.add(part_decoders_built=1)
            return parts
        return self.cache.get(_parts_key(e), load)

    def _decode_parts(self, e: Extent, starts: range, step: int) -> bytes:
        """Decode the parts at these plain starts of the chunk together, checked; cache all but
        the first, which is returned (the cache stores it under the caller's key)."""
        parts = self._parts(e)
        t0 = time.perf_counter()
        with self._counted():
            got = read_chunk_parts(self._fd(e), e, parts, starts[0], starts[-1] + 1)
        if [(a, len(d)) for a, d in got] != [(a, min(step, e.size - a)) for a in starts]:
            raise _NotInParts
        self.counters.add(segments_decoded=len(got), bytes_decoded=sum(len(d) for _, d in got),
                          decode_seconds=time.perf_counter() - t0)
        tally_decoded(sum(len(d) for _, d in got))
        for a, data in got[1:]:
            self.cache.put(_part_key(e, a), data)
        return got[0][1]

    def _part_starts(self, e: Extent, lo: int, hi: int, every: bool = False) -> tuple[range, int] | None:
        """(plain starts of the parts [lo, hi) touches, the part size), or None if the codec
        decodes whole chunks only or (unless `every`) the range touches every part."""
        codec = _codec(e)
        step = codec.part_bytes if codec is not None else 0
        if not step or e.size <= step:
            return None
        starts = range(lo - lo % step, hi, step)
        return (starts, step) if every or len(starts) < -(-e.size // step) else None

    def _from_parts(self, e: Extent, lo: int, hi: int, parts: list[tuple[int, bytes]]) -> Buffer:
        if len(parts) == 1:
            a, data = parts[0]
            return memoryview(data)[lo - a:hi - a]
        return b"".join(memoryview(d)[max(lo, a) - a:min(hi, a + len(d)) - a] for a, d in parts)

    def peek(self, e: Extent, lo: int, hi: int) -> Buffer | None:
        """read()'s bytes if they are cached (the chunk, or the parts the range needs), else None;
        never decodes, never waits."""
        data = self.cache.peek(e.chunk_id)
        if data is not None:
            return _slice(data, lo, hi)
        found = self._part_starts(e, lo, hi, every=True)
        if found is None:
            return None
        parts = [(a, self.cache.peek(_part_key(e, a))) for a in found[0]]
        return None if any(d is None for _, d in parts) else self._from_parts(e, lo, hi, parts)

    def _lent(self, e: Extent, lo: int, hi: int) -> bytes:
        """[lo, hi) of a chunk for a lone read that misses: answered from the decoded array once
        it is checked, before the chunk is copied into the cache, which the settle thread does
        meanwhile (ChunkCache.lend); the copy into memory the process never used before pays a
        page fault per 4 KiB, which the read need not wait for."""
        data, settle = self.cache.lend(e.chunk_id, lambda: self._decode(e, copy=False))
        if settle is not None and isinstance(data, bytes):
            settle()                # already bytes (the codec has no array of its own): no copy to defer
            settle = None
        try:
            with memoryview(data) as view:
                return view[lo:hi].tobytes()
        finally:
            if settle is not None:
                try:
                    self._settler.submit(settle)
                except RuntimeError:        # closing: nobody waits long for a closing source
                    settle()

    # -- what callers ask --------------------------------------------------------------------------
    def read(self, e: Extent, lo: int, hi: int, *, lone: bool = False) -> Buffer:
        """Plain bytes [lo, hi) of the chunk (bytes, or a view of cached bytes), checked; waits
        for a decode another thread has started. CorruptChunk (EIO) if the chunk is damaged."""
        if not 0 <= lo < hi <= e.size:
            raise ValueError(f"range {lo}..{hi} outside the chunk's {e.size} bytes")
        data = self.peek(e, lo, hi)         # the chunk, or every part the range needs (read ahead)
        if data is not None:
            return data
        if lone:
            found = self._part_starts(e, lo, hi)
            if found is not None and e.chunk_id not in self.cache:
                starts, step = found
                try:
                    parts = [(a, self.cache.get(_part_key(e, a), lambda a=a: self._decode_parts(
                        e, self._missing_run(e, a, starts.stop, step), step))) for a in starts]
                    return self._from_parts(e, lo, hi, parts)
                except _NotInParts:
                    pass
            elif found is None:
                return self._lent(e, lo, hi)
        return _slice(self.cache.get(e.chunk_id, lambda: self._decode(e, copy=False)), lo, hi)

    def _missing_run(self, e: Extent, a: int, stop: int, step: int) -> range:
        """The parts from a up to stop, ending before the first one that is cached already."""
        b = a + step
        while b < stop and _part_key(e, b) not in self.cache:
            b += step
        return range(a, b, step)

    def _in_parts(self, e: Extent) -> bool:
        """Parts of the chunk were decoded alone lately (its part decoder is cached)."""
        return _parts_key(e) in self.cache

    def read_nowait(self, e: Extent, lo: int, hi: int, *, lone: bool = False,
                    idle: bool = False) -> Buffer | None:
        """read()'s bytes if they are cached, or cheap to make (what the codec says it decodes
        in about a thread hop's time), or with idle (the caller has nothing else to do, and a
        lone read) made here whatever they cost; else None. Never waits for another thread."""
        data = self.peek(e, lo, hi)
        if data is not None:
            return data
        if e.chunk_id in self.cache:
            return None                     # another thread is decoding it
        found = self._part_starts(e, lo, hi) if lone else None
        if found is not None and any(_part_key(e, a) in self.cache for a in found[0]):
            return None                     # one of its parts is being decoded
        codec = _codec(e)
        need = e.size if found is None else len(found[0]) * found[1]
        if e.base is not None and self.cache.peek(e.base.chunk_id) is None:
            codec = None                    # its base is to be decoded first: never cheap
        if ((codec is not None and need <= codec.cheap_bytes) or (idle and lone)) and self.at_hand(e):
            return self.read(e, lo, hi, lone=lone)
        return None

    def at_hand(self, e: Extent) -> bool:
        """Whether the payloads of the chunk and of the chunks it is coded against can be read
        without waiting on a network (a remote store's packs: fetched already); never for a read
        that must not wait."""
        for link in e.chain():
            pack = self._packs.held(link.location.pack)
            at_hand = getattr(pack, "at_hand", None)
            if at_hand is not None and not at_hand(link.location.offset, link.location.length):
                return False
        return True

    def prefetch(self, e: Extent) -> bool:
        """Decode the chunk into the cache unless it is there or on its way; True if decoded here.
        A chunk that lone reads took parts of gets its missing parts decoded, not all of it again."""
        if e.chunk_id in self.cache:
            return False
        if self._in_parts(e):
            codec = _codec(e)
            step = codec.part_bytes if codec is not None else 0
            starts = range(0, e.size, step) if step else range(0)
            missing = [a for a in starts if _part_key(e, a) not in self.cache]
            if not missing:
                return False
            try:
                for a in missing:
                    self.cache.get(_part_key(e, a), lambda a=a: self._decode_parts(
                        e, self._missing_run(e, a, starts.stop, step), step))
                return True
            except _NotInParts:
                pass
        self.cache.get(e.chunk_id, lambda: self._decode(e, copy=False))
        return True

    def pieces(self, e: Extent, lo: int, hi: int, lone: bool, most: int) -> list[tuple[int, int]]:
        """[lo, hi) of the chunk cut into at most `most` ranges that separate threads may read()
        at once (lone as given) without decoding any byte twice: for a lone read of a chunk that
        decodes in parts and is not cached, at its parts' edges, each range a run of whole parts'
        worth; else [(lo, hi)]. A range's read then decodes only the parts it touches, each
        checked by its own checksum, as a lone read of them would; a range that touches every
        part is never cut, so that the chunk is decoded whole and checked by the chunk's."""
        codec = _codec(e)
        step = codec.part_bytes if codec is not None else 0
        if most < 2 or not lone or not step or e.size <= step or e.base is not None or e.chunk_id in self.cache:
            return [(lo, hi)]
        first, stop = lo // step, -(-hi // step)
        n = stop - first
        if n < 2 or n == -(-e.size // step):
            return [(lo, hi)]
        k = min(most, n)
        edges = [(first + n * i // k) * step for i in range(1, k)]
        bounds = [lo, *edges, hi]
        return list(zip(bounds, bounds[1:]))

    def has(self, e: Extent, lo: int, hi: int) -> bool:
        """[lo, hi) of the chunk is cached or being decoded (the chunk, or every part it needs);
        never decodes, never waits, counts no hit."""
        if e.chunk_id in self.cache:
            return True
        found = self._part_starts(e, lo, hi, every=True)
        return found is not None and all(_part_key(e, a) in self.cache for a in found[0])

    def is_cached(self, e: Extent) -> bool:
        """The chunk is cached whole or being decoded."""
        return e.chunk_id in self.cache

    def discard(self, e: Extent) -> bool:
        """Drop the chunk from the cache (its reader has it all), and the parts of it that lone
        reads decoded, with their part decoder; True if the chunk or a part of it was there."""
        dropped = self.cache.discard(e.chunk_id)
        codec = _codec(e)
        step = codec.part_bytes if codec is not None else 0
        if step and e.size > step:
            for a in range(0, e.size, step):
                dropped |= self.cache.discard(_part_key(e, a))
            self.cache.discard(_parts_key(e))
        return dropped

    def wait_settled(self) -> None:
        """Return once every chunk lent so far is in the cache (the settle thread runs in order)."""
        try:
            self._settler.submit(lambda: None).result()
        except RuntimeError:
            pass

    def close(self) -> None:
        self._settler.shutdown(wait=True)       # readers may wait for the chunks it settles
        self._packs.close()
        self.cache.clear()

