"""Codec 5, ``ggufblocks``: GGUF block-quantised tensors split on their struct fields.

A chunk of whole blocks is cut into one stream per field: each fp16 scale/min field becomes two
byte streams (low bytes, high bytes), every other field one byte stream of its bytes, block after
block. Each stream is coded on its own by the best of stored / zstd / tANS (entropy.encode_stream),
so near-uniform quants are stored and skewed scales shrink. For Q4_1 the 4-bit quants (low nibble
first) are coded one by one with the block's zero point q0 = clamp(round(-m / d), 0, 15) as context:
quants cluster around the zero point, and which one that is differs per block. Bytes after the
last whole block are stored. A CRC-32 of the plain chunk guards the result. Layout:
docs/format.md, codec 5.
"""
from __future__ import annotations

import zlib

import numpy as np

from . import entropy, kernels, tans
from . import zstd as _zstd
from .plainbytes import to_bytes
from ..chunker import ChunkHint
from .base import Buffer, Codec, CodecError, get_varint, put_varint

# ggml type id -> (name, block bytes, fields as (offset, size, kind)); kind "f16" = fp16 scalar,
# "q" = quant bytes, "b" = other bytes. Offsets follow ggml's block structs (ggml-common.h).
LAYOUTS: dict[int, tuple[str, int, tuple[tuple[int, int, str], ...]]] = {
    2: ("Q4_0", 18, ((0, 2, "f16"), (2, 16, "q"))),
    3: ("Q4_1", 20, ((0, 2, "f16"), (2, 2, "f16"), (4, 16, "q"))),
    6: ("Q5_0", 22, ((0, 2, "f16"), (2, 4, "b"), (6, 16, "q"))),
    7: ("Q5_1", 24, ((0, 2, "f16"), (2, 2, "f16"), (4, 4, "b"), (8, 16, "q"))),
    8: ("Q8_0", 34, ((0, 2, "f16"), (2, 32, "q"))),
    10: ("Q2_K", 84, ((0, 16, "b"), (16, 64, "q"), (80, 2, "f16"), (82, 2, "f16"))),
    11: ("Q3_K", 110, ((0, 32, "b"), (32, 64, "q"), (96, 12, "b"), (108, 2, "f16"))),
    12: ("Q4_K", 144, ((0, 2, "f16"), (2, 2, "f16"), (4, 12, "b"), (16, 128, "q"))),
    13: ("Q5_K", 176, ((0, 2, "f16"), (2, 2, "f16"), (4, 12, "b"), (16, 32, "b"), (48, 128, "q"))),
    14: ("Q6_K", 210, ((0, 128, "q"), (128, 64, "b"), (192, 16, "b"), (208, 2, "f16"))),
}
TYPE_OF = {v[0]: k for k, v in LAYOUTS.items()}
Q4_1 = 3


def block_bytes(dtype: str | None) -> int:
    t = TYPE_OF.get((dtype or "").upper())
    return LAYOUTS[t][1] if t is not None else 0


def _q4_1_contexts(blocks: np.ndarray) -> np.ndarray:
    """The context of each of the 32 quants of a block: the block's zero point
    clamp(rint(-m / d), 0, 15) in float32, 0 where that is not a finite number."""
    loop = kernels.compiled()
    nblk, bsize = blocks.shape
    if loop is not None:
        out = np.empty(32 * nblk, dtype=np.uint8)
        loop.q4_1_contexts(np.ascontiguousarray(blocks), nblk, bsize, out)
        return out
    dm = blocks[:, 0:4].view("<f2").astype(np.float32)
    with np.errstate(all="ignore"):
        z = -dm[:, 1] / dm[:, 0]
    z = np.where(np.isfinite(z), z, 0.0)
    return np.repeat(np.clip(np.rint(z), 0, 15).astype(np.uint8), 32)


def merge_nibbles(out: np.ndarray, nib: np.ndarray, nblk: int, bsize: int, foff: int, fsize: int) -> None:
    """Byte i of each block's quant field = nibble 2i | nibble 2i+1 << 4 of that block's symbols
    (the numpy reference decode here, and blockdelta's 4-bit quant fields)."""
    loop = kernels.compiled()
    nib = np.ascontiguousarray(nib, dtype=np.uint8)
    if loop is not None:
        loop.merge_nibbles(nib, out, nblk, bsize, foff, fsize)
        return
    pairs = nib.view("<u2")             # (low | high << 8) per byte; >> 4 moves high into place
    merged = pairs >> 4
    merged |= pairs
    np.copyto(out[: nblk * bsize].reshape(nblk, bsize)[:, foff:foff + fsize], merged.reshape(nblk, fsize),
              casting="unsafe")        # keeps the low byte


def _scatter_field(out: np.ndarray, vals: np.ndarray, nblk: int, bsize: int, foff: int, fsize: int) -> None:
    """Bytes foff .. foff + fsize - 1 of each block = that block's fsize bytes of vals (the numpy
    reference decode's; the compiled decode_fields scatters in C)."""
    vals = np.ascontiguousarray(vals, dtype=np.uint8)
    out[: nblk * bsize].reshape(nblk, bsize)[:, foff:foff + fsize] = vals.reshape(nblk, fsize)


