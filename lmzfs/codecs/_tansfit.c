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

/* float_range(u, n, mb, eb) -> (emin, emax): the smallest and largest exponent field of the n
 * elements (uint64) */
PyObject *tans_float_range(PyObject *self, PyObject *args)
{
    Py_buffer u = {0};
    Py_ssize_t n, mb, eb;
    if (!PyArg_ParseTuple(args, "y*nnn", &u, &n, &mb, &eb))
        return NULL;
    PyObject *result = NULL;
    if (n < 1 || u.len < n * 8 || mb < 0 || eb < 1 || mb + eb > 63) {
        PyErr_SetString(PyExc_ValueError, "float_range: bad arguments");
        goto done;
    }
    const uint64_t *restrict p = u.buf;
    const uint64_t m = (UINT64_C(1) << eb) - 1;
    uint64_t lo = m, hi = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint64_t e = (p[i] >> mb) & m;
        lo = e < lo ? e : lo;
        hi = e > hi ? e : hi;
    }
    Py_END_ALLOW_THREADS
    result = Py_BuildValue("(KK)", (unsigned long long)lo, (unsigned long long)hi);
done:
    PyBuffer_Release(&u);
    return result;
}

/* float_fields(u, n, bits, mb, eb, k, emin, emax, e, sym, cM, sg, H): for every element
 *   e[i]   (uint16) = exponent - emin
 *   sym[i] (int64)  = e[i] * 2**(k+1) + (sign << k | top k mantissa bits)
 * and the histograms fit_model counts: cM[e * 2**k + top mantissa bits] (E x 2**k), sg[sign],
 * H[min(emax - exponent[i-1], 15) * E + e[i]] over i >= 1 (16 x E). The histograms must be zeroed. */
PyObject *tans_float_fields(PyObject *self, PyObject *args)
{
    Py_buffer u = {0}, eo = {0}, so = {0}, cm = {0}, sg = {0}, hh = {0};
    Py_ssize_t n, bits, mb, eb, k, emin, emax;
    if (!PyArg_ParseTuple(args, "y*nnnnnnnw*w*w*w*w*", &u, &n, &bits, &mb, &eb, &k, &emin, &emax,
                          &eo, &so, &cm, &sg, &hh))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t E = emax - emin + 1;
    if (n < 1 || u.len < n * 8 || bits < 2 || bits > 64 || k < 0 || mb < k || eb < 1 || mb + eb + 1 != bits ||
        emin < 0 || E < 1 || emax >= (Py_ssize_t)1 << eb || eo.len < n * 2 || so.len < n * 8 ||
        cm.len < E * ((Py_ssize_t)8 << k) || sg.len < 16 || hh.len < 16 * E * 8) {
        PyErr_SetString(PyExc_ValueError, "float_fields: bad arguments");
        goto done;
    }
    const uint64_t *restrict p = u.buf;
    uint16_t *restrict e = eo.buf;
    int64_t *restrict sym = so.buf, *restrict cM = cm.buf, *restrict S = sg.buf, *restrict H = hh.buf;
    const uint64_t em = (UINT64_C(1) << eb) - 1, km = (UINT64_C(1) << k) - 1;
    const int rb = (int)(mb - k), sb = (int)(bits - 1);
    const int64_t T2 = INT64_C(2) << k;
    int64_t s1 = 0;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    int64_t prev = 0;
    for (Py_ssize_t i = 0; i < n; i++) {
        const uint64_t v = p[i];
        const int64_t x = (int64_t)((v >> mb) & em), top = (int64_t)(v >> rb & km), sign = (int64_t)(v >> sb & 1);
        const int64_t ei = x - emin;
        if (ei < 0 || ei >= E) {
            bad = 1;
            break;
        }
        e[i] = (uint16_t)ei;
        sym[i] = ei * T2 + (sign << k | top);
        cM[(ei << k) + top]++;
        s1 += sign;
        if (i)
            H[(prev < 15 ? prev : 15) * E + ei]++;
        prev = emax - x;
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "float_fields: an exponent is outside [emin, emax]");
        goto done;
    }
    S[0] += n - s1;
    S[1] += s1;
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&u);
    PyBuffer_Release(&eo);
    PyBuffer_Release(&so);
    PyBuffer_Release(&cm);
    PyBuffer_Release(&sg);
    PyBuffer_Release(&hh);
    return result;
}

