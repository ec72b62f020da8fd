/* The decode loop of lmzfs.codecs.tans.decode, compiled.
 *
 * Why C: the numpy loop costs ~11 whole-array passes per step and decodes 40-50 MB/s of bfloat16
 * per core; this is one pass with a running bit position. It computes exactly what the numpy path
 * in tans.py computes (the same symbols, end states and end position), and tans.py falls back to
 * that path when this module is missing, so the pure path still reads every store. The tests
 * decode every fixture both ways.
 *
 * decode(packed, stream, states, out, values, ctx, nxo, interleaved, n, T, Wp, L, pos) -> pos
 *   packed: int64[K*L] decoder entries (base | nb << 16 | sym << 20), L <= 2**15, S <= 8192
 *   stream: the tANS bit string; bits past its end read as zero
 *   states: writable int64[Wp]: in, each lane's first table index; out, its table index after
 *           its last symbol
 *   out:    writable buffer for n items; out[i] = values[symbol i] (the item size is len(out) / n)
 *   values: one item per symbol
 *   ctx:    None, int64[n] or uint8[n] (told apart by length), the table (context) of each
 *           symbol
 *   nxo:    None or int64[S], the table offset of the symbol after each symbol (previous-symbol
 *           contexts)
 * Symbol i belongs to lane i % Wp at step i / Wp (interleaved) or lane i / T at step i % T.
 * Raises ValueError when the stream runs past its end or an index leaves the tables.
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <stdint.h>
#include <string.h>

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

/* The entries repacked to 32 bits (base | nb << 15 | sym << 19) so that 16 tables of 4096 fit in
 * L2; the next-context offset moves to a per-symbol array. */
#define SYM_SHIFT 19
static const uint32_t LOW_BITS[16] = {0, 1, 3, 7, 15, 31, 63, 127, 255, 511, 1023, 2047, 4095, 8191,
                                      16383, 32767};
#define MAX_SYM32 (1u << (32 - SYM_SHIFT))

struct job {
    const uint32_t *tab;
    int64_t ntab;
    const int64_t *nxo;       /* per symbol: next context offset (dyn), or NULL */
    const int64_t *ctx;       /* per symbol index: its context (ctx mode, int64), or NULL */
    const uint8_t *ctx8;      /* the same as uint8, or NULL */
    const uint8_t *s;
    Py_ssize_t slen;
    uint32_t *st;
    uint16_t *sym;            /* step-major symbols: sym[t * Wp + j] */
    int64_t n, T, Wp, L;
    int interleaved;
    uint64_t pos;
};

/* One specialisation per (layout, context mode) so the inner loop carries no mode tests.
 * Entries were checked when the table was repacked (base + 2**nb <= L), and contexts are
 * checked by the caller, so every state stays inside the tables without a test per symbol. */
