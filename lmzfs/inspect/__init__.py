"""`lmz inspect`: what a model file holds, whether its container is sound, and what the store
would save on it. Reads headers with the bounded parsers of lmzfs.formats, disassembles pickles
without running them, and encodes a sample of chunks with the real codecs."""
from __future__ import annotations

import errno
import hashlib
import os
import stat

from lmzfs.formats import parse_file
from lmzfs.formats.segments import FileLayout

from .containers import ContainerInfo, container_info
from .pickles import PickleScan, scan_pickle
from .report import DtypeTotals, InspectReport
from .saving import SAMPLE_BYTES, predict

__all__ = ["inspect_file", "InspectReport", "PickleScan", "scan_pickle"]

# `lmz pack` framing, from docs/format.md: a 24-byte header, 12 bytes per chunk, a 64-byte trailer.
_PACK_HEADER_AND_TRAILER, _PACK_PER_CHUNK = 24 + 64, 12


def inspect_file(path: str | os.PathLike, *, sha256: bool = False, sample_bytes: int = SAMPLE_BYTES,
                 workers: int | None = None) -> InspectReport:
    """Inspect one file. Never raises for a malformed file (that is reported); OSError if unreadable."""
    p = os.fspath(path)
    # O_NONBLOCK: a FIFO opens at once (and is refused) instead of waiting for a writer
    fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    with open(fd, "rb") as f:
        st = os.fstat(fd)
        if stat.S_ISDIR(st.st_mode):
            raise IsADirectoryError(21, "is a directory; give a file", p)
        if not stat.S_ISREG(st.st_mode):
            raise OSError(errno.EINVAL, "not a regular file (fifo, socket or device)", p)
        head = f.read(16)
    layout = parse_file(p)
    info = container_info(p, layout, head)
    report = InspectReport(p, layout.format, layout.size, layout.error, details=info.details,
                           issues=info.issues, pickles=info.pickles, unsafe_entries=info.unsafe_entries)
    _add_totals(report, layout, info)
    report.groups = predict(p, layout, sample_bytes, workers)
    report.archive_overhead_bytes = _PACK_HEADER_AND_TRAILER + _PACK_PER_CHUNK * sum(g.chunks for g in report.groups)
    if sha256:
        report.sha256 = _sha256(p)
    return report


def _add_totals(report: InspectReport, layout: FileLayout, info: ContainerInfo) -> None:
    for seg in layout.segments:
        if seg.kind == "header":
            report.header_bytes += seg.length
        elif seg.kind == "padding":
            report.padding_bytes += seg.length
        elif seg.kind == "opaque":
            report.opaque_bytes += seg.length
    report.tensors = len(info.tensors)
    for t in info.tensors:
        d = report.dtypes.setdefault(t.dtype, DtypeTotals())
        d.tensors += 1
        d.bytes += t.nbytes
        d.elements = None if d.elements is None or t.elements is None else d.elements + t.elements


def _sha256(path: str) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()
