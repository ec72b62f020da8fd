"""Ranged GETs of a remote store's pack objects, through the on-disk block cache.

A read names an object and a byte range; the blocks it needs come from the cache, or from the
engine: the missing ones grouped into runs of at most MAX_GET_BYTES, each run one ranged GET,
the runs issued in parallel, and a block another thread is already fetching waited for, never
fetched twice. A GET's body is taken as it streams in: each block is handed on as soon as its
last byte has arrived, so decoding starts on the first block of a GET while the rest is still on
the wire. While reads of an object follow each other in order, read-ahead fetches the blocks after
them in the background, its window doubling from READAHEAD_MIN to READAHEAD_MAX with each read that
continues the stream (as hf-mount's adaptive prefetch does), never past the object's end, and never
more than a quarter of the disk cache (so a small cache does not evict what it read ahead before it
is read); a read elsewhere starts the window over. At most AHEAD_RUNS read-ahead GETs are in flight,
the window refilled in order as each ends: GETs in flight share the link, so with fewer of them the
bytes come about in the order the reader needs them (docs/remote.md, "Over a real link"). The blocks
read or fetched last are kept in memory (RECENT_BYTES), checked once: a 1 MiB block holds several
chunks' payloads, which would otherwise each read and check it from disk again.
"""
from __future__ import annotations

import threading
import time
from collections import OrderedDict, deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

from lmzfs.store.remote.blockcache import BLOCK_BYTES, BlockCache
from lmzfs.store.remote.objects import ObjectStore, RemoteError, RemoteUnavailable

MAX_GET_BYTES = 4 << 20
READAHEAD_MIN = 8 << 20
READAHEAD_MAX = 128 << 20
FETCH_THREADS = 8
# read-ahead GETs in flight at once, for all streams: enough to keep a link full, few enough that
# the bytes arrive about in the order the reader wants them (GETs in flight share the link: with 8
# of 8 MiB, the block the decoder waits for came at an eighth of the link's rate, issue 50)
AHEAD_RUNS = 4
RECENT_BYTES = 32 << 20       # checked blocks kept in memory: a block serves several chunk reads


@dataclass
class FetchStats:
    requests: int = 0           # ranged GETs the engine answered in full
    bytes_fetched: int = 0      # bytes those GETs returned
    errors: int = 0             # GETs that failed after their retries
    readahead_bytes: int = 0    # of bytes_fetched, those asked for ahead of a reader
    seconds: float = 0.0        # wall time those GETs took
    latencies: deque = field(default_factory=lambda: deque(maxlen=1024))

    def snapshot(self) -> dict:
        lat = sorted(self.latencies)
        return {"requests": self.requests, "bytes_fetched": self.bytes_fetched, "errors": self.errors,
                "readahead_bytes": self.readahead_bytes,
                "latency_ms_mean": round(1000 * self.seconds / self.requests, 2) if self.requests else None,
                "latency_ms_p99": round(1000 * lat[min(len(lat) - 1, int(len(lat) * 0.99))], 2) if lat else None}


@dataclass
class _Stream:
    next_block: int
    window: int
    checked: int = 0         # blocks below this were looked at by an earlier read-ahead


