"""Ranged GETs of a remote store's pack objects, through the on-disk block cache.

A read names an object and a byte range; the blocks it needs come from the cache, or from the
engine: the missing ones grouped into runs of at most MAX_GET_BYTES, each run one ranged GET,
the runs issued in parallel, and a block another thread is already fetching waited for, never
fetched twice. While reads of an object follow each other in order, read-ahead fetches the
blocks after them in the background, its window doubling from READAHEAD_MIN to READAHEAD_MAX
with each read that continues the stream (as hf-mount's adaptive prefetch does), never past
the object's end, and never more than a quarter of the disk cache (so a small cache does not
evict what it read ahead before it is read); a read elsewhere starts the window over. The blocks
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

MAX_GET_BYTES = 8 << 20
READAHEAD_MIN = 8 << 20
READAHEAD_MAX = 128 << 20
FETCH_THREADS = 8
RECENT_BYTES = 32 << 20       # checked blocks kept in memory: a block serves several chunk reads


@dataclass
class FetchStats:
    requests: int = 0
    bytes_fetched: int = 0
    errors: int = 0
    readahead_bytes: int = 0
    seconds: float = 0.0
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
    def read(self, key: str, size: int, offset: int, length: int) -> bytes:
        """Bytes [offset, offset + length) of the object (fewer past its end, as pread).
        RemoteUnavailable (an OSError, EIO) if the engine cannot be reached in time."""
        end = min(offset + length, size)
        if end <= offset:
            return b""
        first, last = offset // BLOCK_BYTES, (end - 1) // BLOCK_BYTES
        self._read_ahead(key, size, first, last)
        blocks = self._blocks(key, size, range(first, last + 1))
        if first == last:
            lo = offset - first * BLOCK_BYTES
            data = blocks[first]
            return data if lo == 0 and end - offset == len(data) else data[lo:lo + end - offset]
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
            return all((key, b) in self._recent or self.cache.contains(key, b) for b in blocks)

    def _block_len(self, size: int, block: int) -> int:
        return min(BLOCK_BYTES, size - block * BLOCK_BYTES)

    def _blocks(self, key: str, size: int, wanted: range) -> dict[int, bytes]:
        got: dict[int, bytes] = {}
        waits: list[Future] = []
        mine: list[int] = []
        for b in wanted:
            data = self._remembered(key, b)
            if data is None:
                data = self.cache.get(key, b, self._block_len(size, b))
                if data is not None:
                    self._remember(key, b, data)
            if data is not None:
                got[b] = data
        with self._lock:
            for b in wanted:
                if b in got:
                    continue
                fut = self._inflight.get((key, b))
                if fut is not None:
                    waits.append(fut)
                else:
                    mine.append(b)
            runs = _runs(mine)
            futures = [self._claim(key, run) for run in runs]
        # the first run here, the others on the pool, so a read of many blocks fetches in parallel
        for run, fut in list(zip(runs, futures))[1:]:
            self._pool.submit(self._fetch_run, key, size, run, fut)
        if runs:
            self._fetch_run(key, size, runs[0], futures[0])
        for fut in [*futures, *waits]:
            got.update(fut.result())
        missing = [b for b in wanted if b not in got]
        if missing:         # a block fetched by a read-ahead run that covered other blocks
            got.update(self._blocks(key, size, range(missing[0], missing[-1] + 1)))
        return got

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

    def _claim(self, key: str, run: range) -> Future:
        fut: Future = Future()
        for b in run:
            self._inflight[(key, b)] = fut
        return fut

    def _fetch_run(self, key: str, size: int, run: range, fut: Future, ahead: bool = False) -> None:
        lo, hi = run.start * BLOCK_BYTES, min(run.stop * BLOCK_BYTES, size)
        t0 = time.perf_counter()
        try:
            data = self.objects.get_range(key, lo, hi)
        except RemoteError as exc:
            self.stats.errors += 1
            self.last_error = str(exc)
            err = exc if isinstance(exc, RemoteUnavailable) else RemoteUnavailable(str(exc))
            self._settle(key, run, fut, error=err)
            return
        except BaseException as exc:            # noqa: BLE001 -- whoever waits gets it
            self._settle(key, run, fut, error=exc)
            return
        dt = time.perf_counter() - t0
        self.stats.requests += 1
        self.stats.bytes_fetched += len(data)
        self.stats.seconds += dt
        self.stats.latencies.append(dt)
        if ahead:
            self.stats.readahead_bytes += len(data)
        self.last_ok, self.last_error = time.time(), None
        out = {}
        view = memoryview(data)
        for b in run:
            out[b] = piece = bytes(view[(b - run.start) * BLOCK_BYTES:(b - run.start + 1) * BLOCK_BYTES])
            self.cache.put(key, b, piece)      # before the run is settled: a block is always somewhere
            self._remember(key, b, piece)
        self._settle(key, run, fut, result=out)

    def _settle(self, key: str, run: range, fut: Future, result=None, error=None) -> None:
        with self._lock:
            for b in run:
                if self._inflight.get((key, b)) is fut:
                    del self._inflight[(key, b)]
        if error is not None:
            fut.set_exception(error)
        else:
            fut.set_result(result)

    # -- read-ahead -------------------------------------------------------------------------------
    def _read_ahead(self, key: str, size: int, first: int, last: int) -> None:
        with self._lock:
            s = self._streams.get(key)
            if s is None or not s.next_block - 1 <= first <= s.next_block:
                self._streams.pop(key, None)
                self._streams[key] = _Stream(last + 1, min(READAHEAD_MIN, self._ahead_max))     # a new stream: no read-ahead yet
                if len(self._streams) > 256:
                    self._streams.pop(next(iter(self._streams)))
                return
            s.window = min(self._ahead_max, s.window * 2)
            s.next_block = max(s.next_block, last + 1)
            stop = min(-(-size // BLOCK_BYTES), last + 1 + s.window // BLOCK_BYTES)
            start = max(last + 1, s.checked)
            ahead = [b for b in range(start, stop) if (key, b) not in self._inflight and (key, b) not in self._recent]
            on_disk = [b for b in ahead if self.cache.contains(key, b)]
            todo = [b for b in ahead if b not in set(on_disk)]
            runs = _runs(todo)
            room = 2 * self._threads - self._ahead
            runs = runs[:max(0, room)]
            # what was looked at and is cached or on its way needs no second look by the next read
            s.checked = runs[-1].stop if len(runs) < len(_runs(todo)) else stop
            futures = [self._claim(key, run) for run in runs]
            self._ahead += len(runs)
        for run, fut in zip(runs, futures):
            self._pool.submit(self._ahead_run, key, size, run, fut)
        for b in on_disk:           # cached blocks: have the kernel read them in meanwhile
            self.cache.advise(key, b)

    def _ahead_run(self, key: str, size: int, run: range, fut: Future) -> None:
        try:
            self._fetch_run(key, size, run, fut, ahead=True)
            try:
                fut.result()
            except BaseException:           # noqa: BLE001 -- a read that needs it fetches it again
                pass
        finally:
            with self._lock:
                self._ahead -= 1

    def close(self) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)


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
