"""Codec 4, ``entropy``: tANS over the chunk's bytes (order-0, or one table per class of matrix
columns when the hint gives a shape: int8 output channels differ in spread); and the coded
streams that ``ggufblocks`` and ``floatsplit`` use (the best of stored, zstd and tANS).

A *symbol section* (docs/format.md, "tANS symbol sections") codes n symbols < S, optionally with
a fixed context per symbol (K tables). Frequencies are sent as a compact integer table. With no
stored bits to hide in the lanes' end states, the last symbols of each lane lend theirs: for
g > 0 the last ceil(R / g) symbols of every lane are coded as (symbol >> g) under the table's
marginal, and their low g bits form the lane's end state ("bits back"), so a lane costs about
as many bytes as its symbols and not R more bits for its flush.
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import math
import zlib
from dataclasses import dataclass

import numpy as np

from . import kernels, tans, uintlist
from . import zstd as _zstd
from ..chunker import ChunkHint
from .base import Buffer, Codec, CodecError, get_varint, put_varint

RAW, ZSTD, TANS = 0, 1, 2
EMPTY_SECTION = b"\x01\x00\x01\x00"     # R = 1, g = 0, one lane, no table: the section of zero symbols


def _marginal(freqs: np.ndarray, g: int) -> np.ndarray:
    K, S = freqs.shape
    pad = -S % (1 << g)
    f = np.concatenate([freqs, np.zeros((K, pad), dtype=np.int64)], axis=1)
    m = f.reshape(K, -1, 1 << g).sum(axis=2)
    return np.concatenate([m, np.zeros((K, S + pad - m.shape[1]), dtype=np.int64)], axis=1)[:, :S]


@functools.lru_cache(maxsize=16)
def _tail_positions(n: int, lanes: int, k: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """_tails and the existing positions themselves (idx[ok]), read-only: chunks of one size share
    them, and the encoder and the decoder ask for the same few layouts again and again."""
    idx, ok = _tails(n, lanes, k)
    ti = idx[ok]
    for a in (idx, ok, ti):
        a.flags.writeable = False
    return idx, ok, ti


def _tails(n: int, lanes: int, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Positions (interleaved lanes) of the last k symbols of every lane, lane by lane, and a mask
    of those that exist (a lane shorter than k has fewer)."""
    T, wp, act = tans.layout(n, lanes, True)
    j = np.arange(wp)
    tj = np.where(j < act[-1], T, T - 1)
    steps = tj[:, None] - k + np.arange(k)[None, :]
    ok = steps >= 0
    return np.where(ok, steps * wp + j[:, None], 0), ok


def _table_log(counts: np.ndarray, n: int, S: int, K: int) -> int:
    """Smallest table log whose rounding costs under 0.05% of the entropy (within memory bounds),
    in the doubles of the compiled model (libm's log2, terms added in order)."""
    used = int((counts > 0).sum(axis=1).max())
    lo = max(6, int(used - 1).bit_length() + 1)
    hi = 14
    while hi > lo and 2 * K * ((1 << hi) + S) > max(1 << 16, 8 * n):
        hi -= 1
    rows = counts[counts.any(axis=1)]
    c = rows.ravel().astype(np.float64)
    tot = np.repeat(rows.sum(axis=1), rows.shape[1]).astype(np.float64)
    nzm = c > 0
    H = -_sum_in_order(c[nzm] * _log2(c[nzm] / tot[nzm]))
    for R in range(lo, hi + 1):
        f = tans.quantize_rows(rows, R).ravel().astype(np.float64)
        Hq = -_sum_in_order(c[nzm] * _log2(f[nzm] / (1 << R)))
        if Hq - H <= 0.0005 * H + 8:
            return R
    return max(lo, hi)


@functools.lru_cache(maxsize=64)
def _groups(S: int, g: int) -> tuple[np.ndarray, np.ndarray]:
    """For each symbol s < S, the first symbol of its group of 2**g and the end of that group
    (at most S): the group the marginal tables of tans_section merge it into."""
    lo = (np.arange(S) >> g) << g
    return lo, np.minimum(lo + (1 << g), S)