/* float_planes(u, n, raw_bits, out): the low raw_bits bits of each element as planes, lowest
 * first: out[j * n + i] = byte j of element i, then (raw_bits % 8) the nibble above them. */
PyObject *tans_float_planes(PyObject *self, PyObject *args)
{
    Py_buffer u = {0}, out = {0};
    Py_ssize_t n, raw_bits;
    if (!PyArg_ParseTuple(args, "y*nnw*", &u, &n, &raw_bits, &out))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t whole = raw_bits / 8, np_ = whole + (raw_bits % 8 ? 1 : 0);
    if (n < 0 || u.len < n * 8 || raw_bits < 0 || raw_bits > 64 || out.len < np_ * n) {
        PyErr_SetString(PyExc_ValueError, "float_planes: bad arguments");
        goto done;
    }
    const uint64_t *restrict p = u.buf;
    uint8_t *restrict o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t j = 0; j < whole; j++)
        for (Py_ssize_t i = 0; i < n; i++)
            o[j * n + i] = (uint8_t)(p[i] >> (8 * j));
    if (np_ > whole)
        for (Py_ssize_t i = 0; i < n; i++)
            o[whole * n + i] = (uint8_t)(p[i] >> (8 * whole) & 15);
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&u);
    PyBuffer_Release(&out);
    return result;
}

/* zero_blocks(planes, n, nplanes, blog, z) -> bool: for each block b of 2**blog elements (the last
 * one may be shorter), z[b] = how many of the lowest planes are zero over the whole block (plane j
 * counts only if every plane below it does); planes: uint8[nplanes * n], plane j at j * n (what
 * float_planes writes). Returns whether any block has a zero plane. */
PyObject *tans_zero_blocks(PyObject *self, PyObject *args)
{
    Py_buffer pl = {0}, zo = {0};
    Py_ssize_t n, np_, blog;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &pl, &n, &np_, &blog, &zo))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t B = blog >= 0 && blog < 31 ? (Py_ssize_t)1 << blog : 1, nblk = n > 0 ? (n - 1) / B + 1 : 0;
    if (n < 0 || np_ < 0 || np_ > 255 || blog < 0 || blog > 30 || pl.len < np_ * n || zo.len < nblk) {
        PyErr_SetString(PyExc_ValueError, "zero_blocks: bad arguments");
        goto done;
    }
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
    result = PyBool_FromLong(any);
done:
    PyBuffer_Release(&pl);
    PyBuffer_Release(&zo);
    return result;
}

/* row_means(e, n, C, shift, out): out[r] = the mean of e over row r, where element i is in row
 * (i + shift) // C (the sums of small integers are exact, so this is numpy's bincount quotient). */
PyObject *tans_row_means(PyObject *self, PyObject *args)
{
    Py_buffer eb = {0}, out = {0};
    Py_ssize_t n, C, shift;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &eb, &n, &C, &shift, &out))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t nrows = n > 0 && C > 0 ? (n - 1 + shift) / C + 1 : 0;
    if (n < 1 || C < 1 || shift < 0 || shift >= C || eb.len < n * 2 || out.len < nrows * 8) {
        PyErr_SetString(PyExc_ValueError, "row_means: bad arguments");
        goto done;
    }
    const uint16_t *restrict e = eb.buf;
    double *restrict m = out.buf;
    Py_BEGIN_ALLOW_THREADS
    Py_ssize_t i = 0;
    for (Py_ssize_t r = 0; r < nrows; r++) {
        const Py_ssize_t end = (r + 1) * C - shift < n ? (r + 1) * C - shift : n;
        int64_t s = 0;
        const Py_ssize_t c = end - i;
        for (; i < end; i++)
            s += e[i];
        m[r] = (double)s / (double)(c > 1 ? c : 1);
    }
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&eb);
    PyBuffer_Release(&out);
    return result;
}

