"""Codec 3, ``floatsplit``: IEEE-style floats split on bit fields; sign, exponent and the top k
mantissa bits entropy-coded with tANS, the low mantissa bits stored as they are.

Each element's top field J = (exponent - emin) * 2**(k+1) + (sign * 2**k + top k mantissa bits)
is one tANS symbol. Its table is its context, either the previous element of the same lane
(b = min(emax - previous exponent, nb - 1): in trained weights small values follow small values)
or the class of its tensor row (rows grouped by mean exponent, when the hint gives a shape),
whichever the encoder estimates smaller. The model is factorised so that it costs few bytes:
P(J | b) is proportional to A[b, exponent] * Sg[sign] * M[exponent, mantissa bits], sent as small
integer tables; the decoder rebuilds the tANS tables from them exactly as the encoder did. The
low mantissa bits are near-uniform and are kept as byte/nibble planes (each a coded stream: stored
unless something is smaller); blocks of 64 elements whose lowest planes are all zero (float16 or
bfloat16 values held in a wider type) store only the others. The first stored bytes ride in the
tANS lanes' end states ("bits back"), so the lanes cost no flush bytes. A CRC-32 of the plain
chunk guards everything, stored bits included. Layout: docs/format.md, codec 3.
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass

import numpy as np

from . import entropy, kernels, tans, uintlist
from ..chunker import ChunkHint
from .base import Buffer, Codec, CodecError, get_varint, put_varint

# format id -> (name, element bits, exponent bits, mantissa bits, k)
FORMATS = {0: ("BF16", 16, 8, 7, 3), 1: ("F16", 16, 5, 10, 2), 2: ("F32", 32, 8, 23, 3),
           3: ("F64", 64, 11, 52, 4), 4: ("F8_E4M3", 8, 4, 3, 3), 5: ("F8_E5M2", 8, 5, 2, 2)}
FORMAT_OF = {v[0]: k for k, v in FORMATS.items()}
FORMAT_OF.update({"F8E4M3": 4, "F8_E4M3FN": 4, "F8E5M2": 5})
_UINT = {8: np.dtype(np.uint8), 16: np.dtype("<u2"), 32: np.dtype("<u4"), 64: np.dtype("<u8")}
A_LOG, M_LOG = 12, 8     # transmitted rows of A are scaled to sum <= 2**A_LOG, of M and S to <= 2**M_LOG
MAX_CONTEXTS = 16
ZERO_BLOCK_LOG = 6       # elements per zero-plane block: 64
MAX_TABLE_SLOTS = 1 << 16   # encoder choice: contexts x 2**R, so that building the tables stays quick
ROW_CLASSES = 0xFF       # the "first context" byte value that selects row-class contexts
# Row classes are measured only for rows of at least this many elements. Shorter "rows" are
# the last axis of a convolution kernel (3) or a column (1): a class per row then costs more in
# its class map than grouping by it saves, on every such chunk of the corpus, while measuring it
# takes a tenth of the chunk's encode. encode_chunk(exhaustive=True) still measures them.
ROW_CLASS_MIN = 8


def _sign_mantissa(S: np.ndarray, M: np.ndarray) -> np.ndarray:
    """B[e, sign * 2**k + m] = S[sign] * M[e, m]: the sign is modelled as independent of the rest."""
    return np.concatenate([S[0] * M, S[1] * M], axis=1)


def _joint_tables(A: np.ndarray, B: np.ndarray, R: int) -> np.ndarray:
    """The nb tANS tables: row b is quantize(A[b, e] * B[e, t] over symbols e * T2 + t, R), or all
    slots on symbol 0 where that product is zero everywhere."""
    joint = (A[:, :, None] * B[None, :, :]).reshape(A.shape[0], -1)
    used = joint.any(axis=1)
    freqs = np.zeros_like(joint)
    freqs[~used, 0] = 1 << R
    if used.any():
        freqs[used] = tans.quantize_rows(joint[used], R)
    return freqs


class FloatSplitCodec(Codec):
    id = 3
    name = "floatsplit"

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        fmt, u, n, tail, crc = split_elements(data, hint)
        if n == 0:
            return bytes((fmt, k_of(fmt), 1, 1, 0)) + put_varint(0) + put_varint(0) + put_varint(0) + \
                crc.to_bytes(4, "little") + put_varint(0), tail
        fit, sym = fit_model(u, n, fmt, hint)
        part = encode_part(fit, u, sym, fit.ctx)
        params = fit.head + put_varint(part.lanes) + put_varint(fit.emin) + put_varint(fit.E) + \
            crc.to_bytes(4, "little") + part.params + fit.blob
        return params, part.body + tail

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        out = self.decode_buffer(params, body, size, check=check)
        return out if isinstance(out, bytes) else out.tobytes()

    def decode_buffer(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> Buffer:
        p = memoryview(params)
        fmt, R, nb, c0, rows, pos = parse_head(p, size, "floatsplit")
        lanes, pos = get_varint(p, pos, "floatsplit lanes")
        emin, pos = get_varint(p, pos, "floatsplit emin")
        E, pos = get_varint(p, pos, "floatsplit exponent range")
        if pos + 4 > len(p):
            raise CodecError("floatsplit: params truncated")
        crc = int.from_bytes(p[pos:pos + 4], "little")
        slen, pos = get_varint(p, pos + 4, "floatsplit stream length")
        if pos >= len(p) and size >= (FORMATS[fmt][1] // 8):
            raise CodecError("floatsplit: params truncated")
        width = FORMATS[fmt][1] // 8
        n, t = divmod(size, width)
        if n > tans.MAX_N:
            raise CodecError("floatsplit: chunk too large")
        body = memoryview(body)
        if n == 0:
            if (lanes, emin, E, slen) != (0, 0, 0, 0) or pos != len(p) or len(body) != t:
                raise CodecError("floatsplit: malformed empty chunk")
            out = bytes(body)
        else:
            groups, q = parse_groups(p, pos, n, fmt, "floatsplit")
            model = decode_model(p[q:], fmt, R, nb, c0, emin, E, n, rows, "floatsplit")
            if not 1 <= lanes <= n:
                raise CodecError("floatsplit: bad lanes or exponent range")
            if part_length(model, n, lanes, slen, groups) + t != len(body):
                raise CodecError("floatsplit: body length does not match params")
            u = np.empty(n, dtype=_UINT[FORMATS[fmt][1]])
            decode_parts_together(model, body[:len(body) - t], [PartSpec(0, 0, n, lanes, slen, groups, 0)], u)
            # the decoded array itself, as bytes; with trailing bytes (rare) a copy with them
            out = u.tobytes() + bytes(body[len(body) - t:]) if t else memoryview(u).cast("B")
        if check and zlib.crc32(out) != crc:
            raise CodecError("floatsplit: checksum mismatch")
        return out


# --- the parts shared with floatseg (a chunk cut into parts that decode on their own) --------

def k_of(fmt: int) -> int:
    return FORMATS[fmt][4]


def split_elements(data: memoryview, hint: ChunkHint) -> tuple[int, np.ndarray, int, bytes, int]:
    """(format id, elements as unsigned integers of their own width, element count, trailing bytes,
    CRC-32 of data). The elements are a view of data where it is aligned for them, else a copy."""
    fmt = FORMAT_OF.get((hint.dtype or "").upper())
    if fmt is None:
        raise ValueError(f"floatsplit: no float format for dtype {hint.dtype!r}")
    bits = FORMATS[fmt][1]
    width = bits // 8
    a = np.frombuffer(data, dtype=np.uint8)
    n = len(a) // width
    u = np.require(a[: n * width].view(_UINT[bits]), requirements=("A", "C"))
    return fmt, u, n, a[n * width:].tobytes(), zlib.crc32(data)


@dataclass
class Fit:
    """The model the encoder chose for a whole chunk; every part of it is coded with it."""
    fmt: int
    R: int
    nb: int
    c0: int
    emin: int
    E: int
    head: bytes             # format, k, R, nb, c0 and the row classes, as params start
    ctx: np.ndarray | None  # row-class context of each element, or None: previous-exponent ones
    tab: tans.Tables
    cmap: np.ndarray
    blob: bytes             # the packed model tables A, Sg, M


@dataclass
class Fields:
    """What fit_model counts in its pass over a chunk's elements."""
    e: np.ndarray       # exponent - emin of each element (an unsigned or int64 array)
    sym: np.ndarray     # each element's tANS symbol (uint16 from the compiled pass, int64 from numpy)
    emin: int
    emax: int
    cM: np.ndarray      # E x 2**k: counts of (exponent, top mantissa bits)
    sg: np.ndarray      # counts of sign 0 and sign 1
    H: np.ndarray       # 16 x E: counts of (min(emax - previous exponent, 15), exponent), after the first