static inline __attribute__((always_inline)) const char *
run_steps_mode(struct job *jb, const int interleaved, const int mode)
{
    const uint32_t *restrict tab = jb->tab;
    const uint8_t *restrict s = jb->s;
    uint32_t *restrict st = jb->st;
    const int64_t *restrict ctx = jb->ctx;
    const uint8_t *restrict ctx8 = jb->ctx8;
    const int64_t *restrict nxo = jb->nxo;
    const int64_t n = jb->n, T = jb->T, Wp = jb->Wp, L = jb->L;
    const int64_t last = n - (Wp - 1) * T;   /* contiguous: the last lane's length */
    const Py_ssize_t slen = jb->slen;
    const uint64_t nbits = (uint64_t)slen * 8;
    /* the fast reader needs 8 readable bytes at pos / 8 */
    const uint64_t safe_bits = slen >= 8 ? (uint64_t)(slen - 8) * 8 : 0;
    uint64_t pos = jb->pos;
    for (int64_t t = 0; t < T; t++) {
        const int64_t a = interleaved ? (n - t * Wp < Wp ? n - t * Wp : Wp) : (t < last ? Wp : Wp - 1);
        uint16_t *restrict out = jb->sym + t * Wp;
        /* lanes below jn decode another symbol at step t + 1 and take its context */
        int64_t jn = 0;
        if ((mode == 1 || mode == 3) && t + 1 < T)
            jn = interleaved ? (n - (t + 1) * Wp < a ? n - (t + 1) * Wp : a)
                             : ((n - t - 1 + T - 1) / T < a ? (n - t - 1 + T - 1) / T : a);
        const int64_t cs = interleaved ? 1 : T;
        const int64_t *restrict cn = mode == 1 ? (interleaved ? ctx + (t + 1) * Wp : ctx + t + 1) : NULL;
        const uint8_t *restrict cn8 = mode == 3 ? (interleaved ? ctx8 + (t + 1) * Wp : ctx8 + t + 1) : NULL;
        for (int64_t j = 0; j < a; j++) {
            const uint32_t e = tab[st[j]];
            const unsigned nb = (e >> 15) & 15;
            out[j] = (uint16_t)(e >> SYM_SHIFT);
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
    if (jb->interleaved) {
        if (mode == 0) return run_steps_mode(jb, 1, 0);
        if (mode == 1) return run_steps_mode(jb, 1, 1);
        if (mode == 3) return run_steps_mode(jb, 1, 3);
        return run_steps_mode(jb, 1, 2);
    }
    if (mode == 0) return run_steps_mode(jb, 0, 0);
    if (mode == 1) return run_steps_mode(jb, 0, 1);
    if (mode == 3) return run_steps_mode(jb, 0, 3);
    return run_steps_mode(jb, 0, 2);
}

/* out[i] = values[sym of i], i in symbol order; contiguous lanes are transposed in blocks of
 * lanes so that reads and writes stay within a few cache lines. */
#define SCATTER(TYPE)                                                                           \
    static void scatter_##TYPE(const struct job *jb, const uint16_t *restrict sym,             \
                               const TYPE *restrict values, TYPE *restrict out)                \
    {                                                                                          \
        const int64_t n = jb->n, T = jb->T, Wp = jb->Wp;                                       \
        if (jb->interleaved) {                                                                 \
            for (int64_t i = 0; i < n; i++)                                                    \
                out[i] = values[sym[i]];                                                       \
            return;                                                                            \
        }                                                                                      \
        for (int64_t j0 = 0; j0 < Wp; j0 += 64) {                                              \
            const int64_t j1 = j0 + 64 < Wp ? j0 + 64 : Wp;                                    \
            for (int64_t t = 0; t < T; t++) {                                                  \
                const uint16_t *row = sym + t * Wp;                                            \
                for (int64_t j = j0; j < j1; j++) {                                            \
                    const int64_t i = j * T + t;                                               \
                    if (i < n)                                                                 \
                        out[i] = values[row[j]];                                               \
                }                                                                              \
            }                                                                                  \
        }                                                                                      \
    }
SCATTER(uint8_t)
SCATTER(uint16_t)
SCATTER(uint32_t)
SCATTER(uint64_t)

static PyObject *decode(PyObject *self, PyObject *args)
{
    Py_buffer packed = {0}, stream = {0}, states = {0}, out = {0}, values = {0}, ctx = {0}, nxo = {0};
    PyObject *ctx_obj, *nxo_obj;
    int interleaved;
    Py_ssize_t n, T, Wp, L, pos0;
    PyObject *result = NULL;
    uint32_t *tab = NULL, *st = NULL;
    uint16_t *sym = NULL;

    if (!PyArg_ParseTuple(args, "y*y*w*w*y*OOpnnnnn", &packed, &stream, &states, &out, &values,
                          &ctx_obj, &nxo_obj, &interleaved, &n, &T, &Wp, &L, &pos0))
        return NULL;
    if (ctx_obj != Py_None && PyObject_GetBuffer(ctx_obj, &ctx, PyBUF_SIMPLE) < 0)
        goto done;
    if (nxo_obj != Py_None && PyObject_GetBuffer(nxo_obj, &nxo, PyBUF_SIMPLE) < 0)
        goto done;

    /* values: the item size is passed through ``out``'s length (n items) */
    const Py_ssize_t isz = n > 0 ? out.len / n : 0;
    const int64_t ntab = packed.len / 8, nsym = isz ? values.len / isz : 0;
    if (n < 1 || T < 1 || Wp < 1 || L < 2 || L > 1 << 15 || pos0 < 0 || states.len / 8 < Wp ||
        out.len != n * isz || (isz != 1 && isz != 2 && isz != 4 && isz != 8) ||
        nsym < 1 || nsym > MAX_SYM32 || ntab > 1 << 24 || ntab % L || (ctx.obj && ctx.len != n && ctx.len != 8 * n) ||
        (nxo.obj && nxo.len / 8 < nsym) ||
        (interleaved ? (T - 1) * Wp >= n || T * Wp < n : (Wp - 1) * T >= n || Wp * T < n)) {
        PyErr_SetString(PyExc_ValueError, "tans: bad decode arguments");
        goto done;
    }
    tab = PyMem_RawMalloc(ntab * sizeof *tab);
    st = PyMem_RawMalloc(Wp * sizeof *st);
    sym = PyMem_RawMalloc(T * Wp * sizeof *sym);
    if (!tab || !st || !sym) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *pk = packed.buf;
    for (int64_t k = 0; k < ntab; k++) {
        const int64_t e = pk[k], sy = (e >> 20) & 0xFFFF;
        if (sy >= nsym) {
            PyErr_SetString(PyExc_ValueError, "tans: a table symbol has no value");
            goto done;
        }
        const int64_t base = e & 0xFFFF, nb = (e >> 16) & 15;
        if (base + ((int64_t)1 << nb) > L) {
            PyErr_SetString(PyExc_ValueError, "tans: a table entry leaves its table");
            goto done;
        }
        tab[k] = (uint32_t)base | (uint32_t)nb << 15 | (uint32_t)sy << SYM_SHIFT;
    }
    const int64_t *st_in = states.buf;
    for (int64_t j = 0; j < Wp; j++) {
        if (st_in[j] < 0 || st_in[j] >= ntab) {
            PyErr_SetString(PyExc_ValueError, "tans: table index out of range");
            goto done;
        }
        st[j] = (uint32_t)st_in[j];
    }
    /* the context item size (1 or 8) follows from the buffer's length, as for ``out`` */
    const int64_t *cx = ctx.obj && ctx.len == 8 * n ? ctx.buf : NULL;
    const uint8_t *cx8 = ctx.obj && ctx.len == n ? ctx.buf : NULL;
    int bad_ctx = 0;
    if (cx)
        for (int64_t i = 0; i < n; i++)
            bad_ctx |= cx[i] < 0 || cx[i] >= ntab / L;
    if (cx8) {
        uint8_t top = 0;
        for (int64_t i = 0; i < n; i++)
            top = cx8[i] > top ? cx8[i] : top;
        bad_ctx = top >= ntab / L;
    }
    if (bad_ctx) {
        PyErr_SetString(PyExc_ValueError, "tans: context out of range");
        goto done;
    }
    const int64_t *nx = nxo.buf;
    if (nxo.obj)
        for (int64_t q = 0; q < nsym; q++)
            if (nx[q] < 0 || nx[q] + L > ntab) {
                PyErr_SetString(PyExc_ValueError, "tans: context out of range");
                goto done;
            }
    struct job jb = {tab, ntab, nxo.obj ? nx : NULL, cx, cx8, stream.buf, stream.len,
                     st, sym, n, T, Wp, L, interleaved, (uint64_t)pos0};
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = run_steps(&jb);
    if (!err) {
        switch (isz) {
        case 1: scatter_uint8_t(&jb, sym, values.buf, out.buf); break;
        case 2: scatter_uint16_t(&jb, sym, values.buf, out.buf); break;
        case 4: scatter_uint32_t(&jb, sym, values.buf, out.buf); break;
        default: scatter_uint64_t(&jb, sym, values.buf, out.buf); break;
        }
    }
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        goto done;
    }
    int64_t *st_out = states.buf;
    for (int64_t j = 0; j < Wp; j++)
        st_out[j] = st[j];
    result = PyLong_FromUnsignedLongLong(jb.pos);
done:
    PyMem_RawFree(tab);
    PyMem_RawFree(st);
    PyMem_RawFree(sym);
    PyBuffer_Release(&packed);
    PyBuffer_Release(&stream);
    PyBuffer_Release(&states);
    PyBuffer_Release(&out);
    PyBuffer_Release(&values);
    if (ctx.obj)
        PyBuffer_Release(&ctx);
    if (nxo.obj)
        PyBuffer_Release(&nxo);
    return result;
}

