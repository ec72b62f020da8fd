"""Counters of the read path that a running mount reports (`lmz stats`, /.lmzfs/stats.json):
the chunk source counts decodes, the readers count reads and read-ahead, into one ReadCounters.
Besides, each thread keeps a tally of the decoding it did itself and of the decodes it waited for
(``thread_tally``), which the mount's read trace (``LMZ_TRACE_READS``) takes per request."""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field, fields


class _Tally(threading.local):
    decoded_bytes = 0       # plain bytes this thread decoded (chunks and parts of chunks)
    waits = 0               # decodes by other threads this thread waited for


_TALLY = _Tally()


def thread_tally() -> tuple[int, int]:
    """(plain bytes decoded, other threads' decodes waited for) by the calling thread so far."""
    return _TALLY.decoded_bytes, _TALLY.waits


def tally_decoded(nbytes: int) -> None:
    _TALLY.decoded_bytes += nbytes


def tally_wait() -> None:
    _TALLY.waits += 1


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
