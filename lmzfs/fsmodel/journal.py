"""The range journal of a spooled file (STORE/spool/ID.log): what each write and truncate did.

A spool record (spool.py) says which file ID.data belongs to and which ranges it held when the
record was written; the journal says what changed since, one fixed-size entry per block a write
touches (offset, length, the block's new sum: spoolsums.py) or per truncate (new size), appended
with one pwrite(2) and no fsync, before the bytes it describes. After a kill of the daemon the
page cache of the store's file system still holds ID.data and every entry, so the next mount
rebuilds the file exactly as written: the record's state, then the entries past the record's
`journal_entries` (the last write's only as far as its bytes reached ID.data).

Each entry carries its own position and a CRC-32, so a torn or damaged tail (a power loss before
anything was fsync'd, a bad block) is found: replay stops at the first entry that is not whole,
and the caller says what it dropped. The header names the format version and the journal's
generation: at COMPACT_ENTRIES entries the journal is folded into a new record (of the next
generation) and starts again, so it stays bounded however long a file is kept busy. An unknown
version is refused (docs/format.md, "Spool directory").
"""
from __future__ import annotations

import errno
import os
import struct
import zlib
from dataclasses import dataclass

from lmzfs.fsmodel.ranges import ByteRanges
from lmzfs.fsmodel.spoolsums import BLOCK, cut_sums
from lmzfs.store.layout import StoreError

JOURNAL_MAGIC = b"LMZJ"
JOURNAL_VERSION = 2                            # 1: entries without checksums (read, never written)
_HEADER = struct.Struct("<4sI16sII")           # magic, version, spool id, generation, crc32 of what precedes
_ENTRY_V1 = struct.Struct("<B3xIQQ4xI")        # kind, index, offset, length, crc32 of what precedes
_ENTRY = struct.Struct("<BB2xIQQQ4xI")         # kind, flags, index, offset, length, block sum, crc32
HEADER_SIZE = _HEADER.size
ENTRY_SIZE = _ENTRY.size
ENTRY_SIZE_V1 = _ENTRY_V1.size
WRITE = 1                                      # offset, length: ID.data holds [offset, offset+length)
TRUNCATE = 2                                   # offset: the file's new size
FIRST = 1                                      # flags: the first entry of one write(2) or truncate
COMPACT_ENTRIES = 8192                         # a journal this long is folded into a new record


@dataclass(frozen=True)
class JournalEntry:
    kind: int
    offset: int
    length: int
    sum: int | None = None             # the sum of the block it changed, after it (None: version 1)
    first: bool = True                 # the first entry of its write


