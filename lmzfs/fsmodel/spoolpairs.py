"""Spool records too large for a page of records.slots, kept in slot pairs of one file
(STORE/spool/records.pairs) instead of a file each: a new file of up to INLINE_MAX bytes keeps
them in its record (spoolinline.py), and making an ID.json, an ID.data and an ID.log for each
such file cost the store's file system three inodes (on ext4 here, up to a millisecond of CPU
each), where rewriting part of a file already open costs microseconds.

A record of more than a page cannot be written in place: the kernel copies a write a page at a
time and a kill of the daemon may stop it between pages. So each slot has two halves, and a
record is written to the half it does not stand in, with a sequence number higher than any
before it; the older half stays as it was until the newer is whole. A mount takes, in each slot,
the half that checks (CRC-32) with the higher number; a half cut short by a kill checks as
damaged and the other half, the record as it stood before that write, stands.

The file (docs/format.md): page 0 is its header, `LMZP`, u32 version, u32 half size, u32 CRC-32
of the 12 bytes before it (little-endian), zeros to the end of the page. Slot k >= 0 starts at
4096 + k * 2 * half size; each half starts with `LMZH`, u64 sequence number, u32 length of the
record's JSON, u32 CRC-32 of the sequence number (8 bytes) and the JSON, the record's spool id
(16 bytes: its 32 hex digits), 4 zero bytes, then the JSON. A half whose first four bytes are
zero is empty. A half that does not check but names a spool id that has a record elsewhere (a
slot, its ID.json) is a write a kill cut short, before the record it would have replaced was
freed: that record stands. Freeing a slot empties its older half and
then its newer one, so a kill in between leaves the record as it stood, never an older one; when
no slot is used the file is cut back to its header.
"""
from __future__ import annotations

import errno
import os
import struct
import zlib
from dataclasses import dataclass
from heapq import heappop, heappush
from pathlib import Path

from lmzfs.fsmodel.spoolslots import HeadedRecordFile, SlotContent

PAIRS_FILE = "records.pairs"
PAIRS_VERSION = 1
HEADER_BYTES = 4096
HALF_BYTES = 32768
_MAGIC = b"LMZP"
_HALF_MAGIC = b"LMZH"
_HALF = struct.Struct("<4sQII16s4x")
HALF_HEAD_BYTES = _HALF.size             # a half's head, before its record's JSON
RECORD_MAX = HALF_BYTES - HALF_HEAD_BYTES  # the largest record a pair holds


def half_offset(slot: int, half: int) -> int:
    return HEADER_BYTES + (2 * slot + half) * HALF_BYTES


@dataclass(frozen=True)
class Half:
    """One half of a slot as read: empty, whole (seq and JSON), or damaged (its bytes)."""
    seq: int = -1
    data: bytes | None = None          # the JSON of a whole half
    damaged: bytes | None = None       # the bytes of a half that does not check
    spool_id: str | None = None        # the id its head names (of a damaged half: unchecked)

    @property
    def empty(self) -> bool:
        return self.data is None and self.damaged is None


def parse_half(raw: bytes) -> Half:
    """A half's bytes (at least its head) as what they hold."""
    if len(raw) < _HALF.size or raw[:4] == b"\0\0\0\0":
        return Half()
    magic, seq, length, crc, ident = _HALF.unpack_from(raw)
    body = raw[_HALF.size:_HALF.size + length]
    spool_id = ident.hex() if magic == _HALF_MAGIC and any(ident) else None
    if magic != _HALF_MAGIC or length > RECORD_MAX or len(body) != length or \
            zlib.crc32(body, zlib.crc32(raw[4:12])) != crc:
        return Half(damaged=raw.rstrip(b"\0"), spool_id=spool_id)
    return Half(seq, body, spool_id=spool_id)


def pack_half(seq: int, spool_id: str, data: bytes) -> bytes:
    seq_bytes = struct.pack("<Q", seq)
    try:
        ident = bytes.fromhex(spool_id) if len(spool_id) == 32 else bytes(16)
    except ValueError:
        ident = bytes(16)
    return _HALF.pack(_HALF_MAGIC, seq, len(data), zlib.crc32(data, zlib.crc32(seq_bytes)), ident) + data


def used_pair_slots(path: Path) -> list[int]:
    """The slots of the file at `path` with a half that is not empty (none if there is no file),
    read without opening the spool."""
    try:
        with open(path, "rb") as f:
            used, slot = [], 0
            while True:
                heads = []
                for half in (0, 1):
                    f.seek(half_offset(slot, half))
                    heads.append(f.read(4))
                if not heads[0]:
                    return used
                if any(h and h != b"\0\0\0\0" for h in heads):
                    used.append(slot)
                slot += 1
    except FileNotFoundError:
        return []


