/* The decode loop of lmzfs.codecs.tans.decode, compiled.
 *
 * Why C: the numpy loop costs ~11 whole-array passes per step and decodes 40-50 MB/s of bfloat16
 * per core; this is one pass with a running bit position. It computes exactly what the numpy path
 * in tans.py computes (the same symbols, end states and end position), and tans.py falls back to
 * that path when this module is missing, so the pure path still reads every store. The tests
 * decode every fixture both ways.
 *
 * decode(packed, compact, stream, states, out, values, ctx, nxo, interleaved, n, T, Wp, L, pos) -> pos
 *   packed: int64[K*L] decoder entries (base | nb << 16 | sym << 20), L <= 2**15, S <= 8192; or,
 *           with compact, uint32[K*L] entries in the loop's own form (base | nb << 15 |
 *           sym << 19, as float_tables writes them), checked and used in place
 *   stream: the tANS bit string; bits past its end read as zero
 *   states: writable int64[Wp]: in, each lane's first table index; out, its table index after
 *           its last symbol
 *   out:    writable buffer for n items; out[i] = values[symbol i] (the item size is len(out) / n);
 *           with interleaved lanes and 1- or 2-byte items the loop stores them here itself
 *   values: one item per symbol
 *   ctx:    None, int64[n] or uint8[n] (told apart by length), the table (context) of each
 *           symbol
 *   nxo:    None or int64[S], the table offset of the symbol after each symbol (previous-symbol
 *           contexts)
 * Symbol i belongs to lane i % Wp at step i / Wp (interleaved) or lane i / T at step i % T.
 * Raises ValueError when the stream runs past its end or an index leaves the tables.
 */
#include "_tansloop.h"
#include <stdint.h>
#include <string.h>
#ifdef __SSE2__
#include <emmintrin.h>
#endif

/* the last few bytes of a stream: byte by byte, zero past the end (kept out of line: the loop
 * needs its registers) */
static __attribute__((noinline)) uint64_t read64(const uint8_t *s, Py_ssize_t slen, uint64_t byte)
{
    uint64_t w = 0;
    if (byte + 8 <= (uint64_t)slen) {
        memcpy(&w, s + byte, 8);   /* little-endian hosts only; checked at import */
    } else {
        for (unsigned q = 0; q < 8 && byte + q < (uint64_t)slen; q++)
            w |= (uint64_t)s[byte + q] << (8 * q);
    }
    return w;
}

/* The entries repacked to 32 bits (base | nb << 15 | sym << SYM_SHIFT, struct job in
 * _tansloop.h) so that 16 tables of 4096 fit in L2; the next-context offset moves to a
 * per-symbol array. */
static const uint32_t LOW_BITS[16] = {0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 2047, 4095, 8191,
                                      16383, 32767};
#define MAX_SYM32 (1u << (32 - SYM_SHIFT))

/* One specialisation per (layout, context mode) so the inner loop carries no mode tests.
 * Entries were checked when the table was repacked (base + 2**nb <= L), and contexts are
 * checked by the caller, so every state stays inside the tables without a test per symbol. */
