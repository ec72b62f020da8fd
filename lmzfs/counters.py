"""Counters of the read path that a running mount reports (`lmz stats`, /.lmzfs/stats.json):
the chunk source counts decodes, the readers count reads and read-ahead, into one ReadCounters."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields


@dataclass
class ReadCounters:
    started: float = field(default_factory=time.time)
    reads: int = 0
    bytes_served: int = 0
    chunks_decoded: int = 0
    segments_decoded: int = 0        # parts of chunks decoded alone for reads that needed no more
    part_decoders_built: int = 0     # chunks whose params were parsed and tables built to decode parts
    bytes_decoded: int = 0
    decode_seconds: float = 0.0
    readahead_chunks: int = 0        # chunks decoded ahead of a sequential reader
    readahead_hits: int = 0          # reads served entirely from chunks that read-ahead decoded
    chunks_released: int = 0         # chunks dropped from the cache once a sequential reader had all of them
    corrupt_chunks: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **deltas) -> None:
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self) -> dict:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if not f.name.startswith("_")}
