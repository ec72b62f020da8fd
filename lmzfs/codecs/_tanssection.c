/* The encoder's passes over a tANS symbol section (entropy.tans_section), compiled: the numpy
 * code in entropy.py computes the same integers and stays the reference the tests compare
 * against (and the path where this extension is not built).
 *
 * Why C: a section codes up to a whole chunk of symbols, and numpy made every step of it an
 * int64 copy of the chunk (the symbols, their contexts, their table rows, the histogram's
 * indices, the tails' symbols and contexts) with the lock held between the steps, so the
 * encoder threads of `lmz add` took turns on it instead of running side by side.
 *
 * Symbols and contexts are uint8[n] or int64[n] (told apart by their length); contexts may be
 * None (all 0). The lanes are interleaved: lane j of Wp holds symbols t * Wp + j, T of them if
 * j < n - (T - 1) * Wp, else T - 1; a symbol of lane j at step t is at depth len - 1 - t from
 * the lane's end (the last symbol is at depth 0).
 *
 * section_counts(sym, ctx, n, S, K, T, Wp, D, counts, depth) -> bool
 *   counts int64[K * S] (zeroed): counts[c * S + s] over every symbol; depth int64[D * K * S]
 *   (zeroed) or None: depth[d * K * S + c * S + s] over the symbols at depth d < D. False (and
 *   the counts half made) if a symbol is >= S or a context >= K.
 * section_model(sym, ctx, n, S, K, T, Wp, D, freqs) -> (R, g)
 *   the counts above, then the section's table log, frequencies and tail width (see below).
 * section_rows(sym, ctx, n, S, K, T, Wp, k, g, fr, rows, bb) -> bool
 *   rows int64[n] or uint16[n] (told apart by length): each symbol's table row, c * S + s, or
 *   for the last k symbols of every lane (g > 0) the marginal's row (c + K) * S + (s >> g); bb
 *   int64[Wp] (zeroed): the low g bits of lane j's q-th tail (its symbol at step len - k + q,
 *   where that is >= 0) at bits q * g of bb[j]. False if a row's frequency fr[row] is 0 or a
 *   symbol or context is out of range.
 */
#include "_tansloop.h"
#include <math.h>
#include <stdlib.h>

struct symbols {
    const uint8_t *s8, *c8;
    const int64_t *s64, *c64;
};

/* n values held as uint8 or as int64, told apart by the buffer's length; 0 if it is neither. */
static int either_width(const Py_buffer *b, Py_ssize_t n, const uint8_t **p8, const int64_t **p64)
{
    if (b->len == n)
        *p8 = b->buf;
    else if (b->len == 8 * n)
        *p64 = b->buf;
    else
        return 0;
    return 1;
}

static int symbols_of(Py_buffer *sb, Py_buffer *cb, Py_ssize_t n, struct symbols *out)
{
    *out = (struct symbols){0};
    return either_width(sb, n, &out->s8, &out->s64) && (!cb->buf || either_width(cb, n, &out->c8, &out->c64));
}

static inline int64_t sym_at(const struct symbols *v, Py_ssize_t i)
{
    return v->s8 ? v->s8[i] : v->s64[i];
}

static inline int64_t ctx_at(const struct symbols *v, Py_ssize_t i)
{
    return v->c8 ? v->c8[i] : v->c64 ? v->c64[i] : 0;
}

static int layout_ok(Py_ssize_t n, Py_ssize_t T, Py_ssize_t Wp)
{
    return n >= 1 && T >= 1 && Wp >= 1 && (T - 1) * Wp < n && T * Wp >= n;
}

static int get_optional(PyObject *o, Py_buffer *b, int writable)
{
    if (o == Py_None)
        return 0;
    return PyObject_GetBuffer(o, b, writable ? PyBUF_WRITABLE : PyBUF_SIMPLE);
}

/* The counts of section_counts into h (K * S, zeroed) and, with dh, the depth counts (D * K * S,
 * zeroed; layout checked by the caller); 0 if a symbol or context is out of range. */