/* build(freqs, K, S, R, packed): the decoder entries tans.Tables builds with numpy, for K rows
 * of S int64 frequencies each summing to 2**R (checked by the caller). Slot k of the symbols
 * dealt in order goes to position (k * step) mod L; the positions of symbol s, in increasing
 * order, get sub-states x = f_s, f_s + 1, ...; entry = base | nb << 16 | s << 20 with
 * nb = R - floor(log2 x) and base = x * 2**nb - L. */
static PyObject *build(PyObject *self, PyObject *args)
{
    Py_buffer freqs = {0}, packed = {0};
    Py_ssize_t K, S, R;
    PyObject *result = NULL;
    int16_t *spread = NULL;
    int64_t *next = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &freqs, &K, &S, &R, &packed))
        return NULL;
    /* R >= 4: below 16 slots the step is not coprime with L and positions would stay unset */
    const int64_t L = (int64_t)1 << (R < 4 || R > 15 ? 4 : R);
    if (R < 4 || R > 15 || K < 1 || S < 1 || S > 32767 || freqs.len != K * S * 8 ||
        packed.len != K * L * 8) {
        PyErr_SetString(PyExc_ValueError, "tans: bad table arguments");
        goto done;
    }
    spread = PyMem_RawMalloc(L * sizeof *spread);
    next = PyMem_RawMalloc(S * sizeof *next);
    if (!spread || !next) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t step = (L >> 1) + (L >> 3) + 3;
    const int64_t *f = freqs.buf;
    int64_t *pk = packed.buf;
    for (Py_ssize_t k = 0; k < K; k++) {
        const int64_t *fr = f + k * S;
        int64_t slot = 0;
        for (Py_ssize_t s = 0; s < S; s++) {
            if (fr[s] < 0 || slot + fr[s] > L) {
                PyErr_SetString(PyExc_ValueError, "tans: a frequency table does not sum to L");
                goto done;
            }
            for (int64_t c = 0; c < fr[s]; c++, slot++)
                spread[(slot * step) & (L - 1)] = (int16_t)s;
            next[s] = fr[s];
        }
        if (slot != L) {
            PyErr_SetString(PyExc_ValueError, "tans: a frequency table does not sum to L");
            goto done;
        }
        int64_t *row = pk + k * L;
        for (int64_t p = 0; p < L; p++) {
            const int64_t s = spread[p], x = next[s]++;
            int lg = 63 - __builtin_clzll((unsigned long long)x);
            const int64_t nb = R - lg;
            row[p] = ((x << nb) - L) | (nb << 16) | (s << 20);
        }
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_RawFree(spread);
    PyMem_RawFree(next);
    PyBuffer_Release(&freqs);
    PyBuffer_Release(&packed);
    return result;
}

