"""Read one chunk back: payload from its pack, decode, and check the plain bytes against the
checksum the catalog keeps for them (XXH3-128, or the SHA-256 id itself for chunks stored without).

The one place where stored bytes become plain bytes; the reader, `lmz verify` and `lmz cat` all
go through it, so nothing can hand out bytes that were not checked. A part of a chunk (one
segment of a floatseg chunk) is checked against its own CRC-32, as the chunk's checksum needs all
of it.
"""
from __future__ import annotations

import hashlib
from contextlib import contextmanager
from typing import Iterator

import xxhash

from lmzfs.codecs import CodecError, PayloadParts, decode_chunk, payload_parts_from
from lmzfs.codecs.base import Buffer
from lmzfs.errors import CorruptChunk
from lmzfs.store.catalog import Extent
from lmzfs.store.packs import PackDamaged, read_payload, read_payload_part


@contextmanager
def _reported(extent: Extent) -> Iterator[None]:
    """Damage and read errors as CorruptChunk (errno EIO), naming the chunk."""
    try:
        yield
    except (PackDamaged, CodecError) as exc:
        raise CorruptChunk(f"chunk {extent.chunk_id.hex()[:16]}: {exc}") from exc
    except OSError as exc:
        raise CorruptChunk(f"chunk {extent.chunk_id.hex()[:16]}: cannot read pack {extent.location.pack}: "
                           f"{exc.strerror or exc}") from exc


def read_chunk(fd: int, extent: Extent, *, check_id: bool = False, copy: bool = True,
               ref: Buffer | None = None) -> Buffer:
    """The chunk's plain bytes, checked against its XXH3-128 (or, for a chunk stored without one,
    or with check_id, its SHA-256 id, which costs far more).
    Bytes, or with copy=False possibly a byte-format memoryview of the codec's array (checked
    all the same; see codecs.decode_chunk). ref: the plain bytes of the chunk's base (checked
    by whoever read them), for a chunk coded against one."""
    with _reported(extent):
        payload = read_payload(fd, extent.chunk_id, extent.location)
        plain = decode_chunk(payload, extent.size, hash_checked=True, copy=copy, ref=ref)   # the check below
    if len(plain) != extent.size or \
            (extent.xxh3 is not None and xxhash.xxh3_128_digest(plain) != extent.xxh3) or \
            ((extent.xxh3 is None or check_id) and hashlib.sha256(plain).digest() != extent.chunk_id):
        raise CorruptChunk(f"chunk {extent.chunk_id.hex()[:16]}: decoded bytes do not match the chunk's hash")
    return plain


def chunk_parts(fd: int, extent: Extent) -> PayloadParts | None:
    """The part decoder of a chunk whose codec decodes in segments (floatseg): its header and
    params read and parsed, its tables built; None for other codecs. Keep it to decode more of
    the chunk's parts with read_chunk_parts."""
    loc = extent.location
    with _reported(extent):
        return payload_parts_from(lambda a, n: read_payload_part(fd, extent.chunk_id, loc, a, n),
                                  loc.length, extent.size)


def read_chunk_parts(fd: int, extent: Extent, parts: PayloadParts, lo: int, hi: int) -> list[tuple[int, bytes]]:
    """(start, plain bytes) of each segment that plain bytes [lo, hi) of the chunk touch, each
    checked against its CRC-32, reading only those segments' bytes."""
    loc = extent.location
    with _reported(extent):
        return parts.decode_from(lambda a, n: read_payload_part(fd, extent.chunk_id, loc, a, n), lo, hi)
