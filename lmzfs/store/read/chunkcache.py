"""Decoded chunks, shared by every open file, bounded in bytes, least recently used out first.

Besides whole chunks it holds parts of chunks and the part decoders they are made with (objects
that state their memory as ``nbytes``), under keys of their own, in the same budget.

A chunk that one thread is decoding is awaited by the others, never decoded twice. A chunk can
also be lent: its loader's buffer goes to the one caller that needs a few of its bytes at once,
and the copy into the cache (settle) follows on another thread while the others wait for it.

The byte budget holds at every instant: what a value needs is evicted before it goes in, and the
cache records the most it ever held (peak_bytes), which tests and stats read.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

from lmzfs.codecs.base import Buffer
from lmzfs.codecs.plainbytes import to_bytes
from lmzfs.counters import tally_wait


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0
    waits: int = 0          # a reader waited for another thread's decode of the same chunk
    decoded_bytes: int = 0


class _InFlight:
    def __init__(self) -> None:
        self.done = threading.Event()
        self.value: bytes | None = None
        self.error: BaseException | None = None
        self.dropped = False    # discarded before it landed: hand it to the waiters, do not keep it


def _nbytes(value) -> int:
    return len(value) if isinstance(value, (bytes, bytearray)) else value.nbytes


class ChunkCache:
    def __init__(self, capacity_bytes: int):
        self.capacity = max(0, capacity_bytes)
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, bytes] = OrderedDict()
        self._inflight: dict[bytes, _InFlight] = {}
        self._bytes = 0
        self._peak = 0
        self.stats = CacheStats()

    @property
    def size_bytes(self) -> int:
        return self._bytes

    @property
    def peak_bytes(self) -> int:
        """The most bytes the cache has held at any instant."""
        return self._peak

    def _hit_locked(self, key: bytes) -> bytes | None:
        value = self._items.get(key)
        if value is not None:
            self._items.move_to_end(key)
            self.stats.hits += 1
        return value

    def peek(self, key: bytes) -> bytes | None:
        """The cached value, or None; never loads, never waits."""
        with self._lock:
            return self._hit_locked(key)

    def __contains__(self, key: bytes) -> bool:
        with self._lock:
            return key in self._items or key in self._inflight

    def get(self, key: bytes, load: Callable[[], bytes]) -> bytes:
        value, flight = self._claim(key)
        if flight is None:
            return value
        try:
            value = load()
        except BaseException as exc:
            self._land(key, flight, error=exc)
            raise
        self._land(key, flight, value=value)
        return value

    def lend(self, key: bytes, load: Callable[[], Buffer]) -> tuple[Buffer, Callable[[], None] | None]:
        """get(), for a caller that needs a few of the bytes at once and the rest later: a value
        that this call loads comes back as load() returned it (any buffer), not yet cached, with a
        settle function that copies it into bytes, caches those and hands them to the threads
        waiting for the key. The caller must call settle exactly once (from any thread), and not
        use the buffer afterwards; settle never raises (a copy that fails is the waiters' error).
        settle is None for a value found cached or decoded by another thread (then bytes, as
        get() returns)."""
        value, flight = self._claim(key)
        if flight is None:
            return value, None
        try:
            lent = load()
        except BaseException as exc:
            self._land(key, flight, error=exc)
            raise

        def settle() -> None:
            value, error = None, None
            try:
                value = to_bytes(lent)
            except BaseException as exc:    # no memory for the copy: the waiters get the error;
                error = exc                 # the lender, answered already, does not
            self._land(key, flight, value=value, error=error)
        return lent, settle

    def _claim(self, key: bytes) -> tuple[bytes | None, _InFlight | None]:
        """(the value, None) if cached or once another thread's load of it lands (its error is
        raised here); else (None, a new flight) that the caller must load and land."""
        with self._lock:
            value = self._hit_locked(key)
            if value is not None:
                return value, None
            flight = self._inflight.get(key)
            if flight is None:
                flight = self._inflight[key] = _InFlight()
                self.stats.misses += 1
                return None, flight
            self.stats.waits += 1
        tally_wait()
        flight.done.wait()
        if flight.error is not None:
            raise flight.error
        return flight.value, None

    def _land(self, key: bytes, flight: _InFlight, value: bytes | None = None,
              error: BaseException | None = None) -> None:
        """End a flight: cache its value (or record its error), then wake its waiters."""
        flight.value, flight.error = value, error
        if value is not None and not flight.dropped:
            self._insert(key, value)
        with self._lock:
            del self._inflight[key]
        flight.done.set()

    def _insert(self, key: bytes, value: bytes) -> None:
        with self._lock:
            self.stats.decoded_bytes += _nbytes(value)
            if _nbytes(value) > self.capacity:
                return
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= _nbytes(old)
            while self._bytes + _nbytes(value) > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= _nbytes(evicted)
            self._items[key] = value
            self._bytes += _nbytes(value)
            self._peak = max(self._peak, self._bytes)

    def put(self, key: bytes, value: bytes) -> None:
        """Cache a value decoded along with another (not awaited by anyone)."""
        self._insert(key, value)

    def discard(self, key: bytes) -> bool:
        """Drop a cached value; True if it was there. A value still being decoded or settled (a
        lent one, whose reader may be done with it first) is not kept once it lands."""
        with self._lock:
            value = self._items.pop(key, None)
            if value is None:
                flight = self._inflight.get(key)
                if flight is not None:
                    flight.dropped = True
                return False
            self._bytes -= _nbytes(value)
            return True

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