@dataclass(frozen=True)
class FileState:
    """What a spooled file is at some point: its size, the stored bytes still showing, ID.data's
    ranges, and (None for a spool of version 1) the sum of each block that holds any of them."""
    size: int
    base_len: int
    ranges: list[tuple[int, int]]
    sums: dict[int, int] | None = None

    def after(self, entries: list[JournalEntry]) -> "FileState":
        ranges = ByteRanges(self.ranges)
        size, base_len = self.size, self.base_len
        sums = None if self.sums is None else dict(self.sums)
        for entry in entries:
            if entry.kind == WRITE:
                ranges.add(entry.offset, entry.offset + entry.length)
                size = max(size, entry.offset + entry.length)
                if sums is not None and entry.sum is not None:
                    sums[entry.offset // BLOCK] = entry.sum
            else:
                if entry.offset < size:
                    ranges.cut(entry.offset)
                    base_len = min(base_len, entry.offset)
                size = entry.offset
                if sums is not None:
                    sums = cut_sums(sums, entry.offset, entry.sum)
        return FileState(size, base_len, ranges.as_list(), sums)


@dataclass(frozen=True)
class JournalRead:
    entries: list[JournalEntry]        # the whole entries from the asked-for index on, in order
    total: int                         # index after the last whole entry
    damage: str | None                 # why reading stopped before the end of the file, if it did
    restart: bool = False              # an older generation: the record includes all it held


def _header(spool_id: str, generation: int) -> bytes:
    head = _HEADER.pack(JOURNAL_MAGIC, JOURNAL_VERSION, bytes.fromhex(spool_id), generation, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def _entry(kind: int, index: int, offset: int, length: int, block_sum: int, first: bool) -> bytes:
    head = _ENTRY.pack(kind, FIRST if first else 0, index & 0xFFFFFFFF, offset, length, block_sum, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


class JournalWriter:
    """Appends entries to one ID.log (created with its header). Entries are written before what
    they describe (write-ahead): a kill between the two leaves an entry whose block does not
    match its sum yet, which a replay rolls back (spoolsums.settle)."""

    def __init__(self, fd: int, spool_id: str, entries: int = 0, generation: int = 0):
        self.fd = fd
        self.spool_id = spool_id
        self.entries = entries
        self.generation = generation
        if entries == 0 and os.fstat(fd).st_size == 0:
            self._pwrite(_header(spool_id, generation), 0)

    @classmethod
    def reopen(cls, fd: int, spool_id: str, entries: int, generation: int) -> "JournalWriter":
        """Go on appending after `entries` whole entries (a damaged tail is overwritten)."""
        writer = cls(fd, spool_id, entries, generation)
        if entries == 0:
            writer._pwrite(_header(spool_id, generation), 0)   # the header may be damaged or older
        os.ftruncate(fd, HEADER_SIZE + entries * ENTRY_SIZE)
        return writer

    def _pwrite(self, data: bytes, offset: int) -> None:
        if os.pwrite(self.fd, data, offset) != len(data):
            raise OSError(errno.ENOSPC, "short write of the spool journal")

    def append(self, entries: list[tuple[int, int, int, int]]) -> int:
        """Append (kind, offset, length, block sum) entries of one operation; the count before,
        for retract() if the operation then fails."""
        mark = self.entries
        data = b"".join(_entry(kind, mark + i, offset, length, block_sum, i == 0)
                        for i, (kind, offset, length, block_sum) in enumerate(entries))
        try:
            self._pwrite(data, HEADER_SIZE + mark * ENTRY_SIZE)
        except OSError:
            self.retract(mark)
            raise
        self.entries += len(entries)
        return mark

    def retract(self, mark: int) -> None:
        """Drop the entries from `mark` on (their operation failed before doing anything)."""
        os.ftruncate(self.fd, HEADER_SIZE + mark * ENTRY_SIZE)
        self.entries = mark

    def restart(self, generation: int) -> None:
        """An empty journal of a new generation: its record now includes every earlier entry."""
        self._pwrite(_header(self.spool_id, generation), 0)
        os.ftruncate(self.fd, HEADER_SIZE)
        self.entries, self.generation = 0, generation


def read_journal(data: bytes, spool_id: str, start: int, source: str, generation: int = 0) -> JournalRead:
    """The whole entries of a journal's bytes from index `start` on; an unknown version is refused.
    A journal of an older generation than its record's holds nothing the record does not include."""
    if len(data) < HEADER_SIZE:
        return JournalRead([], 0, f"{source}: the header is torn ({len(data)} bytes)")
    magic, version, sid, gen, crc = _HEADER.unpack_from(data)
    if magic != JOURNAL_MAGIC or zlib.crc32(data[:HEADER_SIZE - 4]) != crc or sid != bytes.fromhex(spool_id):
        return JournalRead([], 0, f"{source}: the header is damaged")
    if version not in (1, JOURNAL_VERSION):
        raise StoreError(f"spool journal {source}: version {version} is not supported")
    if version == 1 and generation > 0:
        return JournalRead([], 0, None, restart=True)      # recorded again in version 3 (generation 1)
    if version == JOURNAL_VERSION and gen != generation:
        if gen < generation:
            return JournalRead([], 0, None, restart=True)       # folded into the record, then cut
        return JournalRead([], 0, f"{source}: generation {gen} is newer than its record's ({generation})")
    size = ENTRY_SIZE if version == JOURNAL_VERSION else ENTRY_SIZE_V1
    entries: list[JournalEntry] = []
    index = start
    while True:
        pos = HEADER_SIZE + index * size
        if pos == len(data):
            return JournalRead(entries, index, None)
        if pos + size > len(data):
            why = "is torn" if pos < len(data) else "is missing"
            return JournalRead(entries, index, f"{source}: entry {index} {why}")
        if version == JOURNAL_VERSION:
            kind, flags, stored_index, offset, length, block_sum, crc = _ENTRY.unpack_from(data, pos)
        else:
            (kind, stored_index, offset, length, crc), flags, block_sum = _ENTRY_V1.unpack_from(data, pos), FIRST, None
        if zlib.crc32(data[pos:pos + size - 4]) != crc or stored_index != index & 0xFFFFFFFF \
                or kind not in (WRITE, TRUNCATE):
            return JournalRead(entries, index, f"{source}: entry {index} is damaged")
        entries.append(JournalEntry(kind, offset, length, block_sum, bool(flags & FIRST)))
        index += 1
