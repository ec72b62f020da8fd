"""Append-only pack files holding encoded chunk payloads.

A pack starts with a 16-byte header (magic, version) and then holds records back to back:

    b"LZCK" | chunk id (32 bytes, SHA-256 of the plain bytes) | u32 LE payload length | payload

The catalog records (pack id, payload offset, payload length) for each chunk; the record header
makes a pack self-describing so damage can be told from a catalog mismatch, and so a pack can be
scanned without the catalog. A write that fails before its catalog commit (a full disk, a file
that changed under `lmz add`) cuts what it appended (`PackWriter.discard`); bytes appended by a
process killed before its commit are dead space that `lmz gc` reclaims.
"""
from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from lmzfs.store.layout import FILE_MODE, StorePaths, StoreError, fsync_dir

PACK_MAGIC = b"LMZPACK\x00"
PACK_VERSION = 1
PACK_HEADER = PACK_MAGIC + struct.pack("<II", PACK_VERSION, 0)
RECORD_MAGIC = b"LZCK"
RECORD_HEADER = struct.Struct("<4s32sI")          # magic, chunk id, payload length
MAX_PACK_BYTES = 1 << 30                          # start a new pack past this size


class PackDamaged(OSError):
    """A record cannot be read back as the catalog describes it."""


@dataclass(frozen=True)
class ChunkLocation:
    pack: int
    offset: int       # of the payload, not of the record header
    length: int


def check_pack_header(fd: int, path: Path) -> None:
    head = os.pread(fd, len(PACK_HEADER), 0)
    if head[:8] != PACK_MAGIC:
        raise PackDamaged(f"{path}: not an lmzfs pack file")
    version = struct.unpack("<I", head[8:12])[0] if len(head) >= 12 else -1
    if version != PACK_VERSION:
        raise PackDamaged(f"{path}: pack version {version} is not supported")


def read_payload(fd: int, chunk_id: bytes, loc: ChunkLocation) -> memoryview:
    """Read one payload and check its record header names this chunk and length.

    A view past the record header, not a copy: a copy would be paid again for every chunk read."""
    return read_payload_part(fd, chunk_id, loc, 0, loc.length)


def read_payload_part(fd: int, chunk_id: bytes, loc: ChunkLocation, start: int, length: int) -> memoryview:
    """Payload bytes [start, start + length), for a reader that needs only part of a payload
    (one segment of a floatseg chunk: a quarter of the bytes). A part from the payload's start
    comes with its record header, which must name this chunk and length; PackDamaged if not, or
    if the part runs past the payload or the pack."""
    if start < 0 or length < 0 or start + length > loc.length:
        raise PackDamaged(f"pack {loc.pack}: bytes {start}..{start + length} lie outside the payload at {loc.offset}")
    record = loc.offset - RECORD_HEADER.size
    head = 0 if start else RECORD_HEADER.size
    raw = os.pread(fd, head + length, loc.offset + start - head)
    if len(raw) != head + length:
        raise PackDamaged(f"pack {loc.pack}: record at {record} is truncated")
    if head:
        magic, rid, plen = RECORD_HEADER.unpack_from(raw)
        if magic != RECORD_MAGIC or rid != chunk_id or plen != loc.length:
            raise PackDamaged(f"pack {loc.pack}: record at {record} does not hold chunk {chunk_id.hex()[:16]}")
    return memoryview(raw)[head:]


class PackWriter:
    """Appends records for one add or gc; `sync()` makes everything appended so far durable."""

    def __init__(self, paths: StorePaths, append_to: int | None, next_new: int):
        """Append to pack `append_to` if it exists and has room, else create pack `next_new` (or the
        first free id above it: ids are never reused while a committed catalog could name them)."""
        self._paths = paths
        self._next_new = next_new
        self._fd: int | None = None
        self._size = 0
        self.touched: list[int] = []
        # pack id -> its size when this writer began appending to it; 0: this writer created it
        self._began: dict[int, int] = {}
        path = paths.pack(append_to) if append_to is not None else None
        if path is not None and path.exists() and path.stat().st_size < MAX_PACK_BYTES:
            fd = os.open(path, os.O_RDWR)
            try:
                check_pack_header(fd, path)
            except BaseException:
                os.close(fd)
                raise
            self._fd, self._pack_id, self._size = fd, append_to, os.fstat(fd).st_size
            self.touched.append(append_to)
            self._began[append_to] = self._size
        else:
            self._create()

    def _create(self) -> None:
        pack_id = self._next_new
        while True:
            try:
                fd = os.open(self._paths.pack(pack_id), os.O_RDWR | os.O_CREAT | os.O_EXCL, FILE_MODE)
                break
            except FileExistsError:
                pack_id += 1
            except OSError as exc:
                raise StoreError(f"cannot create pack {pack_id}: {exc.strerror}") from exc
        try:
            if os.write(fd, PACK_HEADER) != len(PACK_HEADER):
                raise OSError(errno.ENOSPC, "short write (disk full?)")
            os.fsync(fd)
            fsync_dir(self._paths.packs)
        except OSError as exc:
            os.close(fd)
            try:
                os.unlink(self._paths.pack(pack_id))      # it holds nothing yet
            except OSError:
                pass
            raise StoreError(f"cannot create pack {pack_id}: {exc.strerror}") from exc
        self._began[pack_id] = 0
        self._fd, self._pack_id, self._size = fd, pack_id, len(PACK_HEADER)
        self._next_new = pack_id + 1
        self.touched.append(pack_id)

    def append(self, chunk_id: bytes, payload: bytes | memoryview) -> ChunkLocation:
        if self._size >= MAX_PACK_BYTES:
            self.sync()
            self.close()
            self._create()
        record = RECORD_HEADER.pack(RECORD_MAGIC, chunk_id, len(payload))
        offset = self._size
        try:
            n = os.pwrite(self._fd, record + payload, offset)
        except OSError as exc:
            raise StoreError(f"cannot write to pack {self._pack_id}: {exc.strerror}") from exc
        if n != len(record) + len(payload):
            raise StoreError(f"short write to pack {self._pack_id} (disk full?)") from OSError(
                errno.ENOSPC, "short write")
        self._size += n
        return ChunkLocation(self._pack_id, offset + RECORD_HEADER.size, len(payload))

    @property
    def pack_id(self) -> int:
        return self._pack_id

    def sync(self) -> None:
        if self._fd is not None:
            try:
                os.fsync(self._fd)
            except OSError as exc:
                raise StoreError(f"cannot make pack {self._pack_id} durable: {exc.strerror}") from exc

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def discard(self, named_end: Callable[[int], int]) -> bool:
        """Cut everything this writer appended, for a write that failed before its catalog commit:
        each pack it created is removed, each pack it appended to is cut back to its size before.
        `named_end(pack)` is where the last record the catalog names in that pack ends (0: none);
        if it lies past where this writer began, a commit that reported failure went through, and
        nothing is cut. Returns whether the bytes were cut. It never raises: whatever stops it (a
        catalog it cannot read, an I/O error) leaves the bytes to `lmz gc`, as a killed process
        does, and the caller reports the error that made it discard."""
        self.close()
        try:
            if any(named_end(pack) > start for pack, start in self._began.items()):
                return False
            for pack, start in self._began.items():
                path = self._paths.pack(pack)
                if start == 0:
                    path.unlink(missing_ok=True)
                    continue
                fd = os.open(path, os.O_RDWR)
                try:
                    os.ftruncate(fd, start)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(self._paths.packs)
        except Exception:       # noqa: BLE001 -- see above: the bytes stay for gc
            return False
        self._began.clear()
        return True