/* quantize_rows(counts, K, S, R, freqs): tans.quantize_rows for K rows of S int64 counts, into
 * freqs (int64, K*S). Per row, with L = 2**R and tot = the row's sum: counts whose share is below
 * one slot (c * L < tot) get 1; the others share the rest in proportion, floor first (a count
 * whose floor is 0 joins the small ones, and the split is redone), then one more slot for the d
 * largest remainders (ties to the lower symbol); any difference left goes to the first largest
 * entry. Returns False (and writes nothing valid) for a row that cannot be quantised. */
static int64_t *rem_key;

static int by_remainder(const void *pa, const void *pb)
{
    const int64_t a = *(const int64_t *)pa, b = *(const int64_t *)pb;
    if (rem_key[a] != rem_key[b])
        return rem_key[a] > rem_key[b] ? -1 : 1;
    return a < b ? -1 : a > b;
}

static PyObject *quantize_rows(PyObject *self, PyObject *args)
{
    Py_buffer counts = {0}, freqs = {0};
    Py_ssize_t K, S, R;
    PyObject *result = NULL;
    unsigned char *small = NULL;
    int64_t *rem = NULL, *idx = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &counts, &K, &S, &R, &freqs))
        return NULL;
    if (R < 1 || R > 30 || K < 1 || S < 1 || counts.len != K * S * 8 || freqs.len != K * S * 8) {
        PyErr_SetString(PyExc_ValueError, "quantize_rows: bad arguments");
        goto done;
    }
    small = PyMem_RawMalloc(S);
    rem = PyMem_RawMalloc(S * sizeof *rem);
    idx = PyMem_RawMalloc(S * sizeof *idx);
    if (!small || !rem || !idx) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t L = (int64_t)1 << R;
    int ok = 1;
    for (Py_ssize_t k = 0; k < K && ok; k++) {
        const int64_t *c = (const int64_t *)counts.buf + k * S;
        int64_t *f = (int64_t *)freqs.buf + k * S;
        int64_t tot = 0, nnz = 0;
        for (Py_ssize_t i = 0; i < S; i++) {
            if (c[i] < 0 || c[i] > ((int64_t)1 << 40)) {
                ok = 0;
                break;
            }
            tot += c[i];
            nnz += c[i] > 0;
        }
        if (!ok || tot <= 0 || nnz > L) {
            ok = 0;
            break;
        }
        for (Py_ssize_t i = 0; i < S; i++)
            small[i] = c[i] > 0 && c[i] * L < tot;
        int64_t lb, tb;
        for (;;) {
            int64_t nsmall = 0;
            tb = 0;
            for (Py_ssize_t i = 0; i < S; i++) {
                nsmall += small[i];
                if (c[i] > 0 && !small[i])
                    tb += c[i];
            }
            lb = L - nsmall;
            int newly = 0;
            for (Py_ssize_t i = 0; i < S; i++) {
                if (c[i] > 0 && !small[i]) {
                    f[i] = c[i] * lb / (tb > 0 ? tb : 1);
                    if (f[i] == 0) {
                        small[i] = 1;
                        newly = 1;
                    }
                } else {
                    f[i] = small[i];
                }
            }
            if (!newly)
                break;
        }
        int64_t sumbig = 0, nbig = 0;
        for (Py_ssize_t i = 0; i < S; i++)
            if (c[i] > 0 && !small[i]) {
                sumbig += f[i];
                rem[i] = c[i] * lb % (tb > 0 ? tb : 1);
                idx[nbig++] = i;
            } else {
                rem[i] = -1;
            }
        const int64_t d = lb - sumbig;
        if (d > 0 && nbig > 0) {
            rem_key = rem;      /* qsort has no context argument; the GIL is held throughout */
            qsort(idx, nbig, sizeof *idx, by_remainder);
            for (int64_t q = 0; q < d && q < nbig; q++)
                f[idx[q]] += 1;
        }
        int64_t sum = 0, arg = 0;
        for (Py_ssize_t i = 0; i < S; i++) {
            sum += f[i];
            if (f[i] > f[arg])
                arg = i;
        }
        if (sum != L)
            f[arg] += L - sum;
    }
    result = PyBool_FromLong(ok);
