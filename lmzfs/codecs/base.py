"""The codec interface every codec module implements, and the varint used by payload headers."""
from __future__ import annotations

from abc import ABC, abstractmethod

from ..chunker import ChunkHint  # defined where chunks are cut; importable from here as it always was


class CodecError(ValueError):
    """A payload is corrupt, truncated, of an unknown codec or version, or decodes to the wrong size."""


Buffer = bytes | bytearray | memoryview

# Plain bytes that zstd and plain copies decode in about the time a thread hop takes on one core,
# the usual cheap_bytes of a codec without an entropy coder of our own.
THREAD_HOP_BYTES = 256 << 10


class Codec(ABC):
    """One reversible transform of a chunk's bytes.

    ``id`` is recorded in every payload and is stable forever: never reuse or renumber one.
    A codec is stateless apart from encode-side settings (such as a compression level) that the
    decoder does not need; anything the decoder needs goes into ``params``.
    """

    id: int
    name: str
    # What a reader may ask of the codec, so that the read path never names one:
    # cheap_bytes: decoding up to this many plain bytes of a chunk (all of a chunk that small, or
    # the parts a small read touches) takes about as long as handing the work to a thread and
    # back, so a reader may do it on an event loop; 0: never cheap (an entropy coder of our own).
    cheap_bytes: int = 0
    # part_bytes: > 0 if a chunk decodes in parts of this many plain bytes, each on its own and
    # checked on its own (decode_parts); 0: only whole chunks decode.
    part_bytes: int = 0
    # reference: chunks of this codec decode only given the plain bytes of another chunk
    # (DeltaCodec); the store resolves that chunk first.
    reference: bool = False

    @abstractmethod
    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        """Return ``(params, body)`` for ``data``; the decoder is given both plus ``len(data)``."""

    @abstractmethod
    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        """Return exactly ``size`` bytes, or raise CodecError. Never allocate much more than ``size``.

        check=False skips a codec's own checksum of the plain bytes (CRC-32): only for callers
        that check a hash of the result themselves. Structural checks always run."""

    def decode_buffer(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> Buffer:
        """decode()'s bytes, checked the same way, but possibly in a buffer of the codec's own (a
        byte-format memoryview of the array it decoded into) instead of a copy of it as bytes:
        for a reader that needs a few of them now and the copy later (lmzfs/reader/filereader.py)."""
        return self.decode(params, body, size, check=check)

    def part_decoder(self, params: Buffer, body_len: int, size: int) -> "PartDecoder":
        """The chunk's params parsed and its tables built, once, for decoding its parts one read
        at a time (a reader keeps it while it reads parts of the chunk); for codecs with
        part_bytes > 0 only. Raises CodecError for params that do not fit the body length."""
        raise NotImplementedError(f"{self.name} decodes whole chunks only")

    def decode_parts(self, params: Buffer, read_body, body_len: int, size: int, lo: int,
                     hi: int) -> list[tuple[int, bytes]]:
        """(start, plain bytes) of each part that plain bytes [lo, hi) of the chunk touch, each
        checked against its own checksum, reading only the body bytes they need through
        read_body(start, n); for codecs with part_bytes > 0 only."""
        return self.part_decoder(params, body_len, size).decode_from(read_body, lo, hi)

    def __repr__(self) -> str:
        return f"<codec {self.name} id={self.id}>"


class PartDecoder(ABC):
    """A chunk's parsed params, for decoding its parts: what a reader may keep (``nbytes`` of
    memory) instead of parsing the params and building the tables again for every part."""

    nbytes: int

    @abstractmethod
    def span(self, lo: int, hi: int) -> tuple[int, int]:
        """The body bytes [start, stop) that the parts plain bytes [lo, hi) touch are coded in."""

    @abstractmethod
    def decode(self, piece: Buffer, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """(start, plain bytes) of each part [lo, hi) touches, each checked against its own
        checksum, from piece: exactly the body bytes span(lo, hi) names."""

    def decode_from(self, read_body, lo: int, hi: int) -> list[tuple[int, bytes]]:
        """decode(), reading the body bytes it needs through read_body(start, n)."""
        start, stop = self.span(lo, hi)
        piece = read_body(start, stop - start)
        if len(piece) != stop - start:
            raise CodecError("truncated payload: a part's body is cut short")
        return self.decode(piece, lo, hi)


class DeltaCodec(Codec):
    """A codec whose chunks are coded against a *reference*: the plain bytes of another chunk of
    the same size (the same tensor's chunk in another checkpoint). The store records which chunk
    is the reference and hands its plain bytes to the decoder; nothing of it is in the payload.
    A delta payload never decodes without its reference (encode/decode refuse)."""

    reference = True

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        raise CodecError(f"{self.name} codes a chunk against a reference: use encode_delta")

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        raise CodecError(f"{self.name} payload decoded without its reference chunk")

    @abstractmethod
    def encode_delta(self, data: memoryview, ref: memoryview, hint: ChunkHint) -> tuple[bytes, bytes] | None:
        """``(params, body)`` of ``data`` coded against ``ref`` (same length), or None if this
        codec does not apply to the hint's dtype."""

    @abstractmethod
    def decode_delta(self, params: Buffer, body: Buffer, size: int, ref: Buffer, *, check: bool = True) -> bytes:
        """Exactly ``size`` bytes from a payload and its reference (``size`` bytes), or CodecError."""


# --- unsigned LEB128 varints, canonical (minimal) form only -----------------------------------

VARINT_MAX_BYTES = 10  # enough for any value < 2**64


def put_varint(value: int) -> bytes:
    if value < 0 or value >= 1 << 64:
        raise ValueError(f"varint out of range: {value}")
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def get_varint(buf: Buffer, pos: int, what: str) -> tuple[int, int]:
    """Decode a canonical varint at ``buf[pos:]``; return ``(value, new_pos)`` or raise CodecError."""
    value = 0
    shift = 0
    end = len(buf)
    for i in range(VARINT_MAX_BYTES):
        if pos + i >= end:
            raise CodecError(f"truncated payload: {what} varint runs past the end")
        b = buf[pos + i]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            if b == 0 and i > 0:
                raise CodecError(f"non-canonical {what} varint (redundant trailing zero group)")
            if value >= 1 << 64:
                raise CodecError(f"{what} varint exceeds 64 bits")
            return value, pos + i + 1
        shift += 7
    raise CodecError(f"{what} varint longer than {VARINT_MAX_BYTES} bytes")


def delta_inputs(codec: str, params: Buffer, body: Buffer, size: int, ref: Buffer,
                 min_params: int) -> tuple[memoryview, memoryview]:
    """A delta codec's params and body as views, once the reference's length and the params'
    are checked (CodecError naming `codec` if not)."""
    if len(ref) != size:
        raise CodecError(f"{codec}: reference holds {len(ref)} bytes, the chunk {size}")
    if len(params) < min_params:
        raise CodecError(f"{codec}: params too short")
    return memoryview(params), memoryview(body)
