"""Append-only pack files holding encoded chunk payloads.

A pack starts with a 16-byte header (magic, version) and then holds records back to back:

    b"LZCK" | chunk id (32 bytes, SHA-256 of the plain bytes) | u32 LE payload length | payload

The catalog records (pack id, payload offset, payload length) for each chunk; the record header
makes a pack self-describing so damage can be told from a catalog mismatch, and so a pack can be
scanned without the catalog. A write that fails before its catalog commit (a full disk, a file
that changed under `lmz add`) cuts what it appended (its pack session discards it); bytes appended by a
process killed before its commit are dead space that `lmz gc` reclaims.
"""
from __future__ import annotations

import errno
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Protocol, Union

from lmzfs.store.layout import FILE_MODE, StorePaths, StoreError, fsync_dir

PACK_MAGIC = b"LMZPACK\x00"
PACK_VERSION = 1
PACK_HEADER = PACK_MAGIC + struct.pack("<II", PACK_VERSION, 0)
RECORD_MAGIC = b"LZCK"
RECORD_HEADER = struct.Struct("<4s32sI")          # magic, chunk id, payload length


class PackDamaged(OSError):
    """A record cannot be read back as the catalog describes it."""


@dataclass(frozen=True)
class ChunkLocation:
    pack: int
    offset: int       # of the payload, not of the record header
    length: int


class PackFile(Protocol):
    """A pack opened for reading where it is not a local file (a remote store's pack object)."""
    def pread(self, length: int, offset: int) -> bytes: ...


PackSource = Union[int, PackFile]       # a descriptor of a local pack, or a PackFile


def _pread(src: PackSource, length: int, offset: int) -> bytes:
    return os.pread(src, length, offset) if isinstance(src, int) else src.pread(length, offset)


def check_pack_header(src: PackSource, path: Path | str) -> None:
    head = _pread(src, len(PACK_HEADER), 0)
    if head[:8] != PACK_MAGIC:
        raise PackDamaged(f"{path}: not an lmzfs pack file")
    if len(head) < len(PACK_HEADER):
        raise PackDamaged(f"{path}: pack header is cut short")
    version, reserved = struct.unpack("<II", head[8:16])
    if version != PACK_VERSION:
        raise PackDamaged(f"{path}: pack version {version} is not supported")
    if reserved != 0:
        raise PackDamaged(f"{path}: pack header's reserved field is {reserved:#x}, not 0")


def read_payload(fd: PackSource, chunk_id: bytes, loc: ChunkLocation) -> memoryview:
    """Read one payload and check its record header names this chunk and length.

    A view past the record header, not a copy: a copy would be paid again for every chunk read."""
    return read_payload_part(fd, chunk_id, loc, 0, loc.length)


def read_payload_part(fd: PackSource, chunk_id: bytes, loc: ChunkLocation, start: int, length: int) -> memoryview:
    """Payload bytes [start, start + length), for a reader that needs only part of a payload
    (one segment of a floatseg chunk: a quarter of the bytes). A part from the payload's start
    comes with its record header, which must name this chunk and length; PackDamaged if not, or
    if the part runs past the payload or the pack."""
    if start < 0 or length < 0 or start + length > loc.length:
        raise PackDamaged(f"pack {loc.pack}: bytes {start}..{start + length} lie outside the payload at {loc.offset}")
    record = loc.offset - RECORD_HEADER.size
    head = 0 if start else RECORD_HEADER.size
    raw = _pread(fd, head + length, loc.offset + start - head)
    if len(raw) != head + length:
        raise PackDamaged(f"pack {loc.pack}: record at {record} is truncated")
    if head:
        magic, rid, plen = RECORD_HEADER.unpack_from(raw)
        if magic != RECORD_MAGIC or rid != chunk_id or plen != loc.length:
            raise PackDamaged(f"pack {loc.pack}: record at {record} does not hold chunk {chunk_id.hex()[:16]}")
    return memoryview(raw)[head:]