def _compiled_symbols(a: np.ndarray | None) -> np.ndarray | None:
    """a as the compiled section passes read it: uint8 or int64, contiguous."""
    return None if a is None else tans.compiled_ints(a, np.uint8)


def _section_histograms(sym, S: int, ctx, K: int, lanes: int, D: int) -> tuple[np.ndarray, np.ndarray]:
    """(K x S counts of (context, symbol) over all of sym; D x K x S counts of those at depth d < D
    from the end of their interleaved lane, the last symbol of a lane at depth 0)."""
    loop = kernels.compiled()
    n = len(sym)
    if loop is not None:      # the same integers as the numpy lines below; see _tanssection.c
        counts = np.zeros(K * S, dtype=np.int64)
        depth = np.zeros(D * K * S, dtype=np.int64)
        T, wp, _ = tans.layout(n, lanes, True)
        if not loop.section_counts(_compiled_symbols(sym), _compiled_symbols(ctx), n, S, K, T, wp, D,
                                   counts, depth):
            raise ValueError("tans section: a symbol or context out of range")
        return counts.reshape(K, S), depth.reshape(D, K, S)
    sym = np.asarray(sym, dtype=np.int64)
    c = np.zeros(n, dtype=np.int64) if ctx is None else np.asarray(ctx, dtype=np.int64)
    if sym.min() < 0 or sym.max() >= S or c.min() < 0 or c.max() >= K:
        raise ValueError("tans section: a symbol or context out of range")
    counts = np.bincount(c * S + sym, minlength=K * S).reshape(K, S)
    idx, ok = _tails(n, lanes, D)
    ti = idx[ok]
    d = np.broadcast_to(D - 1 - np.arange(D), idx.shape)[ok]
    depth = np.bincount((d * K + c[ti]) * S + sym[ti], minlength=D * K * S).reshape(D, K, S)
    return counts, depth


def _section_stream(sym, S: int, ctx, K: int, freqs: np.ndarray, R: int, g: int, lanes: int) -> bytes:
    """The tANS stream of a section: the last R // g symbols of every lane (g > 0) coded as
    (symbol >> g) under the marginal tables (contexts K..2K-1), their low g bits the lanes' end
    states."""
    loop = kernels.compiled()
    n = len(sym)
    T, wp, _ = tans.layout(n, lanes, True)
    tab_f = np.concatenate([freqs, _marginal(freqs, g)]) if g else freqs
    k = R // g if g else 0
    if loop is not None:      # the same rows and end states as the numpy lines below
        rows = np.empty(n, dtype=tans.row_dtype(tab_f.size))
        bb = np.zeros(wp, dtype=np.int64)
        if not loop.section_rows(_compiled_symbols(sym), _compiled_symbols(ctx), n, S, K, T, wp, k, g,
                                 np.ascontiguousarray(tab_f.ravel()), rows, bb):
            raise ValueError("tans: a symbol has zero frequency in its table")
        return tans.encode_table_rows(rows, tans.Tables(tab_f, R), lanes, bits_back=bb if g else None,
                                      interleaved=True)
    tsym = np.array(sym, dtype=np.int64)
    tctx = np.zeros(n, dtype=np.int64) if ctx is None else np.array(ctx, dtype=np.int64)
    bb = None
    if g:
        idx, ok = _tails(n, lanes, k)
        lo = np.where(ok, tsym[np.clip(idx, 0, n - 1)] & ((1 << g) - 1), 0)
        bb = (lo << (g * np.arange(k))[None, :]).sum(axis=1)
        ti = idx[ok]
        tctx[ti] += K
        tsym[ti] >>= g
    return tans.encode(tsym, tans.Tables(tab_f, R), lanes, ctx=tctx if (K > 1 or g) else None,
                       bits_back=bb, interleaved=True)


