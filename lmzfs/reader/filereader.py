"""One open file of an Archive: pread() of exact bytes, decoding only the chunks a range touches,
through the archive's shared cache, with read-ahead for sequential streams."""
from __future__ import annotations

import bisect
import threading
import time
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

from lmzfs.codecs import SEGMENT_BYTES, by_name
from lmzfs.codecs.base import Buffer
from lmzfs.reader.api import CorruptChunk
from lmzfs.store.catalog import Extent
from lmzfs.store.chunkread import read_chunk, read_chunk_segments

if TYPE_CHECKING:
    from lmzfs.reader.archive import Archive

# pread_cached(decode_quick=True) decodes one missing chunk of a quick codec up to this size in
# the calling thread: a median 0.55 ms (at most 1.2 ms) for BF16 on the 2-core benchmark host,
# about what handing the read to a thread and back costs there, so such a miss takes half as long.
# One floatseg segment (SEGMENT_BYTES, for a lone read) takes as long: a median 0.7-0.9 ms.
QUICK_BYTES = 256 << 10


class _NotSegmented(Exception):
    """The chunk's segments are not where the reader expected them: decode all of it instead."""


def _segmented(e: Extent) -> bool:
    return e.codec == "floatseg" and e.size > SEGMENT_BYTES


def _segment_key(e: Extent, start: int) -> bytes:
    return e.chunk_id + start.to_bytes(4, "little")     # 36 bytes: never a chunk id (32)


def _quick(e: Extent) -> bool:
    try:
        return e.size <= QUICK_BYTES and by_name(e.codec).quick
    except KeyError:            # an unknown codec: the thread path reports it
        return False


