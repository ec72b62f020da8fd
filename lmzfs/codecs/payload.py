"""The payload every stored chunk is: its self-describing header, encode_with (a payload under
one given codec), parsing and checking a payload, and decoding it, whole or by parts.

Every stored chunk is one *payload* (format described in docs/format.md)::

    b"LC" | version (1 byte, = 1) | codec id (1 byte) | plain size (varint)
          | params length (varint) | params | body (to the end of the payload)

``decode_chunk`` never guesses: it dispatches on the recorded codec id and checks every field.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..chunker import ChunkHint
from .base import VARINT_MAX_BYTES, Buffer, Codec, CodecError, PartDecoder, get_varint, put_varint
from .registry import REGISTRY, by_name

MAGIC = b"LC"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class EncodedChunk:
    payload: bytes
    codec: str  # name of the codec recorded in the payload


@dataclass(frozen=True)
class PayloadHeader:
    version: int
    codec_id: int
    size: int             # plain size recorded in the header
    params: memoryview
    body: memoryview


def header_bytes(codec_id: int, size: int, params: bytes) -> bytes:
    """A payload's header and params: what precedes its body."""
    return MAGIC + bytes((FORMAT_VERSION, codec_id)) + put_varint(size) + put_varint(len(params)) + params


def as_bytes_view(data: Buffer) -> memoryview:
    """A 1-D byte-format view of any contiguous buffer (a typed array, bytes, a bytearray)."""
    mv = memoryview(data)
    if mv.ndim != 1 or mv.format != "B" or mv.itemsize != 1:
        mv = mv.cast("B")  # raises TypeError for non-contiguous buffers
    return mv


def encode_with(codec: Codec | str, data: Buffer, hint: ChunkHint = ChunkHint()) -> bytes:
    """The payload of ``data`` under one given codec (no choice made); mainly for tests/fixtures."""
    if isinstance(codec, str):
        codec = by_name(codec)
    mv = as_bytes_view(data)
    params, body = codec.encode(mv, hint)
    return header_bytes(codec.id, len(mv), params) + body


def parse_payload(payload: Buffer) -> PayloadHeader:
    """Split a payload into its header fields, params and body; CodecError if malformed."""
    mv = as_bytes_view(payload)
    version, codec_id, size, pos, plen = _header_fields(mv)
    if pos + plen > len(mv):
        raise CodecError(f"truncated payload: params length {plen} runs past the end")
    return PayloadHeader(version, codec_id, size, mv[pos:pos + plen], mv[pos + plen:])


def _header_fields(mv: memoryview) -> tuple[int, int, int, int, int]:
    """(version, codec id, plain size, params offset, params length) of a payload or its start."""
    if len(mv) < 4:
        raise CodecError(f"truncated payload: {len(mv)} bytes, the fixed header alone is 4")
    if mv[:2] != MAGIC:
        raise CodecError(f"bad payload magic {bytes(mv[:2])!r}, expected {MAGIC!r}")
    version, codec_id = mv[2], mv[3]
    if version != FORMAT_VERSION:
        raise CodecError(f"unsupported payload format version {version} (this build reads {FORMAT_VERSION})")
    if codec_id not in REGISTRY:
        raise CodecError(f"unknown codec id {codec_id}")
    size, pos = get_varint(mv, 4, "plain size")
    plen, pos = get_varint(mv, pos, "params length")
    return version, codec_id, size, pos, plen


