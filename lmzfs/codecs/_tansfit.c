/* The encoders' passes over a chunk, compiled: floatsplit's bit fields, histograms, row means,
 * row-class histograms and stored planes, and tans.encode's per-symbol table rows. Each gives
 * exactly what the numpy code it stands in for gives (floatsplit.py and tans.py keep that code as
 * the reference the tests compare against).
 *
 * Why C: numpy makes one pass over the chunk per operation, with int64 temporaries, and its calls
 * between them hold Python's lock; `lmz add` spent most of its time there, on one core of two.
 * These loops make one pass each and release the lock, so that the pool's threads encode at once. */
#include "_tansloop.h"

#include <stdlib.h>
#include <string.h>

/* The elements these passes read: n unsigned integers of 2, 4 or 8 bytes (a chunk's floats as
 * they are, without widening them to 64 bits first: for BF16 that copy moved four times the
 * chunk's bytes). Their width is u's length over n, which must be exact. */
static int element_width(const Py_buffer *u, Py_ssize_t n)
{
    if (n < 1)
        return 0;
    const Py_ssize_t w = u->len / n;
    return u->len == n * w && (w == 2 || w == 4 || w == 8) ? (int)w : 0;
}

static inline uint64_t element(const void *p, const int w, Py_ssize_t i)
{
    return w == 2 ? ((const uint16_t *)p)[i] : w == 4 ? ((const uint32_t *)p)[i] : ((const uint64_t *)p)[i];
}

/* a loop body once for each element width, so that each copy reads its elements without a branch */
#define FOR_EACH_WIDTH(w, ...) \
    do { \
        if ((w) == 2) { const int W = 2; __VA_ARGS__ } \
        else if ((w) == 4) { const int W = 4; __VA_ARGS__ } \
        else { const int W = 8; __VA_ARGS__ } \
    } while (0)

/* float_range(u, n, mb, eb) -> (emin, emax): the smallest and largest exponent field of the n
 * elements (see element_width) */
PyObject *tans_float_range(PyObject *self, PyObject *args)
{
    TANS_BUFFER u = {0};
    Py_ssize_t n, mb, eb;
    if (!PyArg_ParseTuple(args, "y*nnn", &u, &n, &mb, &eb))
        return NULL;
    const int w = element_width(&u, n);
    if (!w || mb < 0 || eb < 1 || mb + eb > 8 * w - 1)
        return tans_bad_arguments("float_range");
    const uint64_t m = (UINT64_C(1) << eb) - 1;
    uint64_t lo = m, hi = 0;
    Py_BEGIN_ALLOW_THREADS
    FOR_EACH_WIDTH(w, {
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint64_t e = (element(u.buf, W, i) >> mb) & m;
            lo = e < lo ? e : lo;
            hi = e > hi ? e : hi;
        }
    });
    Py_END_ALLOW_THREADS
    return Py_BuildValue("(KK)", (unsigned long long)lo, (unsigned long long)hi);
}

/* float_fields(u, n, bits, mb, eb, k, emin, emax, e, sym, cM, sg, H): for every element (see
 * element_width)
 *   e[i]   (uint16) = exponent - emin
 *   sym[i] (int64, or uint16 where every symbol fits) = e[i] * 2**(k+1) + (sign << k | top k mantissa bits)
 * and the histograms fit_model counts: cM[e * 2**k + top mantissa bits] (E x 2**k), sg[sign],
 * H[min(emax - exponent[i-1], 15) * E + e[i]] over i >= 1 (16 x E). The histograms must be zeroed. */