class RangeFetcher:
    """Thread-safe."""

    def __init__(self, objects: ObjectStore, cache: BlockCache, *, threads: int = FETCH_THREADS):
        self.objects = objects
        self.cache = cache
        self.stats = FetchStats()
        self._lock = threading.Lock()
        self._inflight: dict[tuple[str, int], Future] = {}
        self._streams: dict[str, _Stream] = {}
        self._ahead = 0                         # read-ahead runs in flight
        self._threads = threads
        self._ahead_max = max(BLOCK_BYTES, min(READAHEAD_MAX, cache.capacity // 4))
        self._recent: OrderedDict[tuple[str, int], bytes] = OrderedDict()
        self._recent_bytes = 0
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="lmz-fetch")
        self.last_error: str | None = None
        self.last_ok: float | None = None

    # -- reading ----------------------------------------------------------------------------------
    def read(self, key: str, size: int, offset: int, length: int) -> bytes | memoryview:
        """Bytes [offset, offset + length) of the object (fewer past its end, as pread), as bytes or a
        view of a block. RemoteUnavailable (an OSError, EIO) if the engine cannot be reached in time."""
        end = min(offset + length, size)
        if end <= offset:
            return b""
        first, last = offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        self._read_ahead(key, size, first, last)
        blocks = self._blocks(key, size, range(first, last + 1))
        if first == last:
            lo = offset - first * BLOCK_BYTES
            data = blocks[first]
            return data if lo == 0 and end - offset == len(data) else memoryview(data)[lo:lo + end - offset]
        parts = []
        for b in range(first, last + 1):
            lo = max(offset, b * BLOCK_BYTES) - b * BLOCK_BYTES
            hi = min(end, (b + 1) * BLOCK_BYTES) - b * BLOCK_BYTES
            parts.append(memoryview(blocks[b])[lo:hi])
        return b"".join(parts)

    def at_hand(self, key: str, size: int, offset: int, length: int) -> bool:
        """Whether every block of the range is in memory or in the disk cache."""
        end = min(offset + length, size)
        if end <= offset:
            return True
        with self._lock:
            blocks = range(offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES + 1)
            return all(self._resting(key, b) for b in blocks)

    def _block_len(self, size: int, block: int) -> int:
        return min(BLOCK_BYTES, size - block * BLOCK_BYTES)

    def _blocks(self, key: str, size: int, wanted: range) -> dict[int, bytes]:
        got: dict[int, bytes] = {}
        todo = list(wanted)
        while todo:
            for b in todo:
                data = self._at_rest(key, size, b)
                if data is not None:
                    got[b] = data
            waits: list[tuple[int, Future]] = []
            mine: list[int] = []
            landed: list[int] = []
            with self._lock:
                for b in todo:
                    if b in got:
                        continue
                    fut = self._inflight.get((key, b))
                    if fut is not None:
                        waits.append((b, fut))
                    elif self._resting(key, b):
                        # a fetch settled it after it was looked for above (a block leaves the
                        # in-flight set only once it is cached): read it, never fetch it again
                        landed.append(b)
                    else:
                        mine.append(b)
                runs = _runs(mine)
                claimed = [self._claim(key, run) for run in runs]
            # the first run here, the others on the pool, so a read of many blocks fetches in parallel
            for run, futs in list(zip(runs, claimed))[1:]:
                self._start(self._fetch_run, key, size, run, futs)
            if runs:
                self._fetch_run(key, size, runs[0], claimed[0])
            for run, futs in zip(runs, claimed):
                for b, fut in zip(run, futs):
                    got[b] = fut.result()
            for b, fut in waits:
                got[b] = fut.result()
            todo = landed       # read where they rest; one found damaged there is dropped, then fetched
        return got

    def _resting(self, key: str, block: int) -> bool:
        """Under the lock: the block is in memory or the disk cache (fetched and settled)."""
        return (key, block) in self._recent or self.cache.contains(key, block)

    def _at_rest(self, key: str, size: int, block: int) -> bytes | None:
        """The block from memory or the disk cache (remembered then), or None."""
        data = self._remembered(key, block)
        if data is None:
            data = self.cache.get(key, size, block)
            if data is not None:
                self._remember(key, block, data)
        return data

    def _remembered(self, key: str, block: int) -> bytes | None:
        with self._lock:
            data = self._recent.get((key, block))
            if data is not None:
                self._recent.move_to_end((key, block))
            return data

    def _remember(self, key: str, block: int, data: bytes) -> None:
        with self._lock:
            if (key, block) in self._recent:
                return
            self._recent[(key, block)] = data
            self._recent_bytes += len(data)
            while self._recent_bytes > RECENT_BYTES:
                self._recent_bytes -= len(self._recent.popitem(last=False)[1])

    def _claim(self, key: str, run: range) -> list[Future]:
        """A future per block of the run, each settled as soon as its block has arrived."""
        futs = [Future() for _ in run]
        for b, fut in zip(run, futs):
            self._inflight[(key, b)] = fut
        return futs

    def _fetch_run(self, key: str, size: int, run: range, futs: list[Future], ahead: bool = False) -> None:
        """One ranged GET for the run's blocks, its body streamed: each block is checked into the
        cache and handed to whoever waits for it as soon as its last byte is in, while the rest of
        the GET is still on the wire (a decoder starts on the first block of an 8 MiB GET without
        waiting for its last)."""
        lo, hi = run.start * BLOCK_BYTES, min(run.stop * BLOCK_BYTES, size)
        t0 = time.perf_counter()
        done = 0                    # blocks of the run settled
        pending: list[memoryview] = []
        have = 0
        try:
            for view in self.objects.get_range_pieces(key, lo, hi, BLOCK_BYTES):
                pending.append(view)
                have += len(view)
                while done < len(run):
                    need = self._block_len(size, run.start + done)
                    if have < need:
                        break
                    piece = _take(pending, need)
                    have -= need
                    self._arrived(key, size, run.start + done, piece, futs[done], ahead)
                    done += 1
            if done < len(run):
                raise RemoteUnavailable(f"{self.objects.url}/{key}: the GET of bytes {lo}..{hi} ended early")
        except RemoteError as exc:
            self.stats.errors += 1
            self.last_error = str(exc)
            err = exc if isinstance(exc, RemoteUnavailable) else RemoteUnavailable(str(exc))
            self._fail(key, run, futs, done, err)
            return
        except BaseException as exc:            # noqa: BLE001 -- whoever waits gets it
            self._fail(key, run, futs, done, exc)
            return
        dt = time.perf_counter() - t0
        self.stats.requests += 1
        self.stats.bytes_fetched += hi - lo
        self.stats.seconds += dt
        self.stats.latencies.append(dt)
        if ahead:
            self.stats.readahead_bytes += hi - lo
        self.last_ok, self.last_error = time.time(), None

    def _arrived(self, key: str, size: int, block: int, data: bytes, fut: Future, ahead: bool) -> None:
        """Whoever waits gets the block first; then it is written to the disk cache, and only then
        is it no longer in flight (a read meanwhile finds the settled future, never a miss),
        whatever the cache does."""
        fut.set_result(data)
        try:
            self.cache.put(key, size, block, data)
            if not ahead:
                self._remember(key, block, data)
        finally:
            with self._lock:
                if self._inflight.get((key, block)) is fut:
                    del self._inflight[(key, block)]

    def _fail(self, key: str, run: range, futs: list[Future], done: int, error: BaseException) -> None:
        """The blocks of the run not yet settled fail with error (those settled keep their bytes):
        every block claimed is settled one way or the other, so that no reader waits for ever."""
        with self._lock:
            for b, fut in list(zip(run, futs))[done:]:
                if self._inflight.get((key, b)) is fut:
                    del self._inflight[(key, b)]
        for fut in futs[done:]:
            if not fut.done():          # a block handed on before what failed after it (its cache write)
                fut.set_exception(error)

    # -- read-ahead -------------------------------------------------------------------------------
    def _read_ahead(self, key: str, size: int, first: int, last: int) -> None:
        with self._lock:
            s = self._streams.get(key)
            if s is None or not s.next_block - 1 <= first <= s.next_block:
                if s is not None and last < s.next_block - 1 and all(
                        self._resting(key, b) for b in range(first, last + 1)):
                    return      # a look back at what this stream read (a chunk stored once, read twice)
                self._streams.pop(key, None)
                self._streams[key] = _Stream(last + 1, min(READAHEAD_MIN, self._ahead_max))     # a new stream: no read-ahead yet
                if len(self._streams) > 256:
                    self._streams.pop(next(iter(self._streams)))
                return
            if last < s.next_block:
                return          # within the block read last: the window was planned for it
            s.window = min(self._ahead_max, s.window * 2)
            s.next_block = last + 1
            issued = self._plan_ahead(key, size, s)
        self._submit_ahead(key, size, issued)

    def _plan_ahead(self, key: str, size: int, s: _Stream) -> list[tuple[range, list[Future]]]:
        """Under the lock: the runs of the stream's window not yet cached or in flight, in order,
        as many as AHEAD_RUNS allows in flight, claimed. What is in the disk cache is left to the
        kernel's own read-ahead: an object's blocks lie in one file, in order, and a stream reads
        them in order (asking it to read them in with POSIX_FADV_WILLNEED made a warm read
        slower, not faster: the advice's reads compete with the kernel's own)."""
        room = AHEAD_RUNS - self._ahead
        stop = min(-(-size // BLOCK_BYTES), s.next_block + s.window // BLOCK_BYTES)
        todo: list[int] = []
        complete = True
        for b in range(max(s.next_block, s.checked), stop):
            if (key, b) in self._inflight or (key, b) in self._recent:
                continue
            if self.cache.contains(key, b):
                continue
            if len(todo) >= max(0, room) * (MAX_GET_BYTES // BLOCK_BYTES):
                complete = False
                break
            todo.append(b)
        runs = _runs(todo)
        if complete and len(runs) <= max(0, room):
            s.checked = stop                # all below is cached or on its way: no second look
        runs = runs[:max(0, room)]
        self._ahead += len(runs)
        return [(run, self._claim(key, run)) for run in runs]

    def _submit_ahead(self, key: str, size: int, issued: list[tuple[range, list[Future]]]) -> None:
        for run, futs in issued:
            if not self._start(self._ahead_run, key, size, run, futs):
                with self._lock:
                    self._ahead -= 1

    def _start(self, fetch, key: str, size: int, run: range, futs: list[Future]) -> bool:
        """fetch(key, size, run, futs) on the pool; False if the pool is closing, the run's blocks
        then failed rather than left claimed (a read of them would wait for ever)."""
        try:
            self._pool.submit(fetch, key, size, run, futs)
            return True
        except RuntimeError:
            self._fail(key, run, futs, 0, RemoteUnavailable("the fetcher is closed"))
            return False

    def _ahead_run(self, key: str, size: int, run: range, futs: list[Future]) -> None:
        try:
            self._fetch_run(key, size, run, futs, ahead=True)     # a failure reaches only those who wait
        finally:
            with self._lock:
                self._ahead -= 1
                s = self._streams.get(key)
                # the window goes on filling while the reader waits on a block, not only when it reads
                issued = self._plan_ahead(key, size, s) if s is not None and s.window > 0 else []
            self._submit_ahead(key, size, issued)

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


def _take(pending: list[memoryview], n: int) -> bytes:
    """The first n bytes of the pieces as one bytes object (one copy), removed from the list."""
    parts = []
    at = 0
    while at < n:
        view = pending[0]
        k = min(len(view), n - at)
        parts.append(view[:k])
        at += k
        if k == len(view):
            pending.pop(0)
        else:
            pending[0] = view[k:]
    return b"".join(parts)


def _runs(blocks: list[int]) -> list[range]:
    """Consecutive blocks grouped into runs of at most MAX_GET_BYTES."""
    per = max(1, MAX_GET_BYTES // BLOCK_BYTES)
    out: list[range] = []
    for b in blocks:
        if out and out[-1].stop == b and len(out[-1]) < per:
            out[-1] = range(out[-1].start, b + 1)
        else:
            out.append(range(b, b + 1))
    return out