def tans_section(sym: np.ndarray, S: int, ctx: np.ndarray | None = None, K: int = 1,
                 lanes: int | None = None) -> bytes:
    """A tANS symbol section for ``sym`` (< S) with optional per-symbol contexts (< K)."""
    loop = kernels.compiled()
    n = len(sym)
    if n == 0:
        return EMPTY_SECTION
    lanes = lanes or tans.lanes_for(n, 128)
    T, wp, _ = tans.layout(n, lanes, True)
    D = min(tans.MAX_R, T)      # tails are at most R // 1 symbols deep, and no deeper than a lane
    if loop is not None:  # the same integers and doubles as the reference; see _tanssection.c
        freqs = np.empty((K, S), dtype=np.int64)
        R, best_g = loop.section_model(_compiled_symbols(sym), _compiled_symbols(ctx), n, S, K, T, wp, D, freqs)
    else:
        R, best_g, freqs = _section_model_reference(sym, S, ctx, K, lanes, T, wp, D)
    stream = _section_stream(sym, S, ctx, K, freqs, R, best_g, lanes)
    blob = uintlist.pack_uints(freqs.ravel())
    return bytes((R, best_g)) + put_varint(lanes) + put_varint(len(blob)) + blob + stream


def _log2(x: np.ndarray) -> np.ndarray:
    """log2 of each element as libm computes it (math.log2), which the compiled model calls:
    numpy's own log2 may differ in the last bit, and the model's choices compare sums of them."""
    return np.array([math.log2(v) for v in np.asarray(x, dtype=np.float64).ravel().tolist()]).reshape(np.shape(x))


def _sum_in_order(x: np.ndarray) -> float:
    """The elements added one after the other in row-major order, as the compiled model adds them
    (numpy's sum pairs them, which rounds differently)."""
    total = 0.0
    for v in np.asarray(x, dtype=np.float64).ravel().tolist():
        total += v
    return total


def _section_model_reference(sym, S: int, ctx, K: int, lanes: int, T: int, wp: int,
                             D: int) -> tuple[int, int, np.ndarray]:
    """tans_section's model, the reference section_model (_tanssection.c) is tested against:
    (table log R, tail width g, K x S frequencies)."""
    counts, depth = _section_histograms(sym, S, ctx, K, lanes, D)
    R = _table_log(counts, len(sym), S, K)
    freqs = np.zeros((K, S), dtype=np.int64)
    used = counts.any(axis=1)
    freqs[used] = tans.quantize_rows(counts[used], R)
    freqs[~used, 0] = 1 << R
    # choose g (bits lent per tail symbol) by the estimated cost of coding the tails on the
    # marginal: only the tails' own costs differ (every other symbol costs the same either way),
    # so it is a sum over the (context, symbol) counts of the tails, exact for the tables used
    logp = _log2(np.where(freqs > 0, freqs, 1) / (1 << R))
    tails = np.cumsum(depth, axis=0)        # tails[k - 1]: the counts of the last k of every lane
    upto = np.zeros((K, S + 1), dtype=np.int64)     # upto[:, s]: the frequencies of the symbols below s
    np.cumsum(freqs, axis=1, out=upto[:, 1:])
    best_g, best_extra = 0, float(R) * wp
    for g in (1, 2, 3, 4, 5, 8):
        if (1 << g) > S:
            break
        k = R // g
        if k == 0 or k > T:
            continue
        lo, hi = _groups(S, g)
        m = upto[:, hi] - upto[:, lo]       # each symbol's marginal, _marginal(freqs, g)[:, s >> g]
        logpm = _log2(np.where(m > 0, m, 1) / (1 << R))
        extra = _sum_in_order(tails[k - 1] * (logp - logpm + g)) + (R - k * g) * wp
        if extra < best_extra:
            best_g, best_extra = g, extra
    return R, best_g, freqs


def _symbol_values(S: int) -> np.ndarray | None:
    """Decode small alphabets straight into uint8 (symbols < 256), larger ones as int64."""
    return np.arange(S, dtype=np.uint8) if S <= 256 else None