PyObject *tans_float_fields(PyObject *self, PyObject *args)
{
    TANS_BUFFER u = {0}, eo = {0}, so = {0}, cm = {0}, sg = {0}, hh = {0};
    Py_ssize_t n, bits, mb, eb, k, emin, emax;
    if (!PyArg_ParseTuple(args, "y*nnnnnnnw*w*w*w*w*", &u, &n, &bits, &mb, &eb, &k, &emin, &emax,
                          &eo, &so, &cm, &sg, &hh))
        return NULL;
    const Py_ssize_t E = emax - emin + 1;
    const int w = element_width(&u, n);
    const int narrow = so.len == n * 2;
    if (!w || bits < 2 || bits > 8 * w || k < 0 || mb < k || eb < 1 || mb + eb + 1 != bits ||
        emin < 0 || E < 1 || emax >= (Py_ssize_t)1 << eb || eo.len < n * 2 || (so.len != n * 8 && !narrow) ||
        (narrow && E << (k + 1) > 65536) ||
        cm.len < E * ((Py_ssize_t)8 << k) || sg.len < 16 || hh.len < 16 * E * 8)
        return tans_bad_arguments("float_fields");
    uint16_t *restrict e = eo.buf;
    int64_t *restrict sym = narrow ? NULL : so.buf, *restrict cM = cm.buf, *restrict S = sg.buf, *restrict H = hh.buf;
    uint16_t *restrict sym16 = narrow ? so.buf : NULL;
    const uint64_t em = (UINT64_C(1) << eb) - 1, km = (UINT64_C(1) << k) - 1;
    const int rb = (int)(mb - k), sb = (int)(bits - 1);
    const int64_t T2 = INT64_C(2) << k;
    int64_t s1 = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    FOR_EACH_WIDTH(w, {
        int64_t prev = 0;
        for (Py_ssize_t i = 0; i < n; i++) {
            const uint64_t v = element(u.buf, W, i);
            const int64_t x = (int64_t)((v >> mb) & em), top = (int64_t)(v >> rb & km), sign = (int64_t)(v >> sb & 1);
            const int64_t ei = x - emin;
            if (ei < 0 || ei >= E) {
                bad = 1;
                break;
            }
            e[i] = (uint16_t)ei;
            const int64_t si = ei * T2 + (sign << k | top);
            if (narrow)
                sym16[i] = (uint16_t)si;
            else
                sym[i] = si;
            cM[(ei << k) + top]++;
            s1 += sign;
            if (i)
                H[(prev < 15 ? prev : 15) * E + ei]++;
            prev = emax - x;
        }
    });
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "float_fields: an exponent is outside [emin, emax]");
        return NULL;
    }
    S[0] += n - s1;
    S[1] += s1;
    return Py_NewRef(Py_None);
}

/* float_planes(u, n, raw_bits, out): the low raw_bits bits of each element (see element_width)
 * as planes, lowest first: out[j * n + i] = byte j of element i, then (raw_bits % 8) the nibble
 * above them. */
PyObject *tans_float_planes(PyObject *self, PyObject *args)
{
    TANS_BUFFER u = {0}, out = {0};
    Py_ssize_t n, raw_bits;
    if (!PyArg_ParseTuple(args, "y*nnw*", &u, &n, &raw_bits, &out))
        return NULL;
    const Py_ssize_t whole = raw_bits / 8, np_ = whole + (raw_bits % 8 ? 1 : 0);
    const int w = n == 0 && u.len == 0 ? 8 : element_width(&u, n);
    if (n < 0 || !w || raw_bits < 0 || raw_bits > 8 * w || out.len < np_ * n)
        return tans_bad_arguments("float_planes");
    uint8_t *restrict o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    FOR_EACH_WIDTH(w, {
        for (Py_ssize_t j = 0; j < whole; j++)
            for (Py_ssize_t i = 0; i < n; i++)
                o[j * n + i] = (uint8_t)(element(u.buf, W, i) >> (8 * j));
        if (np_ > whole)
            for (Py_ssize_t i = 0; i < n; i++)
                o[whole * n + i] = (uint8_t)(element(u.buf, W, i) >> (8 * whole) & 15);
    });
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}

/* zero_blocks(planes, n, nplanes, blog, z) -> bool: for each block b of 2**blog elements (the last
 * one may be shorter), z[b] = how many of the lowest planes are zero over the whole block (plane j
 * counts only if every plane below it does); planes: uint8[nplanes * n], plane j at j * n (what
 * float_planes writes). Returns whether any block has a zero plane. */
PyObject *tans_zero_blocks(PyObject *self, PyObject *args)
{
    TANS_BUFFER pl = {0}, zo = {0};
    Py_ssize_t n, np_, blog;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &pl, &n, &np_, &blog, &zo))
        return NULL;
    const Py_ssize_t B = blog >= 0 && blog < 31 ? (Py_ssize_t)1 << blog : 1, nblk = n > 0 ? (n - 1) / B + 1 : 0;
    if (n < 0 || np_ < 0 || np_ > 255 || blog < 0 || blog > 30 || pl.len < np_ * n || zo.len < nblk)
        return tans_bad_arguments("zero_blocks");
    const uint8_t *restrict p = pl.buf;
    uint8_t *restrict z = zo.buf;
    int any = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t b = 0; b < nblk; b++) {
        const Py_ssize_t lo = b * B, hi = lo + B < n ? lo + B : n;
        Py_ssize_t j = 0;
        for (; j < np_; j++) {
            const uint8_t *restrict q = p + j * n;
            uint8_t or_ = 0;
            for (Py_ssize_t i = lo; i < hi; i++)
                or_ |= q[i];
            if (or_)
                break;
        }
        z[b] = (uint8_t)j;
        any |= j != 0;
    }
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(any);
}