class FileReader:
    def __init__(self, archive: Archive, label: str, size: int, extents: list[Extent]):
        self.label = label
        self.size = size
        self._archive = archive
        self._extents = extents
        self._starts = [e.offset for e in extents]
        covered = sum(e.size for e in extents)
        if covered != size or any(a.offset + a.size != b.offset for a, b in zip(extents, extents[1:])):
            raise CorruptChunk(f"{label}: catalog extents do not tile the file")
        self._fds = archive.packs.acquire({e.location.pack for e in extents})
        # Prefetch tasks use this reader's pack descriptors: close() waits until none is running.
        self._cond = threading.Condition()
        self._prefetching = 0
        self._prefetched: set[bytes] = set()
        self._served: dict[int, int] = {}     # extent index -> bytes of it served to this stream
        self._last_end = -1                   # where the latest read ended
        prefetcher = archive.prefetcher
        self._stream = prefetcher.register(id(self)) if prefetcher is not None else None

    # -- decoding ---------------------------------------------------------------------------------
    def _decode(self, e: Extent, here: bool = False, copy: bool = True) -> Buffer:
        """The chunk's plain bytes, decoded by the worker processes if there are any, unless here;
        without copy, decoded here, perhaps as the codec's own buffer (read_chunk)."""
        t0 = time.perf_counter()
        try:
            fd = self._fds[e.location.pack]
            decoder = None if here or not copy else self._archive.decoder
            data = decoder.decode(fd, e) if decoder is not None else \
                read_chunk(fd, e, check_id=self._archive.check_ids, copy=copy)
        except CorruptChunk:
            self._archive.stats.add(corrupt_chunks=1)
            raise
        self._archive.stats.add(chunks_decoded=1, bytes_decoded=e.size, decode_seconds=time.perf_counter() - t0)
        return data

    def _decode_segments(self, e: Extent, starts: range) -> bytes:
        """Decode the chunk's segments at these plain starts (of the chunk) together, checked; cache
        all but the first, which is returned (the cache stores it under the caller's key)."""
        t0 = time.perf_counter()
        try:
            got = read_chunk_segments(self._fds[e.location.pack], e, starts[0], starts[-1] + 1)
        except CorruptChunk:
            self._archive.stats.add(corrupt_chunks=1)
            raise
        if got is None or [(a, len(d)) for a, d in got] != [(a, min(SEGMENT_BYTES, e.size - a)) for a in starts]:
            raise _NotSegmented
        self._archive.stats.add(segments_decoded=len(got), bytes_decoded=sum(len(d) for _, d in got),
                                decode_seconds=time.perf_counter() - t0)
        for a, data in got[1:]:
            self._archive.cache.put(_segment_key(e, a), data)
        return got[0][1]

    def _segment_starts(self, e: Extent, offset: int, end: int) -> range | None:
        """Plain starts (of the chunk) of the segments [offset, end) touches, None if that is all
        of them or the chunk has none."""
        if not _segmented(e):
            return None
        lo, hi = max(offset, e.offset) - e.offset, min(end, e.offset + e.size) - e.offset
        starts = range(lo - lo % SEGMENT_BYTES, hi, SEGMENT_BYTES)
        return starts if len(starts) < -(-e.size // SEGMENT_BYTES) else None

    def _pieces(self, e: Extent, offset: int, end: int, part: bool) -> list[tuple[int, bytes]]:
        """(file offset, bytes) pieces covering what [offset, end) needs of the chunk: the chunk,
        or with `part`, of a chunk that decodes in segments, only the segments it touches."""
        starts = self._segment_starts(e, offset, end) if part else None
        cache = self._archive.cache
        if starts is not None and e.chunk_id not in cache:
            try:
                with self._located(e):
                    return [(e.offset + a, cache.get(_segment_key(e, a), lambda a=a: self._decode_segments(
                        e, range(a, starts.stop, SEGMENT_BYTES)))) for a in starts]
            except _NotSegmented:
                pass
        return [(e.offset, self._chunk(e))]

    def _lone(self, offset: int) -> bool:
        """A read at offset does not continue the previous one (give or take a segment)."""
        last = self._last_end
        return last < 0 or not last - SEGMENT_BYTES <= offset <= last + SEGMENT_BYTES

    def _lone_segment(self, e: Extent, offset: int, end: int) -> bool:
        """A lone read needs one segment of the chunk, which no thread is decoding."""
        starts = self._segment_starts(e, offset, end)
        return starts is not None and len(starts) == 1 and self._lone(offset) and \
            _segment_key(e, starts[0]) not in self._archive.cache

    def _cached_pieces(self, e: Extent, offset: int, end: int) -> list[tuple[int, bytes]] | None:
        cache = self._archive.cache
        data = cache.peek(e.chunk_id)
        if data is not None:
            return [(e.offset, data)]
        starts = self._segment_starts(e, offset, end)
        if starts is None:
            return None
        pieces = [(e.offset + a, cache.peek(_segment_key(e, a))) for a in starts]
        return None if any(d is None for _, d in pieces) else pieces

    def _lent(self, e: Extent, offset: int, end: int) -> tuple[int, bytes]:
        """(file offset, bytes) of what [offset, end) needs of chunk e, for a lone read that misses:
        answered from the decoded array once it is checked, before the chunk is copied into the
        cache, which the settle thread does meanwhile (ChunkCache.lend). On a fresh mount that copy
        pays a page fault for every 4 KiB of memory never used before (about 0.6 ms of a 1 MiB miss
        on the benchmark host), which the read now need not wait for."""
        with self._located(e):
            data, settle = self._archive.cache.lend(e.chunk_id, lambda: self._decode(e, copy=False))
        lo, hi = max(offset, e.offset), min(end, e.offset + e.size)
        try:
            with memoryview(data) as view:
                return lo, view[lo - e.offset:hi - e.offset].tobytes()
        finally:
            if settle is not None:
                self._archive.settle_later(settle)

    def _chunk(self, e: Extent, here: bool = False) -> bytes:
        """The chunk through the shared cache."""
        with self._located(e):
            return self._archive.cache.get(e.chunk_id, lambda: self._decode(e, here))

    @contextmanager
    def _located(self, e: Extent) -> Iterator[None]:
        """Damage to chunk e is reported with this file and the chunk's offset in it."""
        try:
            yield
        except CorruptChunk as exc:
            raise CorruptChunk(f"{self.label} at offset {e.offset}: {exc.strerror}") from None

    def _prefetch(self, e: Extent) -> None:
        with self._cond:
            if self._fds is None:
                return
            self._prefetching += 1
        try:
            # a chunk the reader has already read past was decoded by it, and may be released
            passed = self._stream is not None and e.offset + e.size <= self._stream.expected
            if not passed and e.chunk_id not in self._archive.cache:
                self._chunk(e)
                self._archive.stats.add(readahead_chunks=1)
                with self._cond:
                    self._prefetched.add(e.chunk_id)
        finally:
            with self._cond:
                self._prefetching -= 1
                self._cond.notify_all()

    # -- reads ------------------------------------------------------------------------------------
    def _span(self, offset: int, length: int) -> tuple[int, int, int]:
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        end = min(self.size, offset + length)
        first = bisect.bisect_right(self._starts, offset) - 1 if offset < end else 0
        return end, first, offset

    def _assemble(self, offset: int, end: int, pieces: list[tuple[int, bytes]]) -> bytes:
        """[offset, end) from pieces (file offset, bytes) that cover it in order. Pieces of a read
        that spans several are cut as views, so that their bytes are copied once, by the join: a
        1 MiB read of the kernel's spans 2-5 chunks, and slicing each first copied it twice."""
        if len(pieces) == 1:
            at, data = pieces[0]
            lo, hi = offset - at, min(len(data), end - at)
            return data if (lo, hi) == (0, len(data)) else data[lo:hi]
        parts = []
        pos = offset
        for at, data in pieces:
            lo, hi = pos - at, min(len(data), end - at)
            parts.append(data if (lo, hi) == (0, len(data)) else memoryview(data)[lo:hi])
            pos = at + hi
        return b"".join(parts)

    def _covering(self, first: int, end: int) -> list[Extent]:
        out = []
        i = first
        while i < len(self._extents) and self._extents[i].offset < end:
            out.append(self._extents[i])
            i += 1
        return out

    def pread(self, offset: int, length: int) -> bytes:
        """Exactly the original bytes of [offset, offset+length), short only at EOF; decodes what it must."""
        end, first, offset = self._span(offset, length)
        if offset >= end:
            return b""
        # A read that does not continue the previous one needs only the segments it touches of a
        # chunk that decodes in segments (a quarter of the work, for a random 4 KiB read); a
        # stream decodes whole chunks, as it will read all of them.
        part = self._lone(offset)
        covering = self._covering(first, end)
        if self._lends(covering, offset, end):
            return self._finish(offset, end, first, 1, [self._lent(covering[0], offset, end)])
        pieces = [p for e in covering for p in self._pieces(e, offset, end, part)]
        return self._finish(offset, end, first, len(covering), pieces)

    def _lends(self, covering: list[Extent], offset: int, end: int) -> bool:
        """A lone read within one chunk that decodes whole, in this process: answered by _lent."""
        return len(covering) == 1 and self._archive.decoder is None and self._lone(offset) and \
            self._segment_starts(covering[0], offset, end) is None

    def pread_cached(self, offset: int, length: int, *, decode_quick: bool = False,
                     decode_lone: bool = False) -> bytes | None:
        """The same bytes as pread() when every chunk they need is already decoded, else None.

        Cheap enough to call on an event loop: it never waits for another thread, and decodes
        nothing, or with decode_quick at most one missing chunk of a quick codec (raw, zstd,
        bytegroup) of at most QUICK_BYTES, or the one segment a lone read needs of a floatseg
        chunk (as long to decode), here. With decode_lone as well, a lone read's one missing
        chunk of any codec (a whole 1 MiB BF16 chunk: 1-2 ms), answered before the chunk is
        cached (_lent): for a caller with nothing else to do meanwhile. May then raise
        CorruptChunk as pread() does."""
        end, first, offset = self._span(offset, length)
        if offset >= end:
            return b""
        cache = self._archive.cache
        found: list[list[tuple[int, bytes]] | None] = []
        missing: int | None = None          # the index in found of the one chunk to decode here
        covering = self._covering(first, end)
        if decode_lone and self._lends(covering, offset, end) and covering[0].chunk_id not in cache:
            return self._finish(offset, end, first, 1, [self._lent(covering[0], offset, end)])
        for i, e in enumerate(covering):
            pieces = self._cached_pieces(e, offset, end)
            if pieces is None:
                # a second miss, a slow codec, or a chunk another thread decodes: a thread waits
                if missing is not None or not decode_quick or e.chunk_id in cache or \
                        not (_quick(e) or self._lone_segment(e, offset, end)):
                    return None
                missing = i
            found.append(pieces)
        if missing is not None:
            # never through the worker processes: waiting for a free one could take long
            e = covering[missing]
            found[missing] = [(e.offset, self._chunk(e, here=True))] if _quick(e) else \
                self._pieces(e, offset, end, True)
        return self._finish(offset, end, first, len(covering), [p for f in found for p in f])

    def _finish(self, offset: int, end: int, first: int, count: int, pieces: list[tuple[int, bytes]]) -> bytes:
        out = self._assemble(offset, end, pieces)
        self._last_end = end
        stats = self._archive.stats
        hit = False
        if self._prefetched:
            with self._cond:
                for e in self._extents[first:first + count]:
                    if e.chunk_id in self._prefetched:
                        self._prefetched.discard(e.chunk_id)
                        hit = True
        released = self._read_ahead(offset, end, first, count)
        stats.add(reads=1, bytes_served=len(out), readahead_hits=int(hit), chunks_released=released)
        return out

    def _read_ahead(self, offset: int, end: int, first: int, count: int) -> int:
        """Feed the stream state; schedule read-ahead; return how many served chunks were released."""
        prefetcher = self._archive.prefetcher
        if prefetcher is None or self._fds is None:
            return 0
        span = prefetcher.note_read(self._stream, offset, end)
        released = self._release(offset, end, first, count)
        if span is None:
            return released
        start, stop = span
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        cache = self._archive.cache
        while i < len(self._extents) and self._extents[i].offset < min(stop, self.size):
            e = self._extents[i]
            if e.chunk_id not in cache:
                prefetcher.submit(lambda e=e: self._prefetch(e))
            i += 1
        return released

    def _release(self, offset: int, end: int, first: int, count: int) -> int:
        """Use once: a chunk that a sequential reader has been served in full is in the kernel's
        page cache (the mount keeps it), so a second copy here would only cost memory, and on a
        fresh mount a page fault for every 4 KiB of it that a recycled buffer does not pay. The
        kernel asks for each page once and its requests can be answered out of order (one waits
        for a decode while the next is served from read-ahead), so "in full" is counted in bytes
        served, not taken from the position of the latest read."""
        cache, done = self._archive.cache, []
        with self._cond:
            if self._stream.sequential_reads == 0:      # a new stream: what the last one left is moot
                self._served.clear()
            for i in range(first, first + count):
                e = self._extents[i]
                got = self._served.get(i, 0) + min(end, e.offset + e.size) - max(offset, e.offset)
                if got >= e.size and self._stream.streaming:
                    self._served.pop(i, None)
                    done.append(e)
                else:
                    self._served[i] = got
        return sum(cache.discard(e.chunk_id) for e in done)

    def close(self) -> None:
        with self._cond:
            fds, self._fds = self._fds, None
            while self._prefetching:
                self._cond.wait()
        if self._stream is not None:
            self._archive.prefetcher.unregister(id(self))
        if fds is not None:
            self._archive.packs.release(fds)

    def __enter__(self) -> "FileReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
