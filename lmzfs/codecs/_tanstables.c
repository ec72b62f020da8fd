/* The table helpers of lmzfs.codecs._tansloop: what tans.py and floatsplit.py compute with numpy
 * before and after the decode loop, compiled because each cost 5-15% of a chunk's decode. Each
 * returns exactly what its numpy twin returns (the tests compare them on random inputs), and
 * the numpy code stays the path used when the extension is missing. */
#include "_tansloop.h"
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

/* build(freqs, K, S, R, packed): the decoder entries tans.Tables builds with numpy, for K rows
 * of S int64 frequencies each summing to 2**R (checked by the caller). Slot k of the symbols
 * dealt in order goes to position (k * step) mod L; the positions of symbol s, in increasing
 * order, get sub-states x = f_s, f_s + 1, ...; entry = base | nb << 16 | s << 20 with
 * nb = R - floor(log2 x) and base = x * 2**nb - L. */
const char *tans_build_rows(const int64_t *f, int64_t K, int64_t S, int64_t R, int64_t L,
                              int16_t *spread, int64_t *next, int64_t *pk, uint32_t *pk32)
{
    const int64_t step = (L >> 1) + (L >> 3) + 3;
    for (int64_t k = 0; k < K; k++) {
        const int64_t *fr = f + k * S;
        int64_t slot = 0;
        for (int64_t s = 0; s < S; s++) {
            if (fr[s] < 0 || slot + fr[s] > L)
                return "tans: a frequency table does not sum to L";
            for (int64_t c = 0; c < fr[s]; c++, slot++)
                spread[(slot * step) & (L - 1)] = (int16_t)s;
            next[s] = fr[s];
        }
        if (slot != L)
            return "tans: a frequency table does not sum to L";
        for (int64_t p = 0; p < L; p++) {
            const int64_t s = spread[p], x = next[s]++;
            const int64_t nb = R - (63 - __builtin_clzll((unsigned long long)x)), base = (x << nb) - L;
            if (pk32)   /* the compiled loop's own 32-bit entries (S <= 8192, checked by the caller) */
                pk32[k * L + p] = (uint32_t)base | (uint32_t)nb << 15 | (uint32_t)s << 19;
            else
                pk[k * L + p] = base | (nb << 16) | (s << 20);
        }
    }
    return NULL;
}

PyObject *tans_build(PyObject *self, PyObject *args)
{
    TANS_BUFFER freqs = {0}, packed = {0};
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
    const char *err;
    Py_BEGIN_ALLOW_THREADS      /* no Python objects are touched: other decodes run meanwhile */
    err = tans_build_rows(freqs.buf, K, S, R, L, spread, next, packed.buf, NULL);
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        goto done;
    }
    Py_INCREF(Py_None);
    result = Py_None;
done:
    PyMem_RawFree(spread);
    PyMem_RawFree(next);
    return result;
}

/* quantize_rows(counts, K, S, R, freqs): tans.quantize_rows for K rows of S int64 counts, into
 * freqs (int64, K*S). Per row, with L = 2**R and tot = the row's sum: counts whose share is below
 * one slot (c * L < tot) get 1; the others share the rest in proportion, floor first (a count
 * whose floor is 0 joins the small ones, and the split is redone), then one more slot for the d
 * largest remainders (ties to the lower symbol); any difference left goes to the first largest
 * entry. Returns False (and writes nothing valid) for a row that cannot be quantised. */
static int by_remainder(const void *pa, const void *pb)
{
    const struct remainder *a = pa, *b = pb;
    if (a->rem != b->rem)
        return a->rem > b->rem ? -1 : 1;
    return a->sym < b->sym ? -1 : a->sym > b->sym;
}

static inline int ranks_before(const struct remainder *x, const struct remainder *y)
{
    return x->rem > y->rem || (x->rem == y->rem && x->sym < y->sym);
}

static inline void swap_remainders(struct remainder *x, struct remainder *y)
{
    const struct remainder t = *x;
    *x = *y;
    *y = t;
}

/* Rearranges a[0..n) so that a[0..d) are its d first in by_remainder's order (in any order among
 * themselves): a quickselect, as only those d get a slot. After a bounded number of rounds (a
 * hostile table could make the pivots bad) it sorts what is left instead. */