/* row_order_stats(e, n, C, shift, E, ranks, out) -> bool: out[j] = the ranks[j]-th smallest row
 * mean (0-based, ranks ascending), the rows and means being row_means's, as numpy's partition
 * finds them. Every full row's mean is its integer sum over C, so one counting pass over the sums
 * orders them (at most two rows, the first and the last, are shorter and are merged in by value);
 * False, with nothing written, when the sums span too many values for that to be cheaper than a
 * partition (the caller partitions instead). */
PyObject *tans_row_order_stats(PyObject *self, PyObject *args)
{
    Py_buffer eb = {0}, rb = {0}, out = {0};
    Py_ssize_t n, C, shift, E;
    if (!PyArg_ParseTuple(args, "y*nnnny*w*", &eb, &n, &C, &shift, &E, &rb, &out))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t nrows = n > 0 && C > 0 ? (n - 1 + shift) / C + 1 : 0, nr = rb.len / 8;
    const int64_t *restrict ranks = rb.buf;
    int bad = n < 1 || C < 1 || shift < 0 || shift >= C || E < 1 || eb.len < n * 2 || out.len < nr * 8;
    for (Py_ssize_t j = 0; j < nr && !bad; j++)
        bad = ranks[j] < 0 || ranks[j] >= nrows || (j && ranks[j] < ranks[j - 1]);
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "row_order_stats: bad arguments");
        goto done;
    }
    const Py_ssize_t bins = (E - 1) * C + 1;
    if (bins > 4 * nrows) {
        result = Py_NewRef(Py_False);
        goto done;
    }
    int64_t *hist = calloc((size_t)bins, sizeof(int64_t));
    if (!hist) {
        PyErr_NoMemory();
        goto done;
    }
    const uint16_t *restrict e = eb.buf;
    double *restrict o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    double extra[2];
    int nx = 0;
    Py_ssize_t i = 0;
    for (Py_ssize_t r = 0; r < nrows && !bad; r++) {
        const Py_ssize_t end = (r + 1) * C - shift < n ? (r + 1) * C - shift : n;
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
        goto done;
    }
    result = Py_NewRef(Py_True);
done:
    PyBuffer_Release(&eb);
    PyBuffer_Release(&rb);
    PyBuffer_Release(&out);
    return result;
}

/* row_classes(e, n, C, shift, means, edges, E, cls, hist): cls[r] = how many of the (sorted)
 * edges are <= means[r] (numpy's searchsorted, side "right"), and hist[cls[row of i] * E + e[i]]
 * counted over every element (hist zeroed, (len(edges) + 1) x E). */
PyObject *tans_row_classes(PyObject *self, PyObject *args)
{
    Py_buffer eb = {0}, mb = {0}, ed = {0}, cl = {0}, hb = {0};
    Py_ssize_t n, C, shift, E;
    if (!PyArg_ParseTuple(args, "y*nnny*y*nw*w*", &eb, &n, &C, &shift, &mb, &ed, &E, &cl, &hb))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t nrows = n > 0 && C > 0 ? (n - 1 + shift) / C + 1 : 0, ne = ed.len / 8;
    if (n < 1 || C < 1 || shift < 0 || shift >= C || E < 1 || eb.len < n * 2 || mb.len < nrows * 8 ||
        cl.len < nrows * 8 || hb.len < (ne + 1) * E * 8) {
        PyErr_SetString(PyExc_ValueError, "row_classes: bad arguments");
        goto done;
    }
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
        const Py_ssize_t end = (r + 1) * C - shift < n ? (r + 1) * C - shift : n;
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
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&eb);
    PyBuffer_Release(&mb);
    PyBuffer_Release(&ed);
    PyBuffer_Release(&cl);
    PyBuffer_Release(&hb);
    return result;
}

