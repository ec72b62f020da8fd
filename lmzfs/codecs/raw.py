"""Codec 0, ``raw``: the body is the data itself, params are empty."""
from __future__ import annotations

from ..chunker import ChunkHint
from .base import THREAD_HOP_BYTES, Buffer, Codec, CodecError


class RawCodec(Codec):
    id = 0
    name = "raw"
    cheap_bytes = THREAD_HOP_BYTES

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        return b"", bytes(data)

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        if len(params):
            raise CodecError(f"raw: expected no params, got {len(params)} bytes")
        if len(body) != size:
            raise CodecError(f"raw: body is {len(body)} bytes, expected {size}")
        return bytes(body)