static void select_first(struct remainder *a, int64_t n, int64_t d)
{
    int64_t lo = 0, hi = n - 1, rounds = 0;
    const int64_t k = d - 1;
    while (hi > lo) {
        if (++rounds > 64) {
            qsort(a + lo, (size_t)(hi - lo + 1), sizeof *a, by_remainder);
            return;
        }
        const int64_t mid = lo + (hi - lo) / 2;       /* median of three to the end as the pivot */
        if (ranks_before(&a[mid], &a[lo]))
            swap_remainders(&a[mid], &a[lo]);
        if (ranks_before(&a[hi], &a[lo]))
            swap_remainders(&a[hi], &a[lo]);
        if (ranks_before(&a[mid], &a[hi]))
            swap_remainders(&a[mid], &a[hi]);
        const struct remainder pivot = a[hi];
        int64_t store = lo;
        for (int64_t i = lo; i < hi; i++)
            if (ranks_before(&a[i], &pivot))
                swap_remainders(&a[i], &a[store++]);
        swap_remainders(&a[store], &a[hi]);
        if (store == k)
            return;
        if (k < store)
            hi = store - 1;
        else
            lo = store + 1;
    }
}

/* the rows of quantize_rows; 0 when a row cannot be quantised */
int tans_quantize_counts(const int64_t *counts, int64_t *freqs, int64_t K, int64_t S, int64_t L,
                         unsigned char *small, struct remainder *big)
{
    for (int64_t k = 0; k < K; k++) {
        const int64_t *c = counts + k * S;
        int64_t *f = freqs + k * S;
        int64_t tot = 0, nnz = 0;
        for (int64_t i = 0; i < S; i++) {
            if (c[i] < 0 || c[i] > ((int64_t)1 << 40))
                return 0;
            tot += c[i];
            nnz += c[i] > 0;
        }
        if (tot <= 0 || nnz > L)
            return 0;
        for (int64_t i = 0; i < S; i++)
            small[i] = c[i] > 0 && c[i] * L < tot;
        int64_t lb, tb;
        for (;;) {
            int64_t nsmall = 0;
            tb = 0;
            for (int64_t i = 0; i < S; i++) {
                nsmall += small[i];
                if (c[i] > 0 && !small[i])
                    tb += c[i];
            }
            lb = L - nsmall;
            int newly = 0;
            for (int64_t i = 0; i < S; i++) {
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
        for (int64_t i = 0; i < S; i++)
            if (c[i] > 0 && !small[i]) {
                sumbig += f[i];
                big[nbig].rem = c[i] * lb % (tb > 0 ? tb : 1);
                big[nbig++].sym = i;
            }
        const int64_t d = lb - sumbig;
        if (d > 0 && nbig > 0) {
            const int64_t take = d < nbig ? d : nbig;
            select_first(big, nbig, take);
            for (int64_t q = 0; q < take; q++)
                f[big[q].sym] += 1;
        }
        int64_t sum = 0, arg = 0;
        for (int64_t i = 0; i < S; i++) {
            sum += f[i];
            if (f[i] > f[arg])
                arg = i;
        }
        if (sum != L)
            f[arg] += L - sum;
    }
    return 1;
}

PyObject *tans_quantize_rows(PyObject *self, PyObject *args)
{
    TANS_BUFFER counts = {0}, freqs = {0};
    Py_ssize_t K, S, R;
    PyObject *result = NULL;
    unsigned char *small = NULL;
    struct remainder *big = NULL;
    if (!PyArg_ParseTuple(args, "y*nnnw*", &counts, &K, &S, &R, &freqs))
        return NULL;
    if (R < 1 || R > 30 || K < 1 || S < 1 || counts.len != K * S * 8 || freqs.len != K * S * 8) {
        PyErr_SetString(PyExc_ValueError, "quantize_rows: bad arguments");
        goto done;
    }
    small = PyMem_RawMalloc(S);
    big = PyMem_RawMalloc(S * sizeof *big);
    if (!small || !big) {
        PyErr_NoMemory();
        goto done;
    }
    int ok;
    Py_BEGIN_ALLOW_THREADS      /* no Python objects are touched: other decodes run meanwhile */
    ok = tans_quantize_counts(counts.buf, freqs.buf, K, S, (int64_t)1 << R, small, big);
    Py_END_ALLOW_THREADS
    result = PyBool_FromLong(ok);
done:
    PyMem_RawFree(small);
    PyMem_RawFree(big);
    return result;
}

/* The refusal of a call whose two buffers were already taken: release both, raise ValueError. */
/* varints(buf, count, out) -> 0 ok, 1 wrong number of values, 2 a value over 5 bytes,
 * 3 a non-canonical value (a last byte of 0 after others): uintlist.unpack_uints's body, with the
 * same precedence of errors. out: int64[count]. */
PyObject *tans_varints(PyObject *self, PyObject *args)
{
    TANS_BUFFER buf = {0}, out = {0};
    Py_ssize_t count;
    if (!PyArg_ParseTuple(args, "y*nw*", &buf, &count, &out))
        return NULL;
    long code = 0;
    if (count < 0 || out.len != count * 8)
        return tans_bad_arguments("varints");
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
    return PyLong_FromLong(code);
}

/* to_varints(values) -> bytes: the int64 values (each 0 <= v < 2**35) as LEB128 varints, the
 * inverse of varints; None if a value is out of that range (pack_uints then raises). */
PyObject *tans_to_varints(PyObject *self, PyObject *arg)
{
    TANS_BUFFER vb = {0};
    if (PyObject_GetBuffer(arg, &vb, PyBUF_SIMPLE) < 0)
        return NULL;
    PyObject *result = NULL;
    const Py_ssize_t count = vb.len / 8;
    uint8_t *out = NULL;
    if (vb.len % 8) {
        PyErr_SetString(PyExc_ValueError, "to_varints: bad arguments");
        goto done;
    }
    out = malloc(5 * (size_t)count + 1);
    if (!out) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *v = vb.buf;
    Py_ssize_t pos = 0;
    for (Py_ssize_t i = 0; i < count; i++) {
        uint64_t x = (uint64_t)v[i];
        if (v[i] < 0 || x >> 35) {
            result = Py_NewRef(Py_None);
            goto done;
        }
        while (x >= 0x80) {
            out[pos++] = (uint8_t)((x & 0x7F) | 0x80);
            x >>= 7;
        }
        out[pos++] = (uint8_t)x;
    }
    result = PyBytes_FromStringAndSize((const char *)out, pos);
done:
    free(out);
    return result;
}

/* pack_fields(values, R, m) -> bytes or None: the int64 values as R-bit little-endian fields of
 * one bit string (value i at bit i * R); its first m bytes, or None when a bit at or past 8 * m
 * is set (floatsplit's lane end states that hold bits past the stored bytes). */
int tans_pack_fields_into(const int64_t *v, Py_ssize_t count, Py_ssize_t R, uint8_t *o, Py_ssize_t m)
{
    const uint64_t mask = ((uint64_t)1 << R) - 1;
    /* a 64-bit accumulator: bits enter at the top of what it holds, whole bytes leave at the
     * bottom (R <= 32, so at most 7 + 32 bits are held between flushes) */
    uint64_t acc = 0;
    unsigned held = 0;
    Py_ssize_t w = 0;
    int past = 0;
    for (Py_ssize_t i = 0; i < count; i++) {     /* bits above R are not part of a field */
        acc |= ((uint64_t)v[i] & mask) << held;
        held += (unsigned)R;
        while (held >= 8) {
            const uint8_t byte = (uint8_t)acc;
            if (w < m)
                o[w] = byte;
            else
                past |= byte != 0;
            w++;
            acc >>= 8;
            held -= 8;
        }
    }
    if (held) {
        if (w < m)
            o[w] = (uint8_t)acc;
        else
            past |= (uint8_t)acc != 0;
        w++;
    }
    for (; w < m; w++)     /* m may ask for up to 7 bits past the last field */
        o[w] = 0;
    return past;
}

PyObject *tans_pack_fields(PyObject *self, PyObject *args)
{
    TANS_BUFFER vals = {0};
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
    int past;
    Py_BEGIN_ALLOW_THREADS      /* only the new bytes object is written, before anyone can see it */
    past = tans_pack_fields_into(vals.buf, count, R, (uint8_t *)PyBytes_AS_STRING(res), m);
    Py_END_ALLOW_THREADS
    if (past) {
        Py_DECREF(res);
        Py_RETURN_NONE;
    }
    return res;
}


/* unpack_fields(buf, R, out) -> None: out[i] = the R-bit little-endian field at bit i * R of buf
 * (pack_fields's inverse; tans.decode's first states). out: int64[count], count * R <= 8 * len. */
void tans_unpack_fields_into(const uint8_t *b, Py_ssize_t R, int64_t *o, Py_ssize_t count)
{
    const uint64_t mask = ((uint64_t)1 << R) - 1;
    uint64_t acc = 0;
    unsigned held = 0;
    Py_ssize_t r = 0;
    for (Py_ssize_t i = 0; i < count; i++) {    /* bytes enter at the top, fields leave at the bottom */
        while (held < (unsigned)R) {
            acc |= (uint64_t)b[r++] << held;
            held += 8;
        }
        o[i] = (int64_t)(acc & mask);
        acc >>= R;
        held -= (unsigned)R;
    }
}

PyObject *tans_unpack_fields(PyObject *self, PyObject *args)
{
    TANS_BUFFER buf = {0}, out = {0};
    Py_ssize_t R;
    if (!PyArg_ParseTuple(args, "y*nw*", &buf, &R, &out))
        return NULL;
    const Py_ssize_t count = out.len / 8;
    if (R < 1 || R > 32 || out.len % 8 || count * R > buf.len * 8)
        return tans_bad_arguments("unpack_fields");
    tans_unpack_fields_into(buf.buf, R, out.buf, count);
    Py_RETURN_NONE;
}