def chunk_fields(u: np.ndarray, n: int, fmt: int) -> Fields:
    """The fields and histograms of n elements (uint64): compiled (one pass, without Python's
    lock) when the loop is built, else numpy's (numpy_fields, the reference)."""
    loop = kernels.compiled()
    if loop is None or n < 1:
        return numpy_fields(u, n, fmt)
    _, bits, eb, mb, k = FORMATS[fmt]
    u = _compiled_elements(u[:n])
    emin, emax = loop.float_range(u, n, mb, eb)
    E = emax - emin + 1
    e = np.empty(n, dtype=np.uint16)
    # 16-bit symbols where every symbol fits (every format here): a quarter of int64's bytes
    sym = np.empty(n, dtype=np.uint16 if E << (k + 1) <= 1 << 16 else np.int64)
    cM = np.zeros((E, 1 << k), dtype=np.int64)
    sg = np.zeros(2, dtype=np.int64)
    H = np.zeros((16, E), dtype=np.int64)
    loop.float_fields(u, n, bits, mb, eb, k, emin, emax, e, sym, cM, sg, H)
    return Fields(e, sym, emin, emax, cM, sg, H)


def _compiled_elements(u: np.ndarray) -> np.ndarray:
    """u as the compiled passes read it: unsigned integers of 2, 4 or 8 bytes, aligned and
    contiguous (a view where u already is, else a copy; anything else as uint64)."""
    if u.dtype.itemsize not in (2, 4, 8) or u.dtype.kind != "u":
        u = np.asarray(u, dtype=np.uint64)
    return np.require(u, requirements=("A", "C"))