@dataclass(frozen=True)
class TansSection:
    """A tANS symbol section's header, checked: table log R, tail width g (bits each lane's
    last R // g symbols lend to its end state; 0: none), lanes, the K x S frequency rows, and
    the tANS stream that follows them."""
    R: int
    g: int
    lanes: int
    freqs: np.ndarray
    stream: memoryview

    def field(self, foff: int, fsize: int, nib: bool, K: int, S: int, classes: np.ndarray | None = None) -> tuple:
        """This section as an item of the compiled decode_fields (_tansblocks.c), which builds
        its tables and decodes it into field foff.. (fsize bytes) of every block."""
        item = (foff, fsize, nib, self.stream, np.ascontiguousarray(self.freqs, dtype=np.int64), self.R, self.g,
                self.lanes, K, S)
        return item if classes is None else item + (np.ascontiguousarray(classes, dtype=np.uint8),)

    def tables(self, S: int) -> "tans.Tables":
        """The decoder's tables: the rows, then (with tails) their marginals over 2**g symbols."""
        if self.g:
            return tans.Tables(np.concatenate([self.freqs, _marginal(self.freqs, self.g)]), self.R)
        return tans.Tables(self.freqs, self.R)


def parse_tans_section(sec, n: int, S: int, K: int = 1) -> TansSection:
    """The header of a section of n > 0 symbols (< S) under K contexts; CodecError if malformed."""
    mv = memoryview(sec)
    if len(mv) < 2 or n > tans.MAX_N:
        raise CodecError("tans section: truncated, or too many symbols")
    R, g = mv[0], mv[1]
    if not 1 <= R <= tans.MAX_R or g not in (0, 1, 2, 3, 4, 5, 8) or (g and (1 << g) > S):
        raise CodecError("tans section: bad table log or tail width")
    lanes, pos = get_varint(mv, 2, "tans section lanes")
    blen, pos = get_varint(mv, pos, "tans section table length")
    if pos + blen > len(mv) or not 1 <= lanes <= max(n, 1):
        raise CodecError("tans section: bad lanes or table length")
    if K * ((1 << R) + S) > max(1 << 16, 8 * n) * 2:
        raise CodecError("tans section: tables too large for the data")
    freqs = uintlist.unpack_uints(mv[pos:pos + blen], K * S, "tans section").reshape(K, S)
    return TansSection(R, g, lanes, freqs, mv[pos + blen:])


def decode_tans_section(sec, n: int, S: int, ctx: np.ndarray | None = None, K: int = 1,
                        values: np.ndarray | None = None) -> np.ndarray:
    mv = memoryview(sec)
    if n == 0:
        if bytes(mv) != EMPTY_SECTION:
            raise CodecError("tans section: malformed empty section")
        return np.zeros(0, dtype=np.int64)
    head = parse_tans_section(mv, n, S, K)
    R, g, lanes, freqs, stream = head.R, head.g, head.lanes, head.freqs, head.stream
    # contexts as uint8 when they fit (K <= 127, tails included): the compiled loop reads 1 byte each
    cdt = np.uint8 if 2 * K <= 255 else np.int64
    if ctx is not None and np.asarray(ctx).dtype != cdt:
        ctx = np.asarray(ctx)
        if len(ctx) != n or (n and (ctx.min() < 0 or ctx.max() >= K)):
            raise CodecError("tans section: context out of range")
    c = np.zeros(n, dtype=cdt) if ctx is None else np.asarray(ctx, dtype=cdt)
    if g:
        k = R // g
        T, Wp, _ = tans.layout(n, lanes, True)
        if k > T:
            raise CodecError("tans section: lanes too short for their tails")
        if ctx is not None:
            c = c.copy()
        loop = kernels.compiled()
        if loop is not None:            # the same as the numpy lines below; see _tanstails.c
            loop.tail_contexts(c, n, T, Wp, k, K)
        else:
            idx, ok, ti = _tail_positions(n, lanes, k)
            c[ti] += cdt(K)
        tab = head.tables(S)
        sym, fin = tans.decode(stream, n, tab, lanes, ctx=c, interleaved=True, values=_symbol_values(S))
        if loop is not None:
            code = loop.tail_symbols(sym, np.ascontiguousarray(fin, dtype=np.int64), n, T, Wp, k, g, S)
            if code == 1:
                raise CodecError("tans section: end state holds bits of no symbol")
            if code:
                raise CodecError("tans section: symbol out of range")
            return sym if values is None else values[sym]
        lo = (fin[:, None] >> (g * np.arange(k))[None, :]) & ((1 << g) - 1)
        if (lo[~ok]).any() or (fin >> (k * g)).any():
            raise CodecError("tans section: end state holds bits of no symbol")
        tail = sym[ti]
        if (tail >= -(-S >> g)).any():
            raise CodecError("tans section: symbol out of range")
        tail <<= g          # symbols < 256 are uint8 here, and (symbol >> g) << g still fits
        tail |= lo[ok].astype(tail.dtype)
        sym[ti] = tail
        if S & (S - 1) and (sym >= S).any():
            raise CodecError("tans section: symbol out of range")
    else:
        tab = head.tables(S)
        sym, fin = tans.decode(stream, n, tab, lanes, ctx=c if K > 1 else None, interleaved=True,
                               values=_symbol_values(S))
        if fin.any():
            raise CodecError("tans section: lanes end in the wrong state")
    return sym if values is None else values[sym]


