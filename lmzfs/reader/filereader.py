"""One open file of an Archive: pread() of exact bytes, asking the store's chunk source for the
chunks a range touches, with read-ahead for sequential streams.

The reader maps file offsets to chunks and keeps what a stream needs (where the last read ended,
what of each chunk it has been served); the bytes themselves come from the ChunkSource
(lmzfs/store/read/chunksource.py), shared by every open file, which decodes and checks them.
"""
from __future__ import annotations

import bisect
import threading
from contextlib import contextmanager
from typing import Iterator

from lmzfs.codecs.base import Buffer
from lmzfs.errors import CorruptChunk
from lmzfs.reader.readahead import Prefetcher
from lmzfs.store.catalog import Extent
from lmzfs.store.read.chunksource import ChunkSource

# A read that starts within this of where the previous one ended continues it (the kernel's
# requests arrive slightly out of order); any other read is lone.
LONE_SLACK = 256 << 10
# chunks partly served whose ranges a reader keeps (to release each once all of it was served);
# past this the oldest is forgotten, and stays in the cache until evicted
MAX_PARTLY_SERVED = 4096


def _merged(ranges: list[tuple[int, int]], lo: int, hi: int) -> list[tuple[int, int]]:
    """The sorted, disjoint ranges with [lo, hi) added (adjacent ones joined)."""
    out = []
    for a, b in ranges:
        if b < lo or a > hi:
            out.append((a, b))
        else:
            lo, hi = min(a, lo), max(b, hi)
    out.append((lo, hi))
    out.sort()
    return out


def _within(e: Extent, offset: int, end: int) -> tuple[int, int]:
    """The part of chunk e that the file range [offset, end) covers, in the chunk's own offsets."""
    return max(offset, e.offset) - e.offset, min(end, e.offset + e.size) - e.offset


