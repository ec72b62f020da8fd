"""Codec 7, ``xorzstd``: a chunk coded as its byte-wise XOR with a reference chunk, in one zstd frame.

The dtype-blind delta: bytes the two chunks share become zeros, which zstd codes in almost
nothing, so it suits integer and block-quantised tensors (int8, GGUF blocks) whose values mostly
repeat between two releases, and any chunk where the float-aware delta codecs do not apply.
params are empty; the body is one zstd frame (bounded as codec 1's) of ``data XOR ref``.
"""
from __future__ import annotations

import numpy as np

from ..chunker import ChunkHint
from .base import Buffer, CodecError, DeltaCodec
from .zstd import DEFAULT_LEVEL, compress, decompress


def _xor(a: Buffer, b: Buffer) -> bytes:
    x = np.frombuffer(a, dtype=np.uint8)
    y = np.frombuffer(b, dtype=np.uint8)
    return np.bitwise_xor(x, y).tobytes()


class XorZstdCodec(DeltaCodec):
    id = 7
    name = "xorzstd"

    def __init__(self, level: int = DEFAULT_LEVEL):
        self.level = level

    def encode_delta(self, data: memoryview, ref: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        if len(ref) != len(data):
            raise ValueError(f"xorzstd: reference of {len(ref)} bytes for a chunk of {len(data)}")
        return b"", compress(_xor(data, ref), self.level)

    def decode_delta(self, params: Buffer, body: Buffer, size: int, ref: Buffer, *, check: bool = True) -> bytes:
        if len(params):
            raise CodecError(f"xorzstd: expected no params, got {len(params)} bytes")
        if len(ref) != size:
            raise CodecError(f"xorzstd: reference holds {len(ref)} bytes, the chunk {size}")
        return _xor(decompress(body, size, "xorzstd"), ref)
