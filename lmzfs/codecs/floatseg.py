"""Codec 6, ``floatseg``: floatsplit with the chunk cut into segments that decode on their own.

A random 4 KiB read that misses the cache must decode the whole chunk it falls in; with floatsplit
that is every element of a 1 MiB chunk. floatseg fits one model (contexts and
tANS tables, as floatsplit does) to the whole chunk, then codes each 2**SEGMENT_LOG plain bytes
with it as a part of its own: own lanes, own tANS stream, own stored bits, own CRC-32. A reader
then decodes the one segment a small read needs (build the tables once, then a quarter of the
steps), and a sequential reader decodes all of them, sharing the tables, for about the cost of
floatsplit. Layout: docs/format.md, codec 6.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from . import floatsplit as fs
from . import tans
from ..chunker import ChunkHint
from .base import Buffer, Codec, CodecError, PartDecoder, get_varint, put_varint

SEGMENT_LOG = 18                 # encoder choice: 256 KiB of plain bytes per segment
MIN_SEGMENT_LOG, MAX_SEGMENT_LOG = 12, 24


@dataclass(frozen=True)
class Segment:
    index: int
    first: int      # first element
    count: int      # elements
    lanes: int
    crc: int        # CRC-32 of the segment's plain bytes (the last one's include the trailing bytes)
    slen: int       # tANS stream length
    groups: fs.GroupLens    # its flags decoded only when the segment is
    body: int       # offset of its bytes in the body
    length: int     # and their count


@dataclass(frozen=True)
class Layout:
    model: fs.Model
    seglog: int
    n: int          # elements
    tail: int       # trailing bytes after the last element
    segments: list[Segment]


class FloatSegCodec(Codec):
    id = 6
    name = "floatseg"
    # a chunk decodes a segment at a time, and one segment takes about a thread hop's time
    part_bytes = cheap_bytes = 1 << SEGMENT_LOG

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        fmt, u, n, tail, _ = fs.split_elements(data, hint)
        width = fs.FORMATS[fmt][1] // 8
        if n == 0:
            raise ValueError("floatseg: a chunk needs at least one element")
        per = (1 << SEGMENT_LOG) // width
        fit, sym = fs.fit_model(u, n, fmt, hint, part=per)
        records, bodies = [], []
        for a in range(0, n, per):
            b = min(n, a + per)
            part = fs.encode_part(fit, u[a:b], sym[a:b], None if fit.ctx is None else fit.ctx[a:b])
            plain = data[a * width: len(data) if b == n else b * width]
            records.append(put_varint(part.lanes) + zlib.crc32(plain).to_bytes(4, "little") + part.params)
            bodies.append(part.body)
        params = fit.head + put_varint(fit.emin) + put_varint(fit.E) + bytes((SEGMENT_LOG,)) + \
            put_varint(len(fit.blob)) + fit.blob + b"".join(records)
        return params, b"".join(bodies) + tail

    def layout(self, params: Buffer, body_len: int, size: int) -> Layout:
        """Parse and check the params against the body length; builds the chunk's tables."""
        p = memoryview(params)
        fmt, R, nb, c0, rows, pos = fs.parse_head(p, size, "floatseg")
        emin, pos = get_varint(p, pos, "floatseg emin")
        E, pos = get_varint(p, pos, "floatseg exponent range")
        if pos >= len(p):
            raise CodecError("floatseg: params truncated")
        seglog = p[pos]
        width = fs.FORMATS[fmt][1] // 8
        if not MIN_SEGMENT_LOG <= seglog <= MAX_SEGMENT_LOG:
            raise CodecError(f"floatseg: bad segment size 2**{seglog}")
        mlen, pos = get_varint(p, pos + 1, "floatseg model length")
        if pos + mlen > len(p):
            raise CodecError("floatseg: model runs past the params")
        n, t = divmod(size, width)
        if n == 0:
            raise CodecError("floatseg: a chunk needs at least one element")
        if n > tans.MAX_N:
            raise CodecError("floatseg: chunk too large")
        model = fs.decode_model(p[pos:pos + mlen], fmt, R, nb, c0, emin, E, n, rows, "floatseg")
        pos += mlen
        per = (1 << seglog) // width
        segments, at = [], 0
        for i, a in enumerate(range(0, n, per)):
            count = min(n, a + per) - a
            lanes, pos = get_varint(p, pos, "floatseg lanes")
            if pos + 4 > len(p):
                raise CodecError("floatseg: params truncated")
            crc = int.from_bytes(p[pos:pos + 4], "little")
            slen, pos = get_varint(p, pos + 4, "floatseg stream length")
            groups, pos = fs.parse_group_lens(p, pos, count, fmt, "floatseg")
            if not 1 <= lanes <= count:
                raise CodecError("floatseg: bad lanes")
            length = fs.part_length(model, count, lanes, slen, groups)
            segments.append(Segment(i, a, count, lanes, crc, slen, groups, at, length))
            at += length
        if pos != len(p):
            raise CodecError("floatseg: params longer than their segments")
        if at + t != body_len:
            raise CodecError("floatseg: body length does not match params")
        return Layout(model, seglog, n, t, segments)

    @staticmethod
    def _decode_into(lay: Layout, piece: memoryview, at: int, segs: list[Segment], u: np.ndarray) -> None:
        """The elements of consecutive segments segs into u (from segs[0]'s first element on),
        from piece: the body bytes [at, ...) that hold them."""
        first = segs[0].first
        fs.decode_parts_together(lay.model, piece, [fs.PartSpec(s.first, s.first - first, s.count, s.lanes, s.slen,
                                                       fs.groups_of(s.groups, s.count, lay.model.fmt), s.body - at)
                                           for s in segs], u)

    @staticmethod
    def _tail(lay: Layout, body: memoryview) -> bytes:
        """The trailing bytes, from a body (or a span of it) that runs to the body's end."""
        return bytes(body[len(body) - lay.tail:]) if lay.tail else b""

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        return self._decode_array(params, body, size, check).tobytes()

    def decode_buffer(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> Buffer:
        # the array the segments were decoded into, trailing bytes and all: no copy of the chunk
        return memoryview(self._decode_array(params, body, size, check))

    def _decode_array(self, params: Buffer, body: Buffer, size: int, check: bool) -> np.ndarray:
        """The chunk's plain bytes as a uint8 array of its own: the elements decoded in place
        into its front (a view of it as the element type), the trailing bytes copied after them."""
        body = memoryview(body)
        lay = self.layout(params, len(body), size)
        width = lay.model.val.itemsize
        out = np.empty(size, dtype=np.uint8)
        self._decode_into(lay, body, 0, lay.segments, out[:lay.n * width].view(lay.model.val.dtype))
        if lay.tail:
            out[lay.n * width:] = np.frombuffer(self._tail(lay, body), dtype=np.uint8)
        if check:
            view = memoryview(out)
            for s in lay.segments:
                stop = size if s.index == len(lay.segments) - 1 else (s.first + s.count) * width
                if zlib.crc32(view[s.first * width:stop]) != s.crc:
                    raise CodecError(f"floatseg: checksum mismatch in segment {s.index}")
        return out

    def part_decoder(self, params: Buffer, body_len: int, size: int) -> "SegmentDecoder":
        return SegmentDecoder(self, self.layout(params, body_len, size), size, body_len)

    @staticmethod
    def touched(lay: Layout, size: int, lo: int, hi: int) -> list[Segment]:
        """The segments that plain bytes [lo, hi) of the chunk touch."""
        if not 0 <= lo < hi <= size:
            raise ValueError(f"floatseg: range {lo}..{hi} outside the chunk's {size} bytes")
        last = len(lay.segments) - 1
        return lay.segments[min(lo >> lay.seglog, last):min((hi - 1) >> lay.seglog, last) + 1]

    @staticmethod
    def span(lay: Layout, segs: list[Segment], body_len: int) -> tuple[int, int]:
        """The body bytes [start, stop) that consecutive segments segs need (the last segment's
        include the trailing bytes): a reader may fetch only these from the store."""
        last = segs[-1]
        return segs[0].body, body_len if last.index == len(lay.segments) - 1 else last.body + last.length

    def decode_span(self, lay: Layout, piece: memoryview, at: int, segs: list[Segment],
                    body_len: int) -> list[tuple[int, bytes]]:
        """(start, plain bytes) of each of the segments segs, each checked by its CRC-32, from
        piece: the body bytes [at, ...) that span() names for them (codecs.decode_segments_from
        reads only those; the tables in lay are built once for all of them)."""
        start, stop = self.span(lay, segs, body_len)
        if start != at or len(piece) != stop - start:
            raise CodecError("floatseg: the body span does not match its segments")
        width = lay.model.val.itemsize
        last = len(lay.segments) - 1
        first = segs[0].first
        u = np.empty(sum(s.count for s in segs), dtype=lay.model.val.dtype)
        self._decode_into(lay, piece, at, segs, u)
        out = []
        for s in segs:
            data = u[s.first - first:s.first - first + s.count].tobytes()
            if s.index == last:
                data += self._tail(lay, piece)
            if zlib.crc32(data) != s.crc:
                raise CodecError(f"floatseg: checksum mismatch in segment {s.index}")
            out.append((s.first * width, data))
        return out


def _layout_bytes(lay: Layout) -> int:
    """About the memory a layout holds: its tables and per-segment records."""
    m = lay.model
    arrays = [m.cmap, m.val] + [a for a in vars(m.tab).values() if isinstance(a, np.ndarray)]
    if m.rows is not None:
        arrays.append(m.rows[2])
    return sum(a.nbytes for a in arrays) + sum(256 + len(s.groups.flags or b"") for s in lay.segments)


class SegmentDecoder(PartDecoder):
    """A floatseg chunk's layout, tables built, for decoding its segments a read at a time."""

    def __init__(self, codec: FloatSegCodec, lay: Layout, size: int, body_len: int):
        self._codec, self._lay, self._size, self._body_len = codec, lay, size, body_len
        self.nbytes = _layout_bytes(lay)

    def span(self, lo: int, hi: int) -> tuple[int, int]:
        return self._codec.span(self._lay, self._codec.touched(self._lay, self._size, lo, hi), self._body_len)

    def decode(self, piece: Buffer, lo: int, hi: int) -> list[tuple[int, bytes]]:
        segs = self._codec.touched(self._lay, self._size, lo, hi)
        start, _ = self._codec.span(self._lay, segs, self._body_len)
        return self._codec.decode_span(self._lay, memoryview(piece), start, segs, self._body_len)