/* The rows the row_* functions walk: n elements cut every C, the first row `shift` short, so that
 * element i is in row (i + shift) // C. */
struct rows {
    Py_ssize_t n, C, shift;
    Py_ssize_t count;           /* set by rows_fit */
};

/* Whether (n, C, shift) is a layout (n, C >= 1, 0 <= shift < C); counts its rows. */
static inline int rows_fit(struct rows *rw)
{
    rw->count = rw->n > 0 && rw->C > 0 ? (rw->n - 1 + rw->shift) / rw->C + 1 : 0;
    return rw->n >= 1 && rw->C >= 1 && rw->shift >= 0 && rw->shift < rw->C;
}

/* Where row r ends (exclusive). */
static inline Py_ssize_t row_end(const struct rows *rw, Py_ssize_t r)
{
    const Py_ssize_t end = (r + 1) * rw->C - rw->shift;
    return end < rw->n ? end : rw->n;
}

/* row_means(e, n, C, shift, out): out[r] = the mean of e over row r, where element i is in row
 * (i + shift) // C (the sums of small integers are exact, so this is numpy's bincount quotient). */
PyObject *tans_row_means(PyObject *self, PyObject *args)
{
    TANS_BUFFER eb = {0}, out = {0};
    struct rows rw;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &eb, &rw.n, &rw.C, &rw.shift, &out))
        return NULL;
    if (!rows_fit(&rw) || eb.len < rw.n * 2 || out.len < rw.count * 8)
        return tans_bad_arguments("row_means");
    const Py_ssize_t nrows = rw.count;
    const uint16_t *restrict e = eb.buf;
    double *restrict m = out.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        const Py_ssize_t end = row_end(&rw, r);
        int64_t s = 0;
        const Py_ssize_t c = end - i;
        for (; i < end; i++)
            s += e[i];
        m[r] = (double)s / (double)(c > 1 ? c : 1);
    }
    Py_END_ALLOW_THREADS
    return Py_NewRef(Py_None);
}

/* row_order_stats(e, n, C, shift, E, ranks, out) -> bool: out[j] = the ranks[j]-th smallest row
 * mean (0-based, ranks ascending), the rows and means being row_means's, as numpy's partition
 * finds them. Every full row's mean is its integer sum over C, so one counting pass over the sums
 * orders them (at most two rows, the first and the last, are shorter and are merged in by value);
 * False, with nothing written, when the sums span too many values for that to be cheaper than a
 * partition (the caller partitions instead). */
PyObject *tans_row_order_stats(PyObject *self, PyObject *args)
{
    TANS_BUFFER eb = {0}, rb = {0}, out = {0};
    struct rows rw;
    Py_ssize_t E;
    if (!PyArg_ParseTuple(args, "y*nnnny*w*", &eb, &rw.n, &rw.C, &rw.shift, &E, &rb, &out))
        return NULL;
    const Py_ssize_t nr = rb.len / 8;
    int bad = !rows_fit(&rw) || E < 1 || eb.len < rw.n * 2 || out.len < nr * 8;
    const Py_ssize_t C = rw.C, nrows = rw.count;
    const int64_t *restrict ranks = rb.buf;
    for (Py_ssize_t j = 0; j < nr && !bad; j++)
        bad = ranks[j] < 0 || ranks[j] >= nrows || (j && ranks[j] < ranks[j - 1]);
    if (bad)
        return tans_bad_arguments("row_order_stats");
    const Py_ssize_t bins = (E - 1) * C + 1;
    if (bins > 4 * nrows)
        return Py_NewRef(Py_False);
    int64_t *hist = calloc((size_t)bins, sizeof(int64_t));
    if (!hist)
        return PyErr_NoMemory();
    const uint16_t *restrict e = eb.buf;
    double *restrict o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    double extra[2];
    int nx = 0;
    Py_ssize_t i = 0;
    for (Py_ssize_t r = 0; r < nrows && !bad; r++) {
        const Py_ssize_t end = row_end(&rw, r);
        int64_t s = 0;
        const Py_ssize_t c = end - i;
        for (; i < end; i++) {
            if (e[i] >= E)
                bad = 1;
            s += e[i];
        }
        if (bad)
            break;
        if (c == C)
            hist[s]++;
        else
            extra[nx++] = (double)s / (double)(c > 1 ? c : 1);
    }
    if (nx == 2 && extra[1] < extra[0]) {
        const double t = extra[0];
        extra[0] = extra[1];
        extra[1] = t;
    }
    /* walk the means in ascending order: the bins' values s / C with the short rows merged in */
    int64_t pos = 0;
    Py_ssize_t j = 0, s = 0;
    int x = 0;
    while (!bad && j < nr) {
        double v;
        int64_t cnt;
        const double vb = s < bins ? (double)s / (double)C : 0.0;
        if (x < nx && (s >= bins || extra[x] <= vb)) {
            v = extra[x++];
            cnt = 1;
        } else if (s < bins) {
            v = vb;
            cnt = hist[s++];
        } else
            break;
        for (; j < nr && ranks[j] < pos + cnt; j++)
            o[j] = v;
        pos += cnt;
    }
    Py_END_ALLOW_THREADS
    free(hist);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "row_order_stats: an exponent is outside the range");
        return NULL;
    }
    return Py_NewRef(Py_True);
}

