"""How much of a file's page cache sits in large folios (multi-page, physically contiguous).

Why: a warm re-read through a FUSE mount is a copy out of the kernel's page cache, as for a plain
file; the daemon is not asked. Where the plain file's cache is made of large folios and the
mount's of single 4 KiB pages, the copy is slower per byte (one lookup per page, and the CPU's
prefetcher stops at every page boundary), which bounds "warm × plain" below 1 whatever the
daemon does. This probe shows which case a machine is in.

    bench/.venv/bin/python bench/folios.py FILE [FILE ...]      (root: reads /proc/kpageflags)

It maps each file read-only, touches its first --mib MiB (faulting them into the page cache
through the file's own read path), then looks up each page's frame in /proc/self/pagemap and
the frame's flags in /proc/kpageflags (bit 15: head of a compound page, 16: tail).
"""
from __future__ import annotations

import argparse
import mmap
import os
import struct
import sys

PAGE = os.sysconf("SC_PAGE_SIZE")
KPF_COMPOUND_HEAD, KPF_COMPOUND_TAIL = 15, 16


def large_folio_pages(path: str, mib: int) -> tuple[int, int, int]:
    """(pages looked at, pages resident, pages that belong to a large folio) of the file's start."""
    import numpy as np     # only for the mapping's address

    fd = os.open(path, os.O_RDONLY)
    try:
        n = min(os.fstat(fd).st_size, mib << 20) // PAGE
        if n == 0:
            return 0, 0, 0
        m = mmap.mmap(fd, n * PAGE, prot=mmap.PROT_READ)
    finally:
        os.close(fd)
    try:
        view = np.frombuffer(m, dtype=np.uint8)
        int(view[::PAGE].sum())        # fault every page in
        base = view.ctypes.data
        del view                       # the mapping cannot close while an array exports it
        resident = large = 0
        with open("/proc/self/pagemap", "rb") as pm, open("/proc/kpageflags", "rb") as kf:
            pm.seek(base // PAGE * 8)
            entries = struct.unpack(f"<{n}Q", pm.read(8 * n))
            for e in entries:
                if not e >> 63:        # not present
                    continue
                resident += 1
                kf.seek((e & ((1 << 55) - 1)) * 8)
                flags = struct.unpack("<Q", kf.read(8))[0]
                large += (flags >> KPF_COMPOUND_HEAD | flags >> KPF_COMPOUND_TAIL) & 1
        return n, resident, large
    finally:
        m.close()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="+")
    ap.add_argument("--mib", type=int, default=64, help="MiB from each file's start to look at (default 64)")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("folios.py: needs root (frame numbers in /proc/self/pagemap and /proc/kpageflags)", file=sys.stderr)
        return 2
    print(f"kernel {os.uname().release}; page {PAGE} B")
    for path in args.files:
        n, resident, large = large_folio_pages(path, args.mib)
        share = f"{100 * large / resident:.1f}%" if resident else "-"
        print(f"{path}: {n} pages looked at, {resident} resident, {large} in large folios ({share})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