class GgufBlocksCodec(Codec):
    id = 5
    name = "ggufblocks"

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        t = TYPE_OF.get((hint.dtype or "").upper())
        if t is None:
            raise ValueError(f"ggufblocks: no block layout for dtype {hint.dtype!r}")
        _, bsize, fields = LAYOUTS[t]
        a = np.frombuffer(data, dtype=np.uint8)
        nblk = len(a) // bsize
        blocks = a[: nblk * bsize].reshape(nblk, bsize)
        ctx = _q4_1_contexts(blocks) if t == Q4_1 and nblk else None
        parts = []
        for off, size, kind in fields:
            if kind == "f16":
                parts += [entropy.encode_stream(np.ascontiguousarray(blocks[:, off + j])) for j in range(2)]
            elif ctx is not None and kind == "q":
                q = blocks[:, off:off + size].reshape(-1)
                nib = np.stack([q & 15, q >> 4], axis=1).reshape(-1)
                parts.append(entropy.encode_stream(nib, 16, ctx, 16))
            else:
                parts.append(entropy.encode_stream(blocks[:, off:off + size].reshape(-1)))
        params = bytes((t,)) + zlib.crc32(data).to_bytes(4, "little") + b"".join(put_varint(len(p)) for p in parts)
        return params, b"".join(parts) + a[nblk * bsize:].tobytes()

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        return to_bytes(self.decode_buffer(params, body, size, check=check))

    def decode_buffer(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> Buffer:
        loop = kernels.compiled()
        p = memoryview(params)
        if len(p) < 5 or p[0] not in LAYOUTS:
            raise CodecError("ggufblocks: unknown block type")
        t = p[0]
        crc = int.from_bytes(p[1:5], "little")
        _, bsize, fields = LAYOUTS[t]
        nblk, tail = divmod(size, bsize)
        if size > tans.MAX_N:
            raise CodecError("ggufblocks: chunk too large")
        sizes = []
        for off, fsize, kind in fields:
            sizes += [1, 1] if kind == "f16" else [fsize]
        pos, lens = 5, []
        for _ in sizes:
            n, pos = get_varint(p, pos, "ggufblocks stream length")
            lens.append(n)
        if pos != len(p) or sum(lens) + tail != len(body):
            raise CodecError("ggufblocks: stream lengths do not add up")
        body = memoryview(body)
        out = np.empty(size, dtype=np.uint8)
        off = 0
        streams = []
        for n in lens:
            streams.append(body[off:off + n])
            off += n
        if loop is not None and nblk:
            _decode_fields(out, nblk, bsize, t, fields, streams)
        else:
            _decode_fields_numpy(out, nblk, bsize, t, fields, streams)
        if tail:
            out[nblk * bsize:] = np.frombuffer(body, dtype=np.uint8, count=tail, offset=off)
        if check and zlib.crc32(out) != crc:
            raise CodecError("ggufblocks: checksum mismatch")
        return memoryview(out).cast("B")


def _field_streams(fields, nblk: int, t: int):
    """(field offset, width, nibbles, symbols, alphabet, contexts) of each stream in order: an
    fp16 field is two one-byte streams; Q4_1's quants are 4-bit symbols under 16 contexts."""
    for foff, fsize, kind in fields:
        if kind == "f16":
            yield foff, 1, False, nblk, 256, 1
            yield foff + 1, 1, False, nblk, 256, 1
        elif t == Q4_1 and kind == "q":
            yield foff, fsize, True, 32 * nblk, 16, 16
        else:
            yield foff, fsize, False, nblk * fsize, 256, 1


def _decode_fields(out: np.ndarray, nblk: int, bsize: int, t: int, fields, streams) -> None:
    """Every stream's header checked here, then all of them decoded into their fields, their
    tables built, by one compiled call that lets go of Python's lock once (_tansblocks.c)."""
    loop = kernels.compiled()
    items = []
    for (foff, fsize, nib, n, S, K), mv in zip(_field_streams(fields, nblk, t), streams):
        if len(mv) < 1:
            raise CodecError("stream: missing mode byte")
        mode = mv[0]
        if mode == entropy.RAW:
            if len(mv) - 1 != n:
                raise CodecError("stream: stored length mismatch")
            items.append((foff, fsize, nib, mv[1:]))
        elif mode == entropy.ZSTD:
            items.append((foff, fsize, nib, _zstd.decompress(mv[1:], n, "stream")))
        elif mode == entropy.TANS:
            items.append(entropy.parse_tans_section(mv[1:], n, S, K).field(foff, fsize, nib, K, S))
        else:
            raise CodecError(f"stream: unknown mode {mode}")
    try:
        loop.decode_fields(out, nblk, bsize, tuple(items))
    except ValueError as exc:
        raise CodecError(str(exc)) from None


def _decode_fields_numpy(out: np.ndarray, nblk: int, bsize: int, t: int, fields, streams) -> None:
    """The reference: each stream decoded by entropy.decode_stream, then put in its field."""
    blocks = out[: nblk * bsize].reshape(nblk, bsize)
    si = 0
    for foff, fsize, kind in fields:
        if kind == "f16":
            for j in range(2):
                _scatter_field(out, entropy.decode_stream(streams[si], nblk), nblk, bsize, foff + j, 1)
                si += 1
            continue
        if t == Q4_1 and kind == "q":
            ctx = _q4_1_contexts(blocks) if nblk else None
            nib = entropy.decode_stream(streams[si], nblk * 32, 16, ctx, 16)
            merge_nibbles(out, nib, nblk, bsize, foff, fsize)
        else:
            _scatter_field(out, entropy.decode_stream(streams[si], nblk * fsize), nblk, bsize, foff, fsize)
        si += 1
