/* tans.encode's step loop and bit packing, compiled: the same stream, byte for byte, as the numpy
 * code in tans.py, which stays the reference the tests compare against.
 *
 * Why C: encoding steps every lane backwards one symbol at a time; numpy does a handful of array
 * operations per step, and a chunk has tens of thousands of steps of few lanes, so its per-call
 * overhead, not the arithmetic, was most of `lmz add`'s time in the entropy coders.
 *
 * encode(si, n, T, Wp, interleaved, ks, thr, sf, enc, x0, R) -> bytes
 *   si   int64[n]: each symbol's row index context * S + symbol (frequency > 0, checked by the caller)
 *   ks, thr, sf  int64[K * S]: per row, R + 1 - bit length of f, f << ks, and start - f
 *   enc  int64[K * L]: encoder slots (L + position)
 *   x0   int64[Wp]: each lane's initial state (L, plus any bits back)
 * Lane j's step t holds symbol t * Wp + j (interleaved) or j * T + t (contiguous), when that is
 * below n. The stream is the Wp final states (x - L, R bits each), then for every step t
 * ascending and lane j ascending the nb low bits of the state before that step's symbol, fields
 * packed least significant bit first. */
#include "_tansloop.h"
#include <stdlib.h>
#include <string.h>

static const char *encode_steps(const int64_t *si, int64_t n, int64_t T, int64_t Wp, int interleaved,
                                const int64_t *ks, const int64_t *thr, const int64_t *sf,
                                const int64_t *enc, int64_t nrows, int64_t nenc, int64_t *x,
                                uint16_t *vals, uint8_t *nbs)
{
    for (int64_t t = T - 1; t >= 0; t--) {
        for (int64_t j = 0; j < Wp; j++) {
            const int64_t i = interleaved ? t * Wp + j : j * T + t;
            if (i >= n) {
                nbs[t * Wp + j] = 0;
                vals[t * Wp + j] = 0;
                continue;
            }
            const int64_t r = si[i];
            if (r < 0 || r >= nrows)
                return "encode: a row index is out of range";
            const int64_t xs = x[j];
            const int64_t nb = ks[r] - (xs < thr[r]);
            if (nb < 0 || nb > 16)
                return "encode: a state is out of range";
            vals[t * Wp + j] = (uint16_t)(xs & ((INT64_C(1) << nb) - 1));
            nbs[t * Wp + j] = (uint8_t)nb;
            const int64_t slot = sf[r] + (xs >> nb);
            if (slot < 0 || slot >= nenc)
                return "encode: a slot is out of range";
            x[j] = enc[slot];
        }
    }
    return NULL;
}

struct bitwriter {
    uint8_t *out;
    uint64_t acc;
    int fill;
    int64_t pos;
};

static inline void put_bits(struct bitwriter *w, uint64_t v, int nb)
{
    w->acc |= v << w->fill;
    w->fill += nb;
    while (w->fill >= 8) {
        w->out[w->pos++] = (uint8_t)w->acc;
        w->acc >>= 8;
        w->fill -= 8;
    }
}