/* row_contexts(cls, n, C, shift, out): out[i] (int64) = cls[(i + shift) // C] */
PyObject *tans_row_contexts(PyObject *self, PyObject *args)
{
    Py_buffer cl = {0}, out = {0};
    Py_ssize_t n, C, shift;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &cl, &n, &C, &shift, &out))
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t nrows = n > 0 && C > 0 ? (n - 1 + shift) / C + 1 : 0;
    if (n < 1 || C < 1 || shift < 0 || shift >= C || cl.len < nrows * 8 || out.len < n * 8) {
        PyErr_SetString(PyExc_ValueError, "row_contexts: bad arguments");
        goto done;
    }
    const int64_t *restrict c = cl.buf;
    int64_t *restrict o = out.buf;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++)
        o[i] = c[(i + shift) / C];
    Py_END_ALLOW_THREADS
    result = Py_NewRef(Py_None);
done:
    PyBuffer_Release(&cl);
    PyBuffer_Release(&out);
    return result;
}

/* encode_rows(sym, n, ctx, cmap, c0, T, S, fr, out) -> bool: tans.encode's row of each symbol,
 * out[i] = context * S + sym[i], where the context is ctx[i] (ctx given), cmap[sym[i - 1]] with
 * c0 at every lane start i % T == 0 (cmap given: contiguous lanes of T steps), or 0; False when
 * a row is out of range or has frequency 0 in fr (the caller raises). out is int64[n], or
 * uint16[n] where fr has at most 65536 rows. */
PyObject *tans_encode_rows(PyObject *self, PyObject *args)
{
    Py_buffer sb = {0}, cb = {0}, mb = {0}, fb = {0}, ob = {0};
    PyObject *ctxo, *cmapo;
    Py_ssize_t n, c0, T, S;
    if (!PyArg_ParseTuple(args, "y*nOOnnny*w*", &sb, &n, &ctxo, &cmapo, &c0, &T, &S, &fb, &ob))
        return NULL;
    PyObject *result = NULL;
    if ((ctxo != Py_None && PyObject_GetBuffer(ctxo, &cb, PyBUF_SIMPLE) < 0) ||
        (cmapo != Py_None && PyObject_GetBuffer(cmapo, &mb, PyBUF_SIMPLE) < 0))
        goto done;
    const Py_ssize_t nrows = fb.len / 8, ncmap = mb.len / 8;
    if (n < 1 || T < 1 || S < 1 || sb.len < n * 8 || (ob.len != n * 8 && !(ob.len == n * 2 && nrows <= 65536)) ||
        (cb.buf && cb.len < n * 8)) {
        PyErr_SetString(PyExc_ValueError, "encode_rows: bad arguments");
        goto done;
    }
    const int64_t *restrict sym = sb.buf, *restrict ctx = cb.buf, *restrict cmap = mb.buf, *restrict fr = fb.buf;
    int64_t *restrict out = ob.len == n * 8 ? ob.buf : NULL;
    uint16_t *restrict out16 = out ? NULL : ob.buf;    /* 16-bit rows: see _tansenc.c */
    int ok = 1;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t i = 0; i < n; i++) {
        const int64_t s = sym[i];
        int64_t c = 0;
        if (ctx)
            c = ctx[i];
        else if (cmap) {
            if (i % T == 0)
                c = c0;
            else {
                const int64_t p = sym[i - 1];
                if (p < 0 || p >= ncmap) {
                    ok = 0;
                    break;
                }
                c = cmap[p];
            }
        }
        const int64_t r = c * S + s;
        if (s < 0 || s >= S || c < 0 || r >= nrows || fr[r] == 0) {
            ok = 0;
            break;
        }
        if (out)
            out[i] = r;
        else
            out16[i] = (uint16_t)r;
    }
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(ok);
done:
    PyBuffer_Release(&sb);
    if (cb.buf)
        PyBuffer_Release(&cb);
    if (mb.buf)
        PyBuffer_Release(&mb);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&ob);
    return result;
}
