"""The private directory a push keeps its catalog copies in (each about the catalog's size), in
the system's temporary directory: removed when the push ends, and, when a push was killed (kill
-9, a lost host) before it could remove it, by the next push. Each holds `.lock`, locked (flock)
for as long as its push runs, so a push removes only directories no running push holds."""
from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Iterator

PREFIX = "lmz-push-"
LOCK = ".lock"


@contextlib.contextmanager
def push_scratch() -> Iterator[Path]:
    """A new private directory, held by this push and removed when it ends; first, those that
    killed pushes of this user left are removed."""
    remove_left()
    tmp = Path(tempfile.mkdtemp(prefix=PREFIX))
    fd = os.open(tmp / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        os.close(fd)


def remove_left(base: Path | None = None) -> int:
    """Remove the push directories under `base` (the temporary directory) that are this user's and
    that no running push holds; returns how many. A directory without a lock file (being made
    now, or not ours) is left alone."""
    base = Path(tempfile.gettempdir()) if base is None else base
    removed = 0
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith(PREFIX)]
    except OSError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        try:
            fd = os.open(os.path.join(entry.path, LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue                    # a push running now
        try:
            shutil.rmtree(entry.path, ignore_errors=True)
            removed += 1
        finally:
            os.close(fd)
    return removed
