"""Table-based asymmetric numeral systems (tANS), vectorised with numpy over many lanes.

Not a codec by itself: the entropy coder the ``floatsplit``, ``entropy`` and ``ggufblocks``
codecs share. docs/format.md ("tANS streams") specifies the bit-exact layout; in short:

* A table set holds K tables (contexts) over an alphabet of S symbols. Table c is a row of
  frequencies f[c, s] >= 0 summing to exactly L = 2**R (4 <= R <= 15).
* Table construction is fixed: the L slots are dealt to symbols in symbol order, slot k goes to
  position (k * step) mod L with step = L/2 + L/8 + 3, and the positions of symbol s, in
  increasing order, get the sub-states x = f_s, f_s + 1, ..., 2 f_s - 1. A decoder entry at
  position p holds sym, nb = R - floor(log2 x) and base = x * 2**nb - L.
* N symbols are decoded by Wp lanes in steps: contiguous lanes (lane j holds symbols j*T ...,
  T = ceil(N / W) steps) or interleaved ones (symbol i belongs to lane i mod Wp). At each step
  every lane still holding a symbol decodes one and then reads nb bits, in lane order.
* The stream is one little-endian bit string (bit i is bit i % 8 of byte i // 8): first the Wp
  initial states, R bits each, then the bits read at step 0, step 1, ... It must be consumed
  exactly; its last byte's unused high bits are zero.
* A symbol's table is its context: fixed per symbol (``ctx``), or a function of the previous
  symbol in the same lane (``dyn`` = (map symbol -> context, context of a lane's first symbol);
  contiguous lanes only).
* The state a lane ends in is the encoder's initial state: callers pass R "bits-back" bits per
  lane (plain data they would otherwise store) or zeros, and check them after decoding.

Every index a corrupt stream can produce stays inside the tables; a stream that runs short or
long raises CodecError.
"""
from __future__ import annotations


import numpy as np

from . import kernels
from .base import CodecError

MAX_R = 15
MIN_R = 4     # below 16 slots the spreading step is not coprime with L (L = 2 and 8)
MAX_SYMBOLS = 1 << 16
MAX_N = 1 << 27          # most symbols one stream may decode to (chunks are far smaller)
_MASK = (np.int64(1) << np.arange(MAX_R + 1, dtype=np.int64)) - 1


def compiled_ints(a: np.ndarray, narrow: type) -> np.ndarray:
    """An integer array as the compiled loops read it, contiguous: as it is where its dtype is
    `narrow` (uint8 contexts, uint16 symbols: a fraction of int64's bytes), else as int64."""
    a = np.asarray(a)
    return np.ascontiguousarray(a, dtype=narrow if a.dtype == narrow else np.int64)


def quantize(counts: np.ndarray, R: int) -> np.ndarray:
    """Integer frequencies summing to 2**R, >= 1 wherever ``counts`` > 0. Deterministic, integer only.

    Symbols whose share is below one slot get exactly one; the others share the remaining slots in
    proportion to their counts (floor, then one more slot for the largest remainders, ties to the
    lower symbol). ``counts`` needs a positive entry and at most 2**R positive entries.
    """
    L = 1 << R
    c = np.asarray(counts, dtype=np.int64)
    tot = int(c.sum())
    nz = c > 0
    if tot <= 0 or int(nz.sum()) > L:
        raise ValueError("cannot quantise: empty row or more symbols than slots")
    small = nz & (c * L < tot)
    while True:
        big = nz & ~small
        lb, tb = L - int(small.sum()), int(c[big].sum())
        f = np.where(small, 1, 0)
        if tb == 0:
            break
        f[big] = (c[big] * lb) // tb
        if (f[big] > 0).all():
            d = lb - int(f[big].sum())
            rem = np.where(big, (c * lb) % tb, -1)
            f[np.argsort(-rem, kind="stable")[:d]] += 1
            break
        small = small | (big & (f == 0))
    if int(f.sum()) != L:
        f[int(np.argmax(f))] += L - int(f.sum())
    return f