class FileReader:
    def __init__(self, source: ChunkSource, prefetcher: Prefetcher | None, label: str, size: int,
                 extents: list[Extent]):
        self.label = label
        self.size = size
        self._source = source
        self._counters = source.counters
        self._extents = tuple(extents)
        self._starts = [e.offset for e in extents]
        covered = sum(e.size for e in extents)
        if covered != size or any(a.offset + a.size != b.offset for a, b in zip(extents, extents[1:])):
            raise CorruptChunk(f"{label}: catalog extents do not tile the file")
        self._hold = source.hold(extents)
        # Prefetch tasks read this file's chunks through its hold: close() waits until none runs.
        self._cond = threading.Condition()
        self._closed = False
        self._prefetching = 0
        self._prefetched: set[bytes] = set()
        self._served: dict[int, list[tuple[int, int]]] = {}   # extent index -> its ranges served so far
        # extents all of whose bytes were served (the kernel's page cache holds them): read-ahead
        # never decodes them again, however late its task for them runs
        self._released: set[int] = set()
        self._last_end = -1                   # where the latest read ended
        self._prefetcher = prefetcher
        self._stream = prefetcher.register(id(self)) if prefetcher is not None else None

    @property
    def extents(self) -> tuple[Extent, ...]:
        """The file's chunks in order: where each starts in the file, its size, codec and id."""
        return self._extents

    # -- the two ways in ---------------------------------------------------------------------------
    def pread(self, offset: int, length: int) -> bytes:
        """Exactly the original bytes of [offset, offset+length), short only at EOF; decodes what
        it must, waiting for decodes other threads have started. Raises CorruptChunk (EIO)."""
        end, first, covering = self._span(offset, length)
        if not covering:
            return b""
        lone = self._lone(offset)
        jobs = [(e, *_within(e, offset, end)) for e in covering]
        helpers = self._prefetcher.helpers if self._prefetcher is not None else 0
        missing = [i for i, (e, lo, hi) in enumerate(jobs) if not self._source.has(e, lo, hi)] if helpers else []
        if 0 < len(missing) <= helpers:
            # fewer chunks to decode than threads: a lone read's chunks are cut at their parts'
            # edges too (each thread then decodes parts of its own; a chunk's part decoder is built
            # by the first thread that needs it, the other waits for it)
            most = -(-(helpers + 1) // len(missing))
            jobs = [(e, a, b) for e, lo, hi in jobs for a, b in
                    (self._source.pieces(e, lo, hi, lone, most) if not self._source.has(e, lo, hi) else [(lo, hi)])]
            missing = [i for i, (e, lo, hi) in enumerate(jobs) if not self._source.has(e, lo, hi)]
        pieces: list = [None] * len(jobs)
        if len(missing) > 1:
            # this thread and helper threads take the missing pieces one by one, in order
            todo, lock = iter(missing), threading.Lock()

            def drain() -> None:
                while True:
                    with lock:
                        i = next(todo, None)
                    if i is None:
                        return
                    pieces[i] = self._read_piece(*jobs[i], lone)
            beside = [self._prefetcher.beside(drain) for _ in range(min(helpers, len(missing) - 1))]
            try:
                drain()
            finally:
                for future in beside:
                    if future is not None:
                        future.result()         # raises what the helper raised, once every helper is done
        for i, job in enumerate(jobs):
            if pieces[i] is None:
                pieces[i] = self._read_piece(*job, lone)
        return self._finish(offset, end, first, covering, pieces)

    def _read_piece(self, e: Extent, lo: int, hi: int, lone: bool):
        with self._located(e):
            return self._source.read(e, lo, hi, lone=lone)

    def pread_nowait(self, offset: int, length: int, *, idle: bool = False) -> bytes | None:
        """pread()'s bytes if they can be had without waiting for another thread: every chunk
        cached but at most one, and that one cheap to decode (as its codec states), or, with idle
        (the caller has nothing else to do meanwhile), a lone read's one missing chunk whatever
        it costs; else None. Cheap enough for an event loop. May raise CorruptChunk."""
        end, first, covering = self._span(offset, length)
        if not covering:
            return b""
        lone = self._lone(offset)
        source = self._source
        pieces: list[Buffer | None] = []
        missing = -1
        for i, e in enumerate(covering):
            got = source.peek(e, *_within(e, offset, end))
            if got is None:
                if missing >= 0:
                    return None         # a second miss: a thread decodes them
                missing = i
            pieces.append(got)
        if missing >= 0:
            e = covering[missing]
            helpers = self._prefetcher.helpers if self._prefetcher is not None else 0
            if helpers and len(source.pieces(e, *_within(e, offset, end), lone, helpers + 1)) > 1:
                return None             # a thread decodes its pieces at once (pread)
            with self._located(e):
                got = source.read_nowait(e, *_within(e, offset, end), lone=lone, idle=idle and len(covering) == 1)
            if got is None:
                return None
            pieces[missing] = got
        return self._finish(offset, end, first, covering, pieces)

    # -- helpers -----------------------------------------------------------------------------------
    def _span(self, offset: int, length: int) -> tuple[int, int, list[Extent]]:
        if offset < 0 or length < 0:
            raise ValueError("negative offset or length")
        end = min(self.size, offset + length)
        if offset >= end:
            return end, 0, []
        first = bisect.bisect_right(self._starts, offset) - 1
        last = bisect.bisect_left(self._starts, end)
        return end, first, list(self._extents[first:last])

    def _lone(self, offset: int) -> bool:
        """A read at offset does not continue the previous one (give or take LONE_SLACK)."""
        last = self._last_end
        return last < 0 or not last - LONE_SLACK <= offset <= last + LONE_SLACK

    @contextmanager
    def _located(self, e: Extent) -> Iterator[None]:
        """Damage to chunk e is reported with this file and the chunk's offset in it."""
        try:
            yield
        except CorruptChunk as exc:
            raise CorruptChunk(f"{self.label} at offset {e.offset}: {exc.strerror}") from None

    def _finish(self, offset: int, end: int, first: int, covering: list[Extent], pieces: list) -> bytes:
        out = bytes(pieces[0]) if len(pieces) == 1 else b"".join(pieces)
        self._last_end = end
        hit = False
        if self._prefetched:
            with self._cond:
                for e in covering:
                    if e.chunk_id in self._prefetched:
                        self._prefetched.discard(e.chunk_id)
                        hit = True
        released = self._read_ahead(offset, end, first, covering)
        self._counters.add(reads=1, bytes_served=len(out), readahead_hits=int(hit), chunks_released=released)
        return out

    # -- read-ahead --------------------------------------------------------------------------------
    def _prefetch(self, i: int, e: Extent) -> None:
        with self._cond:
            if self._closed or i in self._released:
                return
            self._prefetching += 1
        try:
            # a chunk the reader has already read past was decoded by it, and may be released
            if e.offset + e.size > self._stream.expected and self._source.prefetch(e):
                self._counters.add(readahead_chunks=1)
                with self._cond:
                    self._prefetched.add(e.chunk_id)
        finally:
            with self._cond:
                self._prefetching -= 1
                self._cond.notify_all()

    def _read_ahead(self, offset: int, end: int, first: int, covering: list[Extent]) -> int:
        """Feed the stream state; schedule read-ahead; return how many served chunks were released."""
        prefetcher = self._prefetcher
        if prefetcher is None or self._closed:
            return 0
        span = prefetcher.note_read(self._stream, offset, end)
        released = self._release(offset, end, first, covering)
        if span is None:
            return released
        start, stop = span
        i = max(0, bisect.bisect_right(self._starts, start) - 1)
        while i < len(self._extents) and self._extents[i].offset < min(stop, self.size):
            e = self._extents[i]
            if i not in self._released and not self._source.is_cached(e):
                prefetcher.submit(lambda i=i, e=e: self._prefetch(i, e), ready=lambda e=e: self._source.at_hand(e))
            i += 1
        return released

    def _release(self, offset: int, end: int, first: int, covering: list[Extent]) -> int:
        """Use once: a chunk whose every byte has been served to this open file is in the kernel's
        page cache (the mount keeps it), so a second copy here would only cost memory, and room
        that a chunk still partly unread needs: a loader that touches a model in two passes (its
        tensors' first pages, then the rest) comes back for the rest of a chunk much later, and
        had it been evicted meanwhile it would be decoded twice. On a fresh mount a recycled
        buffer also spares a page fault for every 4 KiB. The kernel asks for each page once and
        its requests can be answered out of order (one waits for a decode while the next is
        served from read-ahead), and arrive in any order from mmap faults, so what was served of
        each chunk is kept as byte ranges, not taken from the position of the latest read."""
        done = []
        with self._cond:
            for i, e in enumerate(covering, first):
                lo, hi = _within(e, offset, end)
                ranges = _merged(self._served.pop(i, []), lo, hi)
                if ranges == [(0, e.size)]:
                    done.append(e)
                    self._released.add(i)
                else:
                    self._served[i] = ranges
            while len(self._served) > MAX_PARTLY_SERVED:    # forget the oldest: it stays cached
                del self._served[next(iter(self._served))]
        return sum(self._source.discard(e) for e in done)

    def close(self) -> None:
        with self._cond:
            if self._closed:
                return
            self._closed = True
            while self._prefetching:
                self._cond.wait()
        if self._stream is not None:
            self._prefetcher.unregister(id(self))
        self._source.release(self._hold)

    def __enter__(self) -> "FileReader":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