done:
    PyMem_RawFree(small);
    PyMem_RawFree(rem);
    PyMem_RawFree(idx);
    PyBuffer_Release(&counts);
    PyBuffer_Release(&freqs);
    return result;
}

/* varints(buf, count, out) -> 0 ok, 1 wrong number of values, 2 a value over 5 bytes,
 * 3 a non-canonical value (a last byte of 0 after others): tans.unpack_uints's body, with the
 * same precedence of errors. out: int64[count]. */
static PyObject *varints(PyObject *self, PyObject *args)
{
    Py_buffer buf = {0}, out = {0};
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*nw*", &buf, &count, &out))
        return NULL;
    long code = 0;
    if (count < 0 || out.len != count * 8) {
        PyBuffer_Release(&buf);
        PyBuffer_Release(&out);
        PyErr_SetString(PyExc_ValueError, "varints: bad arguments");
        return NULL;
    }
    const uint8_t *b = buf.buf;
    int64_t *o = out.buf;
    Py_ssize_t got = 0, len = 0;
    int64_t v = 0;
    int too_large = 0, noncanonical = 0;
    for (Py_ssize_t i = 0; i < buf.len; i++) {
        const uint8_t c = b[i];
        if (len < 5)
            v |= (int64_t)(c & 0x7F) << (7 * len);
        len++;
        if (c < 0x80) {
            too_large |= len > 5;
            noncanonical |= len > 1 && c == 0;
            if (got < count)
                o[got] = v;
            got++;
            v = 0;
            len = 0;
        }
    }
    if (got != count || len != 0)
        code = 1;
    else if (too_large)
        code = 2;
    else if (noncanonical)
        code = 3;
    PyBuffer_Release(&buf);
    PyBuffer_Release(&out);
    return PyLong_FromLong(code);
}

