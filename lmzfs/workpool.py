"""A thread pool sized to the CPUs this process may use, and the bounded, ordered window of jobs
every encoder and recoder runs on it.

Encoding and decoding release the GIL (zstd, numpy, the compiled tANS loops), so threads give
real parallelism. A window keeps at most `limit` jobs (and, beyond the first, at most
`max_bytes` of their weight) in flight, and lands their results in the order they were
submitted, on the submitting thread: memory stays bounded however long the stream is, and
whatever a result is landed into (a pack, a plan) needs no lock.
"""
from __future__ import annotations

from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Generic, TypeVar

from lmzfs.hostresources import usable_cpus

T = TypeVar("T")

MAX_WORKERS = 16


def default_workers() -> int:
    """The usable CPUs (cgroup- and affinity-aware), at most MAX_WORKERS."""
    return max(1, min(usable_cpus(), MAX_WORKERS))


def window_limit(workers: int) -> int:
    """Jobs in flight that keep `workers` threads busy while results are landed."""
    return 2 * workers + 2


def worker_pool(workers: int | None = None, name: str = "lmz-encode") -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=workers or default_workers(), thread_name_prefix=name)


class OrderedWindow(Generic[T]):
    """Jobs on `pool`, landed in submission order by `land(tag, result)` on the caller's thread.

    An exception from a job is raised when its result is due (by `submit` or `drain`); `cancel`
    drops the jobs still queued, for a caller that stops early."""

    def __init__(self, pool: ThreadPoolExecutor, limit: int, land: Callable[[Any, T], None], *,
                 max_bytes: int | None = None):
        self._pool = pool
        self._limit = limit
        self._land = land
        self._max_bytes = max_bytes
        self._jobs: deque[tuple[Any, Future, int]] = deque()
        self._weight = 0

    def __len__(self) -> int:
        return len(self._jobs)

    def submit(self, tag: Any, fn: Callable[..., T], *args, weight: int = 0, **kwargs) -> None:
        """Start `fn(*args, **kwargs)`; then land results until the window is within its bounds."""
        self._jobs.append((tag, self._pool.submit(fn, *args, **kwargs), weight))
        self._weight += weight
        while len(self._jobs) > self._limit or (
                self._max_bytes is not None and len(self._jobs) > 1 and self._weight > self._max_bytes):
            self._land_oldest()

    def put(self, tag: Any, result: T) -> None:
        """A result already at hand (no job to run): landed in its turn, after those submitted before."""
        fut: Future = Future()
        fut.set_result(result)
        self._jobs.append((tag, fut, 0))
        while len(self._jobs) > self._limit:
            self._land_oldest()

    def drain(self, keep: int = 0) -> None:
        """Land results, oldest first, until at most `keep` jobs are outstanding."""
        while len(self._jobs) > keep:
            self._land_oldest()

    def _land_oldest(self) -> None:
        tag, fut, weight = self._jobs.popleft()
        self._weight -= weight
        self._land(tag, fut.result())

    def cancel(self) -> None:
        for _, fut, _ in self._jobs:
            fut.cancel()
        self._jobs.clear()
        self._weight = 0