/* row_classes(e, n, C, shift, means, edges, E, cls, hist): cls[r] = how many of the (sorted)
 * edges are <= means[r] (numpy's searchsorted, side "right"), and hist[cls[row of i] * E + e[i]]
 * counted over every element (hist zeroed, (len(edges) + 1) x E). */
PyObject *tans_row_classes(PyObject *self, PyObject *args)
{
    TANS_BUFFER eb = {0}, mb = {0}, ed = {0}, cl = {0}, hb = {0};
    struct rows rw;
    Py_ssize_t E;
    if (!PyArg_ParseTuple(args, "y*nnny*y*nw*w*", &eb, &rw.n, &rw.C, &rw.shift, &mb, &ed, &E, &cl, &hb))
        return NULL;
    const Py_ssize_t ne = ed.len / 8;
    if (!rows_fit(&rw) || E < 1 || eb.len < rw.n * 2 || mb.len < rw.count * 8 || cl.len < rw.count * 8 ||
        hb.len < (ne + 1) * E * 8)
        return tans_bad_arguments("row_classes");
    const Py_ssize_t nrows = rw.count;
    const uint16_t *restrict e = eb.buf;
    const double *restrict m = mb.buf, *restrict edges = ed.buf;
    int64_t *restrict cls = cl.buf, *restrict h = hb.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    for (Py_ssize_t r = 0; r < nrows && !bad; r++) {
        int64_t c = 0;
        for (Py_ssize_t q = 0; q < ne; q++)
            c += edges[q] <= m[r];
        cls[r] = c;
        const Py_ssize_t end = row_end(&rw, r);
        int64_t *row = h + c * E;
        for (; i < end; i++) {
            if (e[i] >= E) {
                bad = 1;
                break;
            }
            row[e[i]]++;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "row_classes: an exponent is outside the range");
        return NULL;
    }
    return Py_NewRef(Py_None);
}

/* row_contexts(cls, n, C, shift, out): out[i] = cls[(i + shift) // C], out int64[n] or uint8[n]
 * (classes are below 256; the 8-bit contexts are what tans.encode reads, an eighth of the bytes).
 * Row by row: no division per element. */
PyObject *tans_row_contexts(PyObject *self, PyObject *args)
{
    TANS_BUFFER cl = {0}, out = {0};
    struct rows rw;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &cl, &rw.n, &rw.C, &rw.shift, &out))
        return NULL;
    if (!rows_fit(&rw) || cl.len < rw.count * 8 || (out.len != rw.n * 8 && out.len != rw.n))
        return tans_bad_arguments("row_contexts");
    const Py_ssize_t n = rw.n, nrows = rw.count;
    const int64_t *restrict c = cl.buf;
    int64_t *restrict o = out.len == n * 8 ? out.buf : NULL;
    uint8_t *restrict o8 = o ? NULL : out.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t r = 0, i = 0; r < nrows; r++) {
        const Py_ssize_t end = row_end(&rw, r);
        const int64_t v = c[r];
        bad |= o8 && (v < 0 || v > 255);
        for (; i < end; i++) {
            if (o)
                o[i] = v;
            else
                o8[i] = (uint8_t)v;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "row_contexts: a class does not fit in 8 bits");
        return NULL;
    }
    return Py_NewRef(Py_None);
}

/* The rows of encode_rows, for one width of symbols (wide: int64, else uint16) and of contexts
 * (cwide: int64, else uint8), so that each copy of the loop reads its arrays without a branch. */