PyObject *tans_encode(PyObject *self, PyObject *args)
{
    Py_buffer si = {0}, ks = {0}, thr = {0}, sf = {0}, enc = {0}, x0 = {0};
    Py_ssize_t n, T, Wp, R;
    int interleaved;
    if (!PyArg_ParseTuple(args, "y*nnnpy*y*y*y*y*n", &si, &n, &T, &Wp, &interleaved, &ks, &thr, &sf, &enc,
                          &x0, &R))
        return NULL;
    PyObject *result = NULL;
    int64_t *x = NULL;
    uint16_t *vals = NULL;
    uint8_t *nbs = NULL;
    const int64_t nrows = ks.len / 8, L = (int64_t)1 << (R < 0 ? 0 : R);
    if (n < 1 || T < 1 || Wp < 1 || T * Wp < n || R < 1 || R > 15 || si.len != 8 * n || x0.len != 8 * Wp ||
            thr.len != ks.len || sf.len != ks.len || enc.len % 8 || (interleaved ? (T - 1) * Wp >= n
                                                                     : (Wp - 1) * T >= n)) {
        PyErr_SetString(PyExc_ValueError, "encode: bad arguments");
        goto done;
    }
    x = malloc(8 * (size_t)Wp);
    vals = malloc(2 * (size_t)(T * Wp));
    nbs = malloc((size_t)(T * Wp));
    if (!x || !vals || !nbs) {
        PyErr_NoMemory();
        goto done;
    }
    memcpy(x, x0.buf, 8 * (size_t)Wp);
    const char *err;
    Py_BEGIN_ALLOW_THREADS
    err = encode_steps(si.buf, n, T, Wp, interleaved, ks.buf, thr.buf, sf.buf, enc.buf, nrows, enc.len / 8, x,
                       vals, nbs);
    Py_END_ALLOW_THREADS
    if (err) {
        PyErr_SetString(PyExc_ValueError, err);
        goto done;
    }
    int64_t bits = R * Wp;
    for (int64_t k = 0; k < T * Wp; k++)
        bits += nbs[k];
    result = PyBytes_FromStringAndSize(NULL, (bits + 7) >> 3);
    if (!result)
        goto done;
    struct bitwriter w = {(uint8_t *)PyBytes_AS_STRING(result), 0, 0, 0};
    Py_BEGIN_ALLOW_THREADS
    for (int64_t j = 0; j < Wp; j++)
        put_bits(&w, (uint64_t)(x[j] - L), (int)R);
    for (int64_t k = 0; k < T * Wp; k++)
        if (nbs[k])
            put_bits(&w, vals[k], nbs[k]);
    if (w.fill)
        w.out[w.pos++] = (uint8_t)w.acc;
    Py_END_ALLOW_THREADS
done:
    free(x);
    free(vals);
    free(nbs);
    PyBuffer_Release(&si);
    PyBuffer_Release(&ks);
    PyBuffer_Release(&thr);
    PyBuffer_Release(&sf);
    PyBuffer_Release(&enc);
    PyBuffer_Release(&x0);
    return result;
}

/* encode_slots(packed, K, S, R, freqs, enc): the encoder slots from the decoder entries that
 * build (_tanstables.c) made: enc[k * L + start + rank] = L + the rank-th position (ascending)
 * holding symbol s in table k, start being the sum of k's frequencies below s. That is
 * tans.py's argsort of the spread, by counting instead of sorting, and without spreading again. */
PyObject *tans_encode_slots(PyObject *self, PyObject *args)
{
    Py_buffer pb = {0}, fb = {0}, eb = {0};
    Py_ssize_t K, S, R;
    if (!PyArg_ParseTuple(args, "y*nnny*w*", &pb, &K, &S, &R, &fb, &eb))
        return NULL;
    PyObject *result = NULL;
    int64_t *cursor = NULL, *limit = NULL;
    const int64_t L = (int64_t)1 << (R < 1 || R > 15 ? 1 : R);
    if (R < 1 || R > 15 || K < 1 || S < 1 || pb.len < K * L * 8 || fb.len < K * S * 8 || eb.len < K * L * 8) {
        PyErr_SetString(PyExc_ValueError, "encode_slots: bad arguments");
        goto done;
    }
    cursor = malloc((size_t)S * sizeof *cursor);
    limit = malloc((size_t)S * sizeof *limit);
    if (!cursor || !limit) {
        PyErr_NoMemory();
        goto done;
    }
    const int64_t *restrict packed = pb.buf, *restrict f = fb.buf;
    int64_t *restrict enc = eb.buf;
    int bad = 0;
    Py_BEGIN_ALLOW_THREADS
    for (Py_ssize_t k = 0; k < K && !bad; k++) {
        int64_t at = 0;
        for (Py_ssize_t s = 0; s < S; s++) {
            cursor[s] = at;
            at += f[k * S + s];
            limit[s] = at;
        }
        if (at != L) {
            bad = 1;
            break;
        }
        const int64_t *row = packed + k * L;
        int64_t *out = enc + k * L;
        for (int64_t p = 0; p < L; p++) {
            const int64_t s = row[p] >> 20;
            if (s < 0 || s >= S || cursor[s] >= limit[s]) {
                bad = 1;
                break;
            }
            out[cursor[s]++] = L + p;
        }
    }
    Py_END_ALLOW_THREADS
    if (bad) {
        PyErr_SetString(PyExc_ValueError, "encode_slots: the entries do not match the frequencies");
        goto done;
    }
    result = Py_NewRef(Py_None);
done:
    free(cursor);
    free(limit);
    PyBuffer_Release(&pb);
    PyBuffer_Release(&fb);
    PyBuffer_Release(&eb);
    return result;
}
