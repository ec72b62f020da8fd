"""Codec 9, ``blockdelta``: GGUF block-quantised chunks coded against a reference chunk field by field.

A chunk of whole blocks is cut into one stream per block field, as ggufblocks cuts it: fp16
scales and minimums, quant bytes, other bytes (sub-block scales, high bits). Each stream is
coded against the same field of the reference's blocks with ulpdelta (codec 8's params and body,
without its payload header): fp16 fields as F16 elements, whose residual in units in the last
place is small when a scale moves a little; 4-bit quant fields unpacked to one quant per byte
(low nibble first), whose residual is small when a weight moves by a step, where the residual
of a packed byte mixes two quants; Q8_0's quants as int8; other fields as bytes. Bytes after
the last whole block are stored. A CRC-32 of the plain chunk guards the result.
Layout: docs/format.md, codec 9.
"""
from __future__ import annotations

import zlib

import numpy as np

from ..chunker import ChunkHint
from .base import Buffer, CodecError, DeltaCodec, delta_inputs, get_varint, put_varint
from .ggufblocks import LAYOUTS, TYPE_OF, merge_nibbles
from .ulpdelta import UlpDeltaCodec

Q8_0 = 8
_ULP = UlpDeltaCodec()


def _streams(t: int) -> list[tuple[int, int, str]]:
    """(field offset, field size, how its stream is coded) for each field of type t's blocks:
    "F16" fp16 elements, "U4" 4-bit quants unpacked to a byte each, "I8" int8 quants, "U8" bytes."""
    out = []
    for off, size, kind in LAYOUTS[t][2]:
        if kind == "f16":
            out.append((off, size, "F16"))
        elif kind == "q":
            out.append((off, size, "I8" if t == Q8_0 else "U4"))
        else:
            out.append((off, size, "U8"))
    return out


def _field_bytes(blocks: np.ndarray, off: int, size: int, how: str) -> bytes:
    f = np.ascontiguousarray(blocks[:, off:off + size])
    if how == "U4":
        return np.stack([f & 15, f >> 4], axis=-1).tobytes()
    return f.tobytes()


def _put_field(blocks: np.ndarray, off: int, size: int, how: str, plain: bytes) -> None:
    v = np.frombuffer(plain, dtype=np.uint8)
    if how == "U4":
        if v.size and int(v.max()) > 15:
            raise CodecError("blockdelta: a 4-bit quant stream holds a value above 15")
        merge_nibbles(blocks.reshape(-1), v, len(blocks), blocks.shape[1], off, size)
    else:
        blocks[:, off:off + size] = v.reshape(len(blocks), size)


class BlockDeltaCodec(DeltaCodec):
    id = 9
    name = "blockdelta"

    def encode_delta(self, data: memoryview, ref: memoryview, hint: ChunkHint) -> tuple[bytes, bytes] | None:
        t = TYPE_OF.get((hint.dtype or "").upper())
        if t is None:
            return None
        if len(ref) != len(data):
            raise ValueError(f"blockdelta: reference of {len(ref)} bytes for a chunk of {len(data)}")
        bsize = LAYOUTS[t][1]
        nblk = len(data) // bsize
        a = np.frombuffer(data, dtype=np.uint8)
        blocks = a[:nblk * bsize].reshape(nblk, bsize)
        refs = np.frombuffer(ref, dtype=np.uint8)[:nblk * bsize].reshape(nblk, bsize)
        params = bytearray((t,)) + zlib.crc32(data).to_bytes(4, "little")
        bodies = []
        for off, size, how in _streams(t) if nblk else []:
            x, y = _field_bytes(blocks, off, size, how), _field_bytes(refs, off, size, how)
            sh = ChunkHint("F16", 2) if how == "F16" else ChunkHint("I8" if how == "I8" else "U8", 1)
            p, b = _ULP.encode_delta(memoryview(x), memoryview(y), sh)
            params += put_varint(len(p)) + p + put_varint(len(b))
            bodies.append(b)
        return bytes(params), b"".join(bodies) + a[nblk * bsize:].tobytes()

    def decode_delta(self, params: Buffer, body: Buffer, size: int, ref: Buffer, *, check: bool = True) -> bytes:
        p, body = delta_inputs("blockdelta", params, body, size, ref, 5)
        t = p[0]
        if t not in LAYOUTS:
            raise CodecError(f"blockdelta: unknown ggml type {t}")
        crc = int.from_bytes(p[1:5], "little")
        bsize = LAYOUTS[t][1]
        nblk = size // bsize
        out = np.empty(size, dtype=np.uint8)
        blocks = out[:nblk * bsize].reshape(nblk, bsize)
        refs = np.frombuffer(ref, dtype=np.uint8)[:nblk * bsize].reshape(nblk, bsize)
        pos, at = 5, 0
        for off, fsize, how in _streams(t) if nblk else []:
            plen, pos = get_varint(p, pos, "blockdelta stream params length")
            if pos + plen > len(p):
                raise CodecError("blockdelta: stream params run past the params")
            sp = p[pos:pos + plen]
            blen, pos = get_varint(p, pos + plen, "blockdelta stream body length")
            if at + blen > len(body):
                raise CodecError("blockdelta: stream bodies run past the body")
            y = _field_bytes(refs, off, fsize, how)
            plain = _ULP.decode_delta(sp, body[at:at + blen], len(y), y, check=False)
            _put_field(blocks, off, fsize, how, plain)
            at += blen
        if pos != len(p):
            raise CodecError("blockdelta: params longer than their streams")
        if len(body) - at != size - nblk * bsize:
            raise CodecError("blockdelta: body length does not match params")
        out[nblk * bsize:] = np.frombuffer(body, dtype=np.uint8, offset=at)
        plain = out.tobytes()
        if check and zlib.crc32(plain) != crc:
            raise CodecError("blockdelta: checksum mismatch")
        return plain
