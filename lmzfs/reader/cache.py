"""Decoded chunks, shared by every open file, bounded in bytes, least recently used out first.

A chunk that one thread is decoding is awaited by the others, never decoded twice.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable


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


class ChunkCache:
    def __init__(self, capacity_bytes: int):
        self.capacity = max(0, capacity_bytes)
        self._lock = threading.Lock()
        self._items: OrderedDict[bytes, bytes] = OrderedDict()
        self._inflight: dict[bytes, _InFlight] = {}
        self._bytes = 0
        self.stats = CacheStats()

    @property
    def size_bytes(self) -> int:
        return self._bytes

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
        with self._lock:
            value = self._hit_locked(key)
            if value is not None:
                return value
            flight = self._inflight.get(key)
            owner = flight is None
            if owner:
                flight = self._inflight[key] = _InFlight()
                self.stats.misses += 1
            else:
                self.stats.waits += 1
        if not owner:
            flight.done.wait()
            if flight.error is not None:
                raise flight.error
            return flight.value
        try:
            value = load()
        except BaseException as exc:
            flight.error = exc
            raise
        else:
            flight.value = value
            self._insert(key, value)
            return value
        finally:
            with self._lock:
                del self._inflight[key]
            flight.done.set()

    def _insert(self, key: bytes, value: bytes) -> None:
        with self._lock:
            self.stats.decoded_bytes += len(value)
            if len(value) > self.capacity:
                return
            old = self._items.pop(key, None)
            if old is not None:
                self._bytes -= len(old)
            self._items[key] = value
            self._bytes += len(value)
            while self._bytes > self.capacity:
                _, evicted = self._items.popitem(last=False)
                self._bytes -= len(evicted)

    def put(self, key: bytes, value: bytes) -> None:
        """Cache a value decoded along with another (not awaited by anyone)."""
        self._insert(key, value)

    def discard(self, key: bytes) -> bool:
        """Drop a cached value (not one being decoded); True if it was there."""
        with self._lock:
            value = self._items.pop(key, None)
            if value is None:
                return False
            self._bytes -= len(value)
            return True

    def clear(self) -> None:
        with self._lock:
            self._items.clear()
            self._bytes = 0
