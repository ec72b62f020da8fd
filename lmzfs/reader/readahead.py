"""Read-ahead: recognise sequential streams and decode the chunks they will ask for next.

The kernel asks a FUSE daemon for at most 128 KiB at a time, so a lone sequential reader would
wait for every chunk decode. Each open file keeps a `StreamState`; a read that starts near where
the previous one ended (mmap faults and the kernel's own read-ahead arrive slightly out of
order, hence the slack) grows the window once START_AFTER such reads came in a row, any other
read resets it; the window never outgrows what the stream has read since it began. Prefetches go through the shared chunk cache, so a chunk being decoded is
awaited, never decoded twice, and the cache's byte budget bounds everything read ahead. With
many active streams each one's window shrinks so that together they stay within half the cache.

A free decode thread takes the oldest queued chunk whose payload is at hand (a remote store's
ranged GETs, several in flight, deliver blocks out of order), and the oldest chunk only when none
of the first SCAN_JOBS is: decoding follows the bytes as they arrive instead of waiting, in file
order, on the one GET that is still on the wire while the others' blocks sit decoded by nobody.
A local store's chunks are always at hand: they are decoded in file order.
"""
from __future__ import annotations

import itertools
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable

SLACK = 2 << 20                 # how far from the expected offset a read still counts as sequential
# sequential reads in a row before anything is read ahead: random reads land within the slack of
# the previous one now and then, and a read-ahead they trigger delays the next miss by a decode
START_AFTER = 2
MIN_WINDOW = 2 << 20            # bytes read ahead once a stream is recognised
MAX_WINDOW = 32 << 20           # bytes read ahead by one stream at full speed
ACTIVE_SECONDS = 1.0            # a stream with no read for this long no longer counts as active
SCAN_JOBS = 32                  # queued read-ahead jobs a free decode thread looks through for one at hand


@dataclass
class StreamState:
    expected: int = -1          # where the next sequential read would start
    window: int = 0             # bytes to keep decoded ahead of the reader
    prefetched_upto: int = 0    # plain offset up to which chunks were already scheduled
    last_access: float = 0.0
    sequential_reads: int = 0
    started: int = 0            # where the stream began: what it has read since bounds its window

    @property
    def streaming(self) -> bool:
        """The last read continued a sequential stream (START_AFTER reads in a row or more)."""
        return self.sequential_reads >= START_AFTER


class Prefetcher:
    """One pool of decode threads shared by every open file of an archive."""

    def __init__(self, workers: int, cache_capacity: int):
        self._jobs: deque[tuple[Callable[[], object], Callable[[], bool] | None]] = deque()
        self._jobs_ready = threading.Condition()
        self._closed = False
        self._decoders = [threading.Thread(target=self._decode_jobs, name=f"lmz-readahead_{k}", daemon=True)
                          for k in range(max(1, workers))]
        for thread in self._decoders:
            thread.start()
        # Beside a reader's own thread, these decode the other pieces of a read that misses more
        # than one piece (FileReader.pread), so that a read nothing was read ahead for (a loader's
        # scattered touch, the start of a stream) is decoded on every CPU: a pool of its own, so
        # such a piece never queues behind the read-ahead's guesses.
        self.helpers = max(0, workers - 1)
        self._helper_pool = ThreadPoolExecutor(max_workers=self.helpers, thread_name_prefix="lmz-beside") \
            if self.helpers else None
        self._cache_capacity = cache_capacity
        self._lock = threading.Lock()
        self._streams: dict[int, StreamState] = {}

    def register(self, key: int) -> StreamState:
        state = StreamState()
        with self._lock:
            self._streams[key] = state
        return state

    def unregister(self, key: int) -> None:
        with self._lock:
            self._streams.pop(key, None)

    def active_streams(self) -> int:
        now = time.monotonic()
        with self._lock:
            return sum(1 for s in self._streams.values() if s.window and now - s.last_access < ACTIVE_SECONDS)

    def window_limit(self) -> int:
        """Per-stream window: at most MAX_WINDOW, and all active streams within half the cache."""
        share = self._cache_capacity // (2 * max(1, self.active_streams()))
        return max(0, min(MAX_WINDOW, share))

    def note_read(self, state: StreamState, offset: int, end: int) -> tuple[int, int] | None:
        """Record a read of [offset, end); return the plain byte range to prefetch, if any.
        Afterwards ``state.streaming`` tells whether this read continued a recognised stream."""
        now = time.monotonic()
        sequential = state.expected >= 0 and state.expected - SLACK <= offset <= state.expected + SLACK
        state.last_access = now
        state.expected = max(end, state.expected) if sequential else end
        if not sequential:
            state.window = 0
            state.sequential_reads = 0
            state.prefetched_upto = end
            state.started = offset
            return None
        state.sequential_reads += 1
        if state.sequential_reads < START_AFTER:
            return None
        # The window doubles with each read, but never past what the stream has read so far: a
        # loader that reads a tensor and jumps to the next would otherwise have decoded up to
        # MAX_WINDOW past each one, evicting from the cache what it had yet to read.
        limit = min(self.window_limit(), max(MIN_WINDOW, state.expected - state.started))
        state.window = min(limit, max(MIN_WINDOW, state.window * 2) if state.window else MIN_WINDOW)
        if state.window < MIN_WINDOW // 2:
            return None         # the cache is too small to read ahead without evicting what is in use
        start = max(state.prefetched_upto, end)
        stop = end + state.window
        if stop <= start:
            return None
        state.prefetched_upto = stop
        return start, stop

    def submit(self, load: Callable[[], object], ready: Callable[[], bool] | None = None) -> None:
        """Queue `load` for a decode thread; `ready`: whether its input is at hand now (None: it
        always is). Called with no lock of the reader's or the store's held."""
        with self._jobs_ready:
            if self._closed:
                return
            self._jobs.append((load, ready))
            self._jobs_ready.notify()

    def _next_job(self) -> Callable[[], object]:
        """The oldest of the first SCAN_JOBS queued jobs whose input is at hand, else the oldest."""
        for k, (load, ready) in enumerate(itertools.islice(self._jobs, SCAN_JOBS)):
            try:
                at_hand = ready is None or ready()
            except Exception:           # a decode thread must outlive a question it cannot answer
                at_hand = False
            if at_hand:
                del self._jobs[k]
                return load
        return self._jobs.popleft()[0]

    def _decode_jobs(self) -> None:
        while True:
            with self._jobs_ready:
                while not self._jobs and not self._closed:
                    self._jobs_ready.wait()
                if self._closed:
                    return
                load = self._next_job()
            _quietly(load)

    def beside(self, load: Callable[[], object]) -> Future | None:
        """Run load on a helper thread; its Future, or None if there is none (then the caller
        runs it itself)."""
        if self._helper_pool is None or self._closed:
            return None
        try:
            return self._helper_pool.submit(load)
        except RuntimeError:        # shut down meanwhile
            return None

    def close(self) -> None:
        """Queued jobs are dropped; the ones running are waited for."""
        with self._jobs_ready:
            self._closed = True
            self._jobs.clear()
            self._jobs_ready.notify_all()
        for thread in self._decoders:
            thread.join()
        if self._helper_pool is not None:
            self._helper_pool.shutdown(wait=True)


def _quietly(load: Callable[[], object]) -> None:
    # A prefetch that fails (damaged chunk) is not an error yet: the reader that asks for that
    # chunk decodes it again and gets the error itself.
    try:
        load()
    except Exception:
        pass