def quantize_rows(counts: np.ndarray, R: int) -> np.ndarray:
    """``quantize`` applied to every row of a 2-D array (each row needs a positive entry); same result."""
    L = 1 << R
    c = np.ascontiguousarray(counts, dtype=np.int64)
    loop = kernels.compiled()
    if loop is not None and c.ndim == 2 and c.size:
        f = np.empty_like(c)
        if loop.quantize_rows(c, c.shape[0], c.shape[1], R, f):
            return f
        # rows it does not take (negative or huge counts, too many symbols) go the numpy way
    tot = c.sum(axis=1, keepdims=True)
    nz = c > 0
    if (tot <= 0).any() or (nz.sum(axis=1) > L).any():
        raise ValueError("cannot quantise: empty row or more symbols than slots")
    small = nz & (c * L < tot)
    while True:
        big = nz & ~small
        lb = L - small.sum(axis=1, keepdims=True)
        tb = np.where(big, c, 0).sum(axis=1, keepdims=True)
        f = np.where(big, (c * lb) // np.maximum(tb, 1), small.astype(np.int64))
        newly = big & (f == 0)
        if not newly.any():
            break
        small |= newly
    d = lb - np.where(big, f, 0).sum(axis=1, keepdims=True)
    rem = np.where(big, (c * lb) % np.maximum(tb, 1), -1)
    order = np.argsort(-rem, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(c.shape[1])[None, :], axis=1)
    f += (rank < d) & big
    for i in np.flatnonzero(f.sum(axis=1) != L):
        f[i, int(np.argmax(f[i]))] += L - int(f[i].sum())
    return f


def scale_rows(counts: np.ndarray, log: int) -> np.ndarray:
    """Rows scaled to sum <= 2**log, keeping every nonzero entry nonzero: the rows over it are
    quantised (quantize, all of them in one quantize_rows), the others kept."""
    out = np.array(counts, dtype=np.int64)
    over = out.sum(axis=1) > 1 << log
    if over.any():
        out[over] = quantize_rows(out[over], log)
    return out


class Tables:
    """Decode (and, lazily, encode) tables for K frequency rows of one alphabet."""

    def __init__(self, freqs: np.ndarray, R: int):
        freqs = np.asarray(freqs, dtype=np.int64)
        if freqs.ndim != 2 or not MIN_R <= R <= MAX_R:
            raise CodecError("tans: bad table shape or table log")
        K, S = freqs.shape
        L = 1 << R
        if not 1 <= S <= MAX_SYMBOLS or K < 1:
            raise CodecError(f"tans: {K} tables of {S} symbols out of range")
        if (freqs < 0).any() or (freqs.sum(axis=1) != L).any():
            raise CodecError(f"tans: a frequency table does not sum to {L}")
        self.K, self.S, self.R, self.L, self.freqs = K, S, R, L, freqs
        self.packed = np.empty(K * L, dtype=np.int64)
        self.packed32 = None
        self.checked_symbols = -1   # the compiled loop checked packed32 against this many symbols
        self._order = None
        self._enc = None
        loop = kernels.compiled()
        if loop is not None and S <= 32767:
            loop.build(np.ascontiguousarray(freqs), K, S, R, self.packed)
        else:
            self._spread_tables()

    @classmethod
    def prebuilt(cls, packed32: np.ndarray, K: int, S: int, R: int) -> "Tables":
        """Decoder tables whose entries a compiled helper built in the compiled loop's own 32-bit
        form (floatsplit's model tables, S <= 8192): for that loop only, as neither the numpy
        loop's entries nor the frequencies the encoder needs are kept."""
        tab = cls.__new__(cls)
        tab.K, tab.S, tab.R, tab.L, tab.freqs = K, S, R, 1 << R, None
        tab.packed, tab.packed32, tab._order, tab._enc = None, packed32, None, None
        tab.checked_symbols = -1
        return tab

    def _spread_tables(self):
        """Fill ``packed`` (the decoder entries) and ``_order`` (each table's positions by symbol)."""
        K, S, R, L, freqs = self.K, self.S, self.R, self.L, self.freqs
        step = (L >> 1) + (L >> 3) + 3
        pos = (np.arange(L, dtype=np.int64) * step) & (L - 1)
        stype = np.int32 if S > 32767 else np.int16
        self._order = []
        for k in range(K):
            f = freqs[k]
            spread = np.empty(L, dtype=stype)
            spread[pos] = np.repeat(np.arange(S, dtype=stype), f)
            order = np.argsort(spread, kind="stable")     # positions of each symbol, increasing
            s_sorted = spread[order].astype(np.int64)
            start = np.cumsum(f) - f
            xs = np.empty(L, dtype=np.int64)
            xs[order] = np.arange(L, dtype=np.int64) - start[s_sorted] + f[s_sorted]
            nb = R + 1 - np.frexp(xs.astype(np.float64))[1].astype(np.int64)
            base = (xs << nb) - L
            self.packed[k * L:(k + 1) * L] = base | (nb << 16) | (spread.astype(np.int64) << 20)
            self._order.append(order)

    def _encode_tables(self):
        if self._enc is None:
            if self.freqs is None:
                raise ValueError("tans: prebuilt tables decode only")
            K, R, L, f = self.K, self.R, self.L, self.freqs
            enc = None
            loop = kernels.compiled()
            if self._order is None and loop is not None and self.S <= 32767:
                # the entries build() made hold each position's symbol: count them into slots
                enc = np.empty(K * L, dtype=np.int64)
                loop.encode_slots(self.packed, K, self.S, R, np.ascontiguousarray(f), enc)
            elif self._order is None:
                self._spread_tables()
            bitlen = np.where(f > 0, np.frexp(np.maximum(f, 1).astype(np.float64))[1], 0).astype(np.int64)
            ks = R + 1 - bitlen
            thr = f << ks
            start = (np.cumsum(f, axis=1) - f) + (np.arange(K, dtype=np.int64)[:, None] * L)
            if enc is None:
                enc = np.empty(K * L, dtype=np.int64)
                for k in range(K):
                    enc[k * L:(k + 1) * L] = L + self._order[k]    # slot start_s + rank -> L + position
            self._enc = (ks.ravel(), thr.ravel(), start.ravel(), f.ravel(), enc)
        return self._enc


def contiguous_layout(n: int, lanes: int) -> tuple[int, int, int]:
    """Contiguous lanes: (steps T, lanes Wp, length of the last lane)."""
    steps = -(-n // lanes)
    wp = -(-n // steps)
    return steps, wp, n - (wp - 1) * steps


def layout(n: int, lanes: int, interleaved: bool) -> tuple[int, int, np.ndarray]:
    """(steps T, lanes Wp, active lanes per step). Active lanes always form a prefix."""
    if interleaved:
        wp = min(lanes, n)
        T = -(-n // wp)
        act = np.full(T, wp, dtype=np.int64)
        act[-1] = n - (T - 1) * wp
        return T, wp, act
    T, wp, last = contiguous_layout(n, lanes)
    act = np.full(T, wp, dtype=np.int64)
    act[last:] = wp - 1
    return T, wp, act


def _grid(v: np.ndarray, n: int, T: int, wp: int, interleaved: bool) -> np.ndarray:
    g = np.zeros(T * wp, dtype=np.int64)
    g[:n] = v
    return g.reshape(T, wp) if interleaved else np.ascontiguousarray(g.reshape(wp, T).T)


def encode(sym: np.ndarray, tab: Tables, lanes: int, ctx: np.ndarray | None = None,
           dyn: tuple[np.ndarray, int] | None = None, bits_back: np.ndarray | None = None,
           interleaved: bool = False) -> bytes:
    """The stream for ``sym`` (ints < S); every (context, symbol) used must have frequency > 0."""
    n = len(sym)
    if n == 0:
        return b""
    if dyn is not None and interleaved:
        raise ValueError("tans: previous-symbol contexts need contiguous lanes")
    T, Wp, act = layout(n, lanes, interleaved)
    L, S, R = tab.L, tab.S, tab.R
    ks, thr, start, fr, enc = tab._encode_tables()
    loop = kernels.compiled()
    if loop is not None:
        # the compiled rows read 16-bit symbols and 8-bit contexts as they are (a chunk's worth
        # of int64 copies was a large part of a float chunk's encode); anything else as int64
        sym = compiled_ints(sym, np.uint16)
        if ctx is not None:
            ctx = compiled_ints(ctx, np.uint8)
        si_all = np.empty(n, dtype=row_dtype(fr.size))
        if not loop.encode_rows(sym, n, ctx,
                                None if dyn is None else np.ascontiguousarray(dyn[0], dtype=np.int64),
                                0 if dyn is None else int(dyn[1]), T, S, fr, si_all):
            raise ValueError("tans: a symbol has zero frequency in its table")
        x = np.full(Wp, L, dtype=np.int64)
        if bits_back is not None:
            x += bits_back
        return loop.encode(si_all, n, T, Wp, interleaved, ks, thr, np.ascontiguousarray(start - fr), enc, x, R)
    sym = np.asarray(sym, dtype=np.int64)
    if dyn is not None:
        ctx = np.empty(n, dtype=np.int64)
        ctx[1:] = dyn[0][sym[:-1]]
        ctx[::T] = dyn[1]
    si_all = sym if ctx is None else np.asarray(ctx, dtype=np.int64) * S + sym
    if (fr[si_all] == 0).any():
        raise ValueError("tans: a symbol has zero frequency in its table")
    sf = start - fr
    x = np.full(Wp, L, dtype=np.int64)
    if bits_back is not None:
        x += bits_back
    grid = _grid(si_all, n, T, Wp, interleaved)
    vals = np.empty((T, Wp), dtype=np.int64)
    nbs = np.zeros((T, Wp), dtype=np.int64)
    for t in range(T - 1, -1, -1):
        a = int(act[t])
        si = grid[t, :a]
        xs = x[:a]
        nb = nbs[t, :a]
        np.subtract(ks[si], xs < thr[si], out=nb)
        np.bitwise_and(xs, _MASK[nb], out=vals[t, :a])
        x[:a] = enc[sf[si] + (xs >> nb)]
    for t in np.flatnonzero(act < Wp):
        vals[t, act[t]:] = 0
    v = np.concatenate([x - L, vals.ravel()])
    b = np.concatenate([np.full(Wp, R, dtype=np.int64), nbs.ravel()])
    end = np.cumsum(b)
    off = end - b
    nbytes = (int(end[-1]) + 7) >> 3
    sh = v << (off & 7)
    bi = off >> 3
    acc = np.zeros(nbytes + 3, dtype=np.float64)
    for q in range(3):   # fields never share a bit, so summing their byte contributions is an OR
        acc += np.bincount(bi + q, weights=((sh >> (8 * q)) & 255).astype(np.float64), minlength=nbytes + 3)
    return acc[:nbytes].astype(np.uint8).tobytes()


def row_dtype(nrows: int) -> np.dtype:
    """The width of the table rows the compiled encoder reads for tables of nrows rows: 16 bits
    where they fit (its steps then read a quarter of the bytes), else 64."""
    return np.dtype(np.uint16 if nrows <= 1 << 16 else np.int64)


def encode_table_rows(rows: np.ndarray, tab: Tables, lanes: int, bits_back: np.ndarray | None = None,
                      interleaved: bool = False) -> bytes:
    """``encode``'s stream for symbols given as their table rows (context * S + symbol, int64
    or uint16, each of frequency > 0: the caller has checked), through the compiled loop only: for callers
    that computed the rows in a compiled pass of their own (entropy.tans_section)."""
    n = len(rows)
    if n == 0:
        return b""
    loop = kernels.compiled()
    if loop is None:
        raise ValueError("tans: encode_table_rows needs the compiled loop")
    T, Wp, _ = layout(n, lanes, interleaved)
    ks, thr, start, fr, enc = tab._encode_tables()
    x = np.full(Wp, tab.L, dtype=np.int64)
    if bits_back is not None:
        x += bits_back
    rows = np.ascontiguousarray(rows, dtype=np.uint16 if rows.dtype == np.uint16 else np.int64)
    return loop.encode(rows, n, T, Wp, interleaved, ks, thr,
                       np.ascontiguousarray(start - fr), enc, x, tab.R)


def decode(stream, n: int, tab: Tables, lanes: int, ctx: np.ndarray | None = None,
           dyn: tuple[np.ndarray, int] | None = None, values: np.ndarray | None = None,
           interleaved: bool = False, out: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Decode n symbols; return (symbols, the Wp end states). CodecError if malformed.

    With ``values`` (an array indexed by symbol) the symbols come back mapped through it, in its dtype.
    With ``out`` (n contiguous elements of that dtype) they are written there, and out is returned.
    """
    if out is not None and (len(out) != n or not out.flags.c_contiguous or
                            out.dtype != (np.dtype(np.int64) if values is None else np.asarray(values).dtype)):
        raise ValueError("tans: out must be n contiguous elements of the values' dtype")
    if n == 0:
        if len(stream):
            raise CodecError("tans: non-empty stream for zero symbols")
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if lanes < 1 or (dyn is not None and interleaved) or n > MAX_N:
        raise CodecError("tans: bad lanes, layout or symbol count")
    T, Wp, act = layout(n, lanes, interleaved)
    L, S, R = tab.L, tab.S, tab.R
    raw = np.frombuffer(stream, dtype=np.uint8)
    nbits = len(raw) * 8
    if nbits < Wp * R:
        raise CodecError("tans: stream shorter than its initial states")
    # the lanes' first states: the first Wp * R bits
    loop = kernels.compiled()
    if loop is not None:
        first = np.empty(Wp, dtype=np.int64)
        loop.unpack_fields(raw, R, first)
    else:
        hb = (Wp * R + 7) >> 3
        head = np.zeros(hb + 4, dtype=np.uint8)
        head[:hb] = raw[:hb]
        o = np.arange(Wp, dtype=np.int64) * R
        first = (np.ndarray((hb + 1,), dtype="<u4", buffer=head, strides=(1,)).astype(np.int64)[o >> 3]
                 >> (o & 7)) & _MASK[R]
    pos = Wp * R
    packed = tab.packed
    compiled = loop is not None and S <= kernels.COMPILED_MAX_SYMBOLS
    cg = None
    if ctx is not None:
        if len(ctx) != n:
            raise CodecError("tans: context out of range")
        if not compiled:
            ctx = np.asarray(ctx, dtype=np.int64)
            if ctx.min() < 0 or ctx.max() >= tab.K:
                raise CodecError("tans: context out of range")
            cg = _grid(ctx, n, T, Wp, interleaved) * L
            first += cg[0]
        else:     # the compiled loop checks every context; uint8 ones cost an eighth of the memory
            ctx = compiled_ints(ctx, np.uint8)
            c0 = (ctx[:Wp] if interleaved else ctx[::T]).astype(np.int64)
            if c0.min() < 0 or c0.max() >= tab.K:
                raise CodecError("tans: context out of range")
            first += c0 * L
    elif dyn is not None:
        first += dyn[1] * L
        if not compiled:
            nxt = (dyn[0] * L)[packed >> 20]        # context offset of the symbol after each entry
            packed = packed | (nxt << 36)
    if compiled:
        return _decode_compiled(loop, raw, n, tab, first, ctx, dyn, values, interleaved, T, Wp, pos, out)
    slack = (Wp * R) // 8 + 8      # one step can overrun the end by at most Wp * R bits
    buf = np.zeros(len(raw) + slack, dtype=np.uint8)
    buf[:len(raw)] = raw
    win = np.ndarray((len(raw) + slack - 3,), dtype="<u4", buffer=buf, offset=0, strides=(1,)).astype(np.int64)
    hist = np.empty((T + 1, Wp), dtype=np.int64)     # table index (context * L + state) per step
    hist[0] = first
    for t in range(T):
        a = int(act[t])
        e = packed[hist[t, :a]]
        nb = (e >> 16) & 15
        end = np.cumsum(nb)
        o = end - nb
        o += pos
        h = hist[t + 1, :a]
        np.bitwise_and(win[o >> 3] >> (o & 7), _MASK[nb], out=h)
        h += e & 0xFFFF
        if cg is not None:
            if t + 1 < T:
                h += cg[t + 1, :a]
        elif dyn is not None:
            h += e >> 36
        pos += int(end[-1])
        if pos > nbits:
            raise CodecError("tans: stream runs past its end")
    if (pos + 7) >> 3 != len(raw) or (pos & 7 and raw[-1] >> (pos & 7)):
        raise CodecError("tans: stream length does not match the symbols decoded")
    fin = hist[T] & (L - 1)
    prev = Wp
    for t in np.flatnonzero(act < Wp):   # lanes [a, prev) ended before step t; later rows were never written
        a = int(act[t])
        if a < prev:
            fin[a:prev] = hist[t, a:prev] & (L - 1)
            hist[t + 1:, a:prev] = 0
            prev = a
    sy = (tab.packed >> 20) if values is None else np.asarray(values)[tab.packed >> 20]
    sym = sy[hist[:T]]
    sym = (sym if interleaved else sym.T).reshape(-1)[:n]
    if out is None:
        return sym, fin
    out[:] = sym
    return out, fin


def _decode_compiled(loop, raw, n, tab, states, ctx, dyn, values, interleaved, T, Wp, pos, out=None):
    """tans.decode's result through the compiled loop (see _tansloop.c)."""
    L = tab.L
    vals = np.arange(tab.S, dtype=np.int64) if values is None else np.ascontiguousarray(values)
    if vals.dtype.itemsize not in (1, 2, 4, 8) or len(vals) < tab.S:
        raise CodecError("tans: bad symbol values")
    vals = vals[:tab.S]
    if out is None:
        out = np.empty(n, dtype=vals.dtype)
    states = np.ascontiguousarray(states, dtype=np.int64)
    nxo = None if dyn is None else np.ascontiguousarray(np.asarray(dyn[0], dtype=np.int64)[:tab.S] * L)
    try:
        compact = tab.packed32 is not None
        # the loop checks a compact table's entries against the symbol count once per Tables:
        # floatseg decodes several streams with one table
        checked = compact and tab.checked_symbols == len(vals)
        pos = loop.decode(tab.packed32 if compact else tab.packed, compact, checked, raw, states, out, vals, ctx,
                          nxo, interleaved, n, T, Wp, L, pos)
        if compact:
            tab.checked_symbols = len(vals)
    except ValueError as exc:
        raise CodecError(str(exc)) from None
    if (pos + 7) >> 3 != len(raw) or (pos & 7 and raw[-1] >> (pos & 7)):
        raise CodecError("tans: stream length does not match the symbols decoded")
    return out, states & (L - 1)


def lanes_for(n: int, target_steps: int = 48, max_lanes: int = 1 << 14) -> int:
    """Encoder choice: enough lanes that decoding takes about ``target_steps`` numpy steps."""
    return max(1, min(max_lanes, -(-n // target_steps)))


def bits_back_values(b: np.ndarray, wp: int, R: int) -> np.ndarray:
    """The lanes' bits-back initial states from plain bytes: the first bytes of the stored bits,
    read as a little-endian bit string cut into R-bit fields (wp of them; bits past the bytes
    are zero)."""
    loop = kernels.compiled()
    if loop is not None:
        padded = np.zeros(-(-wp * R // 8), dtype=np.uint8)
        padded[:len(b)] = b
        out = np.empty(wp, dtype=np.int64)
        loop.unpack_fields(padded, R, out)
        return out
    bits = np.zeros(wp * R, dtype=np.uint8)
    bits[: 8 * len(b)] = np.unpackbits(b, bitorder="little")
    return (bits.reshape(wp, R).astype(np.int64) << np.arange(R)).sum(axis=1)


def bits_back_bytes(fin: np.ndarray, R: int, m: int) -> np.ndarray:
    """bits_back_values reversed: the m plain bytes the lanes' end states (R bits each) hold;
    CodecError if they hold set bits past those bytes."""
    loop = kernels.compiled()
    if loop is not None:
        packed = loop.pack_fields(np.ascontiguousarray(fin, dtype=np.int64), R, m)
        if packed is None:
            raise CodecError("floatsplit: lane end states hold bits past the stored bytes")
        return np.frombuffer(packed, dtype=np.uint8)
    f = fin.astype(np.uint16)      # R <= 15: 16-bit lanes keep the bit matrix small
    bits = ((f[:, None] >> np.arange(R, dtype=np.uint16)) & np.uint16(1)).astype(np.uint8).ravel()
    if bits[8 * m:].any():
        raise CodecError("floatsplit: lane end states hold bits past the stored bytes")
    return np.packbits(bits[: 8 * m], bitorder="little")
