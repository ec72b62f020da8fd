"""Calls made where waiting is not allowed: the FUSE event loop answers cheap calls (create,
rename, mkdir, chmod, utimes ...) itself, saving each the hop to a worker thread, as long as no
lock it needs is held by someone else (a commit holds the store's lock and its file's lock for
as long as it takes). Inside must_not_wait(), take() of a lock that is held raises WouldBlock
instead of waiting; each call that uses take() does so before it changes anything, so the
caller then makes the same call again in a worker thread, where it may wait."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Iterator

_here = threading.local()


class WouldBlock(Exception):
    """A lock was held: nothing was changed; call again where waiting is allowed."""


@contextmanager
def must_not_wait() -> Iterator[None]:
    before = getattr(_here, "on", False)
    _here.on = True
    try:
        yield
    finally:
        _here.on = before


def may_wait() -> bool:
    return not getattr(_here, "on", False)


def take(lock) -> None:
    """Acquire `lock`, or (inside must_not_wait) raise WouldBlock if it is held."""
    if may_wait():
        lock.acquire()
    elif not lock.acquire(blocking=False):
        raise WouldBlock


@contextmanager
def holding(lock) -> Iterator[None]:
    take(lock)
    try:
        yield
    finally:
        lock.release()