static inline __attribute__((always_inline)) const char *
run_steps_mode(struct job *jb, const int interleaved, const int mode, const int out8)
{
    const uint32_t *restrict tab = jb->tab;
    const uint16_t *restrict map = jb->map;
    const uint8_t *restrict map8 = jb->map8;
    const uint8_t *restrict s = jb->s;
    uint32_t *restrict st = jb->st;
    const int64_t *restrict ctx = jb->ctx;
    const uint8_t *restrict ctx8 = jb->ctx8;
    const int64_t *restrict nxo = jb->nxo;
    const int64_t T = jb->T, Wp = jb->Wp, L = jb->L;
    const Py_ssize_t slen = jb->slen;
    const uint64_t nbits = (uint64_t)slen * 8;
    /* the fast reader needs 8 readable bytes at pos / 8 */
    const uint64_t safe_bits = slen >= 8 ? (uint64_t)(slen - 8) * 8 : 0;
    uint64_t pos = jb->pos;
    for (int64_t t = jb->t0; t < T; t++) {
        const int64_t a = tans_active_lanes(jb, interleaved, t);
        uint16_t *restrict out = out8 ? NULL : jb->sym + t * jb->SW;
        uint8_t *restrict o8 = out8 ? jb->sym8 + t * jb->SW : NULL;
        /* lanes below jn decode another symbol at step t + 1 and take its context */
        const int64_t jn = mode == 1 || mode == 3 ? tans_continuing_lanes(jb, interleaved, t, a) : 0;
        const int64_t cs = interleaved ? 1 : T;
        const int64_t *restrict cn = mode == 1 ? (interleaved ? ctx + (t + 1) * Wp : ctx + t + 1) : NULL;
        const uint8_t *restrict cn8 = mode == 3 ? (interleaved ? ctx8 + (t + 1) * Wp : ctx8 + t + 1) : NULL;
        for (int64_t j = t == jb->t0 ? jb->j0 : 0; j < a; j++) {
            const uint32_t e = tab[st[j]];
            const unsigned nb = (e >> 15) & 15;
            if (out8)
                o8[j] = map8[e >> SYM_SHIFT];
            else
                out[j] = map[e >> SYM_SHIFT];
            uint64_t w;
            if (pos <= safe_bits)
                memcpy(&w, s + (pos >> 3), 8);   /* little-endian hosts only; checked at import */
            else
                w = read64(s, slen, pos >> 3);
            uint32_t v = ((uint32_t)(w >> (pos & 7)) & LOW_BITS[nb]) + (e & 0x7FFF);
            pos += nb;
            if (mode == 1)
                v += j < jn ? (uint32_t)(cn[j * cs] * L) : 0;
            else if (mode == 3)
                v += j < jn ? (uint32_t)cn8[j * cs] * (uint32_t)L : 0;
            else if (mode == 2)
                v += (uint32_t)nxo[e >> SYM_SHIFT];
            st[j] = v;
        }
        if (pos > nbits)
            return "tans: stream runs past its end";
    }
    jb->pos = pos;
    return NULL;
}

/* Built twice: with BMI2 (variable shifts without the CL register: ~25% faster here) and
 * without, chosen at load time by the CPU. */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
__attribute__((target_clones("bmi2", "default")))
#endif
static const char *run_steps(struct job *jb)
{
    const int mode = jb->ctx ? 1 : jb->nxo ? 2 : jb->ctx8 ? 3 : 0;
    if (jb->interleaved && jb->sym8) {      /* only interleaved lanes store 8-bit values in place */
        if (mode == 0) return run_steps_mode(jb, 1, 0, 1);
        if (mode == 1) return run_steps_mode(jb, 1, 1, 1);
        if (mode == 3) return run_steps_mode(jb, 1, 3, 1);
        return run_steps_mode(jb, 1, 2, 1);
    }
    if (jb->interleaved) {
        if (mode == 0) return run_steps_mode(jb, 1, 0, 0);
        if (mode == 1) return run_steps_mode(jb, 1, 1, 0);
        if (mode == 3) return run_steps_mode(jb, 1, 3, 0);
        return run_steps_mode(jb, 1, 2, 0);
    }
    if (mode == 0) return run_steps_mode(jb, 0, 0, 0);
    if (mode == 1) return run_steps_mode(jb, 0, 1, 0);
    if (mode == 3) return run_steps_mode(jb, 0, 3, 0);
    return run_steps_mode(jb, 0, 2, 0);
}

/* out[i] = values[sym of i], i in symbol order. Contiguous lanes are transposed through a small
 * tile (TILE lanes x every step, when lanes are at most TILE_STEPS long) so that the reads of the
 * step-major symbols use whole cache lines and the writes of each lane's run are contiguous;
 * strided stores straight into ``out`` cost twice as much. Every lane but the last holds exactly
 * T symbols, so only the last one needs a bound. */
#define TILE 64
/* Rows of contiguous lanes are padded by a cache line: with Wp a power of two, unpadded rows sit
 * 2 * Wp bytes apart, so a tile's reads fall in one L1 set and alias the tile's stores modulo
 * 4 KiB. */
