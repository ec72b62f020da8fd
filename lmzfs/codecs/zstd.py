"""Codec 1, ``zstd``: the body is one standard Zstandard frame, params are empty.

Frames are written with the content size and a content checksum and without a dictionary id.
The compression level is an encoder setting only; nothing about it is recorded.

Decoding is bounded: the frame header's content size must equal the expected size before any
output buffer is allocated, the output buffer is exactly that size, and data after the frame is
rejected. ZstdCompressor/ZstdDecompressor objects are not thread-safe, so each thread keeps its
own (see ``compressor`` and ``decompressor``), shared with the bytegroup codec.
"""
from __future__ import annotations

import threading

import zstandard

from ..chunker import ChunkHint
from .base import THREAD_HOP_BYTES, Buffer, Codec, CodecError

DEFAULT_LEVEL = 3
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
# Largest window a frame may ask for. Frames we write use at most the chunk size (<= 16 MiB);
# the library allocates min(window, content size) anyway, so this only bounds hostile frames.
MAX_WINDOW = 1 << 27

_tls = threading.local()


def compressor(level: int = DEFAULT_LEVEL) -> zstandard.ZstdCompressor:
    """This thread's compressor for ``level`` (created on first use)."""
    cache = getattr(_tls, "cctx", None)
    if cache is None:
        cache = _tls.cctx = {}
    cctx = cache.get(level)
    if cctx is None:
        cctx = cache[level] = zstandard.ZstdCompressor(
            level=level, write_checksum=True, write_content_size=True, write_dict_id=False
        )
    return cctx


def decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor (created on first use)."""
    dctx = getattr(_tls, "dctx", None)
    if dctx is None:
        dctx = _tls.dctx = zstandard.ZstdDecompressor(max_window_size=MAX_WINDOW)
    return dctx


def compress(data: Buffer, level: int = DEFAULT_LEVEL) -> bytes:
    return compressor(level).compress(data)


def decompress(frame: Buffer, size: int, what: str = "zstd") -> bytes:
    """Decode one complete frame that must hold exactly ``size`` bytes; allocate at most ``size``."""
    if bytes(frame[:4]) != ZSTD_MAGIC:
        raise CodecError(f"{what}: body is not a zstd frame (bad magic)")
    try:
        declared = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise CodecError(f"{what}: bad zstd frame header: {e}") from None
    if declared != size:
        shown = "unknown" if declared < 0 else declared
        raise CodecError(f"{what}: zstd frame content size is {shown}, expected {size}")
    dctx = decompressor()
    try:
        if size == 0:
            # decompress() returns b"" for a zero-size frame without reading it; validate it fully.
            dobj = dctx.decompressobj()
            out = dobj.decompress(frame)
            if out or not dobj.eof or dobj.unused_data:
                raise CodecError(f"{what}: malformed empty zstd frame")
            return b""
        out = dctx.decompress(frame, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise CodecError(f"{what}: corrupt zstd frame: {e}") from None
    if len(out) != size:
        raise CodecError(f"{what}: zstd frame decoded to {len(out)} bytes, expected {size}")
    return out


class ZstdCodec(Codec):
    id = 1
    name = "zstd"
    cheap_bytes = THREAD_HOP_BYTES

    def __init__(self, level: int = DEFAULT_LEVEL):
        self.level = level

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        return b"", compress(data, self.level)

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        if len(params):
            raise CodecError(f"zstd: expected no params, got {len(params)} bytes")
        return decompress(body, size)
