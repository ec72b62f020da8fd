"""Compact lists of small unsigned integers (the frequency tables of the tANS codecs): varints,
zstd-compressed when that is smaller. Layout: docs/format.md ("compact integer lists")."""
from __future__ import annotations

import numpy as np

from . import kernels
from . import zstd as _zstd
from .base import CodecError, get_varint, put_varint


# The zstd level of a table's varints. A table is a few hundred bytes, coded once per stream: at
# level 19 this compression cost as much as the rest of a small stream's coding, and level 9
# comes within a byte or two of it (on the corpus, a few KB per 100 MB file).
TABLE_LEVEL = 9


def pack_uints(values: np.ndarray) -> bytes:
    """``values`` (ints < 2**35) as a blob: 0x00 + varints, or 0x01 + a zstd frame of those varints."""
    plain = varints(values)
    z = _zstd.compress(plain, TABLE_LEVEL) if len(plain) > 64 else b""
    if z and len(z) < len(plain):
        return b"\x01" + put_varint(len(plain)) + z
    return b"\x00" + plain


def varints(values: np.ndarray) -> bytes:
    """``values`` (ints under 2**35) as LEB128 varints, compiled where the module is built."""
    loop = kernels.compiled()
    v = np.ascontiguousarray(np.asarray(values, dtype=np.int64).ravel())
    plain = loop.to_varints(v) if loop is not None else None
    if plain is None:       # no compiled module, or a value it refuses (raised below)
        plain = _varints(v)
    return plain


def _varints(v: np.ndarray) -> bytes:
    """The reference: each value as a LEB128 varint (low 7 bits first, high bit: more follow)."""
    out = bytearray()
    for x in v.tolist():
        if not 0 <= x < 1 << 35:
            raise ValueError(f"pack_uints: {x} is not an unsigned integer under 2**35")
        while x >= 0x80:
            out.append((x & 0x7F) | 0x80)
            x >>= 7
        out.append(x)
    return bytes(out)


def unpack_uints(blob, count: int, what: str) -> np.ndarray:
    """Inverse of pack_uints for exactly ``count`` values; CodecError on any mismatch."""
    mv = memoryview(blob)
    if len(mv) < 1 or mv[0] > 1:
        raise CodecError(f"{what}: bad table blob")
    body = mv[1:]
    if mv[0] == 1:
        plen, p = get_varint(body, 0, f"{what} table size")
        if plen > 5 * count + 16:
            raise CodecError(f"{what}: table blob too large")
        body = memoryview(_zstd.decompress(body[p:], plen, f"{what} table"))
    return read_varints(body, count, what)


def read_varints(body, count: int, what: str) -> np.ndarray:
    """Exactly ``count`` canonical varints (each at most 5 bytes) filling ``body``, as int64;
    CodecError on any mismatch."""
    loop = kernels.compiled()
    if loop is not None:
        vals = np.empty(count, dtype=np.int64)
        code = loop.varints(body, count, vals)
        if code:
            raise CodecError(f"{what}: " + ("table holds a wrong number of values", "table value too large",
                                            "non-canonical table value")[code - 1])
        return vals
    raw = np.frombuffer(body, dtype=np.uint8)
    ends = np.flatnonzero(raw < 0x80)
    if len(ends) != count or (count and ends[-1] != len(raw) - 1) or (not count and len(raw)):
        raise CodecError(f"{what}: table holds a wrong number of values")
    starts = np.concatenate([[0], ends[:-1] + 1]) if count else ends
    if count and ((ends - starts) > 4).any():
        raise CodecError(f"{what}: table value too large")
    vals = np.zeros(count, dtype=np.int64)
    low = raw.astype(np.int64) & 0x7F
    for j in range(5):
        sel = starts + j <= ends
        vals[sel] |= low[(starts + j)[sel]] << (7 * j)
    lens = ends - starts
    if count and ((lens > 0) & (raw[ends] == 0)).any():
        raise CodecError(f"{what}: non-canonical table value")
    return vals
