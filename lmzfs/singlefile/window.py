"""Run a function over a stream of jobs in a thread pool, in order, with bounded memory.

Encoding and decoding release the GIL (zstd, numpy, zlib), so threads give real parallelism.
At most ``max_jobs`` jobs, and no more than ``max_bytes`` of their weight beyond the first, are
in flight at once: memory stays bounded however long the stream is.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, Iterable, Iterator, TypeVar

from lmzfs.workpool import OrderedWindow, default_workers, window_limit, worker_pool

T = TypeVar("T")

WINDOW_BYTES = 32 << 20


def ordered_map(fn: Callable[..., T], jobs: Iterable[tuple[tuple, int]], *, workers: int | None = None,
                max_bytes: int = WINDOW_BYTES) -> Iterator[T]:
    """Yield ``fn(*args)`` for each ``(args, weight)`` of ``jobs``, in order.

    An exception from ``fn`` is raised when its result is due; an exception from ``jobs`` as soon
    as it happens. Either way the jobs still queued are cancelled and running ones awaited.
    """
    workers = workers or default_workers()
    ready: deque[T] = deque()
    with worker_pool(workers, "lmz-pack") as pool:
        window = OrderedWindow(pool, window_limit(workers), lambda _, got: ready.append(got), max_bytes=max_bytes)
        try:
            for args, weight in jobs:
                window.submit(None, fn, *args, weight=weight)
                while ready:
                    yield ready.popleft()
            window.drain()
            while ready:
                yield ready.popleft()
        finally:
            window.cancel()
