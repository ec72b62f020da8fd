"""``LMZ_TRACE_READS=FILE``: the daemon appends one line per FUSE read it answers to FILE, so that
what a loader asks of the mount (offsets, sizes, order) and what each request cost can be studied.

Each line is tab-separated, written when the request is answered (so requests answered out of
order appear out of order), and each mount's lines start with a ``#`` line naming the columns:

    time_s   seconds since the trace started (monotonic), when the request arrived
    fh       the open file handle (one per open(); the kernel's read-ahead of an mmap shares it)
    file     model/path of the file
    offset   where the request starts, bytes
    size     bytes the kernel asked for
    served   bytes answered (short only at the end of the file)
    us       microseconds from the request's arrival to its answer
    how      inline (answered on the event loop) or thread (handed to a read thread)
    decoded  plain bytes the request's own thread decoded to answer it (0: served from the cache)
    waits    decodes by other threads (read-ahead, another reader) it waited for

Only reads of stored files are traced (not the /.lmzfs files). The file is written through a
buffer, flushed at least once a second and when the mount ends; a trace costs one formatted
line per request and is meant for study, not for a mount in service.
"""
from __future__ import annotations

import os
import time
from typing import Callable

from lmzfs.counters import thread_tally

TRACE_ENV = "LMZ_TRACE_READS"
COLUMNS = ("time_s", "fh", "file", "offset", "size", "served", "us", "how", "decoded", "waits")
FLUSH_SECONDS = 1.0


def counted(read: Callable[[int, int], bytes | None], offset: int, size: int) -> tuple[bytes | None, int, int]:
    """read(offset, size), and the bytes the calling thread decoded and the decodes it waited for."""
    decoded, waits = thread_tally()
    data = read(offset, size)
    decoded2, waits2 = thread_tally()
    return data, decoded2 - decoded, waits2 - waits


class ReadTrace:
    """The open trace file; used from the event loop's thread only."""

    def __init__(self, path: str | os.PathLike):
        self._file = open(path, "a", buffering=1 << 16)
        self._start = time.monotonic()
        self._flushed = self._start
        self._file.write("# " + "\t".join(COLUMNS) + "\n")

    @classmethod
    def from_environment(cls) -> "ReadTrace | None":
        path = os.environ.get(TRACE_ENV)
        return cls(path) if path else None

    def now(self) -> float:
        return time.monotonic()

    def record(self, arrived: float, fh: int, name: str, offset: int, size: int, served: int, how: str,
               decoded: int, waits: int) -> None:
        now = time.monotonic()
        self._file.write(f"{arrived - self._start:.6f}\t{fh}\t{name}\t{offset}\t{size}\t{served}\t"
                         f"{(now - arrived) * 1e6:.0f}\t{how}\t{decoded}\t{waits}\n")
        if now - self._flushed >= FLUSH_SECONDS:
            self._file.flush()
            self._flushed = now

    def close(self) -> None:
        self._file.close()