#define ROW_PAD 32
#define TILE_STEPS 1024
#define SCATTER(TYPE)                                                                           \
    static void scatter_##TYPE(const struct job *jb, const uint16_t *restrict sym,             \
                               const TYPE *restrict values, TYPE *restrict out,                \
                               TYPE *restrict tile)                                            \
    {                                                                                          \
        const int64_t n = jb->n, T = jb->T, Wp = jb->Wp, SW = jb->SW;                          \
        if (jb->interleaved) {                                                                 \
            for (int64_t i = 0; i < n; i++)                                                    \
                out[i] = values[sym[i]];                                                       \
            return;                                                                            \
        }                                                                                      \
        const int64_t full = Wp - 1;                                                           \
        int64_t j0 = 0;                                                                        \
        for (; tile && j0 + TILE <= full; j0 += TILE) {                                        \
            for (int64_t t = 0; t < T; t++) {                                                  \
                const uint16_t *restrict row = sym + t * SW + j0;                              \
                for (int q = 0; q < TILE; q++)                                                 \
                    tile[q * T + t] = values[row[q]];                                          \
            }                                                                                  \
            memcpy(out + j0 * T, tile, (size_t)(TILE * T) * sizeof(TYPE));                     \
        }                                                                                      \
        for (int64_t j = j0; j < full; j++)                                                    \
            for (int64_t t = 0; t < T; t++)                                                    \
                out[j * T + t] = values[sym[t * SW + j]];                                      \
        for (int64_t t = 0; full * T + t < n; t++)                                             \
            out[full * T + t] = values[sym[t * SW + full]];                                    \
    }
/* The 16-bit case (floatsplit's bfloat16 and float16), contiguous lanes only (interleaved ones
 * store into ``out`` directly): the loop already stored the values, so this is a plain
 * transpose, done in 8 x 8 blocks in SSE2 registers where the host has them. */
static void transpose16(const struct job *jb, const uint16_t *restrict sym, uint16_t *restrict out)
{
    const int64_t n = jb->n, T = jb->T, Wp = jb->Wp, SW = jb->SW, full = Wp - 1;
    int64_t j = 0;
#ifdef __SSE2__
    const int64_t T8 = T & ~(int64_t)7;
    for (; j + 8 <= full; j += 8) {
        for (int64_t t = 0; t < T8; t += 8) {
            const uint16_t *r = sym + t * SW + j;
            const __m128i r0 = _mm_loadu_si128((const __m128i *)(r)),
                          r1 = _mm_loadu_si128((const __m128i *)(r + SW)),
                          r2 = _mm_loadu_si128((const __m128i *)(r + 2 * SW)),
                          r3 = _mm_loadu_si128((const __m128i *)(r + 3 * SW)),
                          r4 = _mm_loadu_si128((const __m128i *)(r + 4 * SW)),
                          r5 = _mm_loadu_si128((const __m128i *)(r + 5 * SW)),
                          r6 = _mm_loadu_si128((const __m128i *)(r + 6 * SW)),
                          r7 = _mm_loadu_si128((const __m128i *)(r + 7 * SW));
            const __m128i a0 = _mm_unpacklo_epi16(r0, r1), a1 = _mm_unpackhi_epi16(r0, r1),
                          a2 = _mm_unpacklo_epi16(r2, r3), a3 = _mm_unpackhi_epi16(r2, r3),
                          a4 = _mm_unpacklo_epi16(r4, r5), a5 = _mm_unpackhi_epi16(r4, r5),
                          a6 = _mm_unpacklo_epi16(r6, r7), a7 = _mm_unpackhi_epi16(r6, r7);
            const __m128i b0 = _mm_unpacklo_epi32(a0, a2), b1 = _mm_unpackhi_epi32(a0, a2),
                          b2 = _mm_unpacklo_epi32(a1, a3), b3 = _mm_unpackhi_epi32(a1, a3),
                          b4 = _mm_unpacklo_epi32(a4, a6), b5 = _mm_unpackhi_epi32(a4, a6),
                          b6 = _mm_unpacklo_epi32(a5, a7), b7 = _mm_unpackhi_epi32(a5, a7);
            uint16_t *o = out + j * T + t;      /* lane j + q's steps t..t+7 */
            _mm_storeu_si128((__m128i *)(o), _mm_unpacklo_epi64(b0, b4));
            _mm_storeu_si128((__m128i *)(o + T), _mm_unpackhi_epi64(b0, b4));
            _mm_storeu_si128((__m128i *)(o + 2 * T), _mm_unpacklo_epi64(b1, b5));
            _mm_storeu_si128((__m128i *)(o + 3 * T), _mm_unpackhi_epi64(b1, b5));
            _mm_storeu_si128((__m128i *)(o + 4 * T), _mm_unpacklo_epi64(b2, b6));
            _mm_storeu_si128((__m128i *)(o + 5 * T), _mm_unpackhi_epi64(b2, b6));
            _mm_storeu_si128((__m128i *)(o + 6 * T), _mm_unpacklo_epi64(b3, b7));
            _mm_storeu_si128((__m128i *)(o + 7 * T), _mm_unpackhi_epi64(b3, b7));
        }
        for (int64_t t = T8; t < T; t++)
            for (int q = 0; q < 8; q++)
                out[(j + q) * T + t] = sym[t * SW + j + q];
    }
#endif
    for (; j < full; j++)
        for (int64_t t = 0; t < T; t++)
            out[j * T + t] = sym[t * SW + j];
    for (int64_t t = 0; full * T + t < n; t++)
        out[full * T + t] = sym[t * SW + full];
}

