"""Spool records kept in the slots of one file (STORE/spool/records.slots, spool version 5), not
one file each: creating a file costs the store's file system a directory entry and an inode (on
ext4 here, about a millisecond of CPU), where rewriting a page of a file already open costs a
few microseconds. A record that is not durable and fits in a slot lives in one; a durable record,
or one too large, is its own ID.json (spool.py).

The file (docs/format.md): page 0 is its header, `LMZS`, u32 version, u32 slot size, u32 CRC-32
of the 12 bytes before it (little-endian), zeros to the end of the page; page k >= 1 is slot k:
free while its first byte is zero, else a record's JSON padded with spaces to the page's end.
Each write of a slot is one pwrite of one aligned page, so a kill of the daemon finds it as it
was or as it became, never torn (the kernel copies a page whole); a power loss may tear one, and
such a slot reads as damaged. Freeing a slot zeroes it; when no slot is used the file is cut back
to its header.
"""
from __future__ import annotations

import errno
import os
import struct
import threading
import zlib
from dataclasses import dataclass
from heapq import heappop, heappush
from pathlib import Path

from lmzfs.store.layout import FILE_MODE, StoreError

SLOTS_FILE = "records.slots"
SLOT_BYTES = 4096
SLOTS_VERSION = 1
_MAGIC = b"LMZS"
_HEAD = struct.Struct("<4sII")


@dataclass(frozen=True)
class SlotContent:
    """What a used slot holds, as read at mount: a record's JSON (padding stripped), or bytes that
    are not one; `damaged_id`: the spool id a damaged slot pair still names (spoolpairs.py)."""
    slot: int
    data: bytes
    damaged_id: str | None = None


def used_slot_numbers(path: Path) -> list[int]:
    """The slots of the file at `path` that hold a record (none if there is no file), read
    without opening the spool: what a check that every file is committed reads."""
    try:
        with open(path, "rb") as f:
            f.seek(SLOT_BYTES)
            used, slot = [], 1
            while page := f.read(SLOT_BYTES):
                if page[0] != 0:
                    used.append(slot)
                slot += 1
            return used
    except FileNotFoundError:
        return []


def used_slots(path: Path) -> int:
    return len(used_slot_numbers(path))


class HeadedRecordFile:
    """What the spool's record files (this slot file, spoolpairs' pair file) share: a file that
    starts with a header page (MAGIC, u32 VERSION, u32 UNIT: the size of its slots or halves, u32
    CRC-32 of those 12 bytes, zeros to HEADER_BYTES), opened (and made with its header) on first
    use, and which spool ids it holds a record of (`_of`)."""
    MAGIC: bytes
    VERSION: int
    UNIT: int
    UNIT_NAME: str                 # what UNIT is the size of, for the refusal of another size
    HEADER_BYTES = 4096

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        self._fd: int | None = None
        self._of: dict = {}                    # spool id -> where its record is

    def _header(self) -> bytes:
        head = _HEAD.pack(self.MAGIC, self.VERSION, self.UNIT)
        return (head + struct.pack("<I", zlib.crc32(head))).ljust(self.HEADER_BYTES, b"\0")

    def _check_header(self, page: bytes) -> None:
        path = self.path
        if len(page) < _HEAD.size + 4:
            raise StoreError(f"{path}: its header is cut short; it is kept, move it away to mount")
        magic, version, unit = _HEAD.unpack_from(page)
        (crc,) = struct.unpack_from("<I", page, _HEAD.size)
        if magic != self.MAGIC or crc != zlib.crc32(page[:_HEAD.size]):
            raise StoreError(f"{path}: its header is damaged; it is kept, move it away to mount")
        if version != self.VERSION or unit != self.UNIT:
            raise StoreError(f"{path}: version {version} with {self.UNIT_NAME} of {unit} bytes is not supported "
                             f"(this lmzfs reads version {self.VERSION}, {self.UNIT}); it is kept")

    def _open(self) -> int:
        """The file, opened (made with its header if there is none). Called with the lock held."""
        if self._fd is None:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
            try:
                header = self._header()
                page = os.pread(fd, len(header), 0)
                if not page:
                    if os.pwrite(fd, header, 0) != len(header):
                        raise OSError(errno.ENOSPC, f"short write of the spool's {self.path.name}")
                else:
                    self._check_header(page)
            except BaseException:
                os.close(fd)
                raise
            self._fd = fd
        return self._fd

    def holds(self, spool_id: str) -> bool:
        return spool_id in self._of

    def ids(self) -> set[str]:
        with self._lock:
            return set(self._of)

    def sync(self) -> None:
        """Every write and free so far durable."""
        with self._lock:
            if self._fd is not None:
                os.fsync(self._fd)

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None


