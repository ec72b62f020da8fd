"""The mounts of this process's namespace, read from /proc/self/mountinfo, which unlike a stat
of the mount point never blocks on a hung FUSE daemon (or on the serving process itself)."""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

MOUNTINFO = "/proc/self/mountinfo"


@dataclass(frozen=True)
class Mount:
    mountpoint: Path
    device: str         # "major:minor"
    options: str        # the per-mount options, "ro,nosuid,..."
    fstype: str         # "fuse.lmzfs", "ext4", ...
    source: str         # what was mounted: a device, or a FUSE file system's fsname


def _unescape(field: str) -> str:
    # The kernel writes space, tab, newline and backslash in paths as octal escapes.
    for code, char in (("\\040", " "), ("\\011", "\t"), ("\\012", "\n"), ("\\134", "\\")):
        field = field.replace(code, char)
    return field


def mounts(mountinfo: str = MOUNTINFO) -> list[Mount]:
    """Every mount, in mount order (the last one at a path is the topmost); [] if unreadable."""
    try:
        with open(mountinfo) as f:
            lines = f.read().splitlines()
    except OSError:
        return []
    out = []
    for line in lines:
        head, sep, tail = line.partition(" - ")
        fields, rest = head.split(), tail.split()
        if not sep or len(fields) < 6 or len(rest) < 2:
            continue
        out.append(Mount(Path(_unescape(fields[4])), fields[2], fields[5], rest[0], _unescape(rest[1])))
    return out


def is_mount_point(path: str | os.PathLike) -> bool:
    path = os.path.abspath(path)
    points = {str(m.mountpoint) for m in mounts()}
    return path in points or os.path.realpath(path) in points