/* pack_fields(values, R, m) -> bytes or None: the int64 values as R-bit little-endian fields of
 * one bit string (value i at bit i * R); its first m bytes, or None when a bit at or past 8 * m
 * is set (floatsplit's lane end states that hold bits past the stored bytes). */
static PyObject *pack_fields(PyObject *self, PyObject *args)
{
    Py_buffer vals = {0};
    Py_ssize_t R, m;
    if (!PyArg_ParseTuple(args, "y*nn", &vals, &R, &m))
        return NULL;
    const Py_ssize_t count = vals.len / 8;
    if (R < 1 || R > 32 || m < 0 || m * 8 > count * R + 7) {
        PyBuffer_Release(&vals);
        PyErr_SetString(PyExc_ValueError, "pack_fields: bad arguments");
        return NULL;
    }
    PyObject *res = PyBytes_FromStringAndSize(NULL, m);
    if (!res) {
        PyBuffer_Release(&vals);
        return NULL;
    }
    uint8_t *o = (uint8_t *)PyBytes_AS_STRING(res);
    memset(o, 0, m);
    const int64_t *v = vals.buf;
    const uint64_t limit = (uint64_t)m * 8;
    int past = 0;
    for (Py_ssize_t i = 0; i < count; i++) {     /* bits above R are not part of a field */
        const uint64_t x = (uint64_t)v[i], bit0 = (uint64_t)i * R;
        for (Py_ssize_t q = 0; q < R; q++) {
            if (!((x >> q) & 1))
                continue;
            const uint64_t bit = bit0 + q;
            if (bit >= limit)
                past = 1;
            else
                o[bit >> 3] |= (uint8_t)(1u << (bit & 7));
        }
    }
    PyBuffer_Release(&vals);
    if (past) {
        Py_DECREF(res);
        Py_RETURN_NONE;
    }
    return res;
}

static PyMethodDef methods[] = {
    {"decode", decode, METH_VARARGS, "Decode a tANS stream; see the comment at the top of _tansloop.c."},
    {"build", build, METH_VARARGS, "Build decoder entries; see the comment above build()."},
    {"quantize_rows", quantize_rows, METH_VARARGS, "tans.quantize_rows; see the comment above it."},
    {"pack_fields", pack_fields, METH_VARARGS, "floatsplit's bits-back bytes; see the comment above it."},
    {"varints", varints, METH_VARARGS, "tans.unpack_uints's varint decoding; see the comment above it."},
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