def numpy_fields(u: np.ndarray, n: int, fmt: int) -> Fields:
    """chunk_fields in numpy: the reference the compiled pass is tested against."""
    _, bits, eb, mb, k = FORMATS[fmt]
    raw_bits = mb - k
    u = np.asarray(u, dtype=np.uint64)
    exp = ((u >> np.uint64(mb)) & np.uint64((1 << eb) - 1)).astype(np.int64)
    top = ((u >> np.uint64(bits - 1)).astype(np.int64) << k) | \
        ((u >> np.uint64(raw_bits)).astype(np.int64) & ((1 << k) - 1))
    emin, emax = int(exp.min()), int(exp.max())
    E, T2 = emax - emin + 1, 1 << (k + 1)
    e = exp - emin
    sym = e * T2 + top
    prev = emax - exp[:-1]
    cM = np.bincount(e * (T2 // 2) + (top & (T2 // 2 - 1)), minlength=E * T2 // 2).reshape(E, T2 // 2)
    sg = np.bincount(top >> k, minlength=2)
    H = np.bincount(np.minimum(prev, 15) * E + e[1:], minlength=16 * E).reshape(16, E)
    return Fields(e, sym, emin, emax, cM, sg, H)


def part_lanes(n: int, fmt: int) -> int:
    """Encoder choice: the lanes of a part of n elements (encode_part's, and what the model
    fit counts their starts by)."""
    return tans.lanes_for(n, 32 if FORMATS[fmt][3] > FORMATS[fmt][4] else 256)


def lane_starts(n: int, fmt: int, part: int | None = None) -> np.ndarray:
    """The elements that start a lane when the chunk's n elements (n >= 1) are coded as
    encode_part lays them out, in parts of `part` elements each on lanes of their own (floatseg's
    segments; None: the whole chunk as one part). Each takes context c0, not its previous element's."""
    step = part or n
    out = []
    for a in range(0, n, step):
        m = min(n, a + step) - a
        steps, wp, _ = tans.contiguous_layout(m, part_lanes(m, fmt))
        out.append(a + np.arange(wp) * steps)
    return np.concatenate(out)


def fit_model(u: np.ndarray, n: int, fmt: int, hint: ChunkHint, part: int | None = None) -> tuple[Fit, np.ndarray]:
    """The chunk's model and each element's tANS symbol; part: elements per part, for a chunk
    coded in parts (floatseg), whose lane starts the model must count where they fall."""
    _, bits, eb, mb, k = FORMATS[fmt]
    width = bits // 8
    fields = chunk_fields(u, n, fmt)
    emin, emax, e, sym = fields.emin, fields.emax, fields.e, fields.sym
    E, T2 = emax - emin + 1, 1 << (k + 1)
    starts = lane_starts(n, fmt, part)
    M = tans.scale_rows(fields.cM, M_LOG)
    S = tans.scale_rows(fields.sg[None, :], M_LOG)[0]
    B = _sign_mantissa(S, M)
    best = None
    # Every candidate context count nb clips the previous exponent at nb - 1, so each one's
    # counts are rows of one histogram of (previous exponent clipped at 15, exponent) over the
    # elements after the first, with the lane starts (which take context c0) moved: one pass over
    # the chunk instead of one per candidate, the same counts.
    H = fields.H
    inner = starts[starts > 0]
    prev_inner = (E - 1) - e[inner - 1].astype(np.int64)   # emax - the previous element's exponent
    for nb in (1, 4, 8, 12, 16):
        nb = min(nb, max(1, E))
        if nb > 1 and nb * (E * T2 + (1 << 10)) > _table_budget(n):
            break
        cA = np.concatenate([H[:nb - 1], H[nb - 1:].sum(axis=0, keepdims=True)])
        c0 = int(cA.sum(axis=1).argmax()) if n > 1 else 0
        cA -= np.bincount(np.minimum(prev_inner, nb - 1) * E + e[inner], minlength=nb * E).reshape(nb, E)
        cA[c0] += np.bincount(e[starts], minlength=E)
        cost = _cost(cA) + 1.3 * np.count_nonzero(cA)
        if best is None or cost < best[0]:
            best = (cost, nb, c0, cA)
        if E == 1 or nb >= E:
            break
    rowmode = b""
    ctx = None
    C = hint.shape[-1] if hint.shape and len(hint.shape) >= 2 and hint.shape[-1] > 0 else 0
    if C and n >= 4 * C and (C >= ROW_CLASS_MIN or entropy.trying_every()):
        shift = (hint.offset // width) % C
        found = _row_classes(e, n, C, shift, E)
        if found and found[0] < best[0]:
            _, nb, cls, cA = found
            c0 = ROW_CLASSES
            cmapq = entropy.encode_stream(cls, nb)
            rowmode = put_varint(C) + put_varint(shift) + put_varint(len(cmapq)) + cmapq
            ctx = _row_contexts(cls, n, C, shift)
    if ctx is None:
        _, nb, c0, cA = best
    A = tans.scale_rows(cA, A_LOG)
    R = _table_log(n, nb, E * T2)
    tab = tans.Tables(_joint_tables(A, B, R), R)
    cmap = np.minimum(E - 1 - (np.arange(E * T2) // T2), nb - 1)
    blob = uintlist.pack_uints(np.concatenate([A.ravel(), S, M.ravel()]))
    head = bytes((fmt, k, R, nb, c0)) + rowmode
    return Fit(fmt, R, nb, c0, emin, E, head, ctx, tab, cmap, blob), sym


@dataclass
class Part:
    """A run of elements coded with a Fit: its own lanes, tANS stream and stored bits."""
    lanes: int
    params: bytes   # stream length, zero-block flags, group lengths
    body: bytes     # the stream, then the stored groups less the bytes the lanes carry


def encode_part(fit: Fit, u: np.ndarray, sym: np.ndarray, ctx: np.ndarray | None) -> Part:
    _, bits, eb, mb, k = FORMATS[fit.fmt]
    raw_bits = mb - k
    n = len(sym)
    lanes = part_lanes(n, fit.fmt)
    wp = tans.layout(n, lanes, ctx is not None)[1]
    planes = _raw_planes(u, raw_bits)
    zb, zflags, z = _zero_blocks(planes, n)
    parts = [entropy.encode_stream(_pack_group(planes[j], mask, j == raw_bits // 8))
             for j, mask in _groups(len(planes), z, n)]
    raw = np.frombuffer(b"".join(parts), dtype=np.uint8)
    m = min(len(raw), wp * fit.R // 8)
    bb = tans.bits_back_values(raw[:m], wp, fit.R)
    if ctx is None:
        stream = tans.encode(sym, fit.tab, lanes, dyn=(fit.cmap, fit.c0), bits_back=bb)
    else:
        stream = tans.encode(sym, fit.tab, lanes, ctx=ctx, bits_back=bb, interleaved=True)
    params = put_varint(len(stream)) + bytes((zb,)) + (put_varint(len(zflags)) + zflags if zb else b"") + \
        b"".join(put_varint(len(q)) for q in parts)
    return Part(lanes, params, stream + raw[m:].tobytes())


def parse_head(p: memoryview, size: int, name: str) -> tuple[int, int, int, int, tuple | None, int]:
    """(format, R, nb, c0, row classes (C, shift, class map) or None, position after them)."""
    if len(p) < 5:
        raise CodecError(f"{name}: params too short")
    fmt, k, R, nb, c0 = p[0], p[1], p[2], p[3], p[4]
    if fmt not in FORMATS:
        raise CodecError(f"{name}: unknown float format {fmt}")
    if k != k_of(fmt) or not 1 <= R <= tans.MAX_R or not 1 <= nb <= MAX_CONTEXTS or \
            (c0 >= nb and c0 != ROW_CLASSES):
        raise CodecError(f"{name}: bad model parameters")
    pos = 5
    rows = None
    if c0 == ROW_CLASSES:
        C, pos = get_varint(p, pos, f"{name} row length")
        shift, pos = get_varint(p, pos, f"{name} row shift")
        mlen, pos = get_varint(p, pos, f"{name} row classes length")
        if not 1 <= C <= size or shift >= C or pos + mlen > len(p):
            raise CodecError(f"{name}: bad row classes")
        rows = (C, shift, p[pos:pos + mlen])
        pos += mlen
    return fmt, R, nb, c0, rows, pos


@dataclass
class Groups:
    """How a part's stored bits are grouped: (plane, element mask or None) and coded lengths."""
    groups: list[tuple[int, np.ndarray | None]]
    lens: list[int]


def _planes_of(fmt: int) -> tuple[int, int]:
    _, bits, eb, mb, k = FORMATS[fmt]
    raw_bits = mb - k
    return raw_bits, raw_bits // 8 + (1 if raw_bits % 8 else 0)


@dataclass(frozen=True)
class GroupLens:
    """A part's stored-group lengths, its zero-block size and its still-coded zero-block flags:
    what a reader that decodes only some parts of a chunk parses of the others."""
    zb: int
    flags: memoryview | None
    lens: tuple[int, ...]


def parse_group_lens(blob: memoryview, q: int, n: int, fmt: int, name: str) -> tuple[GroupLens, int]:
    """The zero-block size and flags (not decoded) and the stored-group lengths of a part of n
    elements at blob[q:]."""
    nplanes = _planes_of(fmt)[1]
    if q >= len(blob):
        raise CodecError(f"{name}: params truncated")
    zb = blob[q]
    flags = None
    if zb:
        if not 1 <= zb <= 16 or not nplanes:
            raise CodecError(f"{name}: bad zero-block size")
        flen, q = get_varint(blob, q + 1, f"{name} zero-block flags length")
        if q + flen > len(blob):
            raise CodecError(f"{name}: zero-block flags run past the params")
        flags = blob[q:q + flen]
        q += flen
    else:
        q += 1
    lens = []
    for _ in range(2 * nplanes - 1 if zb else nplanes):     # as many as _groups makes
        ln, q = get_varint(blob, q, f"{name} plane stream length")
        lens.append(ln)
    return GroupLens(zb, flags, tuple(lens)), q


def groups_of(g: GroupLens, n: int, fmt: int) -> Groups:
    """The groups of a part of n elements, its zero-block flags decoded."""
    nplanes = _planes_of(fmt)[1]
    z = None
    if g.zb:
        nblk = -(-n // (1 << g.zb))
        z = np.repeat(entropy.decode_stream(g.flags, nblk, nplanes + 1), 1 << g.zb)[:n]
    return Groups(_groups(nplanes, z, n), list(g.lens))


def parse_groups(blob: memoryview, q: int, n: int, fmt: int, name: str) -> tuple[Groups, int]:
    """The zero-block flags and stored-group lengths of a part of n elements at blob[q:]."""
    g, q = parse_group_lens(blob, q, n, fmt, name)
    return groups_of(g, n, fmt), q


@dataclass
class Model:
    """What the decoder rebuilds once per chunk from the params: tables and symbol values."""
    fmt: int
    R: int
    rows: tuple | None      # (row length, shift, class of each row) for row-class contexts
    tab: tans.Tables
    cmap: np.ndarray
    c0: int
    val: np.ndarray         # the element bits each symbol stands for


def decode_model(blob: memoryview, fmt: int, R: int, nb: int, c0: int, emin: int, E: int, n: int,
                 rows: tuple | None, name: str) -> Model:
    """The model of a chunk of n elements from its table blob (the rest of blob must be exactly it)."""
    _, bits, eb, mb, k = FORMATS[fmt]
    T2 = 1 << (k + 1)
    raw_bits = mb - k
    if E < 1 or emin + E > 1 << eb or E * T2 > tans.MAX_SYMBOLS:
        raise CodecError(f"{name}: bad lanes or exponent range")
    if nb * (E * T2 + (1 << R)) > _table_budget(n):
        raise CodecError(f"{name}: tables too large for the chunk")
    vals = uintlist.unpack_uints(blob, nb * E + 2 + E * T2 // 2, name)
    tab = _model_tables(vals, nb, E, T2, R)
    cmap = np.minimum(E - 1 - (np.arange(E * T2) // T2), nb - 1)
    J = np.arange(E * T2, dtype=np.uint64)
    e, top = J // np.uint64(T2) + np.uint64(emin), J % np.uint64(T2)
    val = (((top >> np.uint64(k)) << np.uint64(bits - 1)) | (e << np.uint64(mb)) |
           ((top & np.uint64((1 << k) - 1)) << np.uint64(raw_bits))).astype(_UINT[bits])
    if rows is not None:
        C, shift, cmapq = rows
        rows = (C, shift, entropy.decode_stream(cmapq, (n - 1 + shift) // C + 1, nb).astype(np.uint8))
    return Model(fmt, R, rows, tab, cmap, c0, val)


def part_length(model: Model, n: int, lanes: int, slen: int, groups: Groups) -> int:
    """The body bytes of a part: its stream and stored groups, less what its lanes carry."""
    raw_len = sum(groups.lens)
    wp = tans.layout(n, lanes, model.rows is not None)[1]
    return slen + raw_len - min(raw_len, wp * model.R // 8)


def decode_part(model: Model, body: memoryview, first: int, lanes: int, slen: int, groups: Groups,
                out: np.ndarray) -> None:
    """Decode the part whose elements start at element `first` of the chunk into out (their
    count long); body is exactly its bytes (part_length)."""
    n = len(out)
    raw_bits = _planes_of(model.fmt)[0]
    if model.rows is None:
        _, fin = tans.decode(body[:slen], n, model.tab, lanes, dyn=(model.cmap, model.c0), values=model.val,
                             out=out)
    else:
        C, shift, cls = model.rows
        r = (np.arange(first, first + n) + shift) // C
        _, fin = tans.decode(body[:slen], n, model.tab, lanes, ctx=cls[r], values=model.val,
                             interleaved=True, out=out)
    raw_len = sum(groups.lens)
    m = min(raw_len, len(fin) * model.R // 8)
    raw = np.empty(raw_len, dtype=np.uint8)
    raw[:m] = tans.bits_back_bytes(fin, model.R, m)
    raw[m:] = np.frombuffer(body, dtype=np.uint8, count=raw_len - m, offset=slen)
    off = 0
    for (j, mask), ln in zip(groups.groups, groups.lens):
        c = n if mask is None else int(mask.sum())
        nib = j == raw_bits // 8
        v = entropy.decode_stream(raw[off:off + ln], (c + 1) // 2 if nib else c)
        off += ln
        _or_plane(out, v, c, nib, 8 * j, mask)


@dataclass(frozen=True)
class PartSpec:
    """One part of a chunk for decode_parts_together: its first element in the chunk, where its elements
    go in the output, their count, its lanes and tANS stream length, its groups, and where its
    bytes (part_length of them) start in the body given."""
    first: int
    out_at: int
    count: int
    lanes: int
    slen: int
    groups: Groups
    at: int


def decode_parts_together(model: Model, body: memoryview, parts: list[PartSpec], out: np.ndarray) -> None:
    """decode_part for each of parts, into out (whose elements each part's out_at indexes). With
    the compiled loop and the model's compact tables, every part's tANS stream, bits back and
    stored groups are decoded in one call that lets go of Python's lock once for the chunk
    (_tansparts.c); the groups it leaves (zstd or tANS coded) are decoded here afterwards. The
    same elements as decode_part part by part, which is the reference (and the fallback)."""
    loop = kernels.compiled()
    tab = model.tab
    isz = out.itemsize
    if loop is None or tab.packed32 is None or isz not in (2, 4, 8) or not parts:
        for s in parts:
            decode_part(model, body[s.at:], s.first, s.lanes, s.slen, s.groups, out[s.out_at:s.out_at + s.count])
        return
    vals = np.ascontiguousarray(model.val[:tab.S])
    if len(vals) < tab.S:
        raise CodecError("tans: bad symbol values")
    recs = np.empty((len(parts), 9), dtype=np.int64)
    groups: list[tuple[int, int, int]] = []
    masks: list[np.ndarray] = []
    raws: list[np.ndarray] = []
    for i, s in enumerate(parts):
        g0 = len(groups)
        for (j, mask), ln in zip(s.groups.groups, s.groups.lens):
            if mask is not None:
                masks.append(mask.view(np.uint8))
            groups.append((j, ln, -1 if mask is None else len(masks) - 1))
        raw_len = sum(s.groups.lens)
        raws.append(np.empty(raw_len, dtype=np.uint8))
        recs[i] = (s.first, s.out_at, s.count, s.lanes, s.slen, s.at, raw_len, g0, len(groups) - g0)
    if model.rows is None:
        nxo, cls, C, shift = np.ascontiguousarray(model.cmap[:tab.S] * tab.L, dtype=np.int64), None, 1, 0
    else:
        C, shift, cls = model.rows
        nxo, cls = None, np.ascontiguousarray(cls, dtype=np.uint8)
    garr = np.array(groups, dtype=np.int64).reshape(-1, 3)
    try:
        loop.float_parts(tab.packed32, tab.checked_symbols == len(vals), vals, isz, nxo, cls, C, shift,
                          model.c0, body, recs, garr, tuple(masks), tuple(raws), out, model.R, tab.L,
                          _planes_of(model.fmt)[0] // 8)
    except ValueError as exc:
        raise CodecError(str(exc)) from None
    tab.checked_symbols = len(vals)
    raw_bits = _planes_of(model.fmt)[0]
    for s, raw in zip(parts, raws):      # the groups the compiled call left: zstd or tANS coded
        off = 0
        for (j, mask), ln in zip(s.groups.groups, s.groups.lens):
            if ln and raw[off] != entropy.RAW:
                c = s.count if mask is None else int(mask.sum())
                nib = j == raw_bits // 8
                v = entropy.decode_stream(raw[off:off + ln], (c + 1) // 2 if nib else c)
                _or_plane(out[s.out_at:s.out_at + s.count], v, c, nib, 8 * j, mask)
            elif not ln:
                entropy.decode_stream(raw[off:off], 0)      # raises: a group needs its mode byte
            off += ln


def _model_tables(vals: np.ndarray, nb: int, E: int, T2: int, R: int) -> tans.Tables:
    """The decoder's nb tANS tables from the transmitted model: A (nb x E), S (2), M (E x T2/2)."""
    loop = kernels.compiled()
    if loop is not None and E * T2 <= kernels.COMPILED_MAX_SYMBOLS and tans.MIN_R <= R <= 15:   # float_tables's
        packed = np.empty(nb << R, dtype=np.uint32)
        code = loop.float_tables(np.ascontiguousarray(vals, dtype=np.int64), nb, E, T2, R,
                                 1 << A_LOG, 1 << M_LOG, packed)
        if code == 1:
            raise CodecError("floatsplit: model table value out of range")
        if code:
            raise CodecError("floatsplit: the model's tables cannot be quantised")
        return tans.Tables.prebuilt(packed, nb, E * T2, R)
    if vals.max(initial=0) > 1 << A_LOG or vals[nb * E:].max(initial=0) > 1 << M_LOG:
        raise CodecError("floatsplit: model table value out of range")
    A, S = vals[: nb * E].reshape(nb, E), vals[nb * E:nb * E + 2]
    B = _sign_mantissa(S, vals[nb * E + 2:].reshape(E, T2 // 2))
    try:
        return tans.Tables(_joint_tables(A, B, R), R)
    except ValueError:
        raise CodecError("floatsplit: the model's tables cannot be quantised") from None


def _row_classes(e: np.ndarray, n: int, C: int, shift: int, E: int):
    """Rows (of C elements, the first one shifted) grouped into K classes by mean exponent, with the
    estimated cost; None when no split is possible."""
    loop = kernels.compiled()
    compiled = loop is not None and e.dtype == np.uint16
    if compiled:
        nrows = (n - 1 + shift) // C + 1
        mean = np.empty(nrows, dtype=np.float64)
        loop.row_means(e, n, C, shift, mean)
    else:
        r = (np.arange(n) + shift) // C
        nrows = int(r[-1]) + 1
        mean = np.bincount(r, weights=e, minlength=nrows) / np.maximum(np.bincount(r, minlength=nrows), 1)
    best = None
    # The quartile and median cuts are among the eighth ones, so one quantile call, one class per
    # row and one histogram serve all three K: a row's class among K is its class among 8 shifted,
    # and K's counts are sums of 8's rows (the quantiles never decrease).
    edges = _row_edges(e, n, C, shift, E, mean) if compiled else np.quantile(mean, _EIGHTHS)
    if compiled:
        cls8 = np.empty(nrows, dtype=np.int64)
        cA8 = np.zeros((8, E), dtype=np.int64)
        loop.row_classes(e, n, C, shift, mean, np.ascontiguousarray(edges, dtype=np.float64), E, cls8, cA8)
    else:
        cls8 = np.searchsorted(edges, mean, side="right")
        cA8 = np.bincount(cls8[r] * E + e, minlength=8 * E).reshape(8, E)
    for K, shift in ((2, 2), (4, 1), (8, 0)):
        cls = cls8 >> shift
        cA = cA8.reshape(K, 8 // K, E).sum(axis=1)
        cost = _cost(cA) + 1.3 * np.count_nonzero(cA) + nrows * np.log2(K) / 8 + 8
        if best is None or cost < best[0]:
            best = (cost, K, cls, cA)
    return best


_EIGHTHS = np.linspace(0, 1, 9)[1:-1]


def _row_edges(e: np.ndarray, n: int, C: int, shift: int, E: int, mean: np.ndarray) -> np.ndarray:
    """np.quantile(mean, _EIGHTHS), the same floats: the compiled pass finds the order statistics
    the interpolation needs from the rows' integer sums (no partition of the means), and they are
    interpolated here exactly as numpy's "linear" method does; a partition where it cannot."""
    loop = kernels.compiled()
    nrows = len(mean)
    virtual = (nrows - 1) * _EIGHTHS
    prev = np.floor(virtual)
    nxt = prev + 1
    above = virtual >= nrows - 1
    prev[above] = nxt[above] = nrows - 1
    prev, nxt = prev.astype(np.intp), nxt.astype(np.intp)
    ranks = np.unique(np.concatenate((prev, nxt)))
    vals = np.empty(len(ranks), dtype=np.float64)
    if not loop.row_order_stats(e, n, C, shift, E, ranks.astype(np.int64), vals):
        return np.quantile(mean, _EIGHTHS)
    a, b = vals[np.searchsorted(ranks, prev)], vals[np.searchsorted(ranks, nxt)]
    # numpy's gamma uses the floor index, or -1 (the last element) above the bounds
    gamma = virtual - np.where(above, -1, prev)
    diff = b - a
    out = a + diff * gamma
    np.subtract(b, diff * (1 - gamma), out=out, where=gamma >= 0.5)
    return out


def _row_contexts(cls: np.ndarray, n: int, C: int, shift: int) -> np.ndarray:
    """The row class of each element: cls[(i + shift) // C]."""
    loop = kernels.compiled()
    if loop is None:
        return cls[(np.arange(n) + shift) // C]
    out = np.empty(n, dtype=np.uint8)      # at most 8 classes (_row_classes)
    loop.row_contexts(np.ascontiguousarray(cls, dtype=np.int64), n, C, shift, out)
    return out


def _table_budget(n: int) -> int:
    """Most table entries (contexts x (symbols + slots)) a chunk of n elements may ask for."""
    return max(1 << 17, 16 * n)


def _table_log(n: int, nb: int, symbols: int) -> int:
    R = 15 if n >= 1 << 17 else 14 if n >= 1 << 16 else 12 if n >= 1 << 12 else 10
    while (1 << R) < 2 * symbols and R < tans.MAX_R:
        R += 1
    while R > 10 and (nb * ((1 << R) + symbols) > _table_budget(n) or nb << R > MAX_TABLE_SLOTS):
        R -= 1
    return R


def _cost(cA: np.ndarray) -> float:
    """Order-0 code length in bytes of each context's exponent counts (rows of cA), summed."""
    c = cA.astype(np.float64)
    rows = c.sum(axis=1, keepdims=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        h = np.where(c > 0, -c * np.log2(c / np.maximum(rows, 1)), 0.0)
    return float(h.sum()) / 8


def _raw_planes(u: np.ndarray, raw_bits: int) -> np.ndarray:
    """Low ``raw_bits`` bits of each element as planes (rows), lowest first: whole bytes, then a nibble."""
    loop = kernels.compiled()
    nplanes = raw_bits // 8 + (1 if raw_bits % 8 else 0)
    out = np.empty((nplanes, len(u)), dtype=np.uint8)
    if loop is not None and raw_bits:
        loop.float_planes(_compiled_elements(u), len(u), raw_bits, out)
        return out
    u = np.asarray(u, dtype=np.uint64)
    for j in range(raw_bits // 8):
        out[j] = (u >> np.uint64(8 * j)) & np.uint64(255)
    if raw_bits % 8:
        out[-1] = (u >> np.uint64(8 * (raw_bits // 8))) & np.uint64(15)
    return out


def _zero_blocks(planes: np.ndarray, n: int) -> tuple[int, bytes, np.ndarray | None]:
    """z per block of 2**ZERO_BLOCK_LOG elements: how many of its lowest planes are all zero.

    Returns (block log, or 0 when no block has a zero plane; the coded z values; z per element).
    Compiled (one pass, without Python's lock) where the loop is built; the numpy lines are its
    reference.
    """
    loop = kernels.compiled()
    if not len(planes):
        return 0, b"", None
    B = 1 << ZERO_BLOCK_LOG
    nblk = -(-n // B)
    if loop is not None:
        zb = np.empty(nblk, dtype=np.uint8)
        if not loop.zero_blocks(np.ascontiguousarray(planes), n, len(planes), ZERO_BLOCK_LOG, zb):
            return 0, b"", None
        z = zb.astype(np.int64)
    else:
        zero = []
        for p in planes:
            q = np.zeros(nblk * B, dtype=np.uint8)
            q[:n] = p
            zero.append((q.reshape(nblk, B) == 0).all(axis=1))
        z = np.cumprod(np.stack(zero), axis=0).sum(axis=0)
        if not z.any():
            return 0, b"", None
    return ZERO_BLOCK_LOG, entropy.encode_stream(z, len(planes) + 1), np.repeat(z, B)[:n]


def _groups(nplanes: int, z: np.ndarray | None, n: int) -> list[tuple[int, np.ndarray | None]]:
    """The stored groups of each plane j: all elements, or (with zero blocks) the elements of blocks
    whose first nonzero plane is j, then those of blocks where j is above it."""
    if z is None:
        return [(j, None) for j in range(nplanes)]
    out = []
    for j in range(nplanes):
        out.append((j, z == j))
        if j:
            out.append((j, z < j))
    return out


def _pack_group(plane: np.ndarray, mask: np.ndarray | None, nibbles: bool) -> np.ndarray:
    v = plane if mask is None else plane[mask]
    if nibbles:     # two per byte, the first in the low half
        if len(v) % 2:
            v = np.append(v, np.uint8(0))
        v = v[0::2] | (v[1::2] << 4)
    return v


def _or_plane(u: np.ndarray, v: np.ndarray, c: int, nib: bool, shift: int, mask: np.ndarray | None) -> None:
    """u (or u[mask]) |= the c plane values v (bytes, or nibble pairs) << shift."""
    loop = kernels.compiled()
    if loop is not None:
        m = None if mask is None else mask.view(np.uint8)
        err = loop.or_plane(u, u.itemsize, np.ascontiguousarray(v, dtype=np.uint8), nib, shift, m)
        if err == 2:
            raise CodecError("floatsplit: nonzero padding nibble")
        if err:
            raise CodecError("floatsplit: plane length does not match its elements")
        return
    if nib:
        v = _unpack_nibbles(v, c)
    v = v.astype(u.dtype) << u.dtype.type(shift)
    if mask is None:
        u |= v
    else:
        u[mask] |= v


def _unpack_nibbles(packed: np.ndarray, c: int) -> np.ndarray:
    v = np.empty(len(packed) * 2, dtype=np.uint8)
    v[0::2], v[1::2] = packed & 15, packed >> 4
    if c % 2 and v[c]:
        raise CodecError("floatsplit: nonzero padding nibble")
    return v[:c]