# encode_stream leaves out trials that cannot decide on streams at least this long (shorter ones
# try every coding: they are cheap, and there the codings' sizes are often close).
ESTIMATE_BYTES = 8192
# A coded stream (zstd or tANS) is kept only where it is at least 1/2**MIN_GAIN_SHIFT of the
# stored bytes, plus MIN_GAIN_BYTES, smaller than them (zstd's own rule for its literals): a
# stream that codes barely smaller than stored costs a whole tANS or zstd decode for a sliver of
# its bytes. On the corpus only K-quant GGUF files have such streams (the low quant bits of Q5_0
# and Q6_K blocks): storing them makes the Q4_K_M file a little larger and much quicker to
# decode (docs/results.md).
MIN_GAIN_SHIFT = 6
MIN_GAIN_BYTES = 2
# zstd at level 9 is tried only where level 1, many times quicker, comes within this factor of
# the best coding so far: on near-order-0 streams (every stream of the float and block codecs)
# level 9 finds no matches that level 1 misses by more than that (measured on the corpus).
ZSTD_PROBE = 1.02


# Level 9 is run on a stream that level 1 codes near its best only where it gains on a slice:
# ZSTD_SLICE bytes from the middle, at least LEVEL9_GAIN smaller than level 1's. On the block
# fields of K-quant GGUF tensors level 1 comes close to the entropy coder on nearly every stream
# and level 9 gains almost nothing over it, so running it in full was a large part of their
# encode time; where level 9 wins (stored mantissa planes of some float tensors), it gains on
# the slice too (docs/results.md: encode speed per core).
ZSTD_SLICE = 64 << 10
LEVEL9_GAIN = 0.01


def _level9_gains(b: bytes) -> bool:
    """Whether zstd level 9 may code b markedly smaller than level 1 (streams under two slices:
    always tried, as cheap as the slice)."""
    if len(b) < 2 * ZSTD_SLICE:
        return True
    mid = (len(b) - ZSTD_SLICE) // 2
    part = b[mid:mid + ZSTD_SLICE]
    return len(_zstd.compress(part, 9)) <= len(_zstd.compress(part, 1)) * (1 - LEVEL9_GAIN)


_EVERY_TRIAL: contextvars.ContextVar[bool] = contextvars.ContextVar("lmzfs_every_stream_trial", default=False)


@contextlib.contextmanager
def every_trial():
    """Within it (in this thread or task), encode_stream tries every coding, as with ``exhaustive``:
    what encode_chunk(exhaustive=True) measures the estimates against."""
    token = _EVERY_TRIAL.set(True)
    try:
        yield
    finally:
        _EVERY_TRIAL.reset(token)


def trying_every() -> bool:
    """Whether the caller is inside every_trial(): no trial may be left out on an estimate."""
    return _EVERY_TRIAL.get()