static inline int encode_rows_loop(const void *symv, const int wide, Py_ssize_t n, const void *ctxv, const int cwide,
                                   const int64_t *restrict cmap, Py_ssize_t ncmap, Py_ssize_t c0, Py_ssize_t T,
                                   Py_ssize_t S, const int64_t *restrict fr, Py_ssize_t nrows,
                                   int64_t *restrict out, uint16_t *restrict out16)
{
    const int64_t *restrict s64 = symv;
    const uint16_t *restrict s16 = symv;
    const int64_t *restrict c64 = ctxv;
    const uint8_t *restrict c8 = ctxv;
    Py_ssize_t step = 0;        /* i % T, counted: a division per symbol cost more than the rest */
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t s = wide ? s64[i] : s16[i];
        int64_t c = 0;
        if (ctxv)
            c = cwide ? c64[i] : c8[i];
        else if (cmap) {
            if (step == 0)
                c = c0;
            else {
                const int64_t p = wide ? s64[i - 1] : s16[i - 1];
                if (p < 0 || p >= ncmap)
                    return 0;
                c = cmap[p];
            }
            if (++step == T)
                step = 0;
        }
        const int64_t r = c * S + s;
        if (s < 0 || s >= S || c < 0 || r >= nrows || fr[r] == 0)
            return 0;
        if (out)
            out[i] = r;
        else
            out16[i] = (uint16_t)r;
    }
    return 1;
}

/* encode_rows(sym, n, ctx, cmap, c0, T, S, fr, out) -> bool: tans.encode's row of each symbol,
 * out[i] = context * S + sym[i], where the context is ctx[i] (ctx given), cmap[sym[i - 1]] with
 * c0 at every lane start i % T == 0 (cmap given: contiguous lanes of T steps), or 0; False when
 * a row is out of range or has frequency 0 in fr (the caller raises). sym is int64[n] or
 * uint16[n], ctx int64[n] or uint8[n]; out is int64[n], or uint16[n] where fr has at most 65536
 * rows. */
PyObject *tans_encode_rows(PyObject *self, PyObject *args)
{
    TANS_BUFFER sb = {0}, cb = {0}, mb = {0}, fb = {0}, ob = {0};
    PyObject *ctxo, *cmapo;
    Py_ssize_t n, c0, T, S;
    if (!PyArg_ParseTuple(args, "y*nOOnnny*w*", &sb, &n, &ctxo, &cmapo, &c0, &T, &S, &fb, &ob))
        return NULL;
    if ((ctxo != Py_None && PyObject_GetBuffer(ctxo, &cb, PyBUF_SIMPLE) < 0) ||
        (cmapo != Py_None && PyObject_GetBuffer(cmapo, &mb, PyBUF_SIMPLE) < 0))
        return NULL;
    const Py_ssize_t nrows = fb.len / 8, ncmap = mb.len / 8;
    if (n < 1 || T < 1 || S < 1 || (sb.len != n * 8 && sb.len != n * 2) ||
        (ob.len != n * 8 && !(ob.len == n * 2 && nrows <= 65536)) || (cb.buf && cb.len != n * 8 && cb.len != n))
        return tans_bad_arguments("encode_rows");
    const int64_t *restrict cmap = mb.buf, *restrict fr = fb.buf;
    int64_t *restrict out = ob.len == n * 8 ? ob.buf : NULL;
    uint16_t *restrict out16 = out ? NULL : ob.buf;    /* 16-bit rows: see _tansenc.c */
    const int wide = sb.len == n * 8, cwide = cb.buf && cb.len == n * 8;
    int ok;
    Py_BEGIN_ALLOW_THREADS
    if (wide && cwide)
        ok = encode_rows_loop(sb.buf, 1, n, cb.buf, 1, cmap, ncmap, c0, T, S, fr, nrows, out, out16);
    else if (wide)
        ok = encode_rows_loop(sb.buf, 1, n, cb.buf, 0, cmap, ncmap, c0, T, S, fr, nrows, out, out16);
    else if (cwide)
        ok = encode_rows_loop(sb.buf, 0, n, cb.buf, 1, cmap, ncmap, c0, T, S, fr, nrows, out, out16);
    else
        ok = encode_rows_loop(sb.buf, 0, n, cb.buf, 0, cmap, ncmap, c0, T, S, fr, nrows, out, out16);
    Py_END_ALLOW_THREADS
    return PyBool_FromLong(ok);
}
