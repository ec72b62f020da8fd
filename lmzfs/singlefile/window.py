"""Run a function over a stream of jobs in a thread pool, in order, with bounded memory.

Encoding and decoding release the GIL (zstd, numpy, zlib), so threads give real parallelism.
At most ``max_jobs`` jobs, and no more than ``max_bytes`` of their weight beyond the first, are
in flight at once: memory stays bounded however long the stream is.
"""
from __future__ import annotations

import os
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Callable, Iterable, Iterator, TypeVar

T = TypeVar("T")

WINDOW_BYTES = 32 << 20


def default_workers() -> int:
    return max(1, min(os.cpu_count() or 2, 16))


def ordered_map(fn: Callable[..., T], jobs: Iterable[tuple[tuple, int]], *, workers: int | None = None,
                max_bytes: int = WINDOW_BYTES) -> Iterator[T]:
    """Yield ``fn(*args)`` for each ``(args, weight)`` of ``jobs``, in order.

    An exception from ``fn`` is raised when its result is due; an exception from ``jobs`` as soon
    as it happens. Either way the jobs still queued are cancelled and running ones awaited.
    """
    workers = workers or default_workers()
    max_jobs = 2 * workers + 2
    window: deque[tuple[Future, int]] = deque()
    in_flight = 0
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="lmz-pack") as pool:
        try:
            for args, weight in jobs:
                window.append((pool.submit(fn, *args), weight))
                in_flight += weight
                while len(window) > max_jobs or (len(window) > 1 and in_flight > max_bytes):
                    fut, w = window.popleft()
                    in_flight -= w
                    yield fut.result()
            while window:
                fut, _ = window.popleft()
                yield fut.result()
        finally:
            for fut, _ in window:
                fut.cancel()
