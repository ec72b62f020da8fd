"""The range journal of a spooled file (STORE/spool/ID.log): what each write and truncate did.

A spool record (spool.py) says which file ID.data belongs to and which ranges it held when the
record was written; the journal says what changed since, one fixed-size entry per write (offset,
length) or truncate (new size), appended with one pwrite(2) and no fsync. After a kill of the
daemon the page cache of the store's file system still holds ID.data and every entry, so the
next mount rebuilds the file exactly as written: the record's state, then the entries past the
record's `journal_entries`.

Each entry carries its own position and a CRC-32, so a torn or damaged tail (a power loss before
anything was fsync'd, a bad block) is found: replay stops at the first entry that is not whole,
and the caller says what it dropped. The header names the format version; an unknown one is
refused (docs/format.md, "Spool directory").
"""
from __future__ import annotations

import errno
import os
import struct
import zlib
from dataclasses import dataclass

from lmzfs.fsmodel.ranges import ByteRanges
from lmzfs.store.layout import StoreError

JOURNAL_MAGIC = b"LMZJ"
JOURNAL_VERSION = 1
_HEADER = struct.Struct("<4sI16s4xI")          # magic, version, spool id, crc32 of what precedes
_ENTRY = struct.Struct("<B3xIQQ4xI")           # kind, index, offset, length, crc32 of what precedes
HEADER_SIZE = _HEADER.size
ENTRY_SIZE = _ENTRY.size
WRITE = 1                                      # offset, length: ID.data holds [offset, offset+length)
TRUNCATE = 2                                   # offset: the file's new size


@dataclass(frozen=True)
class JournalEntry:
    kind: int
    offset: int
    length: int


@dataclass(frozen=True)
class FileState:
    """What a spooled file is at some point: its size, the stored bytes still showing, ID.data's ranges."""
    size: int
    base_len: int
    ranges: list[tuple[int, int]]

    def after(self, entries: list[JournalEntry]) -> "FileState":
        ranges = ByteRanges(self.ranges)
        size, base_len = self.size, self.base_len
        for entry in entries:
            if entry.kind == WRITE:
                ranges.add(entry.offset, entry.offset + entry.length)
                size = max(size, entry.offset + entry.length)
            else:
                if entry.offset < size:
                    ranges.cut(entry.offset)
                    base_len = min(base_len, entry.offset)
                size = entry.offset
        return FileState(size, base_len, ranges.as_list())


@dataclass(frozen=True)
class JournalRead:
    entries: list[JournalEntry]        # the whole entries from the asked-for index on, in order
    total: int                         # index after the last whole entry
    damage: str | None                 # why reading stopped before the end of the file, if it did


def _header(spool_id: str) -> bytes:
    head = _HEADER.pack(JOURNAL_MAGIC, JOURNAL_VERSION, bytes.fromhex(spool_id), 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


def _entry(kind: int, index: int, offset: int, length: int) -> bytes:
    head = _ENTRY.pack(kind, index & 0xFFFFFFFF, offset, length, 0)[:-4]
    return head + struct.pack("<I", zlib.crc32(head))


class JournalWriter:
    """Appends entries to one ID.log (created with its header)."""

    def __init__(self, fd: int, spool_id: str, entries: int = 0):
        self.fd = fd
        self.entries = entries
        if entries == 0 and os.fstat(fd).st_size == 0:
            self._pwrite(_header(spool_id), 0)

    @classmethod
    def reopen(cls, fd: int, spool_id: str, entries: int) -> "JournalWriter":
        """Go on appending after `entries` whole entries (a damaged tail is overwritten)."""
        writer = cls(fd, spool_id, entries)
        if entries == 0:
            writer._pwrite(_header(spool_id), 0)            # it may be the header that was damaged
        os.ftruncate(fd, HEADER_SIZE + entries * ENTRY_SIZE)
        return writer

    def _pwrite(self, data: bytes, offset: int) -> None:
        if os.pwrite(self.fd, data, offset) != len(data):
            raise OSError(errno.ENOSPC, "short write of the spool journal")

    def write(self, offset: int, length: int) -> None:
        self._append(WRITE, offset, length)

    def truncate(self, size: int) -> None:
        self._append(TRUNCATE, size, 0)

    def _append(self, kind: int, offset: int, length: int) -> None:
        self._pwrite(_entry(kind, self.entries, offset, length), HEADER_SIZE + self.entries * ENTRY_SIZE)
        self.entries += 1


def read_journal(data: bytes, spool_id: str, start: int, source: str) -> JournalRead:
    """The whole entries of a journal's bytes from index `start` on; an unknown version is refused."""
    if len(data) < HEADER_SIZE:
        return JournalRead([], 0, f"{source}: the header is torn ({len(data)} bytes)")
    magic, version, sid, crc = _HEADER.unpack_from(data)
    if magic != JOURNAL_MAGIC or zlib.crc32(data[:HEADER_SIZE - 4]) != crc or sid != bytes.fromhex(spool_id):
        return JournalRead([], 0, f"{source}: the header is damaged")
    if version != JOURNAL_VERSION:
        raise StoreError(f"spool journal {source}: version {version} is not supported")
    entries: list[JournalEntry] = []
    index = start
    while True:
        pos = HEADER_SIZE + index * ENTRY_SIZE
        if pos == len(data):
            return JournalRead(entries, index, None)
        if pos + ENTRY_SIZE > len(data):
            why = "is torn" if pos < len(data) else "is missing"
            return JournalRead(entries, index, f"{source}: entry {index} {why}")
        kind, stored_index, offset, length, crc = _ENTRY.unpack_from(data, pos)
        if zlib.crc32(data[pos:pos + ENTRY_SIZE - 4]) != crc or stored_index != index & 0xFFFFFFFF \
                or kind not in (WRITE, TRUNCATE):
            return JournalRead(entries, index, f"{source}: entry {index} is damaged")
        entries.append(JournalEntry(kind, offset, length))
        index += 1