class RecordSlots(HeadedRecordFile):
    """The slot file of one writable mount's spool: which slot holds which spool id's record."""
    MAGIC, VERSION, UNIT, UNIT_NAME, HEADER_BYTES = _MAGIC, SLOTS_VERSION, SLOT_BYTES, "slots", SLOT_BYTES

    def __init__(self, path: Path):
        super().__init__(path)
        self._of: dict[str, int] = {}          # spool id -> its slot
        self._free: list[int] = []             # free slots below _end (a heap: the lowest first)
        self._end = 1                          # slots at or past this are past the file's end
        self._found: set[int] = set()          # slots read used at mount, not yet bound or freed

    def read(self) -> list[SlotContent]:
        """Every used slot, in slot order (at mount, before any is written); the free ones are
        noted for reuse."""
        with self._lock:
            if not self.path.exists():
                return []
            fd = self._open()
            size = os.fstat(fd).st_size
            found, self._free = [], []
            self._end = max(1, -(-size // SLOT_BYTES))
            for slot in range(1, self._end):
                page = os.pread(fd, SLOT_BYTES, slot * SLOT_BYTES)
                if page and page[0] != 0:
                    found.append(SlotContent(slot, page.rstrip(b" \0")))
                    self._found.add(slot)
                else:
                    heappush(self._free, slot)
            if not found:
                self._cut()
            return found

    def bind(self, spool_id: str, slot: int) -> None:
        """Slot `slot`, found used at mount, holds `spool_id`'s record."""
        with self._lock:
            self._found.discard(slot)
            self._of[spool_id] = slot

    def write(self, spool_id: str, data: bytes) -> None:
        """`spool_id`'s record is `data` (at most SLOT_BYTES): in its slot, or a new one."""
        if len(data) > SLOT_BYTES:
            raise ValueError("a record larger than a slot")
        page = data.ljust(SLOT_BYTES, b" ")
        with self._lock:
            fd = self._open()
            slot = self._of.get(spool_id)
            new = slot is None
            if new:
                slot = heappop(self._free) if self._free else self._end
                if slot == self._end:
                    self._end += 1
                self._of[spool_id] = slot
        try:
            if os.pwrite(fd, page, slot * SLOT_BYTES) != SLOT_BYTES:
                raise OSError(errno.ENOSPC, "short write of a spool record")
        except BaseException:
            if new:
                self.free(spool_id)    # (a short write past the end leaves a part page: zeroed, or cut)
            raise

    def page(self, spool_id: str) -> bytes | None:
        """The record `spool_id`'s slot holds (padding stripped), None if it has none."""
        with self._lock:
            slot = self._of.get(spool_id)
            if slot is None:
                return None
            return os.pread(self._open(), SLOT_BYTES, slot * SLOT_BYTES).rstrip(b" \0")

    def free(self, spool_id: str) -> None:
        """`spool_id` has no record in a slot any more (its slot zeroed; not fsync'd)."""
        with self._lock:
            slot = self._of.pop(spool_id, None)
            if slot is not None:
                self._free_slot(slot)

    def free_slot(self, slot: int) -> None:
        """Zero slot `slot`, found used at mount but bound to no record (damaged, or superseded)."""
        with self._lock:
            self._free_slot(slot)

    def _free_slot(self, slot: int) -> None:
        self._found.discard(slot)
        if not self._of and not self._found:
            self._cut()                # nothing used: the file back to its header
            return
        fd = self._open()
        if slot < self._end:
            os.pwrite(fd, bytes(SLOT_BYTES), slot * SLOT_BYTES)
            heappush(self._free, slot)

    def _cut(self) -> None:
        os.ftruncate(self._open(), SLOT_BYTES)
        self._free, self._end, self._found = [], 1, set()