def encode_stream(a: np.ndarray, S: int = 256, ctx: np.ndarray | None = None, K: int = 1, *,
                  exhaustive: bool = False) -> bytes:
    """The smallest of: mode 0 + stored bytes (S <= 256), mode 1 + zstd frame, mode 2 + tANS section
    (ties in that order), but the stored bytes wherever the smallest coding does not gain enough
    over them (worth_coding). On streams of ESTIMATE_BYTES or more the zstd and tANS trials that
    an estimate rules out are left out (see worth_coding, ZSTD_PROBE) unless ``exhaustive``."""
    a = np.asarray(a)
    estimate = not (exhaustive or _EVERY_TRIAL.get()) and len(a) >= ESTIMATE_BYTES
    raw = z = t = None
    b = None
    if S <= 256:
        b = a.astype(np.uint8).tobytes()
        raw = bytes((RAW,)) + b
    # tANS codes no stream without contexts in fewer bytes than its order-0 entropy: where that is
    # no gain worth coding for, it is not tried
    flat = False
    if len(a) >= 64 or S > 256:
        flat = estimate and raw is not None and ctx is None and order0_bytes(a, S) >= worth_coding(len(raw))
        if not flat:
            t = bytes((TANS,)) + tans_section(a, S, ctx, K)
    if b is not None and len(b) > 16:
        sofar = min(len(c) for c in (raw, t) if c is not None)
        if not estimate:
            z = bytes((ZSTD,)) + _zstd.compress(b, 9)
        else:
            # On a flat stream only repeats can shrink it, and level 1 finds long ones: level 9 is
            # tried only where level 1 already beats the stored bytes.
            z1 = _zstd.compress(b, 1)
            if len(z1) + 1 <= (len(raw) - 1 if flat else sofar * ZSTD_PROBE):
                # level 9 is not always smaller: on short near-order-0 streams (a block's f16
                # scales) its frame often comes out a little larger than level 1's
                z9 = _zstd.compress(b, 9) if _level9_gains(b) else z1
                z = bytes((ZSTD,)) + (z9 if len(z9) <= len(z1) else z1)
    best = b""
    for c in (raw, z, t):
        if c is not None and (not best or len(c) < len(best)):
            best = c
    if raw is not None and best is not raw and len(best) >= worth_coding(len(raw)):
        return raw
    return best


def worth_coding(stored: int) -> int:
    """The length a coded stream must come in under to be kept instead of ``stored`` bytes stored
    (mode byte included in both): see MIN_GAIN_SHIFT."""
    return stored - (stored >> MIN_GAIN_SHIFT) - MIN_GAIN_BYTES


def order0_bytes(a: np.ndarray, S: int) -> float:
    """The order-0 entropy of symbols a (< S), in bytes."""
    loop = kernels.compiled()
    a = np.asarray(a).ravel()
    if loop is not None and len(a):     # the same counts as bincount; see _tanssection.c
        c = np.zeros(S, dtype=np.int64)
        if not loop.section_counts(_compiled_symbols(a), None, len(a), S, 1, 1, 1, 1, c, None):
            raise ValueError("order0_bytes: a symbol out of range")
    else:
        c = np.bincount(a, minlength=S)
    c = c[c > 0].astype(np.float64)
    return float(-(c * np.log2(c / c.sum())).sum()) / 8


def decode_stream(buf, n: int, S: int = 256, ctx: np.ndarray | None = None, K: int = 1) -> np.ndarray:
    """n symbols (uint8 for stored and zstd streams, int64 for tANS ones); CodecError if malformed."""
    mv = memoryview(buf)
    if len(mv) < 1:
        raise CodecError("stream: missing mode byte")
    mode = mv[0]
    if mode == RAW and S <= 256:
        if len(mv) - 1 != n:
            raise CodecError("stream: stored length mismatch")
        out = np.frombuffer(mv[1:], dtype=np.uint8)
    elif mode == ZSTD and S <= 256:
        out = np.frombuffer(_zstd.decompress(mv[1:], n, "stream"), dtype=np.uint8)
    elif mode == TANS:
        return decode_tans_section(mv[1:], n, S, ctx, K)     # its symbols are < S by construction
    else:
        raise CodecError(f"stream: unknown mode {mode}")
    if S < 256 and len(out) and out.max() >= S:
        raise CodecError("stream: symbol out of range")
    return out


# log2(m) for m in [sqrt(1/2), sqrt(2)) as s * sum_k _LOG2_SERIES[k] * z**k, s = (m - 1) / (m + 1),
# z = s * s: the series of 2 * atanh(s) / ln 2, to below a double's precision there
_LOG2_SERIES = np.array([2 / ((2 * k + 1) * 0.6931471805599453) for k in range(11)])
_SQRT_HALF = math.sqrt(0.5)
# the estimated bytes of a table's header, and the refinement rounds per class count
_TABLE_BYTES = 300
_ROUNDS = 3