static int count_section(const struct symbols *vp, Py_ssize_t n, Py_ssize_t S, Py_ssize_t K, Py_ssize_t T,
                         Py_ssize_t Wp, Py_ssize_t D, int64_t *restrict h, int64_t *restrict dh)
{
    const struct symbols v = *vp;
    const Py_ssize_t KS = K * S;
    int ok = 1;
    if (v.s8 && !v.c8 && !v.c64 && S >= 256) {
        /* order-0 bytes: four histograms side by side, so that runs of one byte value do not
         * wait on the same counter */
        int64_t part[4][256] = {{0}};
        Py_ssize_t i = 0;
        for (; i + 4 <= n; i += 4) {
            part[0][v.s8[i]]++;
            part[1][v.s8[i + 1]]++;
            part[2][v.s8[i + 2]]++;
            part[3][v.s8[i + 3]]++;
        }
        for (; i < n; i++)
            part[0][v.s8[i]]++;
        for (int s = 0; s < 256; s++)
            h[s] += part[0][s] + part[1][s] + part[2][s] + part[3][s];
    } else {
        for (Py_ssize_t i = 0; i < n; i++) {
            const int64_t s = sym_at(&v, i), c = ctx_at(&v, i);
            if (s < 0 || s >= S || c < 0 || c >= K) {
                ok = 0;
                break;
            }
            h[c * S + s]++;
        }
    }
    if (ok && dh) {
        const Py_ssize_t last = n - (T - 1) * Wp;      /* lanes with T symbols */
        for (Py_ssize_t j = 0; j < Wp; j++) {
            const Py_ssize_t len = j < last ? T : T - 1;
            for (Py_ssize_t d = 0; d < D && d < len; d++) {
                const Py_ssize_t i = (len - 1 - d) * Wp + j;
                dh[d * KS + ctx_at(&v, i) * S + sym_at(&v, i)]++;   /* in range: checked above */
            }
        }
    }
    return ok;
}