class RecordPairs(HeadedRecordFile):
    """The pair file of one writable mount's spool: which slot holds which spool id's record, and
    which half of it is the newer. The same calls as spoolslots.RecordSlots."""
    MAGIC, VERSION, UNIT, UNIT_NAME, HEADER_BYTES = _MAGIC, PAIRS_VERSION, HALF_BYTES, "halves", HEADER_BYTES

    def __init__(self, path: Path):
        super().__init__(path)
        self._of: dict[str, tuple[int, int]] = {}    # spool id -> (slot, its newer half)
        self._free: list[int] = []             # free slots below _end (a heap: the lowest first)
        self._end = 0                          # slots at or past this are past the file's end
        self._found: dict[int, int] = {}       # slot read used at mount, not yet bound or freed -> newer half
        self._seq = 0                          # the highest sequence number written or read

    def read(self) -> list[SlotContent]:
        """The newer whole record of every used slot, in slot order (at mount, before any is
        written); a slot with no whole half but a damaged one is given as its damaged bytes
        (SpoolRecord.from_json then refuses them). The free slots are noted for reuse."""
        with self._lock:
            if not self.path.exists():
                return []
            fd = self._open()
            size = os.fstat(fd).st_size
            found, self._free = [], []
            self._end = max(0, -(-(size - HEADER_BYTES) // (2 * HALF_BYTES)))
            for slot in range(self._end):
                halves = [parse_half(os.pread(fd, HALF_BYTES, half_offset(slot, h))) for h in (0, 1)]
                whole = [(half.seq, h) for h, half in enumerate(halves) if half.data is not None]
                if whole:
                    seq, h = max(whole)
                    self._seq = max(self._seq, seq)
                    found.append(SlotContent(slot, halves[h].data))
                    self._found[slot] = h
                elif any(not half.empty for half in halves):
                    named = [half.spool_id for half in halves if half.spool_id is not None]
                    found.append(SlotContent(slot, b"".join(half.damaged or b"" for half in halves),
                                             named[0] if len(set(named)) == 1 else None))
                    self._found[slot] = 0
                else:
                    heappush(self._free, slot)
            if not found:
                self._cut()
            return found

    def bind(self, spool_id: str, slot: int) -> None:
        with self._lock:
            self._of[spool_id] = (slot, self._found.pop(slot, 0))

    def write(self, spool_id: str, data: bytes) -> None:
        """`spool_id`'s record is `data` (at most RECORD_MAX): into the half of its slot it does
        not stand in (or a new slot), numbered above every record before it."""
        if len(data) > RECORD_MAX:
            raise ValueError("a record larger than a half")
        with self._lock:
            fd = self._open()
            at = self._of.get(spool_id)
            new = at is None
            if new:
                slot = heappop(self._free) if self._free else self._end
                if slot == self._end:
                    self._end += 1
                half = 0
            else:
                slot, half = at[0], 1 - at[1]
            self._seq += 1
            seq = self._seq
        try:
            half_bytes = pack_half(seq, spool_id, data)
            if os.pwrite(fd, half_bytes, half_offset(slot, half)) != len(half_bytes):
                raise OSError(errno.ENOSPC, "short write of a spool record")
        except BaseException:
            if new:
                with self._lock:
                    self._free_slot(slot, 0)
            raise
        with self._lock:
            if spool_id in self._of or new:
                self._of[spool_id] = (slot, half)

    def page(self, spool_id: str) -> bytes | None:
        """The record `spool_id`'s slot holds (its newer half), None if it has none."""
        with self._lock:
            at = self._of.get(spool_id)
            if at is None:
                return None
            return parse_half(os.pread(self._open(), HALF_BYTES, half_offset(*at))).data

    def free(self, spool_id: str) -> None:
        """`spool_id` has no record in a pair any more (not fsync'd)."""
        with self._lock:
            at = self._of.pop(spool_id, None)
            if at is not None:
                self._free_slot(*at)

    def free_slot(self, slot: int) -> None:
        """Empty slot `slot`, found used at mount but bound to no record (damaged, or superseded)."""
        with self._lock:
            self._free_slot(slot, self._found.get(slot, 0))

    def _free_slot(self, slot: int, newer: int) -> None:
        self._found.pop(slot, None)
        if not self._of and not self._found:
            self._cut()                # nothing used: the file back to its header
            return
        fd = self._open()
        if slot < self._end:
            for half in (1 - newer, newer):        # the older first: a kill between keeps the newer
                os.pwrite(fd, bytes(_HALF.size), half_offset(slot, half))
            heappush(self._free, slot)

    def _cut(self) -> None:
        os.ftruncate(self._open(), HEADER_BYTES)
        self._free, self._end, self._found = [], 0, {}