def _log2_fixed(x: np.ndarray, bits: int) -> np.ndarray:
    """rint(log2(x) * 2**bits) as float64, for x > 0. Not np.log2: this is a fixed sequence of IEEE
    operations (frexp, then a series), which the compiled search (_tanscolumns.c) repeats one for
    one, so that both round every logarithm to the same integer; log2 itself differs in the last
    bit between libm and numpy's vector loops, and that can move a choice."""
    m, e = np.frexp(x)
    low = m < _SQRT_HALF
    m = np.where(low, m * 2.0, m)
    e = e - low
    f = m - 1.0
    s = f / (2.0 + f)
    z = s * s
    p = np.full_like(z, _LOG2_SERIES[-1])
    for c in _LOG2_SERIES[-2::-1]:
        p = p * z + c
    return np.rint((e + s * p) * 2.0 ** bits)


def _score_bits(n: int, rows: int) -> int:
    """F: column scores are sums of a column's counts (at most rows + 1, the tail included) times
    logarithms in units of 2**-F, each at most log2(2 * (n + 128)) bits: F keeps every such sum an
    integer below 2**52, exact in float64 in any order (numpy's BLAS and the compiled loop agree)."""
    return 52 - (rows + 1).bit_length() - (2 * n + 256).bit_length().bit_length()


def _cost_bits(n: int) -> int:
    """G: code lengths are sums of counts (n in all) times logarithms in units of 2**-G, each at most
    log2(n) bits: G keeps them, with the tables' bytes added (_TABLE_BYTES, at most 4096, a class),
    below 2**62 in int64."""
    return min(40, 60 - n.bit_length() - n.bit_length().bit_length())


def _code_length(counts: np.ndarray, G: int) -> int:
    """Order-0 code length of each row of counts, summed, in units of 2**-G bits; exact integers, so
    that the compiled search compares the same numbers."""
    counts = np.asarray(counts, dtype=np.int64)
    nz = counts > 0
    c = counts[nz]
    tot = np.broadcast_to(counts.sum(axis=1, keepdims=True), counts.shape)[nz]
    return -int((c * _log2_fixed(c / tot, G).astype(np.int64)).sum())


def _column_spreads(a: np.ndarray, C: int, mode: int) -> tuple[np.ndarray, np.ndarray]:
    """(mean distance of each column's bytes, as int8, from the mode over the whole rows;
    C x 256 histogram of each column's bytes over all of a). The numpy reference of what
    _tanscolumns.c computes (each spread is an integer sum over the rows divided by rows)."""
    n = len(a)
    rows = n // C
    v = a[: rows * C].reshape(rows, C).astype(np.int64)
    spread = np.abs(((v - mode + 128) & 255) - 128).mean(axis=0)
    col = np.arange(n) % C
    return spread, np.bincount(col * 256 + a, minlength=C * 256).reshape(C, 256)


def _class_counts(hist_f: np.ndarray, cls: np.ndarray, K: int) -> np.ndarray:
    """K x 256: the sum of the column histograms (rows of hist_f, as float64) of each class, as one
    matrix product with the classes' indicator rows instead of K masked copies; exact, as every
    count and sum stays far below 2**53."""
    member = (cls[None, :] == np.arange(K)[:, None]).astype(np.float64)
    return member @ hist_f