def decode_chunk(payload: Buffer, size: int, *, hash_checked: bool = False, copy: bool = True,
                 ref: Buffer | None = None) -> Buffer:
    """Decode a payload that must hold exactly ``size`` plain bytes, or raise CodecError.

    ref: the plain bytes of the reference chunk, for a payload of a delta codec, which needs it;
    a payload of any other codec given one, or a delta payload given none, is refused (the store
    and the payload disagree about what the chunk is).

    hash_checked=True: the caller checks a hash of the result (the store's SHA-256, a single-file
    record's CRC-32), so the codecs skip their own CRC-32 of it (a fifth of a float chunk's decode).
    copy=False: the result may be a byte-format memoryview of the codec's own array instead of
    bytes (Codec.decode_buffer); with copy (the default) it is always bytes.
    """
    h = parse_payload(payload)
    if h.size != size:
        raise CodecError(f"payload records plain size {h.size}, expected {size}")
    codec = REGISTRY[h.codec_id]
    if codec.reference != (ref is not None):
        raise CodecError(f"{codec.name} payload {'needs a' if codec.reference else 'takes no'} reference chunk")
    if codec.reference:
        out = codec.decode_delta(h.params, h.body, size, as_bytes_view(ref), check=not hash_checked)
    else:
        out = (codec.decode if copy else codec.decode_buffer)(h.params, h.body, size, check=not hash_checked)
    if len(out) != size:  # codecs check this themselves; this is the last line of defence
        raise CodecError(f"{codec.name} decoded {len(out)} bytes, expected {size}")
    return out


def decode_chunk_segments(payload: Buffer, size: int, lo: int, hi: int) -> list[tuple[int, bytes]] | None:
    """For a chunk whose codec decodes in segments (floatseg): (start, plain bytes) of each
    segment that plain bytes [lo, hi) touch, each checked against its CRC-32; None for others."""
    mv = as_bytes_view(payload)
    return decode_segments_from(lambda a, n: mv[a:a + n], len(mv), size, lo, hi)


# What decode_segments_from reads first: the header and params (floatseg's are under 1 KiB).
SEGMENT_HEAD_BYTES = 4096


@dataclass(frozen=True)
class PayloadParts:
    """A payload's part decoder and where its body starts in the payload: what a reader keeps
    to decode more parts of the chunk later without reading and parsing its params again."""
    decoder: PartDecoder
    body_at: int

    @property
    def nbytes(self) -> int:
        return self.decoder.nbytes

    def decode_from(self, read: Callable[[int, int], Buffer], lo: int, hi: int) -> list[tuple[int, bytes]]:
        """The parts [lo, hi) touches, reading payload bytes through read(start, n)."""
        return self.decoder.decode_from(lambda a, n: read(self.body_at + a, n), lo, hi)


def payload_parts_from(read: Callable[[int, int], Buffer], length: int, size: int,
                       *, head: int = SEGMENT_HEAD_BYTES) -> PayloadParts | None:
    """The part decoder of a payload of `length` bytes that read(start, n) returns parts of (n
    bytes, fewer only where the payload is truncated), reading its header and params only;
    None for codecs that decode whole chunks only."""
    first = as_bytes_view(read(0, min(length, max(head, 4 + 2 * VARINT_MAX_BYTES))))   # the header's varints
    _, codec_id, psize, pos, plen = _header_fields(first)
    codec = REGISTRY[codec_id]
    if not codec.part_bytes:
        return None
    if psize != size:
        raise CodecError(f"payload records plain size {psize}, expected {size}")
    if pos + plen > length:
        raise CodecError(f"truncated payload: params length {plen} runs past the end")
    if pos + plen > len(first):
        first = as_bytes_view(read(0, pos + plen))
    if len(first) < pos + plen:
        raise CodecError("truncated payload: params cut short")
    body = pos + plen
    return PayloadParts(codec.part_decoder(first[pos:body], length - body, size), body)


def decode_segments_from(read: Callable[[int, int], Buffer], length: int, size: int, lo: int, hi: int,
                         *, head: int = SEGMENT_HEAD_BYTES) -> list[tuple[int, bytes]] | None:
    """decode_chunk_segments for a payload of `length` bytes that read(start, n) returns parts
    of (n bytes, fewer only where the payload is truncated): it reads the header and params,
    then only the body bytes of the segments [lo, hi) touch (a quarter of a 1 MiB chunk's, for
    a small read), not the whole payload. None for codecs without segments."""
    parts = payload_parts_from(read, length, size, head=head)
    return None if parts is None else parts.decode_from(read, lo, hi)
