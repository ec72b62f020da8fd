"""Let the kernel ask for more than 128 KiB per read request.

The kernel sizes buffered FUSE reads by the mount's read-ahead window, which starts at 128 KiB,
so a sequential reader costs one daemon round trip per 128 KiB. libfuse already negotiates
requests of up to 1 MiB; raising the backing device's read_ahead_kb in sysfs lets the kernel use
them, cutting per-request overhead eightfold. Only root may write it: elsewhere this is a no-op.
It must be written after the kernel's FUSE INIT request has been answered: the kernel sets the
window from the INIT reply (128 KiB), undoing an earlier value (mount.py waits for that).
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

from lmzfs.mountinfo import mounts

log = logging.getLogger(__name__)

DEFAULT_READAHEAD_KB = 1024


def device_of_mount(mountpoint: str | os.PathLike) -> str | None:
    """"major:minor" of the mount at *mountpoint*, from mountinfo (a stat of the mountpoint from
    the serving process itself would wait on its own, not yet running, request loop)."""
    target = Path(os.path.abspath(mountpoint))
    found = [m.device for m in mounts() if m.mountpoint == target]
    return found[-1] if found else None     # the last match is the topmost mount there


def raise_kernel_readahead(mountpoint: str | os.PathLike, kb: int = DEFAULT_READAHEAD_KB) -> bool:
    """Set the mount's read_ahead_kb to *kb* if permitted; True when it was set."""
    device = device_of_mount(mountpoint)
    if device is None:
        return False
    knob = Path("/sys/class/bdi") / device / "read_ahead_kb"
    try:
        knob.write_text(f"{kb}\n")
    except OSError as exc:
        log.debug("kernel read-ahead stays at its default (%s: %s)", knob, exc.strerror)
        return False
    log.info("kernel read-ahead for %s set to %d KiB", mountpoint, kb)
    return True
