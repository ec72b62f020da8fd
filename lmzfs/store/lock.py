"""One writer at a time across processes; readers never take this lock."""
from __future__ import annotations

import fcntl
import os
from pathlib import Path

from lmzfs.store.layout import FILE_MODE, StoreError


class WriterLock:
    def __init__(self, path: Path, *, wait: bool = True):
        self._path = path
        self._wait = wait
        self._fd: int | None = None

    def __enter__(self) -> "WriterLock":
        try:
            self._fd = os.open(self._path, os.O_RDWR | os.O_CREAT, FILE_MODE)
        except OSError as exc:      # a store on a read-only file system, or not this user's
            raise StoreError(f"cannot write to the store: {self._path}: {exc.strerror or exc}") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | (0 if self._wait else fcntl.LOCK_NB))
        except BlockingIOError:
            os.close(self._fd)
            self._fd = None
            raise StoreError(f"another lmz process is writing to the store ({self._path})") from None
        return self

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None
