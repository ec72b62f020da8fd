"""A file system to run out of space on, for tests of what a full disk does: a tmpfs of a given
size (mounting one needs root), and a file that takes every block left on it."""
from __future__ import annotations

import contextlib
import os
import subprocess
from pathlib import Path
from typing import Iterator


class CannotMount(OSError):
    """The tmpfs could not be mounted here (not root, no tmpfs): a test should skip."""


@contextlib.contextmanager
def small_disk(where: Path, size: str) -> Iterator[Path]:
    """A tmpfs of `size` (as mount's size= option takes it: "12m") at `where` (created if
    missing), lazily unmounted however the block ends."""
    where.mkdir(parents=True, exist_ok=True)
    run = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True)
    if run.returncode != 0:
        raise CannotMount(f"cannot mount a tmpfs at {where}: {run.stderr.decode(errors='replace').strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=True)


def free_bytes(path: Path) -> int:
    """Bytes an unprivileged writer may still use on the file system holding `path`."""
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def fill(disk: Path, name: str = "filler") -> Path:
    """A file on `disk` that takes every block left (it stops at ENOSPC); unlink it to free them."""
    path = disk / name
    with open(path, "wb", buffering=0) as f, contextlib.suppress(OSError):
        while f.write(bytes(1 << 16)) == 1 << 16:
            pass
    return path
