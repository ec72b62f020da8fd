"""The single-file archive (`lmz pack`) container, version 1: fixed-size structs and their checks.

    header (24 bytes) | chunk record * N | trailer (64 bytes)
    chunk record = record header (12 bytes) | chunk payload (codec format, docs/format.md)

Everything is little-endian. docs/format.md ("Single-file archive") is the normative text; this
module is its one implementation. Readers check every field before acting on it, and every
length against a fixed bound before allocating.
"""
from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import BinaryIO

from .errors import InvalidArchive

MAGIC = b"LMZ1\r\n\x1a\n"    # CR LF, ^Z, LF: damage by text-mode transfers shows up as bad magic
VERSION = 1
TRAILER_MAGIC = b"LMZT"

# Bounds a reader enforces before allocating. The chunker cuts 1 MiB chunks; 16 MiB leaves room
# for a future chunker without letting a hostile record ask for gigabytes.
MAX_CHUNK_BYTES = 16 << 20
# encode_chunk falls back to a raw payload (plain bytes plus a header of a few bytes) whenever no
# codec does better, so a payload is never much larger than its plain bytes.
MAX_PAYLOAD_OVERHEAD = 4096

_HEADER = struct.Struct("<8sHHQ")          # magic, version, flags, plain size
_HEADER_CRC = struct.Struct("<I")
_RECORD = struct.Struct("<III")            # plain length, payload length, CRC-32 of the plain bytes
_TRAILER = struct.Struct("<4sQQQ32s")      # magic, chunk count, plain size, payload bytes, SHA-256
_TRAILER_CRC = struct.Struct("<I")

HEADER_SIZE = _HEADER.size + _HEADER_CRC.size        # 24
RECORD_HEADER_SIZE = _RECORD.size                    # 12
TRAILER_SIZE = _TRAILER.size + _TRAILER_CRC.size     # 64


def crc32(data) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF


@dataclass(frozen=True)
class Header:
    plain_size: int       # size of the original file; the chunk records must add up to it

    def pack(self) -> bytes:
        body = _HEADER.pack(MAGIC, VERSION, 0, self.plain_size)
        return body + _HEADER_CRC.pack(crc32(body))

    @classmethod
    def unpack(cls, raw: bytes) -> "Header":
        if raw[:len(MAGIC)] != MAGIC[:len(raw)]:
            raise InvalidArchive(f"not an lmz single-file archive (magic {raw[:len(MAGIC)]!r}, "
                                 f"expected {MAGIC!r})")
        if len(raw) < HEADER_SIZE:
            raise InvalidArchive(f"truncated: the {HEADER_SIZE}-byte header ends after {len(raw)} bytes")
        _, version, flags, plain_size = _HEADER.unpack_from(raw)
        # The version is checked before the CRC so that a newer archive is reported as newer,
        # not as damaged.
        if version != VERSION:
            raise InvalidArchive(f"unsupported archive format version {version} (this build reads {VERSION})")
        (want,) = _HEADER_CRC.unpack_from(raw, _HEADER.size)
        if crc32(raw[:_HEADER.size]) != want:
            raise InvalidArchive("header checksum mismatch: the header is damaged")
        if flags:
            raise InvalidArchive(f"unknown header flags 0x{flags:04x}")
        return cls(plain_size)


@dataclass(frozen=True)
class RecordHeader:
    plain_length: int
    payload_length: int
    plain_crc32: int

    def pack(self) -> bytes:
        return _RECORD.pack(self.plain_length, self.payload_length, self.plain_crc32)

    @classmethod
    def unpack(cls, raw: bytes, index: int, remaining: int) -> "RecordHeader":
        """Decode and bound-check chunk record ``index``; ``remaining`` plain bytes are still owed."""
        plain, payload, crc = _RECORD.unpack(raw)
        if not 0 < plain <= MAX_CHUNK_BYTES:
            raise InvalidArchive(f"chunk {index}: plain length {plain} outside 1..{MAX_CHUNK_BYTES}")
        if plain > remaining:
            raise InvalidArchive(f"chunk {index}: plain length {plain} runs past the declared size "
                                 f"({remaining} bytes were left): chunks do not tile the file")
        if not 0 < payload <= plain + MAX_PAYLOAD_OVERHEAD:
            raise InvalidArchive(f"chunk {index}: payload length {payload} outside 1..{plain + MAX_PAYLOAD_OVERHEAD} "
                                 f"for {plain} plain bytes")
        return cls(plain, payload, crc)


@dataclass(frozen=True)
class Trailer:
    chunk_count: int
    plain_size: int
    payload_bytes: int    # sum of the payload lengths (record headers excluded)
    sha256: bytes         # of the whole original file

    def pack(self) -> bytes:
        body = _TRAILER.pack(TRAILER_MAGIC, self.chunk_count, self.plain_size, self.payload_bytes, self.sha256)
        return body + _TRAILER_CRC.pack(crc32(body))

    @classmethod
    def unpack(cls, raw: bytes, at: int) -> "Trailer":
        if raw[:4] != TRAILER_MAGIC:
            raise InvalidArchive(f"expected the trailer at offset {at}, found {raw[:4]!r}")
        (want,) = _TRAILER_CRC.unpack_from(raw, _TRAILER.size)
        if crc32(raw[:_TRAILER.size]) != want:
            raise InvalidArchive(f"trailer checksum mismatch at offset {at}: the trailer is damaged")
        _, count, plain, payload, sha = _TRAILER.unpack_from(raw)
        return cls(count, plain, payload, sha)


def read_exact(f: BinaryIO, n: int, what: str, at: int) -> bytes:
    """Exactly n bytes from f, or InvalidArchive naming what was cut off. n is already bounded."""
    data = f.read(n)
    if len(data) != n:
        raise InvalidArchive(f"truncated: {what} at offset {at} needs {n} bytes, the archive ends "
                             f"after {len(data)}")
    return data
