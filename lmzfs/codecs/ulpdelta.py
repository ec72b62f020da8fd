"""Codec 8, ``ulpdelta``: a chunk coded as the distance, in units in the last place, of each element
from the same element of a reference chunk, entropy-coded given the reference element.

Each w-bit element x and its reference element y are mapped to order-preserving keys (floats:
non-negative values get the sign bit set, negative ones are complemented; integers: the key is
the value, so the difference is the same), d = key(x) - key(y) mod 2**w, folded to z (ZigZag: 0,
-1, 1, -2, ... -> 0, 1, 2, 3, ...). Nearby values have nearby keys, so a small update of a
weight is a small z whatever its sign, exponent or zero crossing; every bit pattern (NaN
payloads, signed zeros, infinities, subnormals) maps to a key and back, with integer arithmetic
only. z is coded as one tANS symbol, its bit length b and the ``r`` bits below its leading one
(all of z when b <= r + 1), and the other b - 1 - r bits stored as they are. The symbol's table
is chosen by a field of the reference element, which the decoder holds: the exponent field of a
float (an update moves a weight by about the same amount whatever its size, so the smaller its
exponent, the more units in the last place it moves), the key of a byte-wide integer, grouped
into at most MAX_CONTEXTS ranges of field values chosen per chunk. Block-quantised chunks (GGUF
blocks) of types without a known block layout are coded as their bytes (format U8): a release's
quants and scales mostly move by a few steps, which a residual codes in fewer bits than their
XOR (blockdelta, codec 9, codes the types with a layout field by field). Tables are static per chunk.
The stored bits ride in the tANS lanes' end states first (bits back), as floatsplit's do;
trailing bytes that are not a whole element are stored as they are. A CRC-32 of the plain
chunk guards everything. Layout: docs/format.md, codec 8.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from . import kernels, tans, uintlist
from ..chunker import ChunkHint
from .base import Buffer, CodecError, DeltaCodec, delta_inputs, get_varint, put_varint
from .ggufblocks import TYPE_OF as BLOCK_LAYOUTS


@dataclass(frozen=True)
class ElementFormat:
    """How one dtype's elements are keyed and which bits of the reference choose the table."""
    name: str
    bits: int            # element width w
    floating: bool       # keys of floats fold the sign; integer keys are the values
    field_shift: int     # the context field: (reference key or element >> shift) & (2**field_bits - 1)
    field_bits: int
    field_of_key: bool   # the field is taken from the reference's key (integers), else its raw bits


# format id -> format; ids are part of the payload and never change
FORMATS = {0: ElementFormat("BF16", 16, True, 7, 8, False),
           1: ElementFormat("F16", 16, True, 10, 5, False),
           2: ElementFormat("F32", 32, True, 23, 8, False),
           3: ElementFormat("F8_E4M3", 8, True, 3, 4, False),
           4: ElementFormat("F8_E5M2", 8, True, 2, 5, False),
           5: ElementFormat("I8", 8, False, 0, 8, True),
           6: ElementFormat("U8", 8, False, 0, 8, True)}
FORMAT_OF = {f.name: i for i, f in FORMATS.items()}
FORMAT_OF.update({"F8E4M3": 3, "F8_E4M3FN": 3, "F8E5M2": 4})
_UINT = {8: np.dtype(np.uint8), 16: np.dtype("<u2"), 32: np.dtype("<u4")}
MAX_CONTEXTS = 16
MAX_SYMBOLS = 256        # the alphabet 2**(r+1) + (w-r-1) * 2**r of r refinement bits stays within a byte
ROW_LOG = 12             # transmitted table rows are scaled to sum <= 2**ROW_LOG
# Encoder choices (not needed to decode): the refinement bits per element width, and the
# context counts tried; chosen with bench/delta_codecs.py on the chains of bench/trainchain.py
# and the quire release pair (more refinement bits barely pay; fewer cost).
REFINE_BITS = {8: 3, 16: 3, 32: 3}
CONTEXT_COUNTS = (1, 2, 4, 6, 8, 12, 16)
MERGE_FROM = 48          # more field values in use are grouped into this many ranges first
LANE_FLOOR = 64       # at least this many lanes (or n): fewer decode one symbol after another


def alphabet(bits: int, r: int) -> int:
    return (1 << (r + 1)) + (bits - r - 1) * (1 << r)