SCATTER(uint8_t)
SCATTER(uint32_t)
SCATTER(uint64_t)

/* The entries repacked to 32 bits (or, compact ones, checked) and every index the loop will use
 * checked: the first states, the contexts and the next-context offsets. */
static const char *prepare(struct job *jb, const int64_t *pk, const uint32_t *pk32, int64_t nsym,
                           const int64_t *st_in, int checked)
{
    const int64_t ntab = jb->ntab, L = jb->L, n = jb->n;
    if (pk32 && checked) {
        jb->tab = (uint32_t *)pk32;     /* an earlier decode checked these entries, for this nsym */
    } else if (pk32) {
        uint32_t top = 0, bad = 0;
        for (int64_t k = 0; k < ntab; k++) {
            const uint32_t e = pk32[k], base = e & 0x7FFF, nb = (e >> 15) & 15;
            top = e > top ? e : top;
            bad |= base + (1u << nb) > (uint32_t)L;
        }
        if ((int64_t)(top >> SYM_SHIFT) >= nsym)
            return "tans: a table symbol has no value";
        if (bad)
            return "tans: a table entry leaves its table";
        jb->tab = (uint32_t *)pk32;
    } else {
        for (int64_t k = 0; k < ntab; k++) {
            const int64_t e = pk[k], sy = (e >> 20) & 0xFFFF;
            if (sy >= nsym)
                return "tans: a table symbol has no value";
            const int64_t base = e & 0xFFFF, nb = (e >> 16) & 15;
            if (base + ((int64_t)1 << nb) > L)
                return "tans: a table entry leaves its table";
            jb->tab[k] = (uint32_t)base | (uint32_t)nb << 15 | (uint32_t)sy << SYM_SHIFT;
        }
    }
    for (int64_t j = 0; j < jb->Wp; j++) {
        if (st_in[j] < 0 || st_in[j] >= ntab)
            return "tans: table index out of range";
        jb->st[j] = (uint32_t)st_in[j];
    }
    int bad_ctx = 0;
    if (jb->ctx)
        for (int64_t i = 0; i < n; i++)
            bad_ctx |= jb->ctx[i] < 0 || jb->ctx[i] >= ntab / L;
    if (jb->ctx8) {
        uint8_t top = 0;
        for (int64_t i = 0; i < n; i++)
            top = jb->ctx8[i] > top ? jb->ctx8[i] : top;
        bad_ctx = top >= ntab / L;
    }
    if (bad_ctx)
        return "tans: context out of range";
    if (jb->nxo)
        for (int64_t q = 0; q < nsym; q++)
            if (jb->nxo[q] < 0 || jb->nxo[q] + L > ntab)
                return "tans: context out of range";
    return NULL;
}