def _column_classes(a: np.ndarray, C: int) -> tuple[int, np.ndarray] | None:
    """Split the columns (position mod C) into K classes by their spread, when that pays: (K, the
    class of each column), or None. Compiled (_tanscolumns.c) where the extension is built; the
    numpy lines below are its reference and make the same choices: the logarithms and sums that
    decide are exact integers (see _log2_fixed, _score_bits, _cost_bits)."""
    loop = kernels.compiled()
    n = len(a)
    rows = n // C
    if C < 8 or rows < 32:
        return None
    F, G = _score_bits(n, rows), _cost_bits(n)
    if loop is not None:
        cls = np.empty(C, dtype=np.int64)
        K = loop.column_classes(a, n, C, F, G, _LOG2_SERIES, _ROUNDS, _TABLE_BYTES, cls)
        return (K, cls) if K else None
    mode = int(np.bincount(a).argmax())
    spread, colhist = _column_spreads(a, C, mode)
    hist_f = colhist.astype(np.float64)
    base = _code_length(colhist.sum(axis=0)[None, :], G) + (_TABLE_BYTES * 8 << G)
    best = None
    for K in (2, 4, 8, 16):
        edges = np.quantile(spread, np.linspace(0, 1, K + 1)[1:-1])
        cls = np.searchsorted(edges, spread, side="right")
        for _ in range(_ROUNDS):    # refine: move each column to the class that codes it shortest
            counts = _class_counts(hist_f, cls, K)
            w = _log2_fixed((counts + 0.5) / (counts + 0.5).sum(axis=1, keepdims=True), F)
            refined = np.argmax(hist_f @ np.ascontiguousarray(w.T), axis=1)
            if np.array_equal(refined, cls):    # a fixed point: the rounds left change nothing
                break
            cls = refined
        tables = (_TABLE_BYTES * 8 * K + C * (K.bit_length() - 1)) << G     # headers, and log2(K) bits a column
        cost = _code_length(_class_counts(hist_f, cls, K), G) + tables
        if cost < base and (best is None or cost < best[0]):
            best = (cost, K, cls)
    return None if best is None else (best[1], best[2])


class EntropyCodec(Codec):
    """params: CRC-32 of the plain chunk (4 bytes, little-endian), then a context byte: 0 = none;
    1 = column classes: row length C (varint), K (1 byte), the class of each column as a coded
    stream (varint length + stream). body: one tANS section over the bytes."""

    id = 4
    name = "entropy"

    def encode(self, data: memoryview, hint: ChunkHint) -> tuple[bytes, bytes]:
        a = np.frombuffer(data, dtype=np.uint8)
        crc = zlib.crc32(data).to_bytes(4, "little")
        C = hint.shape[-1] if hint.shape and len(hint.shape) >= 2 and hint.itemsize == 1 else 0
        found = _column_classes(a, C) if C else None
        if found:    # chosen on estimated sizes (the order-0 coding is not tried as well)
            K, cls = found
            cmap = encode_stream(cls, K)
            sec = tans_section(a, 256, np.tile(cls.astype(np.uint8), -(-len(a) // C))[:len(a)], K)
            return crc + b"\x01" + put_varint(C) + bytes((K,)) + put_varint(len(cmap)) + cmap, sec
        return crc + b"\x00", tans_section(a, 256)

    def decode(self, params: Buffer, body: Buffer, size: int, *, check: bool = True) -> bytes:
        loop = kernels.compiled()
        p = memoryview(params)
        if len(p) < 5 or p[4] > 1:
            raise CodecError("entropy: bad params")
        cls, K = None, 1
        if p[4] == 0:
            if len(p) != 5:
                raise CodecError("entropy: trailing params")
        else:
            C, q = get_varint(p, 5, "entropy row length")
            if q + 1 > len(p) or not 1 <= C <= max(size, 1) or p[q] not in (2, 4, 8, 16):
                raise CodecError("entropy: bad column classes")
            K = p[q]
            ln, q = get_varint(p, q + 1, "entropy class map length")
            if q + ln != len(p):
                raise CodecError("entropy: class map length does not match params")
            cls = decode_stream(p[q:], C, K).astype(np.uint8)
        if loop is not None and size:
            # one compiled call, its tables built and the classes tiled in it (_tansblocks.c)
            field = parse_tans_section(body, size, 256, K).field(0, 1, False, K, 256, cls)
            out = np.empty(size, dtype=np.uint8)
            try:
                loop.decode_fields(out, size, 1, (field,))
            except ValueError as exc:
                raise CodecError(str(exc)) from None
        else:
            ctx = None if cls is None else np.tile(cls, -(-size // len(cls)))[:size]
            out = decode_tans_section(body, size, 256, ctx, K)
        res = out.astype(np.uint8, copy=False).tobytes()
        if check and zlib.crc32(res) != int.from_bytes(p[:4], "little"):
            raise CodecError("entropy: checksum mismatch")
        return res
