"""Codec 10, ``strings``: a run of length-prefixed strings, such as a GGUF metadata array of
strings (an LLM tokenizer's vocabulary and BPE merges: megabytes in every GGUF model).

Each string is a little-endian u64 length and that many bytes. The chunk is parsed from its
start for as many whole strings as fit; the lengths become one coded stream (their varints,
order-0 entropy coded: most tokens are a few bytes long), and the strings' bytes, followed by
whatever did not parse as a string (the tail), one zstd frame. Any chunk round-trips: one that
does not start with a string is all tail.

Zstd sees the text without the eight-byte lengths between the strings (seven of them zero
bytes), which otherwise break up its matches and cost it a literal or a short match per string.
Layout: docs/format.md ("10 strings").
"""
from __future__ import annotations

import struct
import zlib

import numpy as np

from . import entropy, kernels
from . import zstd as _zstd
from ..chunker import ChunkHint
from .base import THREAD_HOP_BYTES, Buffer, Codec, CodecError, get_varint, put_varint
from .plainbytes import to_bytes
from .uintlist import read_varints, varints

# The dtype the chunker gives a chunk of a string array (formats/segments.py: STRINGS).
DTYPE = "STRINGS"
# zstd level of the strings' bytes: without the lengths between them, level 12 codes a
# tokenizer's strings smaller than level 19 codes the chunk, at a fraction of its time, and the
# levels above it gain little more for several times the time (docs/results.md: what adding a
# GGUF model costs).
LEVEL = 12
_LENGTH = struct.Struct("<Q")


def split_strings(data: Buffer) -> tuple[np.ndarray, int]:
    """(lengths of the whole strings at the start of data, where the last of them ends)."""
    loop = kernels.compiled()
    if loop is not None:
        out = np.empty(len(data) // 8 + 1, dtype=np.int64)
        count, end = loop.string_lengths(data, out)
        return out[:count].copy(), end
    return _split_strings_reference(data)


def _split_strings_reference(data: Buffer) -> tuple[np.ndarray, int]:
    mv = memoryview(data)
    size = len(mv)
    lengths = []
    pos = 0
    unpack = _LENGTH.unpack_from
    while pos + 8 <= size:
        (n,) = unpack(mv, pos)
        if n > size - pos - 8:
            break
        lengths.append(n)
        pos += 8 + n
    return np.array(lengths, dtype=np.int64), pos


def _length_positions(lengths: np.ndarray) -> np.ndarray:
    """Where each string's eight length bytes start in the chunk."""
    starts = np.empty(len(lengths), dtype=np.int64)
    if len(lengths):
        starts[0] = 0
        np.cumsum(lengths[:-1] + 8, out=starts[1:])
    return starts


def join_strings(lengths: np.ndarray, text: Buffer, size: int) -> np.ndarray:
    """The chunk: each length as eight little-endian bytes, then its string's bytes from text,
    in turn; the rest of text after the last. CodecError unless they make exactly size bytes."""
    loop = kernels.compiled()
    lengths = np.ascontiguousarray(lengths, dtype=np.int64)
    if len(text) != size - 8 * len(lengths) or int(lengths.sum()) > len(text) or (lengths < 0).any():
        raise CodecError("strings: the lengths and the text do not make the chunk")
    out = np.empty(size, dtype=np.uint8)
    if loop is not None:
        if not loop.join_strings(lengths, text, out):
            raise CodecError("strings: the lengths and the text do not make the chunk")
        return out
    at, keep = _length_mask(lengths, size)
    out[at] = lengths.astype("<u8").view(np.uint8)
    out[keep] = np.frombuffer(text, dtype=np.uint8)
    return out


def _length_mask(lengths: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
    """(byte positions of the lengths, in order; a mask of size that is False exactly there)."""
    at = (_length_positions(lengths)[:, None] + np.arange(8)).ravel()
    keep = np.ones(size, dtype=bool)
    keep[at] = False
    return at, keep


class StringsCodec(Codec):
    id = 10
    name = "strings"
    # A zstd frame and a short coded stream: about as quick as zstd's own (zstd.py).
    cheap_bytes = THREAD_HOP_BYTES // 2

    def __init__(self, level: int = LEVEL):
        self.level = level

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        a = np.frombuffer(data, dtype=np.uint8)
        lengths, _ = split_strings(data)
        _, keep = _length_mask(lengths, len(a))
        text = a[keep].tobytes()
        v = varints(lengths)
        lens = entropy.encode_stream(np.frombuffer(v, dtype=np.uint8)) if v else b""
        nv = len(v)
        params = zlib.crc32(data).to_bytes(4, "little") + put_varint(len(lengths)) + put_varint(nv) + \
            put_varint(len(lens))
        return params, lens + _zstd.compress(text, self.level)

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        return to_bytes(self.decode_buffer(params, body, size, check=check))

    def decode_buffer(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> Buffer:
        p, body = memoryview(params), memoryview(body)
        if len(p) < 4:
            raise CodecError("strings: params cut short")
        crc = int.from_bytes(p[:4], "little")
        count, pos = get_varint(p, 4, "strings count")
        nv, pos = get_varint(p, pos, "strings lengths bytes")
        nl, pos = get_varint(p, pos, "strings lengths stream")
        if pos != len(p):
            raise CodecError("strings: params longer than their fields")
        if count > size // 8 or not count <= nv <= 5 * count or nl > len(body):
            raise CodecError("strings: counts do not fit the chunk")
        lengths = np.zeros(0, dtype=np.int64)
        if count:
            lv = entropy.decode_stream(body[:nl], nv)
            lengths = read_varints(np.ascontiguousarray(lv, dtype=np.uint8), count, "strings lengths")
        elif nl:
            raise CodecError("strings: a lengths stream with no strings")
        text = _zstd.decompress(body[nl:], size - 8 * count, "strings text")
        out = join_strings(lengths, text, size)
        if check and zlib.crc32(out) != crc:
            raise CodecError("strings: CRC mismatch")
        return memoryview(out).cast("B")

