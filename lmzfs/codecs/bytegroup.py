"""Codec 2, ``bytegroup``: byte-plane shuffle of fixed-size elements, each plane zstd'd or stored.

For element size k in {2, 4, 8} the n = size // k whole elements are viewed as an n x k byte
matrix and split into k planes: plane j holds byte j of every element, in element order. In
trained float weights the planes holding sign and exponent bits are highly skewed and compress
well, while the low mantissa planes are close to random; compressing each plane on its own lets
the compressible ones shrink and the rest be stored raw (raw planes decode at memcpy speed).

params: k (1 byte) | raw mask (1 byte; bit j set = plane j is stored raw; bits >= k must be 0)
        | for each plane j in order whose bit is clear: varint length of its zstd frame
body:   plane 0 .. plane k-1 in order (a raw plane is n bytes, a zstd plane is one frame of
        content size n), then the size % k trailing bytes as-is.

The plane compressor uses fixed, level-independent settings chosen by measurement on real
weights (docs/format.md): byte planes of float tensors are nearly order-0 sources, so zstd's
entropy coder does the work and long match searches only add short, costly matches. Those
settings are an encoder choice; nothing about them is recorded or needed to decode.
"""
from __future__ import annotations

import threading

import numpy as np
import zstandard

from . import zstd as _zstd
from ..chunker import ChunkHint
from .base import THREAD_HOP_BYTES, Buffer, Codec, CodecError, get_varint, put_varint

ELEMENT_SIZES = (2, 4, 8)

# Strategy "fast", longest minimum match, tiny hash table: near Huffman-only coding of literals.
# On FP32 planes this saves more than level-3 settings, and faster (docs/results.md, codec speed).
_PLANE_PARAMS = dict(
    strategy=zstandard.STRATEGY_FAST, min_match=7, hash_log=6, chain_log=6, search_log=1,
    target_length=0, window_log=20, write_checksum=1, write_content_size=1, write_dict_id=0,
)

_tls = threading.local()


def _plane_compressor() -> zstandard.ZstdCompressor:
    cctx = getattr(_tls, "cctx", None)
    if cctx is None:
        params = zstandard.ZstdCompressionParameters(**_PLANE_PARAMS)
        cctx = _tls.cctx = zstandard.ZstdCompressor(compression_params=params)
    return cctx


class BytegroupCodec(Codec):
    id = 2
    name = "bytegroup"
    cheap_bytes = THREAD_HOP_BYTES

    def __init__(self, level: int = _zstd.DEFAULT_LEVEL):
        # Accepted for a uniform constructor; plane settings do not depend on it (see module doc).
        self.level = level

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        k = hint.itemsize
        if k not in ELEMENT_SIZES:
            raise ValueError(f"bytegroup needs an element size in {ELEMENT_SIZES}, got {k}")
        a = np.frombuffer(data, dtype=np.uint8)
        n = len(a) // k
        grid = a[: n * k].reshape(n, k)
        plane = np.empty(n, dtype=np.uint8)
        cctx = _plane_compressor()
        mask = 0
        lengths = bytearray()
        parts: list[bytes] = []
        for j in range(k):
            plane[...] = grid[:, j]
            frame = cctx.compress(plane) if n else b""
            if n and len(frame) < n:
                lengths += put_varint(len(frame))
                parts.append(frame)
            else:
                mask |= 1 << j
                parts.append(plane.tobytes())
        parts.append(a[n * k:].tobytes())
        return bytes((k, mask)) + bytes(lengths), b"".join(parts)

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        if len(params) < 2:
            raise CodecError(f"bytegroup: params are {len(params)} bytes, need at least 2")
        k, mask = params[0], params[1]
        if k not in ELEMENT_SIZES:
            raise CodecError(f"bytegroup: unsupported element size {k}")
        if mask >> k:
            raise CodecError(f"bytegroup: unknown flag bits in raw mask {mask:#04x} for k={k}")
        n, tail = divmod(size, k)
        pos = 2
        sizes = []
        for j in range(k):
            if mask >> j & 1:
                sizes.append(-1)
            else:
                length, pos = get_varint(params, pos, f"bytegroup plane {j} length")
                if length == 0:
                    raise CodecError(f"bytegroup: plane {j} has an empty zstd frame")
                sizes.append(length)
        if pos != len(params):
            raise CodecError(f"bytegroup: {len(params) - pos} trailing bytes after params")
        expected = sum(n if s < 0 else s for s in sizes) + tail
        if len(body) != expected:
            raise CodecError(f"bytegroup: body is {len(body)} bytes, params describe {expected}")

        body = memoryview(body)
        out = np.empty(size, dtype=np.uint8)
        grid = out[: n * k].reshape(n, k)
        off = 0
        for j, s in enumerate(sizes):
            if s < 0:
                if n:
                    grid[:, j] = np.frombuffer(body, dtype=np.uint8, count=n, offset=off)
                off += n
            else:
                plane = _zstd.decompress(body[off:off + s], n, f"bytegroup plane {j}")
                grid[:, j] = np.frombuffer(plane, dtype=np.uint8)
                off += s
        if tail:
            out[n * k:] = np.frombuffer(body, dtype=np.uint8, count=tail, offset=off)
        return out.tobytes()
