"""Which bytes of a writable mount's file hold data, for st_blocks: a sparse file's holes take no
blocks, as on a local file system.

A file's bytes are its stored version's (the first `base_len` of them) with the spool's ranges in
front (filedata.py). The spool holds only what was written (its holes are holes of ID.data). The
stored version's holes are its runs of chunks of zeros: a hole written out by a commit is stored
as chunks whose plain bytes are all zeros (one chunk, deduplicated, whatever their number), which
a SHA-256 id names exactly. Only chunks of at least HOLE_MIN bytes that their coding shrank
at least ZERO_RATIO times can be such (zeros compress to almost nothing); those are checked
against the id of that many zeros, so nothing else costs a hash.
"""
from __future__ import annotations

import hashlib
from functools import lru_cache
from typing import Iterable

from lmzfs.fsmodel.ranges import ByteRanges

HOLE_MIN = 4096                 # smaller runs of zeros count as data, as a file system's blocks do
ZERO_RATIO = 64                 # a chunk of zeros codes to far less than 1/64 of its size

Holes = tuple[tuple[int, int], ...]


@lru_cache(maxsize=1024)
def _zero_id(size: int) -> bytes:
    return hashlib.sha256(bytes(size)).digest()


def is_zero_chunk(chunk_id: bytes, size: int) -> bool:
    return size >= HOLE_MIN and bytes(chunk_id) == _zero_id(size)


def holes_of(extents: Iterable[tuple[int, int, bytes]]) -> Holes:
    """The holes of a stored file from its candidate extents (offset, plain size, chunk id), merged."""
    ranges = ByteRanges()
    for offset, size, chunk_id in extents:
        if is_zero_chunk(chunk_id, size):
            ranges.add(offset, offset + size)
    return tuple(ranges.as_list())


def data_bytes(size: int, base_len: int, holes: Holes, ranges: ByteRanges | None = None) -> int:
    """Bytes of [0, size) that hold data: the spool's `ranges`, and the stored version's first
    `base_len` bytes outside its `holes`."""
    base_len = min(base_len, size)
    if not holes:                   # the common case, in time logarithmic in the ranges
        return base_len + (ranges.beyond(base_len) if ranges else 0)
    data = ByteRanges(ranges.as_list() if ranges else None)
    pos = 0
    for start, end in holes:
        if start >= base_len:
            break
        data.add(pos, start)
        pos = max(pos, end)
    data.add(pos, base_len)
    return sum(min(end, size) - start for start, end in data.as_list() if start < size)


def blocks(data: int) -> int:
    """st_blocks: 512-byte units."""
    return (data + 511) // 512
