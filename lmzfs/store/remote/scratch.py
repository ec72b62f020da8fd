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
import time
from pathlib import Path
from typing import Iterator

PREFIX = "lmz-push-"
LOCK = ".lock"
MADE_SECONDS = 60       # a directory still under its first name (".lmz-push-*") this long was left by a kill


@contextlib.contextmanager
def push_scratch() -> Iterator[Path]:
    """A new private directory, held by this push and removed when it ends; first, those that
    killed pushes of this user left are removed."""
    remove_left()
    # made under another name, then renamed: a directory named PREFIX* holds its lock file from
    # the start, so one without a lock file is one a push was removing when it was killed
    made = Path(tempfile.mkdtemp(prefix="." + PREFIX))
    fd = os.open(made / LOCK, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        tmp = made.with_name(made.name[1:])
        os.rename(made, tmp)
    except BaseException:
        os.close(fd)
        shutil.rmtree(made, ignore_errors=True)
        raise
    try:
        yield tmp
    finally:
        with contextlib.suppress(OSError):
            _remove(tmp)
        os.close(fd)


def _remove(folder: str | os.PathLike) -> None:
    """Remove a push directory, its lock file last."""
    for entry in os.scandir(folder):
        if entry.name != LOCK:
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(entry.path)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(folder, LOCK))
    with contextlib.suppress(OSError):
        os.rmdir(folder)


def remove_left(base: Path | None = None) -> int:
    """Remove the push directories under `base` (the temporary directory) that are this user's and
    that no running push holds (their lock file is free, or gone with the rest of what a killed
    push was removing), and those a push killed while it made one left under their first name
    (".lmz-push-*", older than MADE_SECONDS); returns how many."""
    base = Path(tempfile.gettempdir()) if base is None else base
    removed = 0
    try:
        entries = [e for e in os.scandir(base) if e.name.startswith((PREFIX, "." + PREFIX))]
    except OSError:
        return 0
    for entry in entries:
        try:
            st = entry.stat(follow_symlinks=False)
        except OSError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
            continue
        if entry.name.startswith(".") and time.time() - st.st_mtime < MADE_SECONDS:
            continue                    # maybe a push making its directory right now
        try:
            fd = os.open(os.path.join(entry.path, LOCK), os.O_RDWR | os.O_CLOEXEC | os.O_NOFOLLOW)
        except FileNotFoundError:
            try:
                _remove(entry.path)
            except OSError:
                continue
            removed += 1
            continue
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            continue                    # a push running now
        try:
            _remove(entry.path)
            removed += 1
        except OSError:
            pass                        # another push removed it first
        finally:
            os.close(fd)
    return removed