PyObject *tans_section_counts(PyObject *self, PyObject *args)
{
    TANS_BUFFER sb = {0}, cb = {0}, hb = {0}, db = {0};
    PyObject *ctxo, *deptho;
    Py_ssize_t n, S, K, T, Wp, D;
    if (!PyArg_ParseTuple(args, "y*Onnnnnnw*O", &sb, &ctxo, &n, &S, &K, &T, &Wp, &D, &hb, &deptho))
        return NULL;
    struct symbols v;
    if (get_optional(ctxo, &cb, 0) < 0 || get_optional(deptho, &db, 1) < 0)
        return NULL;
    const Py_ssize_t KS = K * S;
    if (n < 1 || S < 1 || K < 1 || KS > (Py_ssize_t)1 << 24 || !symbols_of(&sb, &cb, n, &v) ||
        hb.len < KS * 8 || (db.buf && (D < 1 || !layout_ok(n, T, Wp) || db.len < D * KS * 8)))
        return tans_bad_arguments("section_counts");
    int64_t *restrict h = hb.buf, *restrict dh = db.buf;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    ok = count_section(&v, n, S, K, T, Wp, D, h, dh);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

PyObject *tans_section_rows(PyObject *self, PyObject *args)
{
    TANS_BUFFER sb = {0}, cb = {0}, fb = {0}, rb = {0}, bbb = {0};
    PyObject *ctxo;
    Py_ssize_t n, S, K, T, Wp, k, g;
    if (!PyArg_ParseTuple(args, "y*Onnnnnnny*w*w*", &sb, &ctxo, &n, &S, &K, &T, &Wp, &k, &g, &fb, &rb, &bbb))
        return NULL;
    struct symbols v;
    if (get_optional(ctxo, &cb, 0) < 0)
        return NULL;
    const Py_ssize_t nrows = fb.len / 8;
    if (n < 1 || S < 1 || K < 1 || g < 0 || g > 8 || (g && (k < 1 || k > T || k * g > 62)) ||
        !layout_ok(n, T, Wp) || !symbols_of(&sb, &cb, n, &v) || (rb.len != n * 8 && rb.len != n * 2) ||
        bbb.len < Wp * 8 || nrows < (g ? 2 : 1) * K * S || (rb.len == n * 2 && nrows > 65536))
        return tans_bad_arguments("section_rows");
    const int64_t *restrict fr = fb.buf;
    int64_t *restrict rows = rb.len == n * 8 ? rb.buf : NULL, *restrict bb = bbb.buf;
    uint16_t *restrict rows16 = rows ? NULL : rb.buf;
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    if (rows16 && v.s8 && !v.c64) {
        /* the common case, bytes in and 16-bit rows out, as one loop the compiler widens */
        const uint8_t *restrict s8 = v.s8, *restrict c8 = v.c8;
        uint8_t over = 0;
        if (c8)
            for (Py_ssize_t i = 0; i < n; i++) {
                over |= (s8[i] >= S) | (c8[i] >= K);
                rows16[i] = (uint16_t)(c8[i] * S + s8[i]);
            }
        else
            for (Py_ssize_t i = 0; i < n; i++) {
                over |= s8[i] >= S;
                rows16[i] = s8[i];
            }
        ok = !over;
    } else
        for (Py_ssize_t i = 0; i < n; i++) {
            const int64_t s = sym_at(&v, i), c = ctx_at(&v, i);
            if (s < 0 || s >= S || c < 0 || c >= K) {
                ok = 0;
                break;
            }
            if (rows)
                rows[i] = c * S + s;
            else
                rows16[i] = (uint16_t)(c * S + s);
        }
    if (ok && g) {
        const Py_ssize_t last = n - (T - 1) * Wp;
        const int64_t mask = (INT64_C(1) << g) - 1;
        for (Py_ssize_t j = 0; j < Wp; j++) {
            const Py_ssize_t len = j < last ? T : T - 1;
            int64_t bits = 0;
            for (Py_ssize_t q = 0; q < k; q++) {
                const Py_ssize_t t = len - k + q;
                if (t < 0)
                    continue;
                const Py_ssize_t i = t * Wp + j;
                const int64_t s = sym_at(&v, i);
                bits |= (s & mask) << (g * q);
                const int64_t r = (ctx_at(&v, i) + K) * S + (s >> g);
                if (rows)
                    rows[i] = r;
                else
                    rows16[i] = (uint16_t)r;
            }
            bb[j] = bits;
        }
    }
    for (Py_ssize_t i = 0; ok && i < n; i++)
        if (fr[rows ? rows[i] : rows16[i]] == 0)
            ok = 0;
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}

/* entropy._table_log on the counts (K x S): the smallest table log, from the smallest that holds
 * every row's symbols up to 14 (less where the tables would outgrow the section), whose rounding
 * costs at most 0.05% of the entropy plus 8 bits. Sums run in row-major order, one term after
 * the other, and logs are libm's log2: entropy._table_log computes the same doubles. f is
 * K * S scratch; 0 when a row cannot be quantised (a bug: the caller raises). */
static int64_t table_log(const int64_t *counts, int64_t n, int64_t S, int64_t K, int64_t *f,
                         unsigned char *small, struct remainder *big)
{
    int64_t used = 0;
    for (int64_t k = 0; k < K; k++) {
        int64_t nnz = 0;
        for (int64_t s = 0; s < S; s++)
            nnz += counts[k * S + s] > 0;
        used = nnz > used ? nnz : used;
    }
    int64_t lo = 1;
    while (((int64_t)1 << (lo - 1)) <= used - 1)   /* bit length of used - 1, plus one */
        lo++;
    lo = lo > 6 ? lo : 6;
    int64_t hi = 14;
    const int64_t room = 8 * n > (1 << 16) ? 8 * n : (1 << 16);
    while (hi > lo && 2 * K * (((int64_t)1 << hi) + S) > room)
        hi--;
    double H = 0.0;
    for (int64_t k = 0; k < K; k++) {
        int64_t tot = 0;
        for (int64_t s = 0; s < S; s++)
            tot += counts[k * S + s];
        for (int64_t s = 0; s < S && tot; s++) {
            const int64_t c = counts[k * S + s];
            if (c > 0)
                H += (double)c * log2((double)c / (double)tot);
        }
    }
    H = -H;
    for (int64_t R = lo; R <= hi; R++) {
        const int64_t L = (int64_t)1 << R;
        double Hq = 0.0;
        for (int64_t k = 0; k < K; k++) {
            const int64_t *c = counts + k * S;
            int64_t any = 0;
            for (int64_t s = 0; s < S; s++)
                any |= c[s];
            if (!any)
                continue;
            if (!tans_quantize_counts(c, f, 1, S, L, small, big))
                return 0;
            for (int64_t s = 0; s < S; s++)
                if (c[s] > 0)
                    Hq += (double)c[s] * log2((double)f[s] / (double)L);
        }
        Hq = -Hq;
        if (Hq - H <= 0.0005 * H + 8)
            return R;
    }
    return lo > hi ? lo : hi;
}

/* section_model(sym, ctx, n, S, K, T, Wp, D, freqs) -> (R, g): tans_section's model in one call:
 * the counts, the table log R, the frequencies (freqs, int64 K * S: every used row quantised to
 * 2**R, an unused row all on symbol 0) and the tail width g whose estimated cost of the lanes'
 * last R // g symbols is lowest (0: no tails), as entropy._section_model_reference computes them,
 * double for double. D = min(15, T) depths of tails are counted. */
PyObject *tans_section_model(PyObject *self, PyObject *args)
{
    TANS_BUFFER sb = {0}, cb = {0}, fb = {0};
    PyObject *ctxo;
    Py_ssize_t n, S, K, T, Wp, D;
    if (!PyArg_ParseTuple(args, "y*Onnnnnnw*", &sb, &ctxo, &n, &S, &K, &T, &Wp, &D, &fb))
        return NULL;
    PyObject *result = NULL;
    int64_t *counts = NULL, *depth = NULL, *scratch = NULL, *upto = NULL;
    double *logp = NULL;
    unsigned char *small = NULL;
    struct remainder *big = NULL;
    struct symbols v;
    if (get_optional(ctxo, &cb, 0) < 0)
        goto done;
    const Py_ssize_t KS = K * S;
    if (n < 1 || S < 1 || K < 1 || KS > (Py_ssize_t)1 << 24 || !symbols_of(&sb, &cb, n, &v) || D < 1 || D > 15 ||
        !layout_ok(n, T, Wp) || fb.len != KS * 8) {
        PyErr_SetString(PyExc_ValueError, "section_model: bad arguments");
        goto done;
    }
    counts = calloc((size_t)KS, 8);
    depth = calloc((size_t)(D * KS), 8);
    scratch = malloc((size_t)S * 8);
    upto = malloc((size_t)(K * (S + 1)) * 8);
    logp = malloc((size_t)KS * sizeof *logp);
    small = malloc((size_t)S);
    big = malloc((size_t)S * sizeof *big);
    if (!counts || !depth || !scratch || !upto || !logp || !small || !big) {
        PyErr_NoMemory();
        goto done;
    }
    int64_t *restrict f = fb.buf;
    const char *err = NULL;
    int64_t R = 0, best_g = 0;
    Py_BEGIN_ALLOW_THREADS
    if (!count_section(&v, n, S, K, T, Wp, D, counts, depth))
        err = "tans section: a symbol or context out of range";
    else if (!(R = table_log(counts, n, S, K, scratch, small, big)))
        err = "section_model: a row cannot be quantised";
    const int64_t L = (int64_t)1 << R;
    for (int64_t k = 0; k < K && !err; k++) {
        int64_t any = 0;
        for (int64_t s = 0; s < S; s++)
            any |= counts[k * S + s];
        if (any) {
            if (!tans_quantize_counts(counts + k * S, f + k * S, 1, S, L, small, big))
                err = "section_model: a row cannot be quantised";
        } else {
            for (int64_t s = 0; s < S; s++)
                f[k * S + s] = s ? 0 : L;
        }
    }
    if (!err) {
        /* the tails: tails[k - 1] counts the last k symbols of every lane, the running sum of
         * depth over d (kept in depth itself) */
        for (int64_t d = 1; d < D; d++)
            for (int64_t i = 0; i < KS; i++)
                depth[d * KS + i] += depth[(d - 1) * KS + i];
        for (int64_t i = 0; i < KS; i++)
            logp[i] = log2((double)(f[i] > 0 ? f[i] : 1) / (double)L);
        for (int64_t k = 0; k < K; k++) {
            upto[k * (S + 1)] = 0;
            for (int64_t s = 0; s < S; s++)
                upto[k * (S + 1) + s + 1] = upto[k * (S + 1) + s] + f[k * S + s];
        }
        double best_extra = (double)R * (double)Wp;
        static const int64_t widths[] = {1, 2, 3, 4, 5, 8};
        for (int wi = 0; wi < 6; wi++) {
            const int64_t g = widths[wi];
            if (((int64_t)1 << g) > S)
                break;
            const int64_t kk = R / g;
            if (kk == 0 || kk > T)
                continue;
            const int64_t *tails = depth + (kk - 1 < D ? kk - 1 : D - 1) * KS;
            double extra = 0.0;
            for (int64_t c = 0; c < K; c++)
                for (int64_t s = 0; s < S; s++) {
                    const int64_t lo = (s >> g) << g, hi = lo + ((int64_t)1 << g) < S ? lo + ((int64_t)1 << g) : S;
                    const int64_t m = upto[c * (S + 1) + hi] - upto[c * (S + 1) + lo];
                    const double lpm = log2((double)(m > 0 ? m : 1) / (double)L);
                    extra += (double)tails[c * S + s] * ((logp[c * S + s] - lpm) + (double)g);
                }
            extra += (double)((R - kk * g) * Wp);
            if (extra < best_extra) {
                best_g = g;
                best_extra = extra;
            }
        }
    }
    Py_END_ALLOW_THREADS
    if (err)
        PyErr_SetString(PyExc_ValueError, err);
    else
        result = Py_BuildValue("(LL)", (long long)R, (long long)best_g);
done:
    FREE_ALL(counts, depth, scratch, upto, logp, small, big);
    return result;
}