/* tans_decode_run (declared with struct decode_in in _tansloop.h): one decode, GIL-free. */
const char *tans_decode_run(struct decode_in *d, int *nomem)
{
    const int64_t n = d->n, T = d->T, Wp = d->Wp, nsym = d->nsym;
    const Py_ssize_t isz = d->isz;
    const char *err = NULL;
    uint32_t *tab = d->compact ? NULL : PyMem_RawMalloc(d->ntab * sizeof *tab);
    uint32_t *st = PyMem_RawMalloc(Wp * sizeof *st);
    const int64_t SW = d->interleaved ? Wp : Wp + ROW_PAD;
    /* 16-bit values are stored by the loop itself and transposed without a tile; with interleaved
     * lanes, step-major order is symbol order, so 8- and 16-bit values go straight into ``out`` */
    const int mapped = isz == 2, direct = d->interleaved && (isz == 1 || isz == 2);
    const int tiled = !mapped && !direct && T <= TILE_STEPS;
    uint16_t *sym = direct ? NULL : PyMem_RawMalloc(T * SW * sizeof *sym);
    void *tile = tiled ? PyMem_RawMalloc(TILE * T * 8) : NULL;
    uint16_t *ident = mapped || direct ? NULL : PyMem_RawMalloc(nsym * sizeof *ident);
    *nomem = 0;
    if ((!d->compact && !tab) || !st || (!direct && !sym) || (tiled && !tile) || (!mapped && !direct && !ident)) {
        *nomem = 1;
        err = "out of memory";
        goto done;
    }
    if (ident)
        for (int64_t q = 0; q < nsym; q++)
            ident[q] = (uint16_t)q;
    struct job jb = {.tab = tab, .ntab = d->ntab, .nxo = d->nxo, .ctx = d->ctx, .ctx8 = d->ctx8,
                     .s = d->stream, .slen = d->slen, .st = st, .SW = SW, .n = n, .T = T,
                     .Wp = Wp, .L = d->L, .nsym = nsym, .interleaved = d->interleaved, .pos = d->pos,
                     .sym = direct && isz == 2 ? (uint16_t *)d->out : sym,
                     .sym8 = direct && isz == 1 ? (uint8_t *)d->out : NULL,
                     .map = mapped ? (const uint16_t *)d->values : ident,
                     .map8 = direct && isz == 1 ? (const uint8_t *)d->values : NULL};
    err = prepare(&jb, d->compact ? NULL : d->packed, d->compact ? d->packed : NULL, nsym, d->states, d->checked);
    if (!err)
        err = tans_steps_vector(&jb);
    if (!err && jb.t0 < T)
        err = run_steps(&jb);
    if (!err && !direct) {
        switch (isz) {
        case 1: scatter_uint8_t(&jb, sym, d->values, d->out, tile); break;
        case 2: transpose16(&jb, sym, d->out); break;
        case 4: scatter_uint32_t(&jb, sym, d->values, d->out, tile); break;
        default: scatter_uint64_t(&jb, sym, d->values, d->out, tile); break;
        }
    }
    if (!err) {
        for (int64_t j = 0; j < Wp; j++)
            d->states[j] = st[j];
        d->pos = jb.pos;
    }
done:
    PyMem_RawFree(tab);
    PyMem_RawFree(st);
    PyMem_RawFree(sym);
    PyMem_RawFree(tile);
    PyMem_RawFree(ident);
    return err;
}

/* tans_decode_section (declared in _tansloop.h): first states read, decode, end checked. */
const char *tans_first_states(const uint8_t *stream, Py_ssize_t slen, int64_t R, int64_t Wp, int64_t *states)
{
    if (slen * 8 < Wp * R)
        return "tans: stream shorter than its initial states";
    tans_unpack_fields_into(stream, R, states, Wp);
    return NULL;
}

const char *tans_decode_section(struct decode_in *d, int *nomem)
{
    const char *err = tans_decode_run(d, nomem);
    if (err)
        return err;
    if ((Py_ssize_t)((d->pos + 7) >> 3) != d->slen || ((d->pos & 7) && d->stream[d->slen - 1] >> (d->pos & 7)))
        return "tans: stream length does not match the symbols decoded";
    for (int64_t j = 0; j < d->Wp; j++)
        d->states[j] &= d->L - 1;
    return NULL;
}

