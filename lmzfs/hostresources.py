"""The memory, CPUs and file descriptors this process may use, which the mount's defaults are sized from.

A model host may be a laptop, a 1 GiB board or a container with a memory limit far below the
machine's RAM; a fixed cache size is wrong for some of them. So the default decoded-chunk cache is
an eighth of the memory this process may use (the machine's RAM, or less where a cgroup, v1 or v2,
limits this process or any group above it), between MIN_CACHE and MAX_CACHE; and the default
number of decode threads is the CPUs this process may run on (its affinity mask, less where a
cgroup CPU quota allows fewer). Every reading that fails (no /proc, no cgroup files, a value that
does not parse) is left out rather than guessed at.
"""
from __future__ import annotations

import math
import os
import resource
from pathlib import Path

MIN_CACHE = 32 << 20
MAX_CACHE = 256 << 20
CACHE_SHARE = 8                 # the default cache is 1/CACHE_SHARE of the usable memory
UNLIMITED = 1 << 62             # cgroup v1 writes "no limit" as a number near 2**63


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


def _own_groups(proc_cgroup: Path) -> tuple[str | None, dict[str, str]]:
    """(the cgroup v2 path, {v1 controller: path}) of this process, from /proc/self/cgroup."""
    v2, v1 = None, {}
    for line in (_read(proc_cgroup) or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        hierarchy, controllers, path = parts
        if hierarchy == "0" and controllers == "":
            v2 = path
        for c in controllers.split(","):
            if c:
                v1[c] = path
    return v2, v1


def _group_dirs(mount: Path, path: str | None) -> list[Path]:
    """mount/path and every directory above it up to the mount, which is there too: in a
    container with its own cgroup namespace the path may name a group the mount does not show.
    None (this process is in no such hierarchy): none."""
    if path is None:
        return []
    dirs = []
    d = mount / path.strip("/")
    while d != mount and mount in d.parents:
        dirs.append(d)
        d = d.parent
    return dirs + [mount]


def _limits(files: list[Path]) -> list[int]:
    out = []
    for f in files:
        text = _read(f)
        if text and text.isdigit() and int(text) < UNLIMITED:
            out.append(int(text))
    return out


def physical_memory() -> int | None:
    try:
        pages, size = os.sysconf("SC_PHYS_PAGES"), os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None
    return pages * size if pages > 0 and size > 0 else None


def memory_limit(*, cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup"),
                 physical: int | None = None) -> int | None:
    """Bytes of memory this process may use: RAM, or the tightest cgroup limit above it."""
    v2, v1 = _own_groups(proc_cgroup)
    files = [d / "memory.max" for d in _group_dirs(cgroup_root, v2)]
    files += [d / "memory.limit_in_bytes" for d in _group_dirs(cgroup_root / "memory", v1.get("memory"))]
    ram = physical_memory() if physical is None else physical
    found = _limits(files) + ([ram] if ram else [])
    return min(found) if found else None


def usable_cpus(*, cgroup_root: Path = Path("/sys/fs/cgroup"), proc_cgroup: Path = Path("/proc/self/cgroup"),
                affinity: int | None = None) -> int:
    """CPUs this process may run on: its affinity mask, less where a cgroup quota allows fewer."""
    if affinity is None:
        try:
            affinity = len(os.sched_getaffinity(0))
        except (AttributeError, OSError):
            affinity = os.cpu_count() or 1
    v2, v1 = _own_groups(proc_cgroup)
    quotas = []
    for d in _group_dirs(cgroup_root, v2):
        fields = (_read(d / "cpu.max") or "").split()
        if len(fields) == 2 and fields[0].isdigit() and fields[1].isdigit() and int(fields[1]) > 0:
            quotas.append(int(fields[0]) / int(fields[1]))
    for name in ("cpu", "cpu,cpuacct"):
        for d in _group_dirs(cgroup_root / name, v1.get("cpu")):
            quota, period = _read(d / "cpu.cfs_quota_us"), _read(d / "cpu.cfs_period_us")
            if quota and period and quota.isdigit() and period.isdigit() and int(period) > 0:
                quotas.append(int(quota) / int(period))
    allowed = min([affinity] + [math.ceil(q) for q in quotas if q > 0])
    return max(1, allowed)


def default_cache_size(memory: int | None = None) -> int:
    """1/CACHE_SHARE of the usable memory, between MIN_CACHE and MAX_CACHE (MAX_CACHE if unknown)."""
    memory = memory_limit() if memory is None else memory
    if not memory:
        return MAX_CACHE
    return max(MIN_CACHE, min(MAX_CACHE, memory // CACHE_SHARE))


def raise_open_files_limit(*, nr_open: Path = Path("/proc/sys/fs/nr_open")) -> int:
    """Raise this process's soft limit of open descriptors to its hard limit (at most the kernel's
    nr_open); the soft limit it has now. A shell's soft limit is often 1,024 (for programs that
    still use select(2), which the daemon does not), while a mount holds a descriptor for each pack
    its open files read and two for each spooled file not yet committed."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    ceiling = _read(nr_open)
    target = hard
    if ceiling is not None and ceiling.isdigit() and (hard == resource.RLIM_INFINITY or hard > int(ceiling)):
        target = int(ceiling)
    if target == resource.RLIM_INFINITY or target <= soft:
        return soft
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
    except (ValueError, OSError):
        return soft
    return target


def open_files_limit() -> int:
    """This process's soft limit of open descriptors."""
    soft = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    return UNLIMITED if soft == resource.RLIM_INFINITY else soft


def open_descriptors(fd_dir: Path = Path("/proc/self/fd")) -> int:
    """How many descriptors this process holds open (0 where /proc does not say)."""
    try:
        return len(os.listdir(fd_dir))
    except OSError:
        return 0