def symbol_tables(bits: int, r: int) -> tuple[np.ndarray, np.ndarray]:
    """For each symbol: the number of stored bits, and the bits of z it stands for (above them)."""
    S = alphabet(bits, r)
    s = np.arange(S, dtype=np.int64)
    small = s < (1 << (r + 1))
    b = np.where(small, 0, (r + 2) + ((s - (1 << (r + 1))) >> r))
    extra = np.where(small, 0, b - 1 - r)
    top = np.where(small, s, ((1 << r) | (s & ((1 << r) - 1))) << np.maximum(extra, 0))
    return extra, top.astype(np.uint64)


def _keys(u: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """Order-preserving keys, as uint64 below 2**w."""
    if not fmt.floating:
        return u
    sign = np.uint64(1 << (fmt.bits - 1))
    mask = np.uint64((1 << fmt.bits) - 1)
    return np.where(u & sign, ~u & mask, u | sign)


def _unkeys(k: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    if not fmt.floating:
        return k
    sign = np.uint64(1 << (fmt.bits - 1))
    mask = np.uint64((1 << fmt.bits) - 1)
    return np.where(k & sign, k ^ sign, ~k & mask)


def _fields(v: np.ndarray, fmt: ElementFormat) -> np.ndarray:
    """The context field of each reference element, 0 <= field < 2**field_bits."""
    src = _keys(v, fmt) if fmt.field_of_key else v
    return ((src >> np.uint64(fmt.field_shift)) & np.uint64((1 << fmt.field_bits) - 1)).astype(np.int64)


def _context_map(cuts: list[int], field_bits: int) -> np.ndarray:
    """The context of every field value: how many cuts are at or below it."""
    return np.searchsorted(np.asarray(cuts, dtype=np.int64), np.arange(1 << field_bits), side="right").astype(np.uint8)


@dataclass(frozen=True)
class Residuals:
    """What the encoder derives from a chunk and its reference, before any choice of tables."""
    sym: np.ndarray        # int64 symbol per element
    field: np.ndarray      # the reference's context field per element (uint8)
    raw: bytes             # the stored bits, a little-endian bit string padded to whole bytes
    raw_bits: int


def _compiled_loops():
    """The compiled tANS module if it has ulpdelta's loops (a build older than them does not:
    then the numpy paths run), else None. Asked per call: kernels.reference_only() switches it."""
    loop = kernels.compiled()
    return loop if loop is not None and hasattr(loop, "ulp_apply") else None


def residuals(u: np.ndarray, v: np.ndarray, fmt: ElementFormat, r: int) -> Residuals:
    """Symbols, context fields and stored bits of elements u against reference elements v (both
    of the format's unsigned type)."""
    loop = _compiled_loops()
    if loop is not None:
        sym = np.empty(len(u), dtype=np.int64)
        field = np.empty(len(u), dtype=np.uint8)
        raw = bytearray(len(u) * fmt.bits // 8 + 8)
        nbits = loop.ulp_residuals(u, v, fmt.bits, fmt.floating, fmt.field_shift, fmt.field_bits,
                                   fmt.field_of_key, r, sym, field, raw)
        return Residuals(sym, field, bytes(raw[:(nbits + 7) >> 3]), nbits)
    u, v = u.astype(np.uint64), v.astype(np.uint64)
    mask = np.uint64((1 << fmt.bits) - 1)
    d = (_keys(u, fmt) - _keys(v, fmt)) & mask
    neg = d >> np.uint64(fmt.bits - 1)
    z = ((d << np.uint64(1)) & mask) ^ (neg * mask)
    b = np.zeros(len(z), dtype=np.int64)
    nz = z > 0
    b[nz] = np.frexp(z[nz].astype(np.float64))[1]
    small = b <= r + 1
    extra = np.where(small, 0, b - 1 - r)
    lead = (z >> np.maximum(extra, 0).astype(np.uint64)).astype(np.int64) & ((1 << r) - 1)
    sym = np.where(small, z.astype(np.int64), (1 << (r + 1)) + ((b - r - 2) << r) + lead)
    low = z & ((np.uint64(1) << extra.astype(np.uint64)) - np.uint64(1))
    raw, nbits = pack_fields(low, extra)
    return Residuals(sym, _fields(v, fmt).astype(np.uint8), raw, nbits)


def pack_fields(values: np.ndarray, widths: np.ndarray) -> tuple[bytes, int]:
    """Fields of the given bit widths (< 32), in order, as one little-endian bit string."""
    widths = widths.astype(np.int64)
    end = np.cumsum(widths)
    nbits = int(end[-1]) if len(end) else 0
    nbytes = (nbits + 7) >> 3
    keep = widths > 0
    off = (end - widths)[keep]
    sh = values[keep].astype(np.uint64) << (off & 7).astype(np.uint64)
    bi = off >> 3
    acc = np.zeros(nbytes + 5, dtype=np.float64)
    for q in range(5):   # fields never share a bit, so summing their byte contributions is an OR
        acc += np.bincount(bi + q, weights=((sh >> np.uint64(8 * q)) & np.uint64(255)).astype(np.float64),
                           minlength=nbytes + 5)
    return acc[:nbytes].astype(np.uint8).tobytes(), nbits


def unpack_fields(raw: np.ndarray, widths: np.ndarray) -> np.ndarray:
    """The fields pack_fields wrote; raw holds at least their bits."""
    widths = widths.astype(np.int64)
    off = np.cumsum(widths) - widths
    buf = np.zeros(len(raw) + 8, dtype=np.uint8)
    buf[:len(raw)] = raw
    win = np.ndarray((len(raw) + 1,), dtype="<u8", buffer=buf, strides=(1,))
    vals = win[off >> 3] >> (off & 7).astype(np.uint64)
    return vals & ((np.uint64(1) << widths.astype(np.uint64)) - np.uint64(1))


def apply_residuals(sym: np.ndarray, v: np.ndarray, raw: np.ndarray, fmt: ElementFormat, r: int) -> np.ndarray:
    """The elements (uint64) whose symbols and stored bits these are, against reference elements v."""
    extra, top = symbol_tables(fmt.bits, r)
    sym = sym.astype(np.int64)
    ex = extra[sym]
    z = top[sym] | unpack_fields(raw, ex)
    mask = np.uint64((1 << fmt.bits) - 1)
    d = (z >> np.uint64(1)) ^ ((z & np.uint64(1)) * mask)
    return _unkeys((_keys(v, fmt) + d) & mask, fmt)


@dataclass(frozen=True)
class Choice:
    cuts: list[int]        # K - 1 increasing field values that start contexts 1 .. K-1
    counts: np.ndarray     # K x S transmitted rows (scaled counts)
    cost: float            # estimated bytes of symbols and tables


def _entropy_bytes(rows: np.ndarray) -> np.ndarray:
    c = rows.astype(np.float64)
    tot = c.sum(axis=-1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(c > 0, -c * np.log2(c / np.maximum(tot, 1)), 0.0)
    return h.sum(axis=-1) / 8


def choose_contexts(H: np.ndarray) -> Choice:
    """Ranges of field values (at most MAX_CONTEXTS) for the contexts, from the histogram H of
    (field, symbol): adjacent ranges are merged greedily where merging costs the fewest bits,
    and the context count with the smallest estimated size (symbols plus tables) is kept."""
    counts = H.sum(axis=1)
    used = np.flatnonzero(counts)
    if not len(used):
        used = np.zeros(1, dtype=np.int64)
    if len(used) > MERGE_FROM:
        # first group the field values into MERGE_FROM ranges of about equal element counts, so
        # the greedy merge (a few numpy calls a step) starts from few ranges
        cum = np.cumsum(counts[used])
        group = np.minimum((cum - counts[used]) * MERGE_FROM // cum[-1], MERGE_FROM - 1)
        used = used[np.flatnonzero(np.diff(group, prepend=-1))]
    bounds = list(used[1:]) + [len(H)]
    starts = [int(f) for f in used]
    rows = [H[a:b].sum(axis=0).astype(np.int64) for a, b in zip(used, bounds)]
    h = [float(x) for x in _entropy_bytes(np.stack(rows))]
    nnz = [int(np.count_nonzero(r)) for r in rows]
    # merged[i]: the bytes of ranges i and i + 1 coded with one table
    merged = [float(x) for x in _entropy_bytes(np.stack(rows[:-1]) + np.stack(rows[1:]))] if len(rows) > 1 else []
    best: Choice | None = None
    while True:
        K = len(rows)
        if K <= MAX_CONTEXTS and K in CONTEXT_COUNTS or K == 1:
            cost = sum(h) + 1.3 * sum(nnz) + 2 * K
            if best is None or cost < best.cost:
                best = Choice(starts[1:], np.stack(rows), cost)
        if K == 1:
            break
        gain = np.asarray(merged) - np.asarray(h[:-1]) - np.asarray(h[1:])
        i = int(np.argmin(gain))
        rows[i:i + 2] = [rows[i] + rows[i + 1]]
        h[i:i + 2] = [merged[i]]
        nnz[i:i + 2] = [int(np.count_nonzero(rows[i]))]
        del starts[i + 1], merged[i]
        if i > 0:
            merged[i - 1] = float(_entropy_bytes(rows[i - 1] + rows[i]))
        if i < len(rows) - 1:
            merged[i] = float(_entropy_bytes(rows[i] + rows[i + 1]))
    return best


def _table_log(n: int, S: int) -> int:
    R = 12 if n >= 1 << 16 else 11 if n >= 1 << 12 else 10
    while (1 << R) < S:
        R += 1
    return R


def _tables(counts: np.ndarray, R: int) -> tans.Tables:
    """The decoder's tables from transmitted rows; an all-zero row gets every slot on symbol 0."""
    used = counts.any(axis=1)
    freqs = np.zeros_like(counts)
    freqs[~used, 0] = 1 << R
    if used.any():
        freqs[used] = tans.quantize_rows(counts[used], R)
    return tans.Tables(freqs, R)


class UlpDeltaCodec(DeltaCodec):
    id = 8
    name = "ulpdelta"

    def __init__(self, refine: dict[int, int] | None = None):
        self.refine = REFINE_BITS if refine is None else refine

    def encode_delta(self, data: memoryview, ref: memoryview, hint: ChunkHint) -> tuple[bytes, bytes] | None:
        fid = FORMAT_OF.get((hint.dtype or "").upper())
        if fid is None and hint.block_bytes > 0 and (hint.dtype or "").upper() not in BLOCK_LAYOUTS:
            # block-quantised (GGUF) chunks of a type without a known layout: their bytes as
            # uint8, scales and packed quants alike (blockdelta codes the others field by field,
            # always smaller); encode_delta_chunk keeps xorzstd where that is smaller
            fid = FORMAT_OF["U8"]
        if fid is None:
            return None
        if len(ref) != len(data):
            raise ValueError(f"ulpdelta: reference of {len(ref)} bytes for a chunk of {len(data)}")
        fmt = FORMATS[fid]
        width = fmt.bits // 8
        n = len(data) // width
        crc = zlib.crc32(data)
        tail = bytes(data[n * width:])
        r = self.refine[fmt.bits]
        if n == 0:
            return bytes((fid, r, 10, 1)) + put_varint(0) + crc.to_bytes(4, "little") + put_varint(0) + \
                put_varint(0) + b"\x00", tail
        u = np.frombuffer(data, dtype=_UINT[fmt.bits], count=n)
        v = np.frombuffer(ref, dtype=_UINT[fmt.bits], count=n)
        res = residuals(u, v, fmt, r)
        S = alphabet(fmt.bits, r)
        H = np.bincount(res.field.astype(np.int64) * S + res.sym, minlength=(1 << fmt.field_bits) * S).reshape(-1, S)
        choice = choose_contexts(H)
        counts = tans.scale_rows(choice.counts, ROW_LOG)
        R = _table_log(n, S)
        tab = _tables(counts, R)
        ctx = _context_map(choice.cuts, fmt.field_bits)[res.field]
        lanes = min(n, max(LANE_FLOOR, min(tans.lanes_for(n, 32), res.raw_bits // R)))
        wp = tans.layout(n, lanes, True)[1]
        raw = np.frombuffer(res.raw, dtype=np.uint8)
        m = min(len(raw), wp * R // 8)
        bb = tans.bits_back_values(raw[:m], wp, R)
        stream = tans.encode(res.sym, tab, lanes, ctx=ctx, bits_back=bb, interleaved=True)
        params = bytes((fid, r, R, len(choice.cuts) + 1)) + b"".join(put_varint(c) for c in choice.cuts) + \
            put_varint(lanes) + crc.to_bytes(4, "little") + put_varint(len(stream)) + put_varint(len(raw)) + \
            uintlist.pack_uints(counts)
        return params, stream + raw[m:].tobytes() + tail

    def decode_delta(self, params: Buffer, body: Buffer, size: int, ref: Buffer, *, check: bool = True) -> bytes:
        p, body = delta_inputs("ulpdelta", params, body, size, ref, 4)
        fid, r, R, K = p[0], p[1], p[2], p[3]
        if fid not in FORMATS:
            raise CodecError(f"ulpdelta: unknown element format {fid}")
        fmt = FORMATS[fid]
        if r + 1 >= fmt.bits or alphabet(fmt.bits, r) > MAX_SYMBOLS or not 1 <= K <= MAX_CONTEXTS or not tans.MIN_R <= R <= tans.MAX_R:
            raise CodecError("ulpdelta: bad model parameters")
        pos = 4
        cuts = []
        for _ in range(K - 1):
            c, pos = get_varint(p, pos, "ulpdelta context cut")
            if c >= 1 << fmt.field_bits or (cuts and c <= cuts[-1]) or c == 0:
                raise CodecError("ulpdelta: context cuts out of order or range")
            cuts.append(c)
        lanes, pos = get_varint(p, pos, "ulpdelta lanes")
        if pos + 4 > len(p):
            raise CodecError("ulpdelta: params truncated")
        crc = int.from_bytes(p[pos:pos + 4], "little")
        slen, pos = get_varint(p, pos + 4, "ulpdelta stream length")
        rlen, pos = get_varint(p, pos, "ulpdelta stored bits length")
        width = fmt.bits // 8
        n, t = divmod(size, width)
        if n > tans.MAX_N:
            raise CodecError("ulpdelta: chunk too large")
        S = alphabet(fmt.bits, r)
        if n == 0:
            if (lanes, slen, rlen) != (0, 0, 0) or bytes(p[pos:]) != b"\x00" or len(body) != t:
                raise CodecError("ulpdelta: malformed empty chunk")
            out = bytes(body)
        else:
            counts = uintlist.unpack_uints(p[pos:], K * S, "ulpdelta").reshape(K, S)
            if counts.max(initial=0) > 1 << ROW_LOG or (counts.sum(axis=1) > 1 << ROW_LOG).any():
                raise CodecError("ulpdelta: table value out of range")
            if (1 << R) < S:
                raise CodecError("ulpdelta: table log too small for the alphabet")
            try:
                tab = _tables(counts, R)
            except ValueError:
                raise CodecError("ulpdelta: the tables cannot be quantised") from None
            if not 1 <= lanes <= n:
                raise CodecError("ulpdelta: bad lanes")
            wp = tans.layout(n, lanes, True)[1]
            m = min(rlen, wp * R // 8)
            if slen + rlen - m + t != len(body):
                raise CodecError("ulpdelta: body length does not match params")
            v = np.frombuffer(ref, dtype=_UINT[fmt.bits], count=n)
            cmap = _context_map(cuts, fmt.field_bits)
            out_u = self._decode_elements(body, slen, rlen, m, n, tab, lanes, v, cmap, fmt, r, S)
            out = out_u.tobytes() + bytes(body[len(body) - t:]) if t else out_u.tobytes()
        if check and zlib.crc32(out) != crc:
            raise CodecError("ulpdelta: checksum mismatch")
        return out

    @staticmethod
    def _decode_elements(body: memoryview, slen: int, rlen: int, m: int, n: int, tab: tans.Tables, lanes: int,
                         v: np.ndarray, cmap: np.ndarray, fmt: ElementFormat, r: int, S: int) -> np.ndarray:
        loop = _compiled_loops()
        compiled = loop is not None
        if compiled:
            # the contexts live in the output's first n bytes: dead once the symbols are decoded,
            # and the output's pages are then already mapped when the rebuild writes them
            out = np.empty(n, dtype=_UINT[fmt.bits])
            ctx = out.view(np.uint8)[:n]
            loop.ulp_contexts(v, fmt.bits, fmt.floating, fmt.field_shift, fmt.field_bits, fmt.field_of_key,
                              cmap, ctx)
        else:
            ctx = cmap[_fields(v.astype(np.uint64), fmt)]
        sym, fin = tans.decode(body[:slen], n, tab, lanes, ctx=ctx, values=np.arange(S, dtype=np.uint8),
                               interleaved=True)
        raw = np.zeros(rlen + 8, dtype=np.uint8)      # 8 bytes of slack for the compiled loop's reads
        raw[:m] = tans.bits_back_bytes(fin, tab.R, m)
        raw[m:rlen] = np.frombuffer(body, dtype=np.uint8, count=rlen - m, offset=slen)
        if compiled:
            err = loop.ulp_apply(sym, v, raw, rlen, fmt.bits, fmt.floating, r, out)
            if err:
                raise CodecError("ulpdelta: stored bits do not match the symbols")
            return out
        raw = raw[:rlen]
        extra = symbol_tables(fmt.bits, r)[0][sym.astype(np.int64)]
        nbits = int(extra.sum())
        if (nbits + 7) >> 3 != rlen or (nbits & 7 and rlen and raw[-1] >> (nbits & 7)):
            raise CodecError("ulpdelta: stored bits do not match the symbols")
        return apply_residuals(sym, v.astype(np.uint64), raw, fmt, r).astype(_UINT[fmt.bits])