static PyObject *decode(PyObject *self, PyObject *args)
{
    TANS_BUFFER packed = {0}, stream = {0}, states = {0}, out = {0}, values = {0}, ctx = {0}, nxo = {0};
    PyObject *ctx_obj, *nxo_obj;
    int interleaved;
    Py_ssize_t n, T, Wp, L, pos0;

    int compact, checked;
    if (!PyArg_ParseTuple(args, "y*ppy*w*w*y*OOpnnnnn", &packed, &compact, &checked, &stream, &states, &out, &values,
                          &ctx_obj, &nxo_obj, &interleaved, &n, &T, &Wp, &L, &pos0))
        return NULL;
    if (ctx_obj != Py_None && PyObject_GetBuffer(ctx_obj, &ctx, PyBUF_SIMPLE) < 0)
        return NULL;
    if (nxo_obj != Py_None && PyObject_GetBuffer(nxo_obj, &nxo, PyBUF_SIMPLE) < 0)
        return NULL;

    /* values: the item size is passed through ``out``'s length (n items) */
    const Py_ssize_t isz = n > 0 ? out.len / n : 0;
    const int64_t ntab = packed.len / (compact ? 4 : 8), nsym = isz ? values.len / isz : 0;
    if (n < 1 || T < 1 || Wp < 1 || L < 2 || L > 1 << 15 || pos0 < 0 || states.len / 8 < Wp ||
        out.len != n * isz || (isz != 1 && isz != 2 && isz != 4 && isz != 8) ||
        nsym < 1 || nsym > MAX_SYM32 || ntab > 1 << 24 || ntab % L || (ctx.obj && ctx.len != n && ctx.len != 8 * n) ||
        (nxo.obj && nxo.len / 8 < nsym) ||
        (interleaved ? (T - 1) * Wp >= n || T * Wp < n : (Wp - 1) * T >= n || Wp * T < n)) {
        PyErr_SetString(PyExc_ValueError, "tans: bad decode arguments");
        return NULL;
    }
    /* the context item size (1 or 8) follows from the buffer's length, as for ``out`` */
    struct decode_in d = {.packed = packed.buf, .compact = compact, .checked = checked, .ntab = ntab,
                          .stream = stream.buf, .slen = stream.len, .states = states.buf, .out = out.buf,
                          .isz = isz, .values = values.buf, .nsym = nsym,
                          .ctx = ctx.obj && ctx.len == 8 * n ? ctx.buf : NULL,
                          .ctx8 = ctx.obj && ctx.len == n ? ctx.buf : NULL,
                          .nxo = nxo.obj ? nxo.buf : NULL, .interleaved = interleaved, .n = n, .T = T,
                          .Wp = Wp, .L = L, .pos = (uint64_t)pos0};
    const char *err;
    int nomem;
    Py_BEGIN_ALLOW_THREADS      /* from here on only C buffers: other decodes run meanwhile */
    err = tans_decode_run(&d, &nomem);
    Py_END_ALLOW_THREADS
    if (nomem) {
        PyErr_NoMemory();
        return NULL;
    }
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        return NULL;
    }
    return PyLong_FromUnsignedLongLong(d.pos);
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a tANS stream; see the comment at the top of _tansloop.c."},
    {"encode", tans_encode, METH_VARARGS, "tans.encode's steps and packing; see _tansenc.c."},
    {"encode_slots", tans_encode_slots, METH_VARARGS, "tans.encode's slots from built tables; see _tansenc.c."},
    {"build", tans_build, METH_VARARGS, "Build decoder entries; see the comment above build()."},
    {"quantize_rows", tans_quantize_rows, METH_VARARGS, "tans.quantize_rows; see the comment above it."},
    {"pack_fields", tans_pack_fields, METH_VARARGS, "floatsplit's bits-back bytes; see the comment above it."},
    {"unpack_fields", tans_unpack_fields, METH_VARARGS, "tans.decode's first states; see the comment above it."},
    {"float_tables", tans_float_tables, METH_VARARGS, "floatsplit's decoder tables; see the comment above it in _tansfloat.c."},
    {"or_plane", tans_or_plane, METH_VARARGS, "floatsplit's plane merge; see the comment above it in _tansfloat.c."},
    {"merge_nibbles", tans_merge_nibbles, METH_VARARGS, "ggufblocks' Q4_1 quant merge; see _tansgguf.c."},
    {"q4_1_contexts", tans_q4_1_contexts, METH_VARARGS, "ggufblocks' Q4_1 quant contexts; see _tansgguf.c."},
    {"scatter_field", tans_scatter_field, METH_VARARGS, "ggufblocks' field stream into its blocks; see _tansgguf.c."},
    {"tail_contexts", tans_tail_contexts, METH_VARARGS, "symbol sections' tail contexts; see _tanstails.c."},
    {"tail_symbols", tans_tail_symbols, METH_VARARGS, "symbol sections' tail symbols; see _tanstails.c."},
    {"vector_isa", tans_vector_isa, METH_VARARGS, "vector_isa([name]) -> the vector loop in use; see _tansvec.c."},
    {"to_varints", tans_to_varints, METH_O, "uintlist.pack_uints's varints; see _tanstables.c."},
    {"varints", tans_varints, METH_VARARGS, "uintlist.unpack_uints's varint decoding; see the comment above it."},
    {"ulp_residuals", tans_ulp_residuals, METH_VARARGS, "ulpdelta's residuals of a chunk; see _tansulp.c."},
    {"ulp_contexts", tans_ulp_contexts, METH_VARARGS, "ulpdelta's reference contexts; see _tansulp.c."},
    {"ulp_apply", tans_ulp_apply, METH_VARARGS, "ulpdelta's elements from symbols and stored bits; see _tansulp.c."},
    {"float_range", tans_float_range, METH_VARARGS, "floatsplit's exponent range; see _tansfit.c."},
    {"float_fields", tans_float_fields, METH_VARARGS, "floatsplit's fields and histograms; see _tansfit.c."},
    {"float_planes", tans_float_planes, METH_VARARGS, "floatsplit's stored planes; see _tansfit.c."},
    {"zero_blocks", tans_zero_blocks, METH_VARARGS, "floatsplit's zero blocks of the stored planes; see _tansfit.c."},
    {"row_means", tans_row_means, METH_VARARGS, "floatsplit's row means; see _tansfit.c."},
    {"row_classes", tans_row_classes, METH_VARARGS, "floatsplit's row classes and their histogram; see _tansfit.c."},
    {"row_order_stats", tans_row_order_stats, METH_VARARGS, "floatsplit's row-mean order statistics; see _tansfit.c."},
    {"row_contexts", tans_row_contexts, METH_VARARGS, "floatsplit's row-class contexts; see _tansfit.c."},
    {"encode_rows", tans_encode_rows, METH_VARARGS, "tans.encode's table rows; see _tansfit.c."},
    {"section_counts", tans_section_counts, METH_VARARGS, "tANS sections' histograms; see _tanssection.c."},
    {"section_model", tans_section_model, METH_VARARGS, "tANS sections' table log, frequencies and tail width; see _tanssection.c."},
    {"section_rows", tans_section_rows, METH_VARARGS, "tANS sections' table rows and bits back; see _tanssection.c."},
    {"column_classes", tans_column_classes, METH_VARARGS, "the entropy codec's column-class search; see _tanscolumns.c."},
    {"float_parts", tans_float_parts, METH_VARARGS, "floatsplit's parts of a chunk in one call; see _tansparts.c."},
    {"decode_fields", tans_decode_fields, METH_VARARGS, "ggufblocks' field streams of a chunk in one call; see _tansblocks.c."},
    {"string_lengths", tans_string_lengths, METH_VARARGS, "the strings codec's parse of a chunk; see _tansstrings.c."},
    {"join_strings", tans_join_strings, METH_VARARGS, "the strings codec's chunk from lengths and text; see _tansstrings.c."},
    {"copy_bytes", tans_copy_bytes, METH_O, "A buffer's bytes, copied without Python's lock; see _tanscopy.c."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {PyModuleDef_HEAD_INIT, "_tansloop", NULL, -1, methods};

PyMODINIT_FUNC PyInit__tansloop(void)
{
    const uint16_t one = 1;
    if (*(const uint8_t *)&one != 1) {
        PyErr_SetString(PyExc_ImportError, "_tansloop: little-endian hosts only");
        return NULL;
    }
    return PyModule_Create(&module);
}
